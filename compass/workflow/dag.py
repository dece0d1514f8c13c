"""Workflows: named DAGs of tasks, validated once, with the orders and ranks the planner needs.

A :class:`Workflow` is immutable after construction. Everything the planner asks of it on its
hot path (topological order, predecessor lists, task positions) is computed in ``__init__``;
upward ranks are computed on first use and cached per bandwidth.
"""

from __future__ import annotations

import functools
import heapq
import inspect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from compass.errors import InvalidInputs, ModelTooLarge, WorkflowError
from compass.workflow.choices import Unfolding
from compass.workflow.seats import Seat, is_step_batch

__all__ = [
    "Task",
    "TaskProfile",
    "Workflow",
    "batch_limit",
    "batch_scale",
    "is_stepwise",
    "linear_scale",
]


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def linear_scale(item: float, size: int) -> tuple[float, ...]:
    """A batch curve where each item past the first adds ``item`` of one run: the multiples
    for batches of 1..``size`` (``item=1``: no gain; 0.15: a mild one; 0.05: a strong one)."""
    if not _is_number(item) or not 0 <= item <= 1:
        raise WorkflowError(
            f"a batch item cost must be a fraction of one run in [0, 1], got {item!r}"
        )
    return tuple(1.0 + item * b for b in range(size))


def batch_scale(scale: Sequence[float], size: int) -> float:
    """The cost of a batch of ``size`` as a multiple of one run, from a per-size ``scale``
    (empty: no gain; past its end, each item adds the table's last step)."""
    if size <= 1:
        return 1.0
    if not scale:
        return float(size)
    if size <= len(scale):
        return scale[size - 1]
    step = scale[-1] - scale[-2] if len(scale) >= 2 else 1.0
    return scale[-1] + step * (size - len(scale))


def emulated_run_s(lead: TaskProfile, members: Sequence[TaskProfile]) -> float:
    """Seconds an emulated run of ``members`` (a batch led by ``lead``, or ``lead`` alone)
    takes: its longest member's expected time times ``lead``'s batch curve at the run's size.
    The worker's executor and the simulator both time emulated runs by it."""
    return max(m.exec_s for m in members) * batch_scale(lead.batch_scale, len(members))


def batch_key(model: str, steps: int) -> str:
    """What the batches of a model's tasks are counted under, in queues and in views: the model
    for tasks whose calls batch, ``MODEL/steps`` for step-wise tasks, whose steps batch (a
    running step batch takes a task at its next step, a queued batch only before it starts)."""
    return f"{model}/steps" if steps > 1 else model


