"""Names for the worker's child processes, as ``ps``, ``top`` and the benchmarks show them."""

from __future__ import annotations

import logging

log = logging.getLogger("costline.process")


def name_this_process(name: str) -> None:
    """Set the process's command name (Linux keeps 15 characters); elsewhere, nothing."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name[:15])
    except OSError as exc:
        log.debug("process name not set: %s", exc)
