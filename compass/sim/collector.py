"""The simulator's pact with Python's cyclic garbage collector.

A simulation allocates a few objects per event (events, instructions, records) and frees
nearly all of them by reference counting; what stays is the simulated cluster, built before
the first event: every worker's core, cache and cost tables. By default the collector scans
its youngest generation every 700 net allocations and the older ones every 10 and 100 of
those, rescanning the whole cluster each time it reaches the oldest: at 1,000 simulated
workers about a tenth of a run's time (measured: docs/RESULTS.md, "What each planner knows,
and when"). :func:`collector_eased` freezes what exists when the run starts (the collector
skips it until the run ends) and collects the young less often; cycles made during the run
are still collected.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["EASED_THRESHOLD", "collector_eased"]

#: net allocations between two collections of the youngest generation while eased (700 is
#: Python's default)
EASED_THRESHOLD = 50_000


@contextmanager
def collector_eased(threshold: int = EASED_THRESHOLD) -> Iterator[None]:
    """Run the block with the objects that exist at its start frozen and the youngest
    generation collected every ``threshold`` allocations; both restored at its end. Objects
    someone else froze are left as they are (nothing is frozen or thawed then)."""
    before = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0
    if freeze:
        gc.freeze()
    gc.set_threshold(max(threshold, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
        if freeze:
            gc.unfreeze()