def batch_limit(scale: Sequence[float], size: int) -> int:
    """The largest batch, up to ``size``, whose every extra item costs less than one run."""
    n = 1
    while n < size and batch_scale(scale, n + 1) - batch_scale(scale, n) < 1.0:
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class TaskProfile:
    """What a task is expected to cost, as declared by the workflow's author.

    ``exec_ms``: expected execution time in milliseconds; ``output_bytes``: size of its output;
    ``input_bytes``: size of the job input a root task receives (0 for other tasks).
    ``batch_scale``: what a batch of ``b`` items costs, as a multiple of one run, for ``b`` =
    1, 2, ... (so it starts at 1.0 and never falls); a batch larger than the table adds its last
    step per item. Empty: no gain, a batch of ``b`` costs ``b`` runs.
    ``steps``: how many steps a step-wise task is expected to take (1: a plain task, one step);
    ``exec_ms`` counts all of them, so one takes ``step_ms`` on average. ``state_bytes``: what
    a step-wise task's state grows by per step (for a generator over an LLM, its KV cache): a
    task suspended at a step boundary holds that many bytes per step done in its worker's cache
    until it resumes (:mod:`compass.core.preempt`).
    """

    exec_ms: float
    output_bytes: int
    input_bytes: int = 0
    batch_scale: tuple[float, ...] = ()
    steps: int = 1
    state_bytes: int = 0

    def __post_init__(self) -> None:
        if not _is_number(self.exec_ms) or not self.exec_ms >= 0:
            raise WorkflowError(f"TaskProfile.exec_ms must be a number >= 0, got {self.exec_ms!r}")
        for field_name in ("output_bytes", "input_bytes", "state_bytes"):
            value = getattr(self, field_name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise WorkflowError(
                    f"TaskProfile.{field_name} must be an integer >= 0, got {value!r}"
                )
        scale = self.batch_scale
        if isinstance(scale, str) or not isinstance(scale, Iterable):
            raise WorkflowError(f"TaskProfile.batch_scale must be a sequence, got {scale!r}")
        scale = tuple(scale)
        if scale and (
            not all(_is_number(x) for x in scale)
            or scale[0] != 1.0
            or any(b < a for a, b in itertools.pairwise(scale))
        ):
            raise WorkflowError(
                "TaskProfile.batch_scale must start at 1.0 and never fall (the cost of a batch "
                f"of 1, 2, ... items as a multiple of one run), got {list(scale)!r}"
            )
        object.__setattr__(self, "batch_scale", scale)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 1:
            raise WorkflowError(f"TaskProfile.steps must be an integer >= 1, got {self.steps!r}")

    @property
    def step_ms(self) -> float:
        """Expected milliseconds of one step (all of a plain task's one)."""
        return self.exec_ms / self.steps

    def batch_ms(self, size: int) -> float:
        """Expected milliseconds of a batch of ``size`` items (:func:`batch_scale`)."""
        return self.exec_ms * batch_scale(self.batch_scale, size)

    @property
    def exec_s(self) -> float:
        """Expected execution time in seconds."""
        return self.exec_ms / 1000.0


def _as_is(made: Any) -> Any:
    return made


def is_stepwise(fn: Callable[..., Any] | None) -> bool:
    """Whether ``fn`` runs in steps: a generator function, sync or async (a
    ``functools.partial`` of one too). Its final output is what it returns; one that returns
    nothing (None) has its last item as its final output."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn is not None and (inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn))


@dataclass(frozen=True, slots=True)
class Task:
    """One step of a workflow.

    The calling convention lives in :meth:`call`: ``fn(model_module_or_None, **kwargs)`` where a
    root task's keywords are job inputs (those named in ``inputs``, or every job input when
    ``inputs`` is None), any other task's are its predecessors' outputs (one per task in
    ``after``), each under its own name unless ``params`` renames it (source -> parameter), plus
    one keyword per name in ``resources``, the worker process's instance from ``provider``. So
    one function can serve several tasks with different sources. ``fn=None`` marks an emulated
    task (it stands in for compute with its profile).
    """

    name: str
    model: str | None
    after: tuple[str, ...]
    profile: TaskProfile
    fn: Callable[..., Any] | None = None
    #: a run past it fails its job with CompassTimeout (None: the worker's --task-timeout)
    timeout_ms: float | None = None
    #: the job inputs a root task takes (None: every one the job has)
    inputs: tuple[str, ...] | None = None
    #: source (job input or predecessor) -> the parameter it is passed as, where they differ
    params: Mapping[str, str] = field(default_factory=dict, hash=False)
    #: per-process resources passed by name (``provider(name)`` gives the instance)
    resources: tuple[str, ...] = ()
    provider: Callable[[str], Any] | None = field(default=None, compare=False)
    #: the most items one run takes (1: no batching). A batched task's function gets a list
    #: per keyword (one item per job) and returns a list of outputs, one per item
    batch: int = 1
    #: its function is a generator (sync or async): it runs in steps, each ``yield`` ending one
    #: with a partial output, and can be stopped between two (:func:`is_stepwise`); or a step
    #: function over a batch's seats (:func:`~compass.workflow.seats.step_batch`). Set from
    #: ``fn``, not passed
    stepwise: bool = field(default=False, init=False)
    #: the predecessors (of ``after``) whose partial outputs it takes as they come, each as an
    #: iterator argument: it starts at their first step, not at their end (a streamed edge)
    streamed: frozenset[str] = frozenset()
    #: a model-less ``async def`` task run on the worker's event loop, not in a thread
    #: (:meth:`WorkflowBuilder.task <compass.app.WorkflowBuilder.task>`)
    on_loop: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkflowError(f"a task name must be a non-empty string, got {self.name!r}")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise WorkflowError(
                f"task {self.name!r}: model must be a non-empty string or None, got {self.model!r}"
            )
        after = self._names("after", self.after, "a sequence of task names", "task name")
        # accept any iterable for convenience but store the tuple the type promises
        object.__setattr__(self, "after", after)
        if not isinstance(self.profile, TaskProfile):
            raise WorkflowError(
                f"task {self.name!r}: profile must be a TaskProfile, got {self.profile!r}"
            )
        if self.fn is not None and not callable(self.fn):
            raise WorkflowError(f"task {self.name!r}: fn must be callable or None")
        if self.timeout_ms is not None and (
            isinstance(self.timeout_ms, bool)
            or not isinstance(self.timeout_ms, int | float)
            or not self.timeout_ms > 0
        ):
            raise WorkflowError(
                f"task {self.name!r}: timeout_ms must be a positive number of milliseconds "
                f"or None, got {self.timeout_ms!r}"
            )
        if isinstance(self.batch, bool) or not isinstance(self.batch, int) or self.batch < 1:
            raise WorkflowError(
                f"task {self.name!r}: batch must be an integer >= 1 (the most items one run "
                f"takes), got {self.batch!r}"
            )
        if self.batch > 1 and self.model is None:
            raise WorkflowError(
                f"task {self.name!r}: only a task with a model batches (batch={self.batch})"
            )
        object.__setattr__(self, "stepwise", is_stepwise(self.fn) or is_step_batch(self.fn))
        if self.batch > 1 and is_stepwise(self.fn):
            raise WorkflowError(
                f"task {self.name!r}: a generator runs one job (batch={self.batch}); to batch "
                "its steps across jobs, write a step function over a batch's seats "
                "(@compass.step_batch)"
            )
        if self.profile.steps > 1 and self.fn is not None and not self.stepwise:
            raise WorkflowError(
                f"task {self.name!r} expects {self.profile.steps} steps, but its function is "
                "not a generator: a plain function is one step (yield to end a step)"
            )
        self._check_sources()
        self._check_streamed()
        if self.on_loop:
            self._check_on_loop()

    def _check_on_loop(self) -> None:
        fn = self.fn  # (inspect sees through a functools.partial)
        plain = fn is not None and not inspect.iscoroutinefunction(fn)
        why = (
            "it runs in steps" if self.stepwise
            else "its function is not 'async def'" if plain
            else f"it has a model ({self.model!r}), whose compute blocks" if self.model is not None
            else "it reads a stream, whose reads block" if self.streamed
            else None
        )  # fmt: skip
        if why is not None:
            raise WorkflowError(
                f"task {self.name!r} cannot run on the worker's event loop (on_loop=True): {why}; "
                "only a model-less async def task that awaits can"
            )

    def _check_streamed(self) -> None:
        streamed = self.streamed
        if isinstance(streamed, str) or not isinstance(streamed, Iterable):
            raise WorkflowError(
                f"task {self.name!r}: 'streamed' must be a set of task names, got {streamed!r}"
            )
        streamed = frozenset(streamed)
        unknown = sorted(s for s in streamed if s not in self.after)
        if unknown:
            raise WorkflowError(
                f"task {self.name!r} takes {', '.join(map(repr, unknown))} as a stream, which "
                f"is not in its 'after' ({', '.join(map(repr, self.after)) or 'none'})"
            )
        if streamed and self.batch > 1:
            raise WorkflowError(
                f"task {self.name!r}: a task fed by a stream does not batch (batch={self.batch})"
            )
        object.__setattr__(self, "streamed", streamed)

    def _names(self, what: str, value: object, kind: str, noun: str) -> tuple[str, ...]:
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise WorkflowError(f"task {self.name!r}: {what!r} must be {kind}, got {value!r}")
        names = tuple(value)
        for item in names:
            if not isinstance(item, str) or not item:
                raise WorkflowError(
                    f"task {self.name!r}: {what!r} holds {item!r}, which is not a {noun}"
                )
        return names

    def _check_sources(self) -> None:
        if self.inputs is not None:
            inputs = self._names("inputs", self.inputs, "a sequence of job input names", "name")
            if self.after:
                raise WorkflowError(
                    f"task {self.name!r}: only a root task takes job inputs; this one waits for "
                    f"{', '.join(map(repr, self.after))} (pass what it needs through them)"
                )
            if len(set(inputs)) != len(inputs):
                raise WorkflowError(f"task {self.name!r}: 'inputs' {list(inputs)} repeat a name")
            object.__setattr__(self, "inputs", inputs)
        resources = self._names("resources", self.resources, "a sequence of resource names", "name")
        if len(set(resources)) != len(resources):
            raise WorkflowError(f"task {self.name!r}: 'resources' {list(resources)} repeat a name")
        object.__setattr__(self, "resources", resources)
        if resources and not callable(self.provider):
            raise WorkflowError(
                f"task {self.name!r} uses resources {list(resources)} but has no provider"
            )
        if not isinstance(self.params, Mapping):
            raise WorkflowError(
                f"task {self.name!r}: params must map sources to parameter names, "
                f"got {self.params!r}"
            )
        sources = self.after if self.after else (self.inputs or ())
        for source, param in self.params.items():
            if source not in sources:
                where = "'after'" if self.after else "'inputs'"
                raise WorkflowError(
                    f"task {self.name!r}: params renames {source!r}, which is not in its {where}"
                )
            if not isinstance(param, str) or not param.isidentifier():
                raise WorkflowError(
                    f"task {self.name!r}: {source!r} must be passed as a parameter name, "
                    f"got {param!r}"
                )
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        # a repeated source is the workflow's error to report (it names the dependency)
        passed = [self.params.get(s, s) for s in dict.fromkeys(sources)] + list(resources)
        twice = sorted({p for p in passed if passed.count(p) > 1})
        if twice:
            raise WorkflowError(
                f"task {self.name!r} would pass parameter(s) {', '.join(map(repr, twice))} twice"
            )
        if self.fn is not None:
            # complete when the sources are known: a root without 'inputs' gets whatever the job has
            self._check_signature(passed, complete=bool(self.after) or self.inputs is not None)

    def _check_signature(self, passed: list[str], complete: bool) -> None:
        """Fail at declaration, not at the first job, when ``fn`` cannot take what it gets."""
        try:
            signature = inspect.signature(self.fn)  # type: ignore[arg-type]
        except (TypeError, ValueError):  # some builtins and C callables have none
            return
        bind = signature.bind if complete else signature.bind_partial
        try:
            bind(None, **dict.fromkeys(passed))
        except TypeError as exc:
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            given = ", ".join(["module", *passed])
            raise WorkflowError(
                f"task {self.name!r}: {name}{signature} cannot be called with ({given}): {exc}"
            ) from None

    def arguments(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments from what arrived: the job's inputs (a root) or predecessors'
        outputs by task name. Resources are not included (see :meth:`call`)."""
        if self.after:
            names: Iterable[str] = self.after
        elif self.inputs is None:
            names = inputs
        else:
            names = self.inputs
            missing = [n for n in names if n not in inputs]
            if missing:
                raise InvalidInputs(
                    f"task {self.name!r} takes job input(s) {', '.join(map(repr, missing))}, "
                    f"which this job does not have (it has: {', '.join(map(repr, inputs))})"
                )
        return {self.params.get(n, n): inputs[n] for n in names}

    def take_inputs(self, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
        """The job inputs a root task needs (all of them when ``inputs`` is None)."""
        if self.inputs is None:
            return inputs
        return {n: inputs[n] for n in self.inputs if n in inputs}

    def call(self, module: Any, inputs: Mapping[str, Any]) -> Any:
        """Run ``fn`` on what arrived for this task (see the class docstring)."""
        if self.fn is None:
            raise WorkflowError(f"task {self.name!r} is emulated and has no function to call")
        kwargs = self.arguments(inputs)
        if self.resources:
            assert self.provider is not None  # checked in __post_init__
            for name in self.resources:
                kwargs[name] = self.provider(name)
        return self.fn(module, **kwargs)

    def call_steps(
        self, module: Any, seats: Sequence[Seat], awaited: Callable[[Any], Any] = _as_is
    ) -> list[Any]:
        """One step of a step function (:func:`~compass.workflow.seats.step_batch`) over a
        batch's ``seats``, resources as keywords; one item per seat. ``awaited``: what the
        function returned, run to its end where it is a coroutine (an ``async def`` step
        function; the caller's thread knows how)."""
        if self.fn is None:
            raise WorkflowError(f"task {self.name!r} is emulated and has no function to call")
        kwargs: dict[str, Any] = {}
        if self.resources:
            assert self.provider is not None
            for name in self.resources:
                kwargs[name] = self.provider(name)
        items = awaited(self.fn(module, list(seats), **kwargs))
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Iterable):
            raise WorkflowError(
                f"step function {self.name!r} must return one item per seat (a list), got "
                f"{type(items).__name__}"
            )
        items = list(items)
        if len(items) != len(seats):
            raise WorkflowError(
                f"step function {self.name!r} returned {len(items)} items for {len(seats)} seats"
            )
        return items

    def call_batch(
        self,
        module: Any,
        arguments: Sequence[Mapping[str, Any]],
        awaited: Callable[[Any], Any] = _as_is,
    ) -> list[Any]:
        """Run ``fn`` once on several jobs' arguments (each item's :meth:`arguments`): each
        keyword is passed as a list with one value per item, resources once; returns one output
        per item. An output that is an ``Exception`` instance fails its item alone.
        ``awaited``: as :meth:`call_steps`'."""
        if self.fn is None:
            raise WorkflowError(f"task {self.name!r} is emulated and has no function to call")
        names = list(arguments[0])
        if any(list(args) != names for args in arguments):
            raise WorkflowError(
                f"batched task {self.name!r}: the items of one batch pass different keywords"
            )
        kwargs: dict[str, Any] = {k: [args[k] for args in arguments] for k in names}
        if self.resources:
            assert self.provider is not None
            for name in self.resources:
                kwargs[name] = self.provider(name)
        outputs = awaited(self.fn(module, **kwargs))
        if isinstance(outputs, str | bytes | Mapping) or not isinstance(outputs, Iterable):
            raise WorkflowError(
                f"batched task {self.name!r} must return one output per item (a list), "
                f"got {type(outputs).__name__}"
            )
        outputs = list(outputs)  # a list, a tuple, a tensor's first dimension
        if len(outputs) != len(arguments):
            raise WorkflowError(
                f"batched task {self.name!r} returned {len(outputs)} outputs for a batch of "
                f"{len(arguments)}"
            )
        return outputs


