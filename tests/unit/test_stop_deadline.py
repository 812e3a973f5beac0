"""The stop deadline: past it the worker's process exits, with a warning that says why nothing
is lost."""

from __future__ import annotations

import logging
import threading

import pytest

from costline.streams.worker.stop_deadline import arm


def test_past_the_deadline_the_process_exits_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    codes: list[int] = []
    exited = threading.Event()

    def exit_process(code: int) -> None:
        codes.append(code)
        exited.set()

    with caplog.at_level(logging.WARNING, logger="costline.worker"):
        timer = arm(0.05, exit_process)
        assert exited.wait(5)
    assert codes == [0]
    assert timer.daemon  # a stop that ends in time is never held up by it
    assert "not stopped after 0.05 s (COSTLINE_STOP_TIMEOUT_S)" in caplog.text
    assert "counted once" in caplog.text

