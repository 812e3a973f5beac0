"""A longer fuzzing run of the three inputs costline takes from outside: event messages, rule
files and Slack button presses.

    .venv/bin/python bench/fuzz.py [--seconds N] [--target parser|rules|slack|all]
        [--engine mutate|atheris] [--seed S] [--json]

Each target has a checker that states what must hold for any input:

* ``parser`` — ``parse_message`` answers a ``Rejection`` with a known code and a one-line
  reason, or events whose ``ts`` every zone's calendar can place and that survive a dump and
  parse; then intake (``Intake.take``) refuses the message whole with a pricing code, or
  turns each of its events into a ledger entry whose amounts are within the price book's
  bound and that decodes from its record as it was encoded;
* ``rules`` — ``load_rule_text`` gives a whole valid rule set, or ``RulesInvalid`` whose
  every problem is one ``FILE:LINE:COL: message`` line inside the file; one load taking
  longer than ``--slow`` seconds is reported too;
* ``slack`` — ``parse_action`` on a (signed) body gives a well-typed ``ActionRequest`` or
  ``BadRequest``, nothing else.

``--engine mutate`` (the default, no extra packages) mutates the seeds (the contract's
events, ``rules/definitions/*.yaml``, costline's own button payloads) and keeps every input
that produced an outcome not seen before as a new seed. ``--engine atheris`` hands one target
to libFuzzer's coverage-guided loop (``pip install atheris``); with ``--target all`` each target
runs in a subprocess of its own for a third of the time.

It prints, per target, the executions, executions per second and each distinct finding with
the smallest input that showed it; the exit status is 1 when anything was found.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

NOW = 1_796_025_600.0  # 2026-11-30T08:00:00Z
CODES = {
    "invalid_json", "missing_field", "unknown_field", "unknown_kind", "out_of_range",
    "too_long", "too_short", "bad_format", "bad_value", "bad_type", "bad_timestamp",
    "future_ts",
}
PRICING_CODES = {"unknown_resource_type", "unit_mismatch", "negative_cost", "not_hourly",
                 "out_of_range"}
PROBLEM = re.compile(r"(?P<file>[^\n]+?):(?P<line>\d+):(?P<col>\d+): (?P<message>\S[^\n\r]*)")
LINE_BREAK = re.compile("\r\n|[\n\r]")
TOKENS = [
    b"\x00", b"\xff", b"\xc3", b"\xed\xa0\x80", b"\\u0000", b"\\ud800", b'"', b"\\", b",", b"[",
    b"]", b"{", b"}", b":", b"null", b"true", b"-", b"1e999", b"-1e18", b"9" * 400, b"0" * 20,
    b"e13", b"e300", b"000000",
    b"&a ", b"*a", b"<<: *a", b"!!python/object/apply:os.system ['true'] ", b"!x ", b"? ",
    b"- ", b"\t", b"\n", b"\r", b"  ", b"#", b"|", b"---\n", b"%", b"%zz", b"&", b"=", b"+",
]


NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
NUMBERS = [b"0", b"-0", b"-1", b"1e13", b"9.3e12", b"-1e18", b"1e308", b"1e-320", b"9" * 400,
           b"1" + b"0" * 20, b"-62135596800", b"4102444800", b"2147483648", b"0.1"]


class Finding(Exception):
    """A checker's property did not hold."""


@dataclass
class Outcome:
    executions: int = 0
    seconds: float = 0.0
    findings: dict[str, bytes] = field(default_factory=dict)
    seeds: int = 0
    rate: float | None = None  # executions per second while fuzzing, when known apart

    def found(self, what: str, data: bytes) -> None:
        known = self.findings.get(what)
        if known is None or len(data) < len(known):
            self.findings[what] = data


# ── checkers: raise Finding (or anything) when a promise is broken, else return a label ──────


