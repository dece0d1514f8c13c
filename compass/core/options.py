"""How a worker core is set up (:class:`CoreOptions`), the same for the asyncio worker and the
simulator: both build their options with :func:`core_options` from a
:class:`~compass.config.WorkerConfig`, and their cores with
:func:`compass.core.assemble.build_core`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from compass.config import WorkerConfig
from compass.core.answers import KEEP_ANSWER_S
from compass.stimuli import KEEP_STIMULI

__all__ = ["FORGET_AFTER", "CoreOptions", "core_options"]

#: how many finished job ids a worker remembers, to drop late messages of those jobs
FORGET_AFTER = 4096

#: the defaults of a worker: the options both configure read theirs from it (one source)
_WORKER = WorkerConfig()


@dataclass(frozen=True, slots=True)
class CoreOptions:
    """How a worker core is set up, the same for the asyncio worker and the simulator (both
    build it with :func:`core_options`); its defaults are :class:`~compass.config.WorkerConfig`'s.

    ``lanes`` GPU lanes and ``host_lanes`` host lanes (model-less tasks run there, off the GPU
    queue, and are not counted in a peer's wait); ``prefetch_depth`` how far the queue's
    look-ahead loads models (0: no speculative loads); ``prefetch_evicts=False`` prefetches
    into free slabs only (the paper's rule); ``warm``: idle caches warm with the models the
    cluster holds least, when the policy warms caches; ``max_stuck`` tasks past their timeout
    make the worker degraded; ``preempt``: scheduling at step boundaries
    (:mod:`compass.core.preempt`); ``admission``: ``"learned"`` admits only as many jobs of a
    kind as are not mostly dropped on the way (:class:`~compass.core.admission.AdmittedShare`);
    ``max_jobs``, ``max_job_bytes`` (one job's inputs) and
    ``max_held_bytes`` (all its jobs' inputs) bound what an ingress holds;
    ``keep_answer_bytes`` and ``keep_answer_s`` (on the core's clock) the answers it keeps for
    resubmitted job keys; ``learn``: measured timings, output sizes, transfers and
    loads update the profiles (real mode; an emulated worker and the simulator keep the
    spec's); ``instance``: this worker process's id, in every job id; ``inbox_keep_s`` (on the
    core's clock): how long a task's inputs wait for the rest before its job's ingress is told
    it failed (:meth:`~compass.core.jobs.Inbox.expire`; the simulator keeps them forever);
    ``keep_stimuli``: the events its stimulus log keeps (0: none, as in the simulator).
    """

    lanes: int = _WORKER.lanes
    host_lanes: int = _WORKER.host_lanes
    prefetch_depth: int = _WORKER.cache.prefetch_depth
    prefetch_evicts: bool = _WORKER.cache.prefetch_evicts
    warm: bool = _WORKER.sched.warm
    max_stuck: int = _WORKER.max_stuck_tasks
    preempt: bool = _WORKER.sched.preempt
    admission: str = _WORKER.sched.admission
    max_jobs: int = _WORKER.max_jobs
    max_job_bytes: int = _WORKER.job_bytes
    max_held_bytes: int = _WORKER.max_held_bytes
    forget_after: int = FORGET_AFTER
    keep_answer_bytes: int = _WORKER.keep_answer_bytes
    keep_answer_s: float = KEEP_ANSWER_S / _WORKER.time_scale
    learn: bool = not _WORKER.emulate
    instance: str = ""
    inbox_keep_s: float = math.inf
    keep_stimuli: int = KEEP_STIMULI


def core_options(
    config: WorkerConfig, *, instance: str = "", inbox_keep_s: float = math.inf
) -> CoreOptions:
    """The options of the core of a worker configured by ``config``: the asyncio worker's
    and every simulated worker's (:mod:`compass.sim.settings`), so they cannot drift apart.
    ``keep_answer_s`` is in the core's clock, real seconds: :data:`KEEP_ANSWER_S` spec
    seconds over the emulation's ``time_scale``; so is ``inbox_keep_s``, which the asyncio
    worker sets and the simulator leaves infinite."""
    return CoreOptions(
        lanes=config.lanes,
        host_lanes=config.host_lanes,
        prefetch_depth=config.cache.prefetch_depth,
        prefetch_evicts=config.cache.prefetch_evicts,
        warm=config.sched.warm,
        max_stuck=config.max_stuck_tasks,
        preempt=config.sched.preempt,
        admission=config.sched.admission,
        max_jobs=config.max_jobs,
        max_job_bytes=config.job_bytes,
        max_held_bytes=config.max_held_bytes,
        keep_answer_bytes=config.keep_answer_bytes,
        keep_answer_s=KEEP_ANSWER_S / config.time_scale,
        learn=not config.emulate,
        instance=instance,
        inbox_keep_s=inbox_keep_s,
    )
