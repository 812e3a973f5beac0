"""The demo's budget enforcement: research held at its daily GPU budget line on ``slurm-a``.

When a Slurm cluster that keeps accounting answers here (slurmdbd, ``AccountingStorageEnforce``
with associations: what ``.ci/slurm.sh`` starts), the demo runs ``slurm-daily-gpu`` live with
research's own jobs in the Slurm account ``research`` — one running, two waiting to start —
and the worker holds the waiting ones after a short grace while the running one goes on; at
the end the demo lifts the hold as the Lift button would, and cancels its jobs. Without such a
cluster the same rule runs as a dry run and the audit log says what it would have held.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

TEAM = "research"
RULE = "slurm-daily-gpu"
GRACE = "10s"


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def accounting_answers() -> bool:
    """Whether Slurm here enforces associations (so a hold is a real one)."""
    try:
        done = _run(["scontrol", "show", "config"])
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and any(
        line.startswith("AccountingStorageEnforce") and "associations" in line
        for line in done.stdout.splitlines())


@contextmanager
def team_jobs(say: Callable[[str], None]) -> Iterator[list[str]]:
    """Research's jobs in its Slurm account (made for the demo if missing), or ``[]``."""
    if not accounting_answers():
        say(f"No Slurm with accounting here: {TEAM} is held as a dry run.")
        yield []
        return
    created = not _run(["sacctmgr", "-nP", "show", "account", TEAM]).stdout.strip()
    if created:
        _run(["sacctmgr", "-i", "add", "account", TEAM, "description=costline demo",
              "organization=costline"])
        _run(["sacctmgr", "-i", "add", "user", "root", f"account={TEAM}"])
    jobs = [_submit("sweep-next-0")]
    jobs += [_submit(f"sweep-next-{n}", "--begin=now+3600") for n in (1, 2)]
    jobs = [job for job in jobs if job]
    say(f"Slurm keeps accounting here: {TEAM}'s jobs {', '.join(jobs)} run as account "
        f"{TEAM} (the first now, the others waiting to start), and {RULE} holds for real.")
    try:
        yield jobs
    finally:
        if jobs:
            _run(["scancel", *jobs])
        if created:
            _run(["sacctmgr", "-i", "delete", "user", "root", f"account={TEAM}"])
            _run(["sacctmgr", "-i", "delete", "account", TEAM])


def _submit(name: str, *options: str) -> str:
    done = _run(["sbatch", "--parsable", f"--job-name={name}", f"--account={TEAM}",
                 "--output=/dev/null", *options, "--wrap", "sleep 3600"])
    return done.stdout.strip().split(";")[0] if done.returncode == 0 else ""


def job_states(jobs: list[str]) -> list[str]:
    """``4211 RUNNING``, ``4212 PENDING JobHeldAdmin``: each job and why it waits."""
    if not jobs:
        return []
    done = _run(["squeue", "--noheader", "--jobs", ",".join(jobs), "--format", "%i %T %r"])
    return [" ".join(line.split()).replace(" None", "") for line in done.stdout.splitlines()]


def compress_enforcement(rule: dict[str, Any], live: bool) -> list[str]:
    """The demo's version of a rule with ``enforce``: a short grace, live only for real."""
    enforce = rule["enforce"]
    changes = [f"{rule.get('name')} grace {enforce.get('grace', '15m')} → {GRACE}"]
    enforce["grace"] = GRACE
    rule["mode"] = "live" if live else "dry_run"
    return changes


def lift(env: dict[str, str], by: str = "costline demo") -> str:
    """Lift research's enforcement as the Lift button does: restore what was held."""
    from pathlib import Path

    from costline.connectors.enforce_ledger import redis_enforce_ledger
    from costline.connectors.plugins import PLUGINS
    from costline.connectors.redis_client import connect_async
    from costline.rules.loader import load_rules
    from costline.streams.worker.enforcer import Enforcer

    async def run() -> str:
        async def for_the_worker(record: dict[str, Any]) -> None:
            raise RuntimeError("the worker publishes it")

        redis = connect_async(env["COSTLINE_REDIS_URL"])
        rules = load_rules([Path(env["COSTLINE_RULES"])], plugins=PLUGINS)
        enforcer = Enforcer(rules=rules, sink=for_the_worker,
                            ledger=redis_enforce_ledger(redis, env["COSTLINE_NAMESPACE"]))
        try:
            return await enforcer.lift(RULE, f"team={TEAM}", by)
        except (LookupError, RuntimeError) as exc:
            return f"not lifted: {exc}"
        finally:
            await redis.aclose()

    import logging

    logging.getLogger("costline.enforce").setLevel(logging.ERROR)
    return asyncio.run(run())


def enforcement_text(records: list[dict[str, Any]], held: list[str],
                     lifted: list[str]) -> str | None:
    """What the demo says about the enforcement at the end, from its audit records."""
    own = sorted((r for r in records if r.get("automation") == "enforce"
                  and r.get("step") in ("executed", "skipped", "failed")),
                 key=lambda r: str(r.get("at")))
    if not own:
        return None
    last = own[-1]
    group = last.get("resource_id", "?")
    if last["step"] == "executed":
        text = (f"Budget enforcement: {group} held at its budget line ({last['reason']}). "
                f"Its jobs then: {'; '.join(held) or 'none'}.")
        if lifted:
            text += f" Lifted at the end as the Lift button would: {'; '.join(lifted)}."
        return text
    return f"Budget enforcement: {group} {last['step']}: {last['reason']}."
