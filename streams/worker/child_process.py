"""The worker's child processes (the rules' evaluation, the folding): how one is started, and
what each does first. Each is named as ``ps``, ``top`` and the benchmarks show it."""

from __future__ import annotations

import logging
import multiprocessing
import signal
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from typing import Any

log = logging.getLogger("costline.process")


def start(name: str, target: Callable[..., None], *args: Any) -> BaseProcess:
    """A daemon child running ``target(*args)`` at the worker's log level. Spawned, not
    forked: the worker runs an event loop and threads a fork would copy mid-flight."""
    level = logging.getLogger("costline").getEffectiveLevel()
    process = multiprocessing.get_context("spawn").Process(
        target=_begin, name=name, daemon=True, args=(name, level, target, args))
    process.start()
    return process


def _begin(name: str, level: int, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    # Ctrl-C in a terminal reaches the whole process group: the worker decides when to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _name_this_process(name)
    logging.basicConfig(level=level,
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    target(*args)


def _name_this_process(name: str) -> None:
    """Set the process's command name (Linux keeps 15 characters); elsewhere, nothing."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name[:15])
    except OSError as exc:
        log.debug("process name not set: %s", exc)