def parser_target() -> tuple[list[bytes], Callable[[bytes], str]]:
    from costline.connectors.redis_keys import Calendar
    from costline.rules.events import (
        MAX_FUTURE_S,
        MIN_TS,
        Parsed,
        Rejection,
        dump_event,
        parse_message,
    )
    from costline.rules.ledger import FAULT, USAGE, Intake, Record
    from costline.rules.prices import MAX_EVENT_MICRO, PriceBook
    from costline.streams.settings import DEFAULT_PRICES

    intake = Intake(PriceBook.load(DEFAULT_PRICES), 4)
    zones = [Calendar(z) for z in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12")]
    usage = {"event_id": "u-8812", "kind": "usage", "ts": "2026-11-30T08:00:00Z",
             "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
             "quantity": 8.0, "unit": "gpu_hour", "cost": 19.92, "category": "compute",
             "tags": {"project": "llm-70b", "team": "pretrain", "env": "prod"}}
    utilization = {"event_id": "m-19", "kind": "utilization", "ts": 1796025600,
                   "resource_id": "cluster-a/node-017", "resource_type": "gpu.h100",
                   "metric": "gpu_util", "value": 0.02, "tags": {"job": "run-42"}}
    fault = {"event_id": "f-3", "kind": "fault", "ts": "2026-11-30T08:05:00+01:00",
             "fault": "node_failure", "resource_type": "gpu.h100", "units": 512,
             "lost_seconds": 1800, "recovery_seconds": 900, "tags": {"team": "pretrain"}}
    seeds = [json.dumps(v).encode() for v in (usage, utilization, fault,
                                                 [usage, utilization, fault])]
    fields = {f"field {name}" for event in (usage, utilization, fault) for name in event}
    fields.add("message")

    def check(raw: bytes) -> str:
        result = parse_message(raw, now=NOW)
        if isinstance(result, Rejection):
            if result.code not in CODES:
                raise Finding(f"unknown rejection code {result.code!r}")
            if not result.reason.strip() or "\n" in result.reason:
                raise Finding("rejection reason empty or not one line")
            field = re.sub(r"^event \d+: ", "", result.reason).split(":")[0].split(".")[0]
            return f"{result.code}:{field if field in fields else 'other'}"
        assert isinstance(result, Parsed)
        for event in result.events:
            ts = event.unix_ts
            if not MIN_TS <= ts <= NOW + MAX_FUTURE_S:
                raise Finding("accepted ts out of range")
            for calendar in zones:
                calendar.day_bounds(ts)
            if parse_message(dump_event(event), now=NOW) != Parsed([event], False):
                raise Finding("accepted event does not survive dump and parse")
        taken = intake.take([raw], now=NOW)
        if taken.refused:
            [(_, code, reason)] = taken.refused
            if code not in PRICING_CODES or not reason.strip() or "\n" in reason:
                raise Finding(f"pricing refusal {code!r} unknown or its reason not one line")
            return f"refused:{code}"
        entries = []
        for records in taken.records.values():
            for record in records:
                decoded = Record.decode(record)
                if decoded.encode() != record:
                    raise Finding("a ledger record does not decode to itself")
                entries += decoded.entries
        if len(entries) != len(result.events) or taken.events != len(entries):
            raise Finding("not every event of the message became one ledger entry")
        for entry in entries:
            amounts = {USAGE: entry[4:6], FAULT: entry[5:6]}.get(entry[0], ())
            if any(abs(amount) > MAX_EVENT_MICRO for amount in amounts):
                raise Finding("a priced amount beyond the price book's bound")
        return f"parsed:{len(result.events)}"

    return seeds, check


def rules_target(slow_s: float) -> tuple[list[bytes], Callable[[bytes], str]]:
    from costline.connectors.plugins import PLUGINS
    from costline.rules.loader import RuleSet, RulesInvalid, load_rule_text
    from costline.streams.settings import DEFAULT_RULES

    seeds = [path.read_bytes() for path in sorted(DEFAULT_RULES.glob("*.yaml"))]

    def check(raw: bytes) -> str:
        text = raw.decode("utf-8", errors="replace")
        started = time.perf_counter()
        try:
            rules = load_rule_text(text, file="f.yaml", plugins=PLUGINS)
        except RulesInvalid as invalid:
            lines = LINE_BREAK.split(text)
            for error in invalid.errors:
                found = PROBLEM.fullmatch(str(error))
                if not found or found["file"] != "f.yaml":
                    raise Finding("problem is not one FILE:LINE:COL: message line") from None
                line, col = int(found["line"]), int(found["col"])
                if not (1 <= line <= len(lines) and 1 <= col <= len(lines[line - 1]) + 1):
                    raise Finding("problem position outside the file") from None
            label = f"invalid:{' '.join(invalid.errors[0].message.split()[:4])}"
        else:
            assert isinstance(rules, RuleSet)
            names = [rule.name for rule in rules]
            if len(names) != len(set(names)):
                raise Finding("valid rule set with repeated names")
            label = f"valid:{len(rules)}"
        if time.perf_counter() - started > slow_s:
            raise Finding(f"one load took longer than {slow_s}s")
        return label

    return seeds, check


def slack_target() -> tuple[list[bytes], Callable[[bytes], str]]:
    from costline.connectors.slack_actions import BadRequest, parse_action
    from costline.connectors.slack_render import APPROVE_ACTION, KEEP_ACTION, SNOOZE_ACTIONS

    value = json.dumps({"alert_id": "idle-gpus/77c2d1", "rule": "idle-gpus",
                        "resource_id": "cluster-a/node-017"})
    seeds = []
    for action in (*SNOOZE_ACTIONS, KEEP_ACTION, APPROVE_ACTION):
        payload = {"type": "block_actions", "user": {"id": "U0BOSS", "username": "boss"},
                   "channel": {"id": "C0ML"}, "container": {"message_ts": "1796025800.000100"},
                   "actions": [{"action_id": action, "value": value}]}
        seeds.append(urlencode({"payload": json.dumps(payload)}).encode())

    def check(raw: bytes) -> str:
        try:
            request = parse_action(raw, timedelta(days=1))
        except BadRequest as exc:
            return f"bad:{str(exc)[:30]}"
        texts = (request.alert_id, request.rule, request.user_id, request.user_name)
        if not all(isinstance(t, str) and t for t in texts):
            raise Finding("accepted press with a missing or non-text id")
        for optional in (request.resource_id, request.channel_id, request.message_ts):
            if optional is not None and not isinstance(optional, str):
                raise Finding("accepted press with a non-text optional field")
        return f"ok:{request.action}"

    return seeds, check


def targets(name: str, slow_s: float) -> tuple[list[bytes], Callable[[bytes], str]]:
    if name == "parser":
        return parser_target()
    if name == "rules":
        return rules_target(slow_s)
    return slack_target()


# ── the mutation engine ──────────────────────────────────────────────────────────────────────


def mutate(rng: random.Random, data: bytes, corpus: list[bytes]) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        at = rng.randint(0, len(out))
        op = rng.randrange(9)
        if op == 0 and out:
            out[min(at, len(out) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            del out[at:]
        elif op == 2:
            del out[at:at + rng.randint(1, 16)]
        elif op == 3:
            out[at:at] = rng.choice(TOKENS)
        elif op == 4:
            out[at:at] = out[at:at + rng.randint(1, 32)] * rng.randint(1, 4)
        elif op == 5:
            other = rng.choice(corpus)
            cut = rng.randint(0, len(other))
            out[at:] = other[cut:]
        elif op == 6:
            lines = bytes(out).split(b"\n")
            i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
            out = bytearray(b"\n".join(lines))
        elif op == 7:
            numbers = list(NUMBER.finditer(out))
            if numbers:
                found = rng.choice(numbers)
                out[found.start():found.end()] = rng.choice(NUMBERS)
        else:
            opener, closer = rng.choice([(b"[", b"]"), (b"{", b"}"), (b'{"a":', b"}")])
            depth = rng.choice([2, 40, 400, 40_000])
            out[at:at] = opener * depth + closer * depth
    return bytes(out)


def run_mutate(name: str, seconds: float, seed: int, slow_s: float) -> Outcome:
    seeds, check = targets(name, slow_s)
    rng = random.Random(seed)
    corpus = list(seeds)
    seen: set[str] = set()
    outcome = Outcome()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        data = mutate(rng, rng.choice(corpus), corpus)
        outcome.executions += 1
        try:
            label = check(data)
        except Finding as finding:
            outcome.found(str(finding), data)
            continue
        except Exception as exc:  # noqa: BLE001 - an unexpected exception is a finding
            outcome.found(f"{type(exc).__name__}: {str(exc)[:120]}", data)
            continue
        if label not in seen and len(data) < 200_000:
            seen.add(label)
            corpus.append(data)
    outcome.seconds = time.monotonic() - started
    outcome.seeds = len(corpus)
    return outcome


# ── atheris ──────────────────────────────────────────────────────────────────────────────────


def run_atheris_here(name: str, seconds: float, slow_s: float, corpus: Path) -> None:
    """libFuzzer's loop in this process; it exits the process when done or on a finding."""
    import atheris

    with atheris.instrument_imports():
        seeds, check = targets(name, slow_s)

    def one_input(data: bytes) -> None:
        check(data)

    for index, seed in enumerate(seeds):
        (corpus / f"seed-{index}").write_bytes(seed)
    crashes = Path(tempfile.gettempdir()) / f"costline-fuzz-{name}-"
    atheris.Setup([sys.argv[0], f"-max_total_time={max(1, int(seconds))}",
                   "-print_final_stats=1", "-rss_limit_mb=4096",
                   f"-artifact_prefix={crashes}", str(corpus)], one_input)
    atheris.Fuzz()


def run_atheris(name: str, seconds: float, slow_s: float) -> Outcome:
    """One target in a subprocess (the time includes instrumenting the imports); executions
    from libFuzzer's final stats."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"costline-fuzz-{name}-") as corpus:
        command = [sys.executable, __file__, "--engine", "atheris-child", "--target", name,
                   "--seconds", str(seconds), "--slow", str(slow_s), "--corpus", corpus]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    outcome = Outcome(seconds=time.monotonic() - started)
    log = done.stdout + done.stderr
    runs = re.search(r"stat::number_of_executed_units:\s*(\d+)", log)
    outcome.executions = int(runs.group(1)) if runs else 0
    rate = re.search(r"stat::average_exec_per_sec:\s*(\d+)", log)
    outcome.rate = float(rate.group(1)) if rate else None
    if done.returncode != 0:
        crash = re.findall(r"=== Uncaught Python exception: ===\n(.+)", log)
        saved = re.findall(r"Test unit written to (\S+)", log)
        what = crash[0] if crash else f"libFuzzer exited {done.returncode}"
        outcome.found(what + (f" (input saved to {saved[0]})" if saved else ""),
                      log[-2000:].encode())
    return outcome


# ── command line ─────────────────────────────────────────────────────────────────────────────


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="total time of the run")
    parser.add_argument("--target", choices=["parser", "rules", "slack", "all"], default="all")
    parser.add_argument("--engine", choices=["mutate", "atheris", "atheris-child"],
                        default="mutate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--slow", type=float, default=5.0,
                        help="a rule file load slower than this is a finding")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.engine == "atheris-child":
        run_atheris_here(args.target, args.seconds, args.slow, args.corpus)
        return 0
    names = ["parser", "rules", "slack"] if args.target == "all" else [args.target]
    share = args.seconds / len(names)
    results: dict[str, Outcome] = {}
    for name in names:
        print(f"fuzzing {name} for {share:.0f}s ({args.engine})", file=sys.stderr)
        results[name] = (run_atheris(name, share, args.slow) if args.engine == "atheris"
                         else run_mutate(name, share, args.seed, args.slow))
    if args.json:
        print(json.dumps({name: {"executions": r.executions, "seconds": round(r.seconds, 1),
                                 "findings": {k: v[:2000].decode("utf-8", "replace")
                                              for k, v in r.findings.items()}}
                          for name, r in results.items()}, indent=2))
    else:
        for name, r in results.items():
            rate = r.rate if r.rate is not None else (
                r.executions / r.seconds if r.seconds else 0.0)
            print(f"{name}: {r.executions} executions in {r.seconds:.1f}s ({rate:.0f}/s), "
                  f"{len(r.findings)} finding(s)" + (f", corpus {r.seeds}" if r.seeds else ""))
            for what, data in sorted(r.findings.items()):
                print(f"  - {what}\n    input: {data[:300]!r}")
    return 1 if any(r.findings for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
