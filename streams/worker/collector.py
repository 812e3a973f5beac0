"""Python's cyclic garbage collector, tuned for a process that allocates by the million.

Pricing makes a few GC-tracked objects per event (the event, its tags), the aggregation keeps
a window of decoded ledger entries alive until Redis has it, and an evaluation builds as many
answers. With the default thresholds (a young collection every 700 net allocations, a full
one every 100 young ones) the collector walks those windows again and again, and every full
collection walks everything the process imported too. Reference counting frees these
objects; almost none of them are cyclic, so collecting far less often costs little memory and
saves the walks.
"""

from __future__ import annotations

import gc

# A young collection per 50,000 net allocations (a window's worth of events, not a handful),
# the older generations every 20 and 100 of those.
THRESHOLDS = (50_000, 20, 100)


def settle() -> None:
    """Call once the process has started: what exists by then (modules, the app) lives as
    long as the process, so no collection walks it again; later allocations are collected
    at ``THRESHOLDS``."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
