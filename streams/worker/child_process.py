"""The worker's child processes (the rules' evaluation, the pricing pool): how one begins.

Each is named as ``ps`` and ``top`` show it. Ctrl-C in a terminal reaches the whole process
group, and so does a SIGTERM sent to the group: the worker decides what to do with them. A
child ignores SIGINT; the evaluation process ends quietly on SIGTERM (the worker, stopping too,
starts no other), and a pricing process ignores it (the pool ends its processes itself, as its
shutdown says). Every child also ends when the worker does."""

from __future__ import annotations

import logging
import multiprocessing
import os
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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _quietly)
    name_this_process(name)
    logging.basicConfig(level=level,
                        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s")
    target(*args)


def _quietly(signum: int, frame: Any) -> None:
    os._exit(0)


def ignore_stop_signals() -> None:
    """For a process the worker ends itself: neither Ctrl-C nor a SIGTERM to the group."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def name_this_process(name: str) -> None:
    """Set the process's command name (Linux keeps 15 characters); elsewhere, nothing."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name[:15])
    except OSError as exc:
        log.debug("process name not set: %s", exc)
