"""How a worker core is set up (:class:`CoreOptions`), the same for the asyncio worker and the
simulator: both build their cores with :func:`compass.core.assemble.build_core`.
"""

from __future__ import annotations

from dataclasses import dataclass

from compass.core.answers import KEEP_ANSWER_BYTES, KEEP_ANSWER_S
from compass.stimuli import KEEP_STIMULI

__all__ = ["FORGET_AFTER", "CoreOptions"]

#: how many finished job ids a worker remembers, to drop late messages of those jobs
FORGET_AFTER = 4096


@dataclass(frozen=True, slots=True)
class CoreOptions:
    """How a worker core is set up, the same for the asyncio worker and the simulator (both
    build it with :func:`build_core`).

    ``lanes`` GPU lanes and ``host_lanes`` host lanes (model-less tasks run there, off the GPU
    queue, and are not counted in a peer's wait); ``prefetch_depth`` how far the queue's
    look-ahead loads models (0: no speculative loads); ``prefetch_evicts=False`` prefetches
    into free slabs only (the paper's rule); ``warm``: idle caches warm with the models the
    cluster holds least, when the policy warms caches; ``max_stuck`` tasks past their timeout
    make the worker degraded; ``max_jobs`` and ``max_job_bytes`` bound what an ingress
    holds; ``keep_answer_bytes`` and ``keep_answer_s`` (on the core's clock) the answers it
    keeps for resubmitted job keys; ``learn``: measured timings, output sizes, transfers and
    loads update the profiles (real mode; an emulated worker and the simulator keep the
    spec's); ``instance``: this worker process's id, in every job id; ``keep_stimuli``: the
    events its stimulus log keeps (0: none, as in the simulator).
    """

    lanes: int = 1
    host_lanes: int = 0
    prefetch_depth: int = 3
    prefetch_evicts: bool = True
    warm: bool = True
    max_stuck: int = 4
    max_jobs: int = 10_000
    max_job_bytes: int = 1 << 62
    forget_after: int = FORGET_AFTER
    keep_answer_bytes: int = KEEP_ANSWER_BYTES
    keep_answer_s: float = KEEP_ANSWER_S
    learn: bool = False
    instance: str = ""
    keep_stimuli: int = KEEP_STIMULI
