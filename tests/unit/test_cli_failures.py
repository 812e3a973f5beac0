"""What ``costline`` prints when its surroundings are wrong: Redis down, slow or loading, an
unknown ``--tz``, a setting whose JSON does not parse. One line on stderr, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio.connection
import redis.connection
from redis.exceptions import BusyLoadingError, RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError
from typer.testing import CliRunner, Result

from costline.connectors import redis_client
from costline.connectors.redis_client import ClusterUrlError
from costline.streams.cli.root import _register, app
from costline.streams.settings import Settings, without_password

ROOT = Path(__file__).parents[2]
DEFINITIONS = ROOT / "rules" / "definitions"
ONE_RULE = Path(__file__).parent / "rulefiles" / "good" / "minimal.yaml"
# Nothing listens on port 1: the connection is refused at once.
CLOSED = "redis://:s3cret@127.0.0.1:1/0"
SHOWN = "redis://:***@127.0.0.1:1/0"

REDIS_COMMANDS = [
    ["spend"],
    ["spend", "--json"],
    ["spend", "--tz", "Europe/Paris"],
    ["alerts"],
    ["alerts", "--json"],
    ["actions"],
    ["reclaim", "status"],
    ["reclaim", "pause"],
    ["reclaim", "resume"],
    ["silence", "list"],
    ["silence", "add", "--rule", "x", "--for", "4h"],
    ["silence", "expire", "some-id"],
    ["report", "--html", "-"],
]


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def costline(runner: CliRunner, *args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), env=env)


def one_line(result: Result) -> str:
    """The single stderr line of a clean failure (a traceback would be many, or none)."""
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize("args", REDIS_COMMANDS, ids=" ".join)
def test_redis_down_is_one_line_naming_the_command_and_the_url(
        runner: CliRunner, args: list[str]) -> None:
    result = costline(runner, "--redis-url", CLOSED, *args)
    assert result.exit_code == 1
    command = " ".join(a for a in args[:2] if not a.startswith("-"))
    assert one_line(result).startswith(f"costline {command}: Redis at {SHOWN} did not answer: ")
    assert "s3cret" not in result.output


def _failing_connect(exc: RedisError) -> tuple[Callable[..., Any], Callable[..., Any]]:
    def sync_connect(self: Any, *args: Any, **kwargs: Any) -> None:
        raise exc

    async def async_connect(self: Any, *args: Any, **kwargs: Any) -> None:
        raise exc

    return sync_connect, async_connect


@pytest.mark.parametrize(("exc", "said"), [
    (RedisTimeoutError("Timeout reading from socket"), "did not answer in time"),
    (BusyLoadingError("Redis is loading the dataset in memory"), "is still loading its data"),
])
@pytest.mark.parametrize("args", [["alerts"], ["reclaim", "status"]], ids=" ".join)
def test_redis_slow_or_loading_is_one_line_too(
        runner: CliRunner, monkeypatch: pytest.MonkeyPatch, exc: RedisError, said: str,
        args: list[str]) -> None:
    sync_connect, async_connect = _failing_connect(exc)
    monkeypatch.setattr(redis.connection.AbstractConnection, "connect", sync_connect)
    monkeypatch.setattr(redis.asyncio.connection.AbstractConnection, "connect", async_connect)
    result = costline(runner, "--redis-url", "redis://127.0.0.1:6379/0", *args)
    assert result.exit_code == 1
    assert one_line(result) == (
        f"costline {' '.join(args)}: Redis at redis://127.0.0.1:6379/0 {said}: {exc}")


@pytest.mark.parametrize(("exc", "said"), [
    (RedisClusterException("Redis Cluster cannot be connected. Please provide at least one "
                           "reachable node: Error 111 connecting to 127.0.0.1:7001."),
     "is a Redis Cluster that did not answer"),
    (ClusterUrlError("a Redis Cluster has only database 0, the Redis URL names 2"),
     "is a Redis Cluster"),
])
@pytest.mark.parametrize("args", [["spend"], ["alerts"], ["reclaim", "status"]], ids=" ".join)
def test_a_cluster_none_of_whose_nodes_answers_is_one_line_too(
        runner: CliRunner, monkeypatch: pytest.MonkeyPatch, exc: Exception, said: str,
        args: list[str]) -> None:
    """redis-py's cluster client raises RedisClusterException, not a RedisError, when no node
    answers."""
    def refuse(*_: Any, **__: Any) -> None:
        raise exc

    monkeypatch.setattr(redis_client, "connect", refuse)
    monkeypatch.setattr(redis_client, "connect_async", refuse)
    result = costline(runner, "--redis-url", "redis://127.0.0.1:7000/0", *args)
    assert result.exit_code == 1
    assert one_line(result) == (
        f"costline {' '.join(args)}: Redis at redis://127.0.0.1:7000/0 {said}: {exc}")


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:pw@h:1/0", "redis://:***@h:1/0"),
    ("rediss://user:p%40w@h/2", "rediss://user:***@h/2"),
    ("unix://:pw@/run/redis.sock?db=1", "unix://:***@/run/redis.sock?db=1"),
    ("redis://h/0?password=pw&ssl_ca_certs=/a/ca.pem", "redis://h/0?password=***&ssl_ca_certs=/a/ca.pem"),
])
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert without_password(url) == shown


def test_an_unknown_tz_is_a_usage_error(runner: CliRunner) -> None:
    result = costline(runner, "--redis-url", CLOSED, "spend", "--tz", "Mars/Base")
    assert result.exit_code == 2
    assert "unknown IANA time zone 'Mars/Base'" in result.stderr
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize("variable", ["COSTLINE_SLACK_CHANNELS", "COSTLINE_SLACK_APPROVERS"])
def test_a_json_setting_that_does_not_parse_names_its_variable(
        runner: CliRunner, variable: str) -> None:
    result = costline(runner, "rules", "validate", str(DEFINITIONS), env={variable: "{bad"})
    assert result.exit_code == 2
    field = variable.removeprefix("COSTLINE_").lower()
    assert one_line(result) == (
        f"costline: setting {field}: Value error, {variable} is not JSON: Expecting property "
        "name enclosed in double quotes at line 1 column 2")


def test_json_settings_still_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COSTLINE_SLACK_CHANNELS", raising=False)
    assert Settings(slack_channels={"a": "#b"}).slack_channels == {"a": "#b"}
    monkeypatch.setenv("COSTLINE_SLACK_CHANNELS", '{"ml": "#ml-costs"}')
    monkeypatch.setenv("COSTLINE_SLACK_APPROVERS", '{"idle": ["U1", "U2"]}')
    settings = Settings()
    assert settings.slack_channels == {"ml": "#ml-costs"}
    assert settings.slack_approvers == {"idle": ["U1", "U2"]}


def test_validate_counts_one_rule_in_the_singular(runner: CliRunner) -> None:
    result = costline(runner, "rules", "validate", str(ONE_RULE))
    assert (result.exit_code, result.stdout) == (0, "ok: 1 rule in 1 file\n")


def test_a_worker_on_a_taken_port_says_so_in_one_line_naming_the_setting(tmp_path: Path) -> None:
    """Another process holds the port, as a first worker would: the second worker exits 2
    with one line naming COSTLINE_WEB_PORT, before it touches Redis or Kafka (neither answers
    here) and without a traceback."""
    holder = subprocess.Popen(
        [sys.executable, "-c", "import socket, sys, time\n"
         "s = socket.socket(); s.bind(('0.0.0.0', 0)); s.listen()\n"
         "print(s.getsockname()[1], flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = holder.stdout.readline().strip()
        env = {**os.environ, "COSTLINE_WEB_PORT": port, "COSTLINE_REDIS_URL": CLOSED,
               "COSTLINE_KAFKA_BOOTSTRAP": "127.0.0.1:1", "COSTLINE_STATE_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-m", "costline.streams", "worker"], env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        holder.kill()
        holder.wait()
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [
        f"costline worker: port {port} is in use (another worker?): set COSTLINE_WEB_PORT (or "
        "costline --web-port) to a free port for this worker's /healthz, /metrics and "
        "/slack/actions"]


def test_a_worker_logging_to_a_file_draws_no_spinner(tmp_path: Path) -> None:
    """Faust's start-up spinner writes terminal escapes ([?25l) into a log file; a terminal
    keeps it."""
    import faust

    from costline.streams.cli.worker_cmd import faust_worker

    app = faust.App("spinner-test", broker="kafka://127.0.0.1:1", store="memory://",
                    datadir=str(tmp_path), autodiscover=False)
    with (tmp_path / "worker.log").open("w") as log:
        assert faust_worker(app, "warning", log).spinner is None
    controller, terminal = os.openpty()
    with os.fdopen(terminal, "w") as tty:
        assert faust_worker(app, "warning", tty).spinner is not None
    os.close(controller)
