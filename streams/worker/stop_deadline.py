"""A stop that ends: a worker's stop (asked for, or after a crash) ends its process within
``COSTLINE_STOP_TIMEOUT_S``.

A graceful stop delivers the takes in flight, commits their input, writes the folded windows
and leaves both consumer groups, and each of those waits on Kafka or Redis. With the broker
not answering, aiokafka's requests and Faust's consumer thread wait out their own timeouts
one after the other: such a stop took 142 s, past an orchestrator's grace period
(Kubernetes' default is 30 s), and ended in tracebacks from a thread whose event loop had
closed. Exiting at the deadline instead loses nothing, as a crash loses nothing: input not
committed is read again by the next worker, and each of its events is counted once at its
home partition (the watermark and the dedup memory in Redis). The children end with the
worker (``costline.streams.worker.child_process``).

The deadline is a thread of its own, since the event loop may be what waits.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger("costline.worker")

# The exit status of a stop cut short: not a clean stop, though nothing is lost.
CUT_SHORT = 1
# Past the deadline, how long writing the warning may take (a handler stuck on a full pipe
# holds its lock) before the process exits without it.
WARNING_S = 1.0


def arm(seconds: float, exit_process: Callable[[int], object] = os._exit) -> threading.Timer:
    """Start the deadline: after ``seconds``, unless it is cancelled or the process ends
    first (the thread is a daemon, so it never holds the process up), a warning and
    ``exit_process(CUT_SHORT)``."""
    timer = threading.Timer(seconds, _expire, args=(seconds, exit_process))
    timer.name = "stop-deadline"
    timer.daemon = True
    timer.start()
    return timer


def _expire(seconds: float, exit_process: Callable[[int], object]) -> None:
    fallback = threading.Timer(WARNING_S, exit_process, args=(CUT_SHORT,))
    fallback.daemon = True
    fallback.start()
    log.warning("still stopping after %g s (COSTLINE_STOP_TIMEOUT_S; Kafka or Redis may not "
                "be answering): exiting now. Input not committed yet is read again by the "
                "next worker and counted once", seconds)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    exit_process(CUT_SHORT)