class Workflow:
    """A validated DAG of tasks.

    Raises :class:`~compass.errors.WorkflowError` naming the problem for an empty workflow,
    duplicate task names, a dependency on an unknown task or on itself, and cycles (naming the
    tasks on the cycle).

    ``tasks`` iterates in topological order (stable: declaration order wherever the
    dependencies allow); ``index`` maps each task to its position in ``order``.
    """

    __slots__ = (
        "_preds",
        "_rank_cache",
        "_streamed_succs",
        "_succs",
        "best_ms",
        "index",
        "inputs",
        "model_order",
        "models",
        "name",
        "order",
        "roots",
        "sinks",
        "slo_ms",
        "slo_x",
        "tasks",
        "unfold",
    )

    name: str
    inputs: tuple[str, ...]
    best_ms: float | None
    tasks: Mapping[str, Task]
    order: tuple[str, ...]
    index: Mapping[str, int]
    roots: tuple[str, ...]
    sinks: tuple[str, ...]
    models: frozenset[str]
    #: the same, sorted: a fixed order (sampling candidates per model must not depend on the
    #: process's string hashing)
    model_order: tuple[str, ...]
    #: the default objective of its jobs (one without ``deadline_ms``): answered within this
    #: many ms, or within this multiple of the workflow's computed best time; None: none
    slo_ms: float | None
    slo_x: float | None
    #: its run-time choices, when it was unrolled from branches, fan-outs or loops
    #: (:func:`compass.workflow.unfold.unfold_workflow`); None: a static workflow
    unfold: Unfolding | None

    def __init__(
        self,
        name: str,
        tasks: Iterable[Task],
        *,
        inputs: Sequence[str] = (),
        best_ms: float | None = None,
        slo_ms: float | None = None,
        slo_x: float | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise WorkflowError(f"a workflow name must be a non-empty string, got {name!r}")
        self.name = name
        if isinstance(inputs, str):
            raise WorkflowError(
                f"workflow {name!r}: inputs must be a sequence of names, not the string {inputs!r}"
            )
        self.inputs = tuple(inputs)
        if len(set(self.inputs)) != len(self.inputs):
            raise WorkflowError(f"workflow {name!r}: inputs {list(self.inputs)} repeat a name")
        if best_ms is not None and (not _is_number(best_ms) or not best_ms > 0):
            raise WorkflowError(f"workflow {name!r}: best_ms must be > 0, got {best_ms!r}")
        self.best_ms = best_ms
        for field_name, value in (("slo_ms", slo_ms), ("slo_x", slo_x)):
            if value is not None and (not _is_number(value) or not 0 < value < math.inf):
                raise WorkflowError(
                    f"workflow {name!r}: {field_name} must be a number > 0, got {value!r}"
                )
        if slo_ms is not None and slo_x is not None:
            raise WorkflowError(f"workflow {name!r}: give slo_ms or slo_x, not both")
        if slo_x is not None and slo_x < 1:
            raise WorkflowError(
                f"workflow {name!r}: slo_x must be >= 1 (no job beats its best time), got {slo_x!r}"
            )
        self.slo_ms, self.slo_x = slo_ms, slo_x

        declared: dict[str, Task] = {}
        for task in tasks:
            if not isinstance(task, Task):
                raise WorkflowError(f"workflow {name!r}: {task!r} is not a Task")
            if task.name in declared:
                raise WorkflowError(f"workflow {name!r}: duplicate task name {task.name!r}")
            declared[task.name] = task
        if not declared:
            raise WorkflowError(f"workflow {name!r} has no tasks")
        for task in declared.values():
            seen: set[str] = set()
            for dep in task.after:
                if dep == task.name:
                    raise WorkflowError(f"workflow {name!r}: task {task.name!r} waits for itself")
                if dep not in declared:
                    raise WorkflowError(
                        f"workflow {name!r}: task {task.name!r} waits for unknown task {dep!r}"
                    )
                if dep in seen:
                    raise WorkflowError(
                        f"workflow {name!r}: task {task.name!r} lists {dep!r} twice in 'after'"
                    )
                seen.add(dep)
            unknown = [n for n in task.inputs or () if self.inputs and n not in self.inputs]
            if unknown:
                raise WorkflowError(
                    f"workflow {name!r}: task {task.name!r} takes job input(s) "
                    f"{', '.join(map(repr, unknown))}, which the workflow does not declare "
                    f"(its inputs: {', '.join(map(repr, self.inputs))})"
                )

        order = _topological_order(name, declared)
        self.order = order
        self.tasks = MappingProxyType({t: declared[t] for t in order})
        self.index = MappingProxyType({t: i for i, t in enumerate(order)})
        succs: dict[str, list[str]] = {t: [] for t in order}
        for t in order:
            for dep in declared[t].after:
                succs[dep].append(t)
        self._preds = {t: declared[t].after for t in order}
        self._succs = {t: tuple(s) for t, s in succs.items()}
        self._streamed_succs = {
            t: tuple(s for s in ss if t in declared[s].streamed) for t, ss in self._succs.items()
        }
        _check_streams(name, declared)
        self.roots = tuple(t for t in order if not declared[t].after)
        self.sinks = tuple(t for t in order if not succs[t])
        self.models = frozenset(t.model for t in declared.values() if t.model is not None)
        self.model_order = tuple(sorted(self.models))
        self._rank_cache: dict[float, Mapping[str, float]] = {}
        self.unfold = None

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, tasks={list(self.order)})"

    def __len__(self) -> int:
        return len(self.order)

    def _known(self, task: str) -> str:
        if task not in self._preds:
            raise WorkflowError(f"workflow {self.name!r} has no task {task!r}")
        return task

    def preds(self, task: str) -> tuple[str, ...]:
        """The tasks ``task`` waits for, in declaration order."""
        return self._preds[self._known(task)]

    def succs(self, task: str) -> tuple[str, ...]:
        """The tasks that wait for ``task``, in topological order."""
        return self._succs[self._known(task)]

    def streamed_succs(self, task: str) -> tuple[str, ...]:
        """The successors that take ``task``'s partial outputs as they come (streamed edges),
        in topological order."""
        return self._streamed_succs[self._known(task)]

    def is_join(self, task: str) -> bool:
        """Whether ``task`` waits for two or more tasks (its inputs must meet on one worker)."""
        return len(self._preds[self._known(task)]) >= 2

    def upward_rank(self, bytes_per_s: float) -> Mapping[str, float]:
        """HEFT upward rank in seconds, from the declared profiles.

        ``rank(t) = exec(t) + max over successors s of (output(t) / bytes_per_s + rank(s))``.
        Cached per bandwidth.
        """
        if not _is_number(bytes_per_s) or not bytes_per_s > 0:
            raise WorkflowError(f"upward_rank: bytes_per_s must be > 0, got {bytes_per_s!r}")
        key = float(bytes_per_s)
        cached = self._rank_cache.get(key)
        if cached is not None:
            return cached
        rank: dict[str, float] = {}
        for t in reversed(self.order):
            profile = self.tasks[t].profile
            xfer = profile.output_bytes / key
            tail = max((xfer + rank[s] for s in self._succs[t]), default=0.0)
            rank[t] = profile.exec_s + tail
        result = MappingProxyType({t: rank[t] for t in self.order})
        self._rank_cache[key] = result
        return result

    def check_models(self, model_sizes: Mapping[str, int], capacity_bytes: int | None) -> None:
        """Every model must be known, and (when ``capacity_bytes`` is given) fit in it.

        Raises :class:`~compass.errors.WorkflowError` for an unknown model and
        :class:`~compass.errors.ModelTooLarge` for one larger than ``capacity_bytes``.
        """
        for t in self.order:
            model = self.tasks[t].model
            if model is None:
                continue
            if model not in model_sizes:
                raise WorkflowError(
                    f"workflow {self.name!r}: task {t!r} uses unknown model {model!r} "
                    f"(known: {', '.join(sorted(model_sizes)) or 'none'})"
                )
            size = model_sizes[model]
            if capacity_bytes is not None and size > capacity_bytes:
                raise ModelTooLarge(
                    f"workflow {self.name!r}: model {model!r} ({size} B) is larger than the "
                    f"GPU cache ({capacity_bytes} B); give workers more cache memory",
                    detail={"model": model, "bytes": size, "capacity": capacity_bytes},
                )

    def check_inputs(self, inputs: Mapping[str, Any]) -> None:
        """With declared ``inputs``, the job's inputs must be exactly those names.

        Raises :class:`~compass.errors.InvalidInputs` naming the missing and the unexpected
        names. A workflow that declares no inputs accepts any.
        """
        if not self.inputs:
            return
        missing = [n for n in self.inputs if n not in inputs]
        unexpected = sorted(str(n) for n in inputs if n not in self.inputs)
        if not missing and not unexpected:
            return
        parts = []
        if missing:
            parts.append(f"missing {', '.join(repr(n) for n in missing)}")
        if unexpected:
            parts.append(f"unexpected {', '.join(repr(n) for n in unexpected)}")
        raise InvalidInputs(
            f"workflow {self.name!r}: bad inputs: {'; '.join(parts)} "
            f"(expected {', '.join(repr(n) for n in self.inputs)})",
            detail={"missing": missing, "unexpected": unexpected},
        )


