"""``costline rules backtest`` on recordings a new user has: lines the worker would refuse,
a far-future time, a long replay watched on a terminal."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from costline.rules.backtest import read_events, replay_span
from costline.rules.prices import PriceBook
from costline.streams.cli.root import _register, app

ROOT = Path(__file__).parents[2]
DEFINITIONS = ROOT / "rules" / "definitions"
PRICES = ROOT / "rules" / "prices" / "example.yaml"
NOW = 1796169600.0  # 2026-12-02T00:00:00Z


def usage(event_id: str, ts: str, resource_type: str = "gpu.h100") -> dict[str, Any]:
    return {"event_id": event_id, "kind": "usage", "ts": ts, "resource_id": "n1",
            "resource_type": resource_type, "quantity": 8.0, "unit": "gpu_hour",
            "tags": {"team": "pretrain", "env": "prod"}}


def recording(tmp_path: Path, lines: list[Any]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return path


def nine_days(tmp_path: Path) -> Path:
    """Eight days of usage, one event in 2099, one of a type the price book does not know."""
    lines: list[Any] = [usage(f"u-{day}", f"2026-11-{10 + day:02d}T08:00:00Z")
                        for day in range(8)]
    lines.insert(3, usage("u-far", "2099-01-01T00:00:00Z"))
    lines.append(usage("u-unpriced", "2026-11-12T00:00:00Z", "gpu.h999"))
    lines.append('{"not": "an event"}')
    return recording(tmp_path, lines)


def test_lines_the_worker_would_refuse_are_named_by_file_and_line_and_left_out(tmp_path):
    path = nine_days(tmp_path)
    found = read_events(path, PriceBook.load(PRICES), now=NOW)
    assert [event.event_id for event in found.events] == [f"u-{day}" for day in range(8)]
    assert found.rejected == [
        f"{path}:4: field ts: more than 10 minutes in the future",
        f"{path}:10: field resource_type: 'gpu.h999' is not in the price book",
        f"{path}:11: field kind: Field required (one of usage, utilization, fault, progress, "
        "checkpoint, restore, run_end)",
    ]


def test_an_unpriced_event_in_a_batch_line_is_named_by_its_index(tmp_path):
    path = recording(tmp_path, [[usage("a", "2026-11-10T08:00:00Z"),
                                 usage("b", "2026-11-10T08:00:00Z", "gpu.h999")]])
    found = read_events(path, PriceBook.load(PRICES), now=NOW)
    assert found.events == []
    assert found.rejected == [
        f"{path}:1: event 1: field resource_type: 'gpu.h999' is not in the price book"]


def test_the_replay_spans_the_valid_events_only(tmp_path):
    found = read_events(nine_days(tmp_path), PriceBook.load(PRICES), now=NOW)
    start, end = replay_span(found.events) or (0.0, 0.0)
    assert end - start <= 8 * 86400


def costline(*args: str) -> Any:
    _register()
    return CliRunner().invoke(app, ["--prices", str(PRICES), *args])


def test_a_backtest_with_a_far_future_event_finishes_and_says_what_it_skipped(tmp_path):
    path = nine_days(tmp_path)
    began = time.monotonic()
    result = costline("rules", "backtest", "--rules", str(DEFINITIONS), "--events", str(path))
    assert result.exit_code == 0, result.output
    assert time.monotonic() - began < 20
    assert result.stdout.splitlines()[-1] == "8 events, 0 alert changes, 0 alerts fired"
    assert result.stderr.splitlines() == [
        f"{path}:4: field ts: more than 10 minutes in the future",
        f"{path}:10: field resource_type: 'gpu.h999' is not in the price book",
        f"{path}:11: field kind: Field required (one of usage, utilization, fault, progress, "
        "checkpoint, restore, run_end)",
        "costline rules backtest: 3 lines left out: the worker would refuse them"]


def test_until_decades_after_the_recording_is_refused(tmp_path):
    path = nine_days(tmp_path)
    result = costline("rules", "backtest", "--rules", str(DEFINITIONS), "--events", str(path),
                      "--until", "2099-01-01T00:00:00Z")
    assert result.exit_code == 2
    said = " ".join(result.stderr.replace("│", " ").split())
    assert "2099-01-01T00:00:00Z is more than 31 days after the last event" in said


def test_a_long_backtest_shows_a_progress_bar_on_a_terminal_and_json_stays_clean(tmp_path):
    """stderr is a terminal (a pty), stdout a pipe: the bar goes to the one, JSON to the other."""
    path = recording(tmp_path, [usage("first", "2026-11-01T00:00:00Z"),
                                usage("last", "2026-11-20T00:00:00Z")])
    controller, terminal = pty.openpty()
    env = {**os.environ, "COLUMNS": "100", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "costline.streams", "--prices", str(PRICES), "rules", "backtest",
         "--rules", str(DEFINITIONS), "--events", str(path), "--json"],
        stdout=subprocess.PIPE, stderr=terminal, env=env)
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the pty closes when the command ends
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=120)
    os.close(controller)
    assert proc.returncode == 0, shown.decode(errors="replace")
    assert json.loads(out) == []
    bar = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", shown.decode())
    # 19 days of 5-minute steps, and the one after the last event
    assert "backtest" in bar and "5473/5473 5-minute steps" in bar
