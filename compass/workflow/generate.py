"""Workloads compass was never tuned on: random but realistic specs, reproducible by seed.

:func:`generate_spec` draws a workload in the JSON layout :func:`~compass.workflow.spec.
parse_workload` reads (the one of ``bench/workloads/paper.json``); :class:`GeneratorParams`
holds every range it draws from, with the defaults below. One ``random.Random(seed)`` makes
every draw, in a fixed order, so a seed always gives the same spec.

=====================  =================  =====================================================
parameter              default            meaning
=====================  =================  =====================================================
``workflows``          2..8               workflows per workload
``zipf_s``             1.0                popularity: workflow ``k`` (0-based) has weight
                                          ``1 / (k + 1) ** zipf_s`` (the spec's ``weight``)
``shapes``             all four           DAG shapes drawn from, uniformly (below)
``chain_length``       2..5               tasks in a ``chain``
``fan_width``          3..5               parallel tasks in a ``fan``
``branch_length``      1..3               tasks per branch of a ``diamond`` (two branches)
``models``             3..20              distinct models (capped by the tasks that need one)
``model_gb``           0.1..15            model size, log-uniform, GB (10^9 bytes)
``cache_ratio``        1..3               total model bytes / one worker's GPU cache
``exec_ms``            5..2000            a model task's time, log-uniform
``host_exec_ms``       0.5..200           a model-less task's time, log-uniform
``join_no_model``      0.5                chance that a join (aggregate) needs no model
``task_no_model``      0.1                chance that any other task needs no model
``output_kb``          1..5000            a task's output, log-uniform, kB (10^3 bytes)
``input_kb``           1..5000            a root task's job input, log-uniform, kB
``workers``            4..8               ``cluster.workers``
``utilization``        0.5..0.6           GPU lane utilization at load 1 (sets the rate)
``h2d_gbps`` ...       12, 12, 12.5, 5 us host-to-device, device-to-host, network, net latency
``jobs``, ``gamma_cv`` 1000, 10           the ``arrivals`` object (all three processes)
``cache_headroom_mb``  128                the cache holds the largest model plus this much,
                                          so it fits whole 64 MiB slabs
``stepwise``           0                  chance that a model task of ``step_min_ms`` or more
                                          runs in steps (a generation: tokens)
``step_ms``            10..60             a step-wise task's time per step, log-uniform
``step_min_ms``        100                the shortest task drawn to run in steps
``state_kb``           10..400            a step-wise task's state per step, log-uniform, kB
``step_batch``         8                  the most jobs a step-wise task's steps batch (1: no
                                          step batching)
``step_item``          0.03..0.2          each extra job's share of a batched step, log-uniform
=====================  =================  =====================================================

Step-wise tasks are drawn after everything else, from a generator of their own seeded by the
same seed: a workload drawn with ``stepwise=0`` (the default) is the one earlier releases drew,
and one drawn with steps is that same workload with some of its tasks run in steps
(``compass workload generate --stepwise 0.5``). Their step batch curves come from a third
generator, so ``compass sim --step-batch off`` runs the steps as drawn before step batching.

Shapes: ``chain`` (a line), ``fan`` (one task fans out to ``fan_width`` tasks that one join
gathers), ``diamond`` (a split, two branches of ``branch_length`` tasks, a join) and ``mix``
(a lead-in of two tasks, then two or three branches of one or two tasks, a join and a tail of
one or two tasks; half of them also have a side branch that is a second sink). Each
workflow's shape is written in its ``shape`` key, which the parser ignores.

The arrival rate follows from the utilization target: a job of the popularity mix needs
``E`` lane-seconds on average (the sum of its tasks' times, every task on a GPU lane), so a
total rate of ``utilization * workers / E`` jobs per second fills the workers' lanes that much
at load 1, and ``mean_interval_ms_per_client`` is ``1000 * sum(weights)`` over that rate.
:func:`expected_utilization` computes it back from any parsed workload. No workflow declares
``best_ms``: compass computes it (:mod:`compass.workflow.best`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass
from typing import Any

from compass.errors import ConfigError
from compass.workflow.spec import Workload, parse_workload

__all__ = [
    "SHAPES",
    "GeneratorParams",
    "expected_utilization",
    "generate_spec",
    "generate_workload",
    "summary_line",
]

#: the DAG shapes the generator draws from
SHAPES = ("chain", "fan", "diamond", "mix")

_IntRange = tuple[int, int]
_Range = tuple[float, float]


@dataclass(frozen=True, slots=True)
class GeneratorParams:
    """Every range :func:`generate_spec` draws from (the module docstring's table); a range is
    ``(low, high)``, both included."""

    workflows: _IntRange = (2, 8)
    zipf_s: float = 1.0
    shapes: tuple[str, ...] = SHAPES
    chain_length: _IntRange = (2, 5)
    fan_width: _IntRange = (3, 5)
    branch_length: _IntRange = (1, 3)
    models: _IntRange = (3, 20)
    model_gb: _Range = (0.1, 15.0)
    cache_ratio: _Range = (1.0, 3.0)
    exec_ms: _Range = (5.0, 2000.0)
    host_exec_ms: _Range = (0.5, 200.0)
    join_no_model: float = 0.5
    task_no_model: float = 0.1
    output_kb: _Range = (1.0, 5000.0)
    input_kb: _Range = (1.0, 5000.0)
    workers: _IntRange = (4, 8)
    utilization: _Range = (0.5, 0.6)
    h2d_gbps: float = 12.0
    d2h_gbps: float = 12.0
    net_gbps: float = 12.5
    net_fixed_us: float = 5.0
    jobs: int = 1000
    gamma_cv: float = 10.0
    cache_headroom_mb: float = 128.0
    stepwise: float = 0.0
    step_ms: _Range = (10.0, 60.0)
    step_min_ms: float = 100.0
    state_kb: _Range = (10.0, 400.0)
    step_batch: int = 8
    step_item: _Range = (0.03, 0.2)

    def __post_init__(self) -> None:
        for name in ("workflows", "chain_length", "fan_width", "branch_length", "workers"):
            _int_range(name, getattr(self, name), 1)
        _int_range("chain_length", self.chain_length, 2)
        _int_range("fan_width", self.fan_width, 2)
        _int_range("models", self.models, 1)
        for name in ("model_gb", "exec_ms", "host_exec_ms", "output_kb", "input_kb", "step_ms",
                     "state_kb", "step_item"):  # fmt: skip
            _range(name, getattr(self, name), positive=True)
        _range("cache_ratio", self.cache_ratio, positive=True)
        if self.cache_ratio[0] < 1.0:
            raise ConfigError(
                f"GeneratorParams.cache_ratio: every model must fit in the cache (ratio >= 1), "
                f"got {self.cache_ratio!r}"
            )
        _range("utilization", self.utilization, positive=True)
        if self.utilization[1] > 1.0:
            raise ConfigError(
                f"GeneratorParams.utilization must stay <= 1, got {self.utilization!r}"
            )
        for name in ("join_no_model", "task_no_model", "stepwise"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value <= 1.0:
                raise ConfigError(f"GeneratorParams.{name} must be in [0, 1], got {value!r}")
        for name in ("zipf_s", "net_fixed_us", "cache_headroom_mb", "step_min_ms"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 <= value < math.inf:
                raise ConfigError(f"GeneratorParams.{name} must be a number >= 0, got {value!r}")
        for name in ("h2d_gbps", "d2h_gbps", "net_gbps", "gamma_cv"):
            value = getattr(self, name)
            if not _is_number(value) or not 0.0 < value < math.inf:
                raise ConfigError(f"GeneratorParams.{name} must be a number > 0, got {value!r}")
        if (
            not isinstance(self.step_batch, int)
            or isinstance(self.step_batch, bool)
            or (self.step_batch < 1)
        ):
            raise ConfigError(
                f"GeneratorParams.step_batch must be an integer >= 1, got {self.step_batch!r}"
            )
        if not isinstance(self.jobs, int) or isinstance(self.jobs, bool) or self.jobs < 1:
            raise ConfigError(f"GeneratorParams.jobs must be an integer >= 1, got {self.jobs!r}")
        unknown = [s for s in self.shapes if s not in SHAPES]
        if isinstance(self.shapes, str) or not self.shapes or unknown:
            raise ConfigError(
                f"GeneratorParams.shapes must be a non-empty tuple of {', '.join(SHAPES)}; "
                f"got {self.shapes!r}"
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int_range(name: str, value: object, minimum: int) -> None:
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and minimum <= value[0] <= value[1]
    )
    if not ok:
        raise ConfigError(
            f"GeneratorParams.{name} must be (low, high) integers with {minimum} <= low <= high, "
            f"got {value!r}"
        )


def _range(name: str, value: object, *, positive: bool) -> None:
    ok = (
        isinstance(value, tuple)
        and len(value) == 2
        and all(_is_number(v) and math.isfinite(v) for v in value)
        and (value[0] > 0 or not positive)
        and value[0] <= value[1]
    )
    if not ok:
        raise ConfigError(
            f"GeneratorParams.{name} must be (low, high) finite numbers with "
            f"{'0 < ' if positive else ''}low <= high, got {value!r}"
        )


def generate_spec(
    seed: int, params: GeneratorParams | None = None, **overrides: Any
) -> dict[str, Any]:
    """A workload spec (a JSON-ready dict) drawn from ``params`` (default
    :class:`GeneratorParams`) with ``overrides`` of its fields, by ``seed``."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ConfigError(f"generate_spec needs an integer seed, got {seed!r}")
    base = GeneratorParams() if params is None else params
    if overrides:
        fields = {f.name for f in dataclasses.fields(GeneratorParams)}
        unknown = sorted(set(overrides) - fields)
        if unknown:
            raise ConfigError(
                f"unknown generator parameter(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(sorted(fields))}"
            )
        base = dataclasses.replace(base, **overrides)
    return _Generator(random.Random(seed), base).spec(seed)


def generate_workload(
    seed: int, params: GeneratorParams | None = None, **overrides: Any
) -> Workload:
    """:func:`generate_spec`, parsed and validated."""
    return parse_workload(generate_spec(seed, params, **overrides), source=f"generated-{seed}")


def expected_utilization(
    workload: Workload,
    *,
    load: float = 1.0,
    workers: int | None = None,
    lanes: int = 1,
    host_lanes: int = 0,
) -> float:
    """The fraction of the GPU lanes' time a workload's jobs keep busy at ``load``: the job
    rate of each workflow's client (weight * load / mean interval) times its tasks' seconds,
    over ``workers * lanes`` (``workers``: the spec's ``cluster.workers`` by default). With
    ``host_lanes``, model-less tasks leave the GPU lanes. Model loads are not counted."""
    n = workload.cluster.workers if workers is None else workers
    interval_s = workload.arrivals.mean_interval_ms_per_client / 1000.0
    busy = 0.0
    for name, wf in workload.workflows.items():
        seconds = sum(
            t.profile.exec_s for t in wf.tasks.values() if not (host_lanes and t.model is None)
        )
        busy += workload.weights.get(name, 1.0) * load / interval_s * seconds
    return busy / (n * lanes)


def summary_line(workload: Workload) -> str:
    """One line: workflows, models, model GB against the cache, workers, utilization at load 1."""
    total = sum(workload.models.values())
    cache = workload.cluster.gpu_memory_bytes
    return (
        f"{workload.name}: {len(workload.workflows)} workflows, {len(workload.models)} models, "
        f"{total / 1e9:.1f} GB of models vs {cache / 1e9:.1f} GB cache per worker "
        f"({total / cache:.2f}x), {workload.cluster.workers} workers, expected utilization "
        f"{expected_utilization(workload):.2f} at load 1"
    )


@dataclass(slots=True)
class _Task:
    name: str
    after: list[str]
    join: bool
    needs_model: bool = True
    model: str | None = None
    exec_ms: float = 0.0
    output_kb: float = 0.0
    input_kb: float = 0.0
    #: a step-wise task's steps (1: a plain one) and state per step
    steps: int = 1
    state_kb: float = 0.0
    #: a step-wise task's step batch: the most jobs, and each extra one's share of a step
    batch: int = 1
    batch_item: float = 0.0


class _Generator:
    """The draws, in one fixed order (so that a seed always gives the same spec)."""

    def __init__(self, rng: random.Random, params: GeneratorParams) -> None:
        self.rng = rng
        self.p = params

    def log_uniform(self, bounds: _Range, digits: int) -> float:
        low, high = bounds
        value = math.exp(self.rng.uniform(math.log(low), math.log(high)))
        # rounding never leaves the range: both ends are given to at most `digits` places in
        # practice, and the clamp covers the rest
        return min(max(round(value, digits), low), high)

    def spec(self, seed: int) -> dict[str, Any]:
        p, rng = self.p, self.rng
        n_workflows = rng.randint(*p.workflows)
        shapes = [rng.choice(p.shapes) for _ in range(n_workflows)]
        flows = [self.shape(shape) for shape in shapes]
        tasks = [t for flow in flows for t in flow]
        for t in tasks:
            chance = p.join_no_model if t.join else p.task_no_model
            t.needs_model = rng.random() >= chance
        needs_model = [t for t in tasks if t.needs_model]
        no_model = [t for t in tasks if not t.needs_model]
        rng.shuffle(no_model)
        while len(needs_model) < min(p.models[0], len(tasks)):
            flipped = no_model.pop()
            flipped.needs_model = True
            needs_model.append(flipped)
        n_models = min(rng.randint(*p.models), len(needs_model))
        names = [f"m{i:02d}" for i in range(n_models)]
        sizes_mb, cache_mb, ratio = self.models(n_models)
        order = list(range(len(needs_model)))
        rng.shuffle(order)
        # every model is used by some task; the rest pick models at random (shared models)
        for k, i in enumerate(order):
            needs_model[i].model = names[k] if k < n_models else rng.choice(names)
        for t in tasks:
            t.exec_ms = self.log_uniform(p.exec_ms if t.needs_model else p.host_exec_ms, 2)
            t.output_kb = self.log_uniform(p.output_kb, 1)
            if not t.after:
                t.input_kb = self.log_uniform(p.input_kb, 1)
        if p.stepwise > 0:
            self.steps(tasks, random.Random(f"steps-{seed}"))
            self.step_batches(tasks, random.Random(f"step-batches-{seed}"))
        weights = [round(1.0 / (k + 1) ** p.zipf_s, 4) for k in range(n_workflows)]
        workers = rng.randint(*p.workers)
        target = rng.uniform(*p.utilization)
        # lane-seconds of one job of the popularity mix
        work_s = [sum(t.exec_ms for t in flow) / 1000.0 for flow in flows]
        mean_work_s = sum(w * s for w, s in zip(weights, work_s, strict=True)) / sum(weights)
        rate = target * workers / mean_work_s  # jobs per second, every client together
        interval_ms = 1000.0 * sum(weights) / rate
        workflows = {
            f"wf{i}_{shape}": {
                "shape": shape,
                "weight": weights[i],
                "tasks": {t.name: _task_json(t) for t in flow},
            }
            for i, (shape, flow) in enumerate(zip(shapes, flows, strict=True))
        }
        return {
            "name": f"generated-{seed}",
            "about": (
                f"Drawn by compass.workflow.generate from seed {seed}: {n_workflows} workflows "
                f"of Zipf popularity (s={p.zipf_s:g}), {n_models} models "
                f"({sum(sizes_mb) / 1000:.1f} GB, {ratio:.2f}x one cache), "
                f"{target:.2f} GPU utilization at load 1. Sizes in MB, times in ms."
            ),
            "generator": {"seed": seed, "utilization": round(target, 6), "cache_ratio": ratio},
            "cluster": {
                "workers": workers,
                "gpu_memory_mb": cache_mb,
                "h2d_gbps": p.h2d_gbps,
                "d2h_gbps": p.d2h_gbps,
                "net_gbps": p.net_gbps,
                "net_fixed_us": p.net_fixed_us,
            },
            "models": {name: {"size_mb": size} for name, size in zip(names, sizes_mb, strict=True)},
            "workflows": workflows,
            "arrivals": {
                "mean_interval_ms_per_client": round(interval_ms, 3),
                "jobs": p.jobs,
                "processes": ["uniform", "poisson", "gamma"],
                "gamma_cv": p.gamma_cv,
            },
        }

    def steps(self, tasks: list[_Task], rng: random.Random) -> None:
        """Draw which long model tasks run in steps, their step time and state (from ``rng``,
        a generator of their own: the rest of the spec is drawn as without steps)."""
        p = self.p
        for t in tasks:
            chosen = rng.random() < p.stepwise
            step_ms = math.exp(rng.uniform(*map(math.log, p.step_ms)))
            state_kb = math.exp(rng.uniform(*map(math.log, p.state_kb)))
            if chosen and t.model is not None and t.exec_ms >= p.step_min_ms:
                t.steps = max(2, round(t.exec_ms / step_ms))
                t.state_kb = round(state_kb, 1)

    def step_batches(self, tasks: list[_Task], rng: random.Random) -> None:
        """Draw each step-wise task's step batch curve (from ``rng``, a generator of its own)."""
        p = self.p
        for t in tasks:
            item = math.exp(rng.uniform(*map(math.log, p.step_item)))
            if t.steps > 1 and p.step_batch > 1:
                t.batch, t.batch_item = p.step_batch, round(item, 3)

    def shape(self, shape: str) -> list[_Task]:
        p, rng = self.p, self.rng
        if shape == "chain":
            n = rng.randint(*p.chain_length)
            return [_Task(f"step{i}", [f"step{i - 1}"] if i else [], False) for i in range(n)]
        if shape == "fan":
            width = rng.randint(*p.fan_width)
            split = _Task("split", [], False)
            parts = [_Task(f"part{i}", ["split"], False) for i in range(width)]
            return [split, *parts, _Task("merge", [t.name for t in parts], True)]
        if shape == "diamond":
            split = _Task("split", [], False)
            branches = [self.branch(side, "split", rng.randint(*p.branch_length)) for side in "lr"]
            merge = _Task("merge", [b[-1].name for b in branches], True)
            return [split, *branches[0], *branches[1], merge]
        # mix: a lead-in, branches, a join, a tail, and maybe a side sink
        lead = [_Task("lead0", [], False), _Task("lead1", ["lead0"], False)]
        branches = [
            self.branch(f"b{i}_", "lead1", rng.randint(1, 2)) for i in range(rng.randint(2, 3))
        ]
        merge = _Task("merge", [b[-1].name for b in branches], True)
        tail_n = rng.randint(1, 2)
        tail = [_Task(f"tail{i}", [f"tail{i - 1}" if i else "merge"], False) for i in range(tail_n)]
        side = [_Task("side", [branches[0][0].name], False)] if rng.random() < 0.5 else []
        return [*lead, *(t for b in branches for t in b), merge, *tail, *side]

    @staticmethod
    def branch(prefix: str, after: str, n: int) -> list[_Task]:
        return [
            _Task(f"{prefix}{i}", [f"{prefix}{i - 1}" if i else after], False) for i in range(n)
        ]

    def models(self, n: int) -> tuple[list[int], float, float]:
        """Sizes (MB), the cache (MB) and its ratio: total / cache in ``cache_ratio`` and the
        largest model plus the headroom fitting in the cache."""
        p = self.p
        mb = (p.model_gb[0] * 1000.0, p.model_gb[1] * 1000.0)
        for _ in range(100):
            sizes = [int(self.log_uniform(mb, 0)) for _ in range(n)]
            total = sum(sizes)
            most = total / (max(sizes) + p.cache_headroom_mb)
            if most >= p.cache_ratio[0]:
                break
        else:
            raise ConfigError(
                f"cannot draw {n} models of {p.model_gb} GB whose total is at least "
                f"{p.cache_ratio[0]}x a cache holding the largest one plus "
                f"{p.cache_headroom_mb} MB; allow more models or a lower cache_ratio"
            )
        ratio = self.rng.uniform(p.cache_ratio[0], min(p.cache_ratio[1], most))
        # rounded up to 0.1 MB: the cache never shrinks below the largest model's need
        cache_mb = math.ceil(total / ratio * 10.0) / 10.0
        return sizes, cache_mb, round(total / cache_mb, 6)


def _task_json(t: _Task) -> dict[str, Any]:
    entry: dict[str, Any] = {"model": t.model, "exec_ms": t.exec_ms}
    if t.steps > 1:
        entry.update(steps=t.steps, state_kb=t.state_kb)
    if t.batch > 1:
        entry.update(batch=t.batch, batch_item=t.batch_item)
    if not t.after:
        entry["input_kb"] = t.input_kb
    entry["output_kb"] = t.output_kb
    entry["after"] = list(t.after)
    return entry
