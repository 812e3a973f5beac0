"""The demo run: services up, the real worker, the scenario played, a summary read back.

Everything the demo shows comes from the running pipeline: the Slack messages are the ones the
worker's notifier sent, the summary is read from Redis the way ``costline spend`` reads it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console

from costline.connectors.kafka_security import PLAINTEXT
from costline.rules.durations import rfc3339
from costline.rules.prices import PriceBook, format_micro
from costline.streams.demo import enforcement
from costline.streams.demo.played import counted_micro, exactness, played_micro
from costline.streams.demo.scenario import DEV_BOXES, Scenario, training_cluster
from costline.streams.demo.summary import print_summary, reclamation, span_text
from costline.streams.demo.training import stand_ins
from costline.streams.demo.training_summary import expiry, training_summary
from costline.streams.settings import Settings

KAFKA_SECURITY_VARIABLES = ("COSTLINE_KAFKA_SECURITY_", "COSTLINE_KAFKA_SASL_",
                            "COSTLINE_KAFKA_SSL_")

console = Console(stderr=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Demo:
    def __init__(self, settings: Settings, *, days: int, use_running: bool, keep: bool,
                 quiet: bool) -> None:
        self.settings, self.days = settings, days
        self.use_running, self.keep, self.quiet = use_running, keep, quiet
        self.kafka_security = PLAINTEXT  # the embedded stack's; the running one's is set later
        self.namespace = f"demo-{secrets.token_hex(3)}"
        self.state_dir = settings.state_dir / "demo"
        self.checkpoint_root = self.state_dir / "checkpoints" / self.namespace

    def say(self, text: str) -> None:
        if not self.quiet:
            console.print(text)

    def run(self) -> dict[str, Any]:
        began = time.time()
        with self._slurm_jobs() as jobs, enforcement.team_jobs(self.say) as team, \
                self._services(bool(jobs), bool(team)) as env, \
                self._slack(env) as slack, self._worker(env) as worker:
            scenario = training_cluster(time.time(), days=self.days, slurm_jobs=jobs,
                                        checkpoint_root=self.checkpoint_root)
            stand_ins([e for m in scenario.usage if isinstance(m, list) for e in m])
            self.say(f"[bold]The story[/]: {self.days} days of a training cluster, "
                     f"{span_text(scenario.start, scenario.now, self.settings.timezone)}:")
            for line in scenario.story:
                self.say(f"  • {line}")
            self._play(env, scenario)
            self._wait_for_worker(env, worker)
            self._settle(env)
            releases = self._wait_for_releases(env)
            held = enforcement.job_states(team)
            lifted = enforcement.job_states(team) if team and not enforcement.lift(
                env).startswith("not lifted") else []
            summary = self._summary(env, slack, scenario)
            # enforcement's records name their automation; the checkpoint lifecycle's carry
            # what they save a day
            reclaimed = [r for r in releases
                         if "automation" not in r and "saves_per_day" not in r]
            summary["reclamation"] = reclamation(reclaimed, PriceBook.load(self.settings.prices),
                                                 self.settings.timezone, live=bool(jobs))
            summary["enforcement"] = enforcement.enforcement_text(releases, held, lifted)
            summary["expiry_dry_run"] = expiry(releases)
        if not self.keep:
            shutil.rmtree(self.checkpoint_root, ignore_errors=True)
        summary["seconds"] = round(time.time() - began, 1)
        if not self.quiet:
            self._print(summary)
        return summary

    # -- services -----------------------------------------------------------------------

    @contextmanager
    def _slurm_jobs(self) -> Iterator[dict[str, str]]:
        """When a Slurm cluster answers here, each dev box is a real job the demo may cancel."""
        jobs: dict[str, str] = {}
        if shutil.which("sbatch") and _quiet_ok(["sinfo", "-h"]):
            for box, owner, _ in DEV_BOXES:
                done = subprocess.run(
                    ["sbatch", "--parsable", f"--job-name=notebook-{owner}", "--output=/dev/null",
                     "--wrap", "sleep 3600"], capture_output=True, text=True, timeout=30)
                if done.returncode == 0:
                    jobs[box] = done.stdout.strip().split(";")[0]
            self.say(f"Slurm answers here: the dev boxes run as jobs {', '.join(jobs.values())}.")
        else:
            self.say("No Slurm here: idle boxes are reclaimed as a dry run.")
        try:
            yield jobs
        finally:
            if jobs:
                subprocess.run(["scancel", *jobs.values()], capture_output=True, timeout=30)

    def _rules(self, live: bool, enforcing: bool = False) -> Path:
        """The shipped rules as the demo runs them (``compress``), written to its state folder;
        what was changed is said before the story is played."""
        from ruamel.yaml import YAML

        from costline.rules.loader import rule_files

        target = self.state_dir / "demo-rules"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        yaml = YAML(typ="rt")
        changes = []
        for source in rule_files([self.settings.rules]):
            document = yaml.load(source.read_text())
            changes += compress(document.get("rules") or [], live, enforcing,
                                self.checkpoint_root)
            with (target / source.name).open("w") as out:
                yaml.dump(document, out)
        if changes:
            self.say("The demo plays days in about a minute, so what waits on the clock is "
                     f"shortened: {'; '.join(changes)}.")
        return target

    @contextmanager
    def _services(self, live: bool, enforcing: bool) -> Iterator[dict[str, str]]:
        env = dict(os.environ)
        env.update(COSTLINE_NAMESPACE=self.namespace, COSTLINE_WEB_PORT=str(_free_port()),
                   COSTLINE_PARTITIONS="4", COSTLINE_RULES_TICK_S="5",
                   COSTLINE_RECLAIM_TICK_S="2",
                   COSTLINE_RULES=str(self._rules(live, enforcing)),
                   COSTLINE_PRICES=str(self.settings.prices))
        if self.use_running:
            env.update(COSTLINE_KAFKA_BOOTSTRAP=self.settings.kafka_bootstrap,
                       COSTLINE_REDIS_URL=self.settings.redis_url)
            self.kafka_security = self.settings.kafka_security()
            yield env
            return
        # The embedded broker speaks PLAINTEXT only: the worker must not try TLS or SASL on it.
        for name in [name for name in env if name.startswith(KAFKA_SECURITY_VARIABLES)]:
            del env[name]
        from costline.streams import stack

        self.say("[bold]Starting the embedded stack[/] (Tansu broker, Valkey)…")
        info = stack.up(self.state_dir, kafka="embedded", redis="embedded", kafka_port=0,
                        redis_port=0)
        env.update(info.exports)
        try:
            yield env
        finally:
            if not self.keep:
                stack.down(self.state_dir)

    @contextmanager
    def _slack(self, env: dict[str, str]) -> Iterator[Any]:
        if self.settings.slack_bot_token is not None:
            self.say("Alerts go to Slack (SLACK_BOT_TOKEN is set).")
            yield None
            return
        from costline.connectors.slack_server import DEFAULT_TOKEN, LocalSlackThread

        slack = LocalSlackThread(self._channels(), echo=not self.quiet)
        env.update(SLACK_API_URL=slack.start(), SLACK_BOT_TOKEN=DEFAULT_TOKEN)
        self.say("Slack messages below come from a local Slack-compatible server.")
        try:
            yield slack
        finally:
            slack.stop()

    def _channels(self) -> list[str]:
        from costline.connectors.plugins import PLUGINS
        from costline.rules.loader import load_rules

        names = {self.settings.slack_fallback_channel.lstrip("#")}
        for rule in load_rules([self.settings.rules], self.settings.timezone, plugins=PLUGINS):
            notify = getattr(rule, "notify", None)
            if notify is None:
                continue
            for channel in [getattr(notify, "slack", None),
                            *(getattr(notify, "channels", None) or {}).values()]:
                if channel:
                    names.add(str(channel).lstrip("#"))
        return sorted(names)

    @contextmanager
    def _worker(self, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
        from costline.streams.topics import create_topics

        env.update(COSTLINE_KAFKA_SESSION_TIMEOUT_S=env.get("COSTLINE_KAFKA_SESSION_TIMEOUT_S",
                                                            "6"),
                   COSTLINE_KAFKA_REBALANCE_TIMEOUT_S=env.get(
                       "COSTLINE_KAFKA_REBALANCE_TIMEOUT_S", "3"))
        create_topics(Settings(kafka_bootstrap=env["COSTLINE_KAFKA_BOOTSTRAP"],
                               namespace=self.namespace, partitions=4),
                      security=self.kafka_security)
        log = (self.state_dir / "demo-worker.log")
        log.parent.mkdir(parents=True, exist_ok=True)
        self.say(f"Starting the worker (log: {log})…")
        proc = subprocess.Popen([sys.executable, "-m", "costline.streams", "worker", "--loglevel",
                                 "warning"], env=env, stdout=log.open("wb"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            yield proc
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)

    # -- the story ----------------------------------------------------------------------

    def _play(self, env: dict[str, str], scenario: Scenario) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        from costline.connectors.kafka import producer

        out = producer(env["COSTLINE_KAFKA_BOOTSTRAP"], client_id="costline-demo",
                       security=self.kafka_security)
        usage, faults = f"{self.namespace}.usage.v1", f"{self.namespace}.faults.v1"
        messages = [(usage, m) for m in scenario.usage] + [(faults, f) for f in scenario.faults]
        events = 0
        bar = Progress(TextColumn("Playing the story into Kafka"), BarColumn(),
                       MofNCompleteColumn(), TextColumn("messages"), console=console,
                       transient=True, disable=self.quiet)
        with bar:
            for topic, message in bar.track(messages):
                first = message[0] if isinstance(message, list) else message
                out.send(topic, json.dumps(message).encode(), key=first["event_id"].encode())
                events += len(message) if isinstance(message, list) else 1
            out.flush(60)
        out.close()
        self.say(f"Played {events - len(scenario.faults):,} usage events and "
                 f"{len(scenario.faults)} faults.")

    def _wait_for_worker(self, env: dict[str, str], worker: subprocess.Popen[bytes],
                         timeout: float = 180) -> None:
        from unittest import mock

        from costline.connectors.redis_client import connect
        from costline.streams.progress import behind
        from costline.streams.settings import Settings

        with mock.patch.dict(os.environ, env):
            settings = Settings()
        redis = connect(env["COSTLINE_REDIS_URL"])
        deadline = time.time() + timeout
        with console.status("The worker is counting…") if not self.quiet else _null():
            while time.time() < deadline:
                if worker.poll() is not None:
                    raise RuntimeError("the worker stopped; see its log")
                if behind(settings, redis).counted:
                    return
                time.sleep(0.5)
        raise RuntimeError("the worker did not catch up in time")

    def _settle(self, env: dict[str, str], quiet_for: float = 8.0, most: float = 45.0) -> None:
        """Wait until the rules have had their say: nothing pending, and no new alert change
        for ``quiet_for``."""
        from costline.connectors.alert_store import AlertStore
        from costline.connectors.redis_client import connect

        redis = connect(env["COSTLINE_REDIS_URL"])
        store = AlertStore(redis, self.namespace)
        key = f"{self.namespace}:alerts:book"
        last, changed, began = None, time.time(), time.time()
        with console.status("The rules are evaluating what was counted…") if not self.quiet \
                else _null():
            while time.time() - began < most:
                book = redis.get(key)
                if book != last:
                    last, changed = book, time.time()
                elif book is not None and time.time() - changed > quiet_for and not any(
                        alert.state == "pending" for alert in store.book().active()):
                    return
                time.sleep(0.5)

    def _wait_for_releases(self, env: dict[str, str], most: float = 90.0
                           ) -> list[dict[str, Any]]:
        """The audit log of reclamation and the checkpoint lifecycle, once every plan of both
        has closed (or ``most`` has passed)."""
        from costline.connectors.kafka import consumer as kafka_consumer

        topic = f"{self.namespace}.actions.v1"
        consumer = kafka_consumer(env["COSTLINE_KAFKA_BOOTSTRAP"], topic,
                                  security=self.kafka_security, auto_offset_reset="earliest",
                                  enable_auto_commit=False, consumer_timeout_ms=2000)
        records: dict[str, dict[str, Any]] = {}
        began = time.time()
        with console.status("Waiting for the grace periods to end…") if not self.quiet \
                else _null():
            try:
                while time.time() - began < most:
                    for message in consumer:
                        record = json.loads(message.value)
                        records[record["action_id"]] = record
                    plans = {r["plan_id"] for r in records.values()}
                    closed = {r["plan_id"] for r in records.values()
                              if r["step"] in ("executed", "skipped", "failed")}
                    # the checkpoint lifecycle plans on its own clock: wait for it too
                    lifecycle = any("saves_per_day" in r for r in records.values())
                    if plans and plans == closed and lifecycle:
                        break
            finally:
                consumer.close()
        for record in sorted(records.values(), key=lambda r: r["at"]):
            if record["step"] in ("executed", "skipped", "failed") and \
                    "saves_per_day" not in record:  # the checkpoint lifecycle's: summed up
                what = record.get("automation") or "reclaim"
                self.say(f"  {what} {record['resource_id']}: {record['step']} — "
                         f"{record['reason']}")
        return list(records.values())

    # -- summary ------------------------------------------------------------------------

    def _summary(self, env: dict[str, str], slack: Any, scenario: Scenario) -> dict[str, Any]:
        """What the pipeline counted over the days played, read back the way ``costline
        spend`` reads it, and the alerts the rules raised (each over its own period)."""
        from costline.connectors.alert_store import AlertStore
        from costline.connectors.redis_client import connect
        from costline.connectors.redis_state import RedisState
        from costline.streams.cli.alerts_cmd import alert_rows

        redis = connect(env["COSTLINE_REDIS_URL"])
        state = RedisState(redis, self.namespace, self.settings.timezone)
        # Every event played lies in [start, now]; the end reaches through now's bucket.
        start, end = scenario.start, scenario.now + 300

        book = PriceBook.load(self.settings.prices)

        def table(measure: str, by: list[str]) -> dict[str, str]:
            totals = state.totals(measure, {}, by, start, end)  # type: ignore[arg-type]
            ordered = sorted(totals.items(), key=lambda kv: -kv[1])
            return {"/".join(k) or "—": format_micro(v) for k, v in ordered}

        return {
            "namespace": self.namespace,
            "currency": book.currency,
            "period": {"start": rfc3339(scenario.start), "end": rfc3339(scenario.now),
                       "zone": self.settings.timezone},
            "spend_by_team": table("cost", ["team"]),
            "spend_by_category": table("cost", ["category"]),
            "fixed_vs_elastic": table("cost", ["billing"]),
            "waste_by_fault": table("waste", ["fault"]),
            "exactness": exactness(played_micro(scenario, book),
                                   counted_micro(state, start, end)),
            **training_summary(state, self.settings, scenario.start, end),
            "alerts": alert_rows(AlertStore(redis, self.namespace).book()),
            "slack_messages": slack.posted() if slack else None,
        }

    def _print(self, summary: dict[str, Any]) -> None:
        print_summary(Console(), summary, self.days)


def compress(rules: list[Any], live: bool, enforcing: bool = False,
             checkpoints: Path | None = None) -> list[str]:
    """Rewrite the shipped rules (YAML mappings, in place) for a demo that plays days in a
    minute, and say what changed:

    * idle reclamation waits a 30 s grace (live only when the boxes are real Slurm jobs, else
      a dry run with the dry_run connector, which names no job);
    * budget enforcement waits a 10 s grace, live only when Slurm with accounting answers
      (``enforcing``: costline.streams.demo.enforcement), else a dry run;
    * a rule's ``for`` — how long its condition must hold on the clock before the alert fires
      — is 0s, as the data played already holds it for longer (the log burst lasts 40 minutes,
      the checkpoints grow for hours). An idle rule's ``for`` is counted in its samples, not
      on the clock, and is kept;
    * the checkpoint lifecycle waits a 30 s grace and acts on the demo's stand-in files under
      ``checkpoints`` (still a dry run: it says what it would move and delete).
    """
    changes = []
    for rule in rules:
        name = rule.get("name")
        if rule.get("kind") == "checkpoint_lifecycle" and rule.get("act"):
            changes.append(f"{name} grace {rule['act'].get('grace', '1h')} → 30s")
            rule["act"]["grace"] = "30s"
            if checkpoints is not None and rule["act"].get("connector") == "filesystem":
                rule["act"]["root"] = str(checkpoints)
                rule["act"]["cold_root"] = str(checkpoints.parent / "archive")
        elif rule.get("kind") == "idle":
            if rule.get("reclaim"):
                changes.append(f"{name} grace {rule['reclaim'].get('grace', '15m')} → 30s")
                rule["reclaim"]["grace"] = "30s"
                rule["mode"] = "live" if live else "dry_run"
                if not live:
                    rule["reclaim"] = _dry_run_reclaim(rule["reclaim"])
        elif rule.get("enforce"):
            changes += enforcement.compress_enforcement(rule, enforcing)
        elif rule.get("for") not in (None, "0s"):
            changes.append(f"{name} for {rule['for']} → 0s")
            rule["for"] = "0s"
    return changes


@contextmanager
def _null() -> Iterator[None]:
    yield


def _dry_run_reclaim(reclaim: dict[str, Any]) -> dict[str, Any]:
    """A rule's reclaim block for the ``dry_run`` connector: its common keys, none of the
    keys only its own connector takes (``action`` is Slurm's)."""
    from costline.connectors.reclaim.dry_run import DryRunParams

    kept = {k: v for k, v in reclaim.items() if k in DryRunParams.model_fields}
    return {"connector": "dry_run", "grace": reclaim.get("grace", "30s"), **kept}


def _quiet_ok(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False
