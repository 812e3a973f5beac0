"""The stop deadline: past it the worker's process exits, with a warning that says why nothing
is lost, even when the warning cannot be written."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import pytest

from costline.streams.worker import stop_deadline


def exits() -> tuple[list[int], threading.Event, Callable[[int], object]]:
    codes: list[int] = []
    exited = threading.Event()

    def exit_process(code: int) -> None:
        codes.append(code)
        exited.set()
    return codes, exited, exit_process


def test_past_the_deadline_the_process_exits_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    codes, exited, exit_process = exits()
    with caplog.at_level(logging.WARNING, logger="costline.worker"):
        timer = stop_deadline.arm(0.05, exit_process)
        assert exited.wait(5)
    assert codes[0] == stop_deadline.CUT_SHORT == 1  # not a clean stop
    assert timer.daemon  # a stop that ends in time is never held up by it
    assert "still stopping after 0.05 s (COSTLINE_STOP_TIMEOUT_S" in caplog.text
    assert "counted once" in caplog.text


def test_a_log_handler_that_never_returns_does_not_keep_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    codes, exited, exit_process = exits()
    stuck = threading.Event()
    monkeypatch.setattr(stop_deadline, "WARNING_S", 0.05)
    monkeypatch.setattr(stop_deadline.log, "warning", lambda *args: stuck.wait(10))
    stop_deadline.arm(0.01, exit_process)
    assert exited.wait(5)
    assert codes[0] == stop_deadline.CUT_SHORT
    stuck.set()
