"""Online profiles: expected execution times, output sizes, bandwidths and model sizes.

Every estimate the planner uses lives here. Execution times and output sizes start from the
workflow's declared profile and follow measurements by an exponential moving average (EMA);
bandwidths start from configuration and follow measurements the same way.

Layout, for speed: each worker name seen gets a small integer slot; per-worker values live in
numpy arrays indexed by slot, NaN meaning "never measured there, use the default". The planner
asks for whole vectors ordered like a view's worker names (:meth:`Profiles.exec_matrix`,
:meth:`Profiles.h2d_inverse`, ...), one gather each. Version counters let callers cache what
they derive: :meth:`Profiles.workflow_version` changes when a workflow's times or sizes do,
:attr:`Profiles.links_version` when a bandwidth or a model size does.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from compass.errors import ConfigError, UnknownWorkflow, WorkflowError
from compass.workflow.dag import Workflow, batch_scale
from compass.workflow.frequencies import ChoiceFrequencies

if TYPE_CHECKING:
    from compass.workflow.spec import Workload

__all__ = ["LEARNED_SPREAD", "SAMPLES_COUNTED", "Learned", "Profiles"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.intp]

_INITIAL_SLOTS = 8
#: a new measurement changes the version (and so rebuilds cached cost tables) only when it moves
#: an estimate by more than this fraction from the value the tables were built from
REPLAN_TOLERANCE = 0.02
#: ...and by more than this much in absolute terms (seconds for times, bytes for sizes): tiny
#: tasks' times jitter by large fractions of nothing, which no plan depends on
REPLAN_FLOOR = (0.0005, 4096.0, 0.0005)
#: the most learned task times a worker spreads of itself (:meth:`Profiles.learned_of`), the
#: most recently learned first: a bound on what its heartbeats carry, whatever its app's size
LEARNED_SPREAD = 16
#: a worker's learned time weighs by its samples in the overall estimate up to this many: an
#: EMA of alpha 0.2 remembers about ten runs, so a long-running worker does not outvote the
#: rest by its age alone
SAMPLES_COUNTED = 10

#: :attr:`_WorkflowProfile.sole` of a task no worker learned, and of one several learned
_NONE = -1
_SEVERAL = -2

#: one learned task time as it spreads: ``(workflow, task, seconds, samples)``, the worker's
#: own estimate of the task's run there and the runs it measured
Learned = tuple[str, str, float, int]


def _check_positive(what: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise ConfigError(f"{what} must be a number > 0, got {value!r}")
    if math.isinf(value):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    return float(value)


def _check_nonnegative(what: str, value: float) -> float:
    kind = type(value)
    if (kind is float and 0.0 <= value < math.inf) or (kind is int and value >= 0):
        return float(value)  # a measured time or size, as nearly every call gives
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
        raise ConfigError(f"{what} must be a number >= 0, got {value!r}")
    if math.isinf(value):
        raise ConfigError(f"{what} must be finite, got {value!r}")
    return float(value)


class _WorkflowProfile:
    """Per-task estimates of one workflow, indexed like ``workflow.order``."""

    __slots__ = (
        "exec_by_slot",
        "exec_s",
        "learned_at",
        "measured_on_workers",
        "output_bytes",
        "published",
        "samples",
        "sole",
        "steps",
        "version",
        "wf",
    )

    def __init__(self, wf: Workflow, slots: int, version: int) -> None:
        self.wf = wf
        tasks = [wf.tasks[t] for t in wf.order]
        self.exec_s: FloatArray = np.array([t.profile.exec_s for t in tasks], dtype=np.float64)
        self.output_bytes: FloatArray = np.array(
            [t.profile.output_bytes for t in tasks], dtype=np.float64
        )
        self.exec_by_slot: FloatArray = np.full((len(tasks), slots), np.nan)
        #: per task and worker: runs measured there, and when it was last learned (a tick of
        #: :attr:`Profiles._ticks`; 0: never), which orders what a worker spreads of itself
        self.samples: IntArray = np.zeros((len(tasks), slots), dtype=np.intp)
        self.learned_at: IntArray = np.zeros((len(tasks), slots), dtype=np.intp)
        #: per task, the one worker slot that learned it (:data:`_NONE`: none yet;
        #: :data:`_SEVERAL`: more than one), so that the overall estimate of a task learned on
        #: one worker alone needs no arrays (:meth:`Profiles._merged`)
        self.sole: list[int] = [_NONE] * len(tasks)
        #: expected steps of each task (1: a plain one), learned apart from the time of one
        #: step (:meth:`Profiles.observe_steps`)
        self.steps: FloatArray = np.array([t.profile.steps for t in tasks], dtype=np.float64)
        self.measured_on_workers = False
        self.version = version
        #: the estimates as of the last version bump, what cached cost tables were built from
        self.published: tuple[FloatArray, FloatArray, FloatArray] = self._copy()

    def _copy(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        return self.exec_s.copy(), self.output_bytes.copy(), self.exec_by_slot.copy()

    def learned(self, i: int, slot: int) -> None:
        """Task ``i`` was learned on worker ``slot`` (its samples there are counted)."""
        sole = self.sole[i]
        if sole != slot and sole != _SEVERAL:
            self.sole[i] = slot if sole == _NONE else _SEVERAL

    def drifted(self, which: int, i: int, value: float, slot: int = -1) -> bool:
        """Whether ``value``, task ``i``'s new estimate in table ``which`` (on worker ``slot``
        in the per-worker table), is more than :data:`REPLAN_TOLERANCE` away from what was
        published."""
        table = self.published[which]
        if slot < 0:
            old = float(table[i])
        elif slot >= table.shape[1]:  # a worker slot added since the last bump
            return True
        else:
            old = float(table[i, slot])
        if old != old:  # NaN: none published
            return True
        return abs(value - old) > max(REPLAN_TOLERANCE * abs(old), REPLAN_FLOOR[which])


class Profiles:
    """Expected costs for the planner, seeded from declarations and updated by measurement.

    Transfer model: ``transfer_s(src, dst, n) = fixed + n / net`` between two different
    workers, plus, when ``staged`` (the default, the paper's GPU-to-GPU constant), the
    device-to-host copy at the source and the host-to-device copy at the destination. Loading a
    model of ``n`` bytes onto a worker's GPU costs ``fetch_s(worker, n) = n / h2d(worker)``.

    ``alpha`` is the EMA weight of a new measurement.

    Learned times spread (issue 39): each worker measures its own runs (:meth:`observe_exec`)
    and tells its peers its estimates (:meth:`learned_of`, carried by its heartbeats), which
    they take in as its (:meth:`adopt_exec`). A task's estimate on a worker is that worker's
    own learned time; on a worker that never ran it, the overall estimate: the mean of every
    worker's learned time weighted by its samples (up to :data:`SAMPLES_COUNTED` each), the
    declared time while none has run it. Every worker that heard the same peers so computes the
    same estimates, and admission agrees across the cluster.
    """

    def __init__(
        self,
        *,
        h2d_bytes_per_s: float,
        net_bytes_per_s: float,
        net_fixed_s: float = 0.0,
        d2h_bytes_per_s: float | None = None,
        model_sizes: Mapping[str, int] | None = None,
        workflows: Iterable[Workflow] = (),
        alpha: float = 0.2,
        staged: bool = True,
    ) -> None:
        self._h2d_default = _check_positive("h2d_bytes_per_s", h2d_bytes_per_s)
        self._d2h_default = _check_positive(
            "d2h_bytes_per_s", h2d_bytes_per_s if d2h_bytes_per_s is None else d2h_bytes_per_s
        )
        self._net_default = _check_positive("net_bytes_per_s", net_bytes_per_s)
        self._fixed_default = _check_nonnegative("net_fixed_s", net_fixed_s)
        if not isinstance(alpha, int | float) or not 0 < alpha <= 1:
            raise ConfigError(f"Profiles alpha must be in (0, 1], got {alpha!r}")
        self.alpha = float(alpha)
        self.staged = bool(staged)
        # one clock for every workflow's version: a replaced workflow never reuses a number
        self._clock = itertools.count(1)
        self.links_version = 0
        self._models: dict[str, int] = {}
        for name, size in (model_sizes or {}).items():
            self.set_model_bytes(name, size)
        self._slots: dict[str, int] = {}
        self._capacity = _INITIAL_SLOTS
        self._h2d: FloatArray = np.full(self._capacity, np.nan)
        self._d2h: FloatArray = np.full(self._capacity, np.nan)
        self._h2d_measured = False
        self._d2h_measured = False
        # (src, dst) -> (bytes/s, fixed s); empty in the common case of one network
        self._links: dict[str, dict[str, tuple[float, float]]] = {}
        self._workflows: dict[str, _WorkflowProfile] = {}
        #: (workflow, task, worker) -> size -> measured seconds of a batch of that size (EMA)
        self._batches: dict[tuple[str, str, str], dict[int, float]] = {}
        #: per (workflow, task, worker, size): the batch cost cached cost tables last saw
        self._batches_published: dict[tuple[str, str, str, int], float] = {}
        #: orders learned times (``learned_at``), newest last; and, per worker, the entries it
        #: spreads of itself, kept until a version changes: ``(clock, entries)``
        self._ticks = itertools.count(1)
        self._spread_clock = 0
        self._spread: dict[str, tuple[int, tuple[Learned, ...]]] = {}
        self._perm_names: tuple[str, ...] | None = None
        self._perm: IntArray = np.zeros(0, dtype=np.intp)
        #: the choice frequencies of workflows decided at run time, learned and spread
        self.choices = ChoiceFrequencies(self._workflow_named)
        for wf in workflows:
            self.add_workflow(wf)

    @classmethod
    def from_workload(cls, workload: Workload, *, alpha: float = 0.2) -> Profiles:
        """Profiles for a parsed workload: its cluster's bandwidths, models and workflows."""
        c = workload.cluster
        return cls(
            h2d_bytes_per_s=c.h2d_bytes_per_s,
            d2h_bytes_per_s=c.d2h_bytes_per_s,
            net_bytes_per_s=c.net_bytes_per_s,
            net_fixed_s=c.net_fixed_s,
            model_sizes=workload.models,
            workflows=workload.workflows.values(),
            alpha=alpha,
        )

    # -- workflows ------------------------------------------------------------------------

    def add_workflow(self, wf: Workflow) -> None:
        """Register ``wf``, seeding its estimates from the declared profile.

        Registering the same object again keeps the measurements; a different workflow under
        the same name replaces them.
        """
        known = self._workflows.get(wf.name)
        if known is not None and (known.wf is wf or dict(known.wf.tasks) == dict(wf.tasks)):
            known.wf = wf
            return
        self._workflows[wf.name] = _WorkflowProfile(wf, self._capacity, next(self._clock))

    def _workflow_named(self, name: str) -> Workflow | None:
        known = self._workflows.get(name)
        return None if known is None else known.wf

    def _wf(self, workflow: str) -> _WorkflowProfile:
        prof = self._workflows.get(workflow)
        if prof is None:
            raise UnknownWorkflow(
                f"no profile for workflow {workflow!r}; known: "
                f"{', '.join(sorted(self._workflows)) or 'none'}"
            )
        return prof

    def _task(self, prof: _WorkflowProfile, task: str) -> int:
        i = prof.wf.index.get(task)
        if i is None:
            raise WorkflowError(f"workflow {prof.wf.name!r} has no task {task!r}")
        return i

    def workflow_version(self, workflow: str) -> int:
        """Changes whenever an estimate of ``workflow`` does."""
        prof = self._workflows.get(workflow)  # read for every job, several times
        return self._wf(workflow).version if prof is None else prof.version

    def exec_s(self, workflow: str, task: str, worker: str | None = None) -> float:
        """Expected execution seconds of ``task``, on ``worker`` when measured there."""
        prof = self._wf(workflow)
        i = self._task(prof, task)
        if worker is not None:
            slot = self._slots.get(worker)
            if slot is not None:
                value = float(prof.exec_by_slot[i, slot])
                if not math.isnan(value):
                    return value
        return float(prof.exec_s[i])

    def output_bytes(self, workflow: str, task: str) -> int:
        """Expected output size of ``task`` in bytes."""
        prof = self._wf(workflow)
        return round(float(prof.output_bytes[self._task(prof, task)]))

    def observe_exec(self, workflow: str, task: str, worker: str, seconds: float) -> None:
        """Fold a measured execution time into the task's estimate on ``worker`` (an EMA), and
        so into the overall one (the learned times' mean, see the class docstring)."""
        seconds = _check_nonnegative("measured execution seconds", seconds)
        prof = self._wf(workflow)
        i = self._task(prof, task)
        slot = self._slot(worker)
        # a worker's first measurement blends with the overall estimate so one outlier
        # cannot set its value alone; the new estimates as stored (a float64 array holds a
        # float exactly) are compared below without reading them back
        mine = float(prof.exec_by_slot[i, slot])
        if math.isnan(mine):
            mine = float(prof.exec_s[i])
        new_mine = prof.exec_by_slot[i, slot] = mine + self.alpha * (seconds - mine)
        prof.samples[i, slot] += 1
        prof.learned(i, slot)
        prof.learned_at[i, slot] = next(self._ticks)
        prof.measured_on_workers = True
        new = prof.exec_s[i] = self._merged(prof, i)
        if prof.drifted(0, i, new) or prof.drifted(2, i, new_mine, slot):
            self._bump(prof)

    def adopt_exec(
        self, workflow: str, task: str, worker: str, seconds: float, samples: int
    ) -> bool:
        """Take ``worker``'s own learned time of ``task`` (``seconds`` over ``samples`` runs
        there), as its heartbeat spread it: its estimate there, and a part of the overall one.
        False (nothing changed) for a workflow or task this app does not declare."""
        prof = self._workflows.get(workflow)
        i = None if prof is None else prof.wf.index.get(task)
        if prof is None or i is None:
            return False
        seconds = _check_nonnegative("learned execution seconds", seconds)
        slot = self._slot(worker)
        prof.exec_by_slot[i, slot] = seconds
        prof.samples[i, slot] = max(int(samples), 1)
        prof.learned(i, slot)
        prof.learned_at[i, slot] = next(self._ticks)
        prof.measured_on_workers = True
        new = prof.exec_s[i] = self._merged(prof, i)
        if prof.drifted(0, i, new) or prof.drifted(2, i, seconds, slot):
            self._bump(prof)
        return True

    def _merged(self, prof: _WorkflowProfile, i: int) -> float:
        """Task ``i``'s overall estimate: the workers' learned times weighted by their samples
        (see the class docstring). Called once something was learned of it. Learned on one
        worker alone, that worker's time, computed as the arrays would (``x * w / w``, the
        same float: a dot product of one term is one product) without them."""
        sole = prof.sole[i]
        if sole >= 0:
            weight = min(int(prof.samples[i, sole]), SAMPLES_COUNTED)
            return float(prof.exec_by_slot[i, sole]) * weight / weight
        weights = np.minimum(prof.samples[i], SAMPLES_COUNTED)
        learned = weights > 0
        return float(np.dot(prof.exec_by_slot[i, learned], weights[learned]) / weights.sum())

    def learned_of(self, worker: str, most: int = LEARNED_SPREAD) -> tuple[Learned, ...]:
        """What ``worker`` learned of itself (:meth:`observe_exec`, or :meth:`adopt_exec` as
        it spread it) as it spreads: at most
        ``most`` task times, the most recently learned first. The same tuple until an estimate
        moves past the version tolerance, so a heartbeat that carries it changes only then."""
        clock, entries = self._spread.get(worker, (-1, ()))
        if clock == self._spread_clock:
            return entries
        slot = self._slots.get(worker)
        found: list[tuple[int, Learned]] = []
        for name, prof in self._workflows.items() if slot is not None else ():
            for i in np.flatnonzero(prof.samples[:, slot]):
                learned = (name, prof.wf.order[i], float(prof.exec_by_slot[i, slot]),
                           int(prof.samples[i, slot]))  # fmt: skip
                found.append((int(prof.learned_at[i, slot]), learned))
        found.sort(key=lambda pair: pair[0], reverse=True)
        entries = tuple(learned for _, learned in found[:most])
        if len(self._spread) >= len(self._slots):
            self._spread.clear()  # a status asked of every worker once: no more kept than slots
        self._spread[worker] = (self._spread_clock, entries)
        return entries

    def steps(self, workflow: str, task: str) -> float:
        """Expected steps of ``task`` (1 for a plain task), as learned."""
        prof = self._wf(workflow)
        return float(prof.steps[self._task(prof, task)])

    def step_s(self, workflow: str, task: str, worker: str | None = None) -> float:
        """Expected seconds of one step of ``task`` (on ``worker`` when measured there)."""
        return self.exec_s(workflow, task, worker) / self.steps(workflow, task)

    def observe_steps(
        self, workflow: str, task: str, worker: str, steps: int, seconds: float
    ) -> None:
        """Fold a step-wise run of ``steps`` steps that took ``seconds`` on ``worker``.

        Its two halves are learned apart, because they vary for different reasons: how many
        steps a run takes depends on the job (a longer answer), one step's time on the worker
        (its device). The step count is one estimate for the task; the step time is learned
        overall and per worker like :meth:`observe_exec`'s times; the task's expected time is
        their product everywhere. So a worker that happened to run short generations is not
        taken for fast, and a longer expected count lengthens every worker's estimate at once.
        Memory is that of the task's times: one count per task, no history kept."""
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"measured steps must be an integer >= 1, got {steps!r}")
        step = _check_nonnegative("measured execution seconds", seconds) / steps
        prof = self._wf(workflow)
        i = self._task(prof, task)
        slot = self._slot(worker)
        a = self.alpha
        old_steps = float(prof.steps[i])
        new_steps = prof.steps[i] = old_steps + a * (steps - old_steps)
        overall = float(prof.exec_s[i]) / old_steps
        row = prof.exec_by_slot[i]
        row *= new_steps / old_steps  # every worker's step time, at the new count
        mine = float(row[slot]) / new_steps
        if math.isnan(mine):  # a worker's first measurement blends with the overall estimate
            mine = overall
        row[slot] = new_steps * (mine + a * (step - mine))
        prof.samples[i, slot] += 1  # learned here: it spreads with the view
        prof.learned(i, slot)
        prof.learned_at[i, slot] = next(self._ticks)
        prof.measured_on_workers = True
        new = prof.exec_s[i] = self._merged(prof, i)  # the workers' times, as observe_exec's
        if prof.drifted(0, i, new) or any(
            prof.drifted(2, i, float(row[s]), int(s)) for s in np.flatnonzero(~np.isnan(row))
        ):
            self._bump(prof)

    def observe_batch(
        self, workflow: str, task: str, worker: str, size: int, seconds: float
    ) -> None:
        """Fold a measured batch of ``size`` items (``size`` 1 is :meth:`observe_exec`). Like
        a single run's, a batch cost that moves by more than :data:`REPLAN_TOLERANCE` changes
        the workflow's version, so the planner's cost tables take the learned curve."""
        if size <= 1:
            self.observe_exec(workflow, task, worker, seconds)
            return
        seconds = _check_nonnegative("measured batch seconds", seconds)
        prof = self._wf(workflow)
        self._task(prof, task)
        table = self._batches.setdefault((workflow, task, worker), {})
        old = table.get(size)
        new = table[size] = seconds if old is None else old + self.alpha * (seconds - old)
        key = (workflow, task, worker, size)
        seen = self._batches_published.get(key)
        if seen is None or abs(new - seen) > max(REPLAN_TOLERANCE * seen, REPLAN_FLOOR[0]):
            self._batches_published[key] = new
            self._bump(prof)

    def batch_scale(self, workflow: str, task: str, worker: str) -> tuple[float, ...]:
        """The cost of a batch of 1, 2, ... items of ``task`` on ``worker`` as multiples of one
        run: measured sizes from :meth:`observe_batch`, the declared curve elsewhere (capped by
        the measurement of a larger size), never falling with size."""
        prof = self._wf(workflow)
        declared_task = prof.wf.tasks[prof.wf.order[self._task(prof, task)]]
        declared = declared_task.profile.batch_scale
        table = self._batches.get((workflow, task, worker))
        if not table:
            return declared
        single = self.exec_s(workflow, task, worker)
        size = max(declared_task.batch, max(table))
        values = [1.0]
        cap = math.inf  # a measured size bounds the guesses for smaller sizes
        guesses: list[float] = []
        for b in range(size, 1, -1):
            measured = table.get(b)
            if measured is not None and single > 0:
                cap = measured / single
                guesses.append(cap)
            else:
                guesses.append(min(batch_scale(declared, b), cap))
        for value in reversed(guesses):
            values.append(max(values[-1], value))  # never falling, whatever the noise
        return tuple(values)

    def observe_output(self, workflow: str, task: str, nbytes: int) -> None:
        """Fold a measured output size into the task's estimate."""
        size = _check_nonnegative("measured output bytes", nbytes)
        prof = self._wf(workflow)
        i = self._task(prof, task)
        old = float(prof.output_bytes[i])
        new = prof.output_bytes[i] = old + self.alpha * (size - old)
        if prof.drifted(1, i, new):
            self._bump(prof)

    def _bump(self, prof: _WorkflowProfile) -> None:
        prof.version = next(self._clock)
        prof.published = prof._copy()
        self._spread_clock += 1

    # -- models -----------------------------------------------------------------------------

    def model_bytes(self, name: str) -> int:
        """Size of model ``name`` in bytes."""
        size = self._models.get(name)
        if size is None:
            raise WorkflowError(
                f"unknown model {name!r}; known: {', '.join(sorted(self._models)) or 'none'}"
            )
        return size

    def set_model_bytes(self, name: str, nbytes: int) -> None:
        """Declare or correct a model's size."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ConfigError(f"model {name!r}: size must be an integer >= 0, got {nbytes!r}")
        self._models[name] = nbytes
        self.links_version += 1

    @property
    def model_sizes(self) -> Mapping[str, int]:
        """Every known model and its size in bytes (a read-only view)."""
        return MappingProxyType(self._models)

    # -- bandwidths -------------------------------------------------------------------------

    def _slot(self, worker: str) -> int:
        slot = self._slots.get(worker)
        if slot is not None:
            return slot
        slot = len(self._slots)
        if slot >= self._capacity:
            self._grow(max(2 * self._capacity, slot + 1))
        self._slots[worker] = slot
        return slot

    def _grow(self, capacity: int) -> None:
        extra = capacity - self._capacity

        def pad(a: FloatArray) -> FloatArray:
            tail = np.full((*a.shape[:-1], extra), np.nan)
            return np.concatenate([a, tail], axis=-1)

        def zeros(a: IntArray) -> IntArray:
            return np.concatenate([a, np.zeros((a.shape[0], extra), dtype=np.intp)], axis=-1)

        self._h2d = pad(self._h2d)
        self._d2h = pad(self._d2h)
        for prof in self._workflows.values():
            prof.exec_by_slot = pad(prof.exec_by_slot)
            prof.samples = zeros(prof.samples)
            prof.learned_at = zeros(prof.learned_at)
        self._capacity = capacity

    def h2d_bytes_per_s(self, worker: str) -> float:
        """Host-to-device bandwidth of ``worker``."""
        slot = self._slots.get(worker)
        value = math.nan if slot is None else float(self._h2d[slot])
        return self._h2d_default if math.isnan(value) else value

    def d2h_bytes_per_s(self, worker: str) -> float:
        """Device-to-host bandwidth of ``worker``."""
        slot = self._slots.get(worker)
        value = math.nan if slot is None else float(self._d2h[slot])
        return self._d2h_default if math.isnan(value) else value

    def set_h2d(self, worker: str, bytes_per_s: float) -> None:
        """Set ``worker``'s host-to-device bandwidth (a fresh measurement or a known value)."""
        self._h2d[self._slot(worker)] = _check_positive("h2d_bytes_per_s", bytes_per_s)
        self._h2d_measured = True
        self.links_version += 1

    def set_d2h(self, worker: str, bytes_per_s: float) -> None:
        """Set ``worker``'s device-to-host bandwidth."""
        self._d2h[self._slot(worker)] = _check_positive("d2h_bytes_per_s", bytes_per_s)
        self._d2h_measured = True
        self.links_version += 1

    def observe_h2d(self, worker: str, nbytes: int, seconds: float) -> None:
        """Fold a timed host-to-device copy into ``worker``'s bandwidth estimate."""
        if nbytes <= 0 or not seconds > 0:
            return  # nothing measurable: an empty copy or a clock that did not move
        old = self.h2d_bytes_per_s(worker)
        self.set_h2d(worker, old + self.alpha * (nbytes / seconds - old))

    def set_network(self, bytes_per_s: float, fixed_s: float) -> None:
        """Set the default network bandwidth and fixed latency between any two workers."""
        self._net_default = _check_positive("net_bytes_per_s", bytes_per_s)
        self._fixed_default = _check_nonnegative("net_fixed_s", fixed_s)
        self.links_version += 1

    def set_link(
        self, src: str, dst: str, bytes_per_s: float, fixed_s: float | None = None
    ) -> None:
        """Set the network bandwidth (and fixed latency) from ``src`` to ``dst`` only."""
        bps = _check_positive("link bytes_per_s", bytes_per_s)
        fixed = self._fixed_default if fixed_s is None else _check_nonnegative("fixed_s", fixed_s)
        self._links.setdefault(src, {})[dst] = (bps, fixed)
        self.links_version += 1

    def observe_transfer(self, src: str, dst: str, nbytes: int, seconds: float) -> None:
        """Fold a timed network transfer into the ``src`` -> ``dst`` bandwidth estimate."""
        bps, fixed = self.link(src, dst)
        payload_s = seconds - fixed
        if nbytes <= 0 or not payload_s > 0:
            return
        self.set_link(src, dst, bps + self.alpha * (nbytes / payload_s - bps), fixed)

    def link(self, src: str, dst: str) -> tuple[float, float]:
        """``(bytes_per_s, fixed_s)`` of the network path from ``src`` to ``dst``."""
        pair = self._links.get(src)
        if pair is not None:
            found = pair.get(dst)
            if found is not None:
                return found
        return self._net_default, self._fixed_default

    def transfer_s(self, src: str, dst: str, nbytes: int) -> float:
        """Seconds to move ``nbytes`` of task output from ``src`` to ``dst``; 0 on one worker."""
        if src == dst:
            return 0.0
        bps, fixed = self.link(src, dst)
        seconds = fixed + nbytes / bps
        if self.staged:
            seconds += nbytes / self.d2h_bytes_per_s(src) + nbytes / self.h2d_bytes_per_s(dst)
        return seconds

    def fetch_s(self, worker: str, nbytes: int) -> float:
        """Seconds to copy ``nbytes`` of model weights from host memory to ``worker``'s GPU."""
        return nbytes / self.h2d_bytes_per_s(worker)

    # -- vectors for the planner -----------------------------------------------------------

    @property
    def net_bytes_per_s(self) -> float:
        """The default network bandwidth."""
        return self._net_default

    @property
    def net_fixed_s(self) -> float:
        """The default network fixed latency."""
        return self._fixed_default

    @property
    def default_h2d_bytes_per_s(self) -> float:
        """Host-to-device bandwidth of a worker never measured."""
        return self._h2d_default

    @property
    def default_d2h_bytes_per_s(self) -> float:
        """Device-to-host bandwidth of a worker never measured."""
        return self._d2h_default

    @property
    def has_links(self) -> bool:
        """Whether any worker pair has its own network estimate."""
        return bool(self._links)

    def links_from(self, src: str) -> Mapping[str, tuple[float, float]]:
        """Per-destination ``(bytes_per_s, fixed_s)`` overrides from ``src`` (often empty)."""
        return self._links.get(src, {})

    def _perm_for(self, names: tuple[str, ...]) -> IntArray:
        # snapshots of an unchanged membership share one names tuple: identity is the fast hit
        if names is not self._perm_names and names != self._perm_names:
            self._perm = np.fromiter(
                (self._slot(n) for n in names), dtype=np.intp, count=len(names)
            )
            self._perm_names = names
        return self._perm

    def _per_worker(self, values: FloatArray, default: float, names: tuple[str, ...]) -> FloatArray:
        picked = values[self._perm_for(names)]
        return np.where(np.isnan(picked), default, picked)

    def h2d_inverse(self, names: tuple[str, ...]) -> FloatArray | float:
        """Seconds per byte of host-to-device copy, per worker of ``names`` (or one scalar
        when no worker has its own measurement)."""
        if not self._h2d_measured:
            return 1.0 / self._h2d_default
        return 1.0 / self._per_worker(self._h2d, self._h2d_default, names)

    def d2h_inverse(self, names: tuple[str, ...]) -> FloatArray | float:
        """Seconds per byte of device-to-host copy, per worker of ``names`` (or one scalar)."""
        if not self._d2h_measured:
            return 1.0 / self._d2h_default
        return 1.0 / self._per_worker(self._d2h, self._d2h_default, names)

    def exec_matrix(self, workflow: str, names: tuple[str, ...]) -> FloatArray:
        """Expected execution seconds, shape ``(tasks in workflow.order, len(names))``."""
        prof = self._wf(workflow)
        overall = prof.exec_s[:, None]
        if not prof.measured_on_workers:
            return np.repeat(overall, len(names), axis=1)
        picked = prof.exec_by_slot[:, self._perm_for(names)]
        return np.where(np.isnan(picked), overall, picked)

    def output_vector(self, workflow: str) -> FloatArray:
        """Expected output bytes per task, indexed like ``workflow.order`` (a copy)."""
        return self._wf(workflow).output_bytes.copy()