def _check_streams(workflow: str, tasks: Mapping[str, Task]) -> None:
    """A streamed edge needs a predecessor that runs in steps: a plain one has no partial
    outputs to give before its end."""
    for task in tasks.values():
        for source in sorted(task.streamed):
            pred = tasks[source]
            if not (pred.stepwise or (pred.fn is None and pred.profile.steps > 1)):
                raise WorkflowError(
                    f"workflow {workflow!r}: task {task.name!r} takes {source!r} as a stream, "
                    f"but {source!r} does not run in steps (make it a generator, or give an "
                    "emulated task steps > 1)"
                )


def _topological_order(workflow: str, tasks: Mapping[str, Task]) -> tuple[str, ...]:
    """Kahn's algorithm, always taking the earliest-declared ready task (a stable order)."""
    position = {t: i for i, t in enumerate(tasks)}
    pending = {t: len(task.after) for t, task in tasks.items()}
    waiters: dict[str, list[str]] = {t: [] for t in tasks}
    for t, task in tasks.items():
        for dep in task.after:
            waiters[dep].append(t)
    ready = [position[t] for t, n in pending.items() if n == 0]
    heapq.heapify(ready)
    names = list(tasks)
    order: list[str] = []
    while ready:
        t = names[heapq.heappop(ready)]
        order.append(t)
        for w in waiters[t]:
            pending[w] -= 1
            if pending[w] == 0:
                heapq.heappush(ready, position[w])
    if len(order) < len(tasks):
        cycle = _find_cycle(tasks, {t for t, n in pending.items() if n > 0})
        raise WorkflowError(
            f"workflow {workflow!r} has a cycle: {' -> '.join(cycle)}",
            detail={"cycle": cycle},
        )
    return tuple(order)


def _find_cycle(tasks: Mapping[str, Task], stuck: set[str]) -> list[str]:
    """A cycle among the tasks Kahn could not order; each of them waits for another stuck task.

    Walks predecessor links from a stuck task until one repeats; the walk is bounded by the
    number of stuck tasks.
    """
    start = next(t for t in tasks if t in stuck)
    path: list[str] = []
    at: dict[str, int] = {}
    t = start
    while t not in at:
        at[t] = len(path)
        path.append(t)
        t = next(d for d in tasks[t].after if d in stuck)
    loop = path[at[t] :]
    # the walk followed 'waits for' links; report in execution direction
    loop.reverse()
    return [*loop, loop[0]]
