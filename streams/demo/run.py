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
from rich.table import Table

from costline.connectors.kafka_security import PLAINTEXT
from costline.streams.demo.scenario import DEV_BOXES, Scenario, training_cluster
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

    def say(self, text: str) -> None:
        if not self.quiet:
            console.print(text)

    def run(self) -> dict[str, Any]:
        began = time.time()
        with self._slurm_jobs() as jobs, self._services(bool(jobs)) as env, \
                self._slack(env) as slack, self._worker(env) as worker:
            scenario = training_cluster(time.time(), days=self.days, slurm_jobs=jobs)
            for line in scenario.story:
                self.say(f"  • {line}")
            self._play(env, scenario)
            self._wait_for_worker(env, worker)
            self._settle(env)
            releases = self._wait_for_releases(env)
            summary = self._summary(env, slack)
            summary["reclamation"] = _reclamation(releases, live=bool(jobs))
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

    def _rules(self, live: bool) -> Path:
        """The shipped rules, with idle reclamation's grace cut to 30 s so the demo can show
        it (live only when the boxes are real Slurm jobs, else a dry run that names no job)."""
        from ruamel.yaml import YAML

        from costline.rules.loader import rule_files

        target = self.state_dir / "demo-rules"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        yaml = YAML(typ="rt")
        for source in rule_files([self.settings.rules]):
            document = yaml.load(source.read_text())
            for rule in document.get("rules") or []:
                if rule.get("kind") == "idle" and rule.get("reclaim"):
                    rule["reclaim"]["grace"] = "30s"
                    rule["mode"] = "live" if live else "dry_run"
                    if not live:  # no Slurm job holds the boxes: nothing for slurm to name
                        rule["reclaim"] = _dry_run_reclaim(rule["reclaim"])
            with (target / source.name).open("w") as out:
                yaml.dump(document, out)
        return target

    @contextmanager
    def _services(self, live: bool) -> Iterator[dict[str, str]]:
        env = dict(os.environ)
        env.update(COSTLINE_NAMESPACE=self.namespace, COSTLINE_WEB_PORT=str(_free_port()),
                   COSTLINE_PARTITIONS="4", COSTLINE_RULES_TICK_S="5",
                   COSTLINE_RULES=str(self._rules(live)),
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
        from costline.connectors.kafka import producer

        out = producer(env["COSTLINE_KAFKA_BOOTSTRAP"], client_id="costline-demo",
                       security=self.kafka_security)
        usage, faults = f"{self.namespace}.usage.v1", f"{self.namespace}.faults.v1"
        events = 0
        for message in scenario.usage:
            first = message[0] if isinstance(message, list) else message
            out.send(usage, json.dumps(message).encode(), key=first["event_id"].encode())
            events += len(message) if isinstance(message, list) else 1
        for fault in scenario.faults:
            out.send(faults, json.dumps(fault).encode(), key=fault["event_id"].encode())
        out.flush(60)
        out.close()
        self.say(f"Played {events:,} usage events and {len(scenario.faults)} faults.")

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
        """Wait until the rules have had their say: no new alert change for ``quiet_for``."""
        from costline.connectors.redis_client import connect

        redis = connect(env["COSTLINE_REDIS_URL"])
        key = f"{self.namespace}:alerts:book"
        last, changed, began = None, time.time(), time.time()
        while time.time() - began < most:
            book = redis.get(key)
            if book != last:
                last, changed = book, time.time()
            elif book is not None and time.time() - changed > quiet_for:
                return
            time.sleep(0.5)

    def _wait_for_releases(self, env: dict[str, str], most: float = 90.0
                           ) -> list[dict[str, Any]]:
        """The reclamation audit log, once every plan has closed (or ``most`` has passed)."""
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
                    if plans and plans == closed:
                        break
            finally:
                consumer.close()
        for record in sorted(records.values(), key=lambda r: r["at"]):
            if record["step"] in ("executed", "skipped", "failed"):
                self.say(f"  reclaim {record['resource_id']}: {record['step']} — "
                         f"{record['reason']}")
        return list(records.values())

    # -- summary ------------------------------------------------------------------------

    def _summary(self, env: dict[str, str], slack: Any) -> dict[str, Any]:
        from costline.connectors.alert_store import AlertStore
        from costline.connectors.redis_client import connect
        from costline.connectors.redis_state import RedisState
        from costline.rules.prices import format_micro
        from costline.streams.cli.alerts_cmd import alert_rows

        redis = connect(env["COSTLINE_REDIS_URL"])
        state = RedisState(redis, self.namespace, self.settings.timezone)
        start, end = time.time() - (self.days + 1) * 86400, time.time() + 3600

        def table(measure: str, by: list[str]) -> dict[str, str]:
            totals = state.totals(measure, {}, by, start, end)  # type: ignore[arg-type]
            ordered = sorted(totals.items(), key=lambda kv: -kv[1])
            return {"/".join(k) or "—": format_micro(v) for k, v in ordered}

        return {
            "namespace": self.namespace,
            "spend_by_team": table("cost", ["team"]),
            "spend_by_category": table("cost", ["category"]),
            "fixed_vs_elastic": table("cost", ["billing"]),
            "waste_by_fault": table("waste", ["fault"]),
            "alerts": alert_rows(AlertStore(redis, self.namespace).book()),
            "slack_messages": slack.posted() if slack else None,
        }

    def _print(self, summary: dict[str, Any]) -> None:
        out = Console()
        for title, key in [("Spend by team", "spend_by_team"),
                           ("Spend by category", "spend_by_category"),
                           ("Fixed vs elastic", "fixed_vs_elastic"),
                           ("Waste by fault type", "waste_by_fault")]:
            grid = Table(title=title)
            grid.add_column("group")
            grid.add_column("USD", justify="right")
            for group, amount in summary[key].items():
                grid.add_row(group, amount)
            out.print(grid)
        alerts = Table(title="Alerts")
        for column in ("state", "rule", "group", "value", "line"):
            alerts.add_column(column)
        for row in summary["alerts"]:
            group = ", ".join(f"{k}={v}" for k, v in row["group"].items())
            alerts.add_row(row["state"], row["rule"], group, row["value"] or "",
                           row["threshold"] or "")
        out.print(alerts)
        reclaim = summary.get("reclamation", {})
        if reclaim:
            verb = "released" if reclaim["live"] else "would release (dry run)"
            out.print(f"Idle resources {verb}: {', '.join(reclaim['resources']) or 'none'} · "
                      f"saved {reclaim['saved']} USD"
                      + ("" if reclaim["live"] else f" (would save {reclaim['would_save']})"))
        sent = summary["slack_messages"]
        out.print(f"Slack messages posted: {sent if sent is not None else 'see Slack'} · "
                  f"done in {summary['seconds']} s · namespace {summary['namespace']}")


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


def _reclamation(records: list[dict[str, Any]], live: bool) -> dict[str, Any]:
    """What reclamation did: resources released and the money that saved (or would have)."""
    from decimal import Decimal

    executed = [r for r in records if r["step"] == "executed"]
    dry = [r for r in records if r["step"] == "skipped" and "would_save" in r]
    return {
        "live": live,
        "resources": sorted(r["resource_id"] for r in (executed if live else dry)),
        "saved": str(sum((Decimal(r["saved"]) for r in executed), Decimal("0.000000"))),
        "would_save": str(sum((Decimal(r["would_save"]) for r in dry), Decimal("0.000000"))),
        "steps": len(records),
    }
