"""Workflows decided at run time: branches, fan-outs and bounded loops, unrolled into a DAG.

Three primitives, declared beside the tasks (in Python on the app's workflow builder, or in a
workload spec):

- :class:`Branch`: a task chooses which of its declared successors ``to`` run; the others are
  skipped. Successors it does not name always run.
- :class:`FanOut`: a task's output is a list; successor ``copies`` runs once per item (up to a
  declared ``max_width``), and ``join`` receives the list of their outputs, in item order.
- :class:`Loop`: a sub-workflow ``body`` repeats until its task ``until`` says stop, or
  ``max_iter`` iterations have run (at that bound the body's tasks after ``until`` are
  skipped: the loop cannot go on). Tasks outside the body that wait for ``until`` receive
  the output of its last iteration; the body's entry receives, from the second iteration on,
  the output of the previous iteration's last task as the keyword ``carry``. A loop whose body
  is a part of another loop's body is **nested** in it: it runs, and decides, afresh in each
  outer iteration. Two loops are apart or nested; a nested loop holds neither its outer loop's
  entry nor its ``until`` (so no two loops share an ``until``: a task decides one loop); the
  loops a task is in unroll it at most :data:`MAX_NESTED_ITERATIONS` times (the product of
  their ``max_iter``).

Every bound is declared, so a workflow unrolls into a finite DAG once, at declaration: the
``i``-th iteration of a body task ``t`` is the task ``t@i`` (``t@i.j``: iteration ``j`` of a
nested loop in iteration ``i`` of its outer one), the ``k``-th copy of a fan-out's ``copies`` is
``c#k``. The planner, the profiles, the messages and the traces all see the
unrolled tasks; :attr:`Unfolding.origin` maps each back to the task declared.

**The skip rule** (dead-path elimination, as in BPEL and Airflow's ``none_failed``): an edge
whose source was not chosen, or was itself skipped, is skipped; a task all of whose inputs are
skipped is skipped too, and so are its outgoing edges; a task with at least one input that ran
runs, except that a loop body task's inputs from outside its innermost loop (its entry's
aside: *side inputs*) do not keep it alive, so that an iteration that will not come is skipped
whole. Skipped inputs are dropped from the lists a fan-out's join and a loop's exit receive; a
plain input that was skipped arrives as :data:`SKIPPED`. A job answers once every sink ran or
was skipped, with the outputs of those that ran.

What is decided where: the worker that ran a decision task resolves its choice
(:meth:`Unfolding.route`): from a :class:`Decision` the function returned, or, for an
emulated task (no function: the simulator, benchmarks), drawn from the declared
probabilities with a hash of the job and the task, so that every policy sees the same draws.
"""

from __future__ import annotations

import inspect
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from compass.errors import WorkflowError
from compass.workflow.choices import SKIPPED, ChoicePoint, Unfolding, is_skipped
from compass.workflow.dag import Task, TaskProfile, Workflow, is_stepwise

__all__ = [
    "MAX_NESTED_ITERATIONS",
    "Branch",
    "Declared",
    "FanOut",
    "Loop",
    "likely_workflow",
    "ran_workflow",
    "run_chances",
    "unfold_workflow",
]

#: the iteration and copy separators of unrolled task names; a nested loop's iterations are
#: joined by ``_LEVEL`` (``t@1.2``: iteration 2 of the inner loop in iteration 1 of the outer)
_AT, _COPY, _LEVEL = "@", "#", "."

#: the most instances one declared task may unroll to: the product of the ``max_iter`` of the
#: loops it is in (a loop alone has the same bound on its ``max_iter``)
MAX_NESTED_ITERATIONS = 256


def _weights(
    where: str, given: Mapping[Any, float] | None, keys: Sequence[Any]
) -> tuple[float, ...]:
    """``given`` (relative weights by key, default uniform) as probabilities in ``keys``'s order."""
    if given is None:
        return tuple(1.0 / len(keys) for _ in keys)
    unknown = [k for k in given if k not in keys]
    if unknown:
        raise WorkflowError(f"{where}: {unknown[0]!r} is not one of {list(keys)!r}")
    values = [given.get(k, 0.0) for k in keys]
    if any(isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0 for v in values):
        raise WorkflowError(f"{where}: weights must be numbers >= 0, got {dict(given)!r}")
    total = math.fsum(values)
    if not total > 0 or not math.isfinite(total):
        raise WorkflowError(f"{where}: the weights must add up to a positive number")
    return tuple(v / total for v in values)


@dataclass(frozen=True, slots=True)
class Branch:
    """Task ``task`` runs one of ``to`` (its declared successors), chosen at run time;
    ``to`` maps each to its expected frequency (relative weights; the planner's prior and the
    simulator's draw)."""

    task: str
    to: Mapping[str, float]


@dataclass(frozen=True, slots=True)
class FanOut:
    """Task ``task``'s output is a list of up to ``max_width`` items; ``copies`` (whose only
    predecessor is ``task``) runs once per item; ``join`` gets their outputs as a list.
    ``widths``: expected frequency of each width 0..``max_width`` (default: uniform over
    1..``max_width``). A width of 0 skips the join too (the skip rule: none of its inputs ran)."""

    task: str
    copies: str
    join: str
    max_width: int
    widths: Mapping[int, float] | None = None


@dataclass(frozen=True, slots=True)
class Loop:
    """``body`` (a sub-workflow with one entry) repeats until ``until`` (a body task) says
    stop, at most ``max_iter`` times. ``counts``: expected frequency of each number of
    iterations 1..``max_iter`` (default uniform). ``carry``: the keyword under which the
    body's entry gets the previous iteration's last output."""

    body: tuple[str, ...]
    until: str
    max_iter: int
    counts: Mapping[int, float] | None = None
    carry: str = "carry"


def ran_workflow(workflow: Workflow, ran: Iterable[str]) -> Workflow:
    """The sub-workflow of the tasks in ``ran`` (what one job actually ran), without functions:
    its best time is that job's own."""
    kept = set(ran)
    tasks = [
        replace(
            workflow.tasks[t],
            after=tuple(p for p in workflow.preds(t) if p in kept),
            fn=None,
            params={},
            inputs=None,
            resources=(),
        )
        for t in workflow.order
        if t in kept
    ]
    return Workflow(workflow.name, tasks)


def run_chances(workflow: Workflow, samples: int = 1000) -> dict[str, float]:
    """How often each task of ``workflow`` runs, by drawing ``samples`` jobs' choices as the
    simulator draws them (fixed draws: the same figures every time); 1.0 for every task of a
    static workflow. What a job costs on average: ``sum(chance * exec)``."""
    unfolding = workflow.unfold
    if unfolding is None:
        return dict.fromkeys(workflow.order, 1.0)
    runs = dict.fromkeys(workflow.order, 0)
    for n in range(samples):
        live: set[str] = set()
        for t in workflow.order:
            if workflow.preds(t) and t not in live:
                continue
            runs[t] += 1
            route = unfolding.route(t, None, f"chance{n}|{t}", emulated=True)
            live.update(s for s, _ in route.sends if not unfolding.aside(t, s))
    return {t: count / samples for t, count in runs.items()}


def likely_workflow(workflow: Workflow, likely: Iterable[str] | None = None) -> Workflow:
    """The sub-workflow a job of unrolled ``workflow`` runs when every choice takes its most
    likely option (``likely``: those tasks as learned; default :attr:`Unfolding.likely`, by
    the declared weights): the best time of a typical job (queue rank, ``slo_x``); a static
    workflow is itself."""
    if workflow.unfold is None:
        return workflow
    return ran_workflow(workflow, workflow.unfold.likely if likely is None else likely)


@dataclass(frozen=True, slots=True)
class Declared:
    """What an unrolled workflow was declared as: its tasks and its choices."""

    tasks: tuple[Task, ...]
    branches: tuple[Branch, ...]
    fanouts: tuple[FanOut, ...]
    loops: tuple[Loop, ...]
    #: the same choices with the weights planning starts from, where a spec's ``prior`` gave
    #: them apart from the weights emulated choices are drawn from
    prior: Declared | None = None

    def unfold(self, wf: Workflow, change: Callable[[Task], Task]) -> Workflow:
        """``wf`` (unrolled from this) again, each declared task changed by ``change``."""
        prior = None if self.prior is None else self.prior.choices()
        return unfold_workflow(
            wf.name, [change(t) for t in self.tasks], branches=self.branches,
            fanouts=self.fanouts, loops=self.loops, inputs=wf.inputs, best_ms=wf.best_ms,
            slo_ms=wf.slo_ms, slo_x=wf.slo_x, prior=prior,
        )  # fmt: skip

    def choices(self) -> dict[str, Any]:
        """The choices as :func:`unfold_workflow` takes them."""
        return {"branches": self.branches, "fanouts": self.fanouts, "loops": self.loops}

    def choices_to_dict(self) -> dict[str, Any]:
        """The choices in a workload spec's form (read back by
        :func:`compass.workflow.unfold_spec.parse_choices`)."""
        out = self._choices_to_dict()
        if self.prior is not None:
            out["prior"] = self.prior._choices_to_dict()
        return out

    def _choices_to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.branches:
            out["branches"] = {b.task: dict(b.to) for b in self.branches}
        if self.fanouts:
            out["fanouts"] = {}
            for f in self.fanouts:
                fan = {"copies": f.copies, "join": f.join, "max_width": f.max_width}
                out["fanouts"][f.task] = fan | _spread_to_dict("widths", f.widths)
        if self.loops:
            out["loops"] = {}
            for i, loop in enumerate(self.loops):
                body = {"body": list(loop.body), "until": loop.until, "max_iter": loop.max_iter}
                body["carry"] = loop.carry
                out["loops"][f"loop{i}"] = body | _spread_to_dict("counts", loop.counts)
        return out


def _spread_to_dict(key: str, spread: Mapping[int, float] | None) -> dict[str, Any]:
    return {} if spread is None else {key: {str(k): v for k, v in spread.items()}}


# -- unrolling -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Node:
    """An unrolled task being built: its declared task and its sources, each (instance,
    parameter, mode): "one" passed as is, "any" the first that ran of its group, "list" all
    that ran."""

    origin: Task
    sources: list[tuple[str, str, str]] = field(default_factory=list)
    root: bool = False
    #: the sources from outside its innermost loop, of a body task other than the entry
    side: set[str] = field(default_factory=set)


def unfold_workflow(
    name: str,
    tasks: Iterable[Task],
    *,
    branches: Sequence[Branch] = (),
    fanouts: Sequence[FanOut] = (),
    loops: Sequence[Loop] = (),
    prior: Mapping[str, Any] | None = None,
    **options: Any,
) -> Workflow:
    """A :class:`~compass.workflow.dag.Workflow` of ``tasks`` with run-time ``branches``,
    ``fanouts`` and ``loops``, unrolled to their bounds (the module docstring); ``options``
    are the Workflow's own (``inputs``, ``best_ms``, ``slo_ms``, ``slo_x``). With none of the
    three it is the plain Workflow. ``prior``: the same choices (``branches``, ``fanouts``,
    ``loops``: the same tasks and bounds) with the weights planning starts from, where they
    differ from those emulated choices are drawn from (a spec's ``prior``: to test planning
    that starts from a wrong declaration). Raises :class:`WorkflowError` naming what is wrong."""
    declared = Workflow(name, tasks, **options)  # the declared DAG must be valid by itself
    if not (branches or fanouts or loops):
        if prior:
            raise WorkflowError(f"workflow {name!r}: a prior needs branches, fan-outs or loops")
        return declared
    workflow = _Unroller(declared, branches, fanouts, loops).build(options)
    if prior is not None:
        _with_prior(workflow, _Unroller(declared, **prior).build(options))
    return workflow


def _with_prior(workflow: Workflow, prior: Workflow) -> None:
    """Give ``workflow``'s choice points ``prior``'s weights as the ones planning starts from;
    :class:`WorkflowError` unless both have the same choices, options and labels."""
    unfolding, other = workflow.unfold, prior.unfold
    assert unfolding is not None and other is not None
    points = dict(unfolding.points)

    def shape(point: ChoicePoint) -> tuple[str, dict[str, frozenset[str]]]:
        return point.kind, dict(zip(point.labels, point.options, strict=True))

    if set(points) != set(other.points) or any(
        shape(points[t]) != shape(other.points[t]) for t in points
    ):
        raise WorkflowError(
            f"workflow {workflow.name!r}: its prior must declare the same branches, fan-outs "
            "and loops (the same tasks, options and bounds), only other weights"
        )
    for task, point in points.items():
        weight = dict(zip(other.points[task].labels, other.points[task].weights, strict=True))
        points[task] = replace(point, prior=tuple(weight[label] for label in point.labels))
    assert isinstance(unfolding.declared, Declared) and isinstance(other.declared, Declared)
    declared = replace(unfolding.declared, prior=other.declared)
    workflow.unfold = unfolding.with_points(points, declared)


class _Unroller:
    def __init__(
        self,
        wf: Workflow,
        branches: Sequence[Branch],
        fanouts: Sequence[FanOut],
        loops: Sequence[Loop],
    ) -> None:
        self.wf = wf
        self.name = wf.name
        for t in wf.order:
            if _AT in t or _COPY in t:
                raise WorkflowError(
                    f"workflow {wf.name!r}: task {t!r}: names of a workflow with branches, "
                    f"fan-outs or loops may not hold {_AT!r} or {_COPY!r}"
                )
        self.branches = {b.task: self._check_branch(b) for b in branches}
        self.fanouts = {f.task: self._check_fanout(f) for f in fanouts}
        self.loops = [self._check_loop(loop) for loop in loops]
        #: each task's loops, outermost first (a loop nests in another when its body is a
        #: part of the other's)
        self.chain: dict[str, tuple[Loop, ...]] = self._nest()
        twice = set(self.branches) & set(self.fanouts)
        if twice:
            raise WorkflowError(
                f"workflow {wf.name!r}: task {sorted(twice)[0]!r} both branches and fans out"
            )
        for fan in self.fanouts.values():
            loops_of = {tuple(map(id, self.loops_of(t))) for t in (fan.task, fan.copies, fan.join)}
            if len(loops_of) != 1:
                raise WorkflowError(
                    f"workflow {wf.name!r}: fan-out of {fan.task!r}: {fan.task!r}, "
                    f"{fan.copies!r} and {fan.join!r} must be in the same loop body, or none"
                )

    # -- validation ---------------------------------------------------------------------------

    def _known(self, what: str, task: str) -> str:
        if task not in self.wf.tasks:
            raise WorkflowError(f"workflow {self.name!r}: {what} names unknown task {task!r}")
        return task

    def _check_branch(self, b: Branch) -> Branch:
        self._known("a branch", b.task)
        succs = self.wf.succs(b.task)
        if not isinstance(b.to, Mapping) or len(b.to) < 2:
            raise WorkflowError(
                f"workflow {self.name!r}: branch of {b.task!r}: 'to' must map two or more of "
                f"its successors to their frequency, got {b.to!r}"
            )
        for s in b.to:
            if s not in succs:
                raise WorkflowError(
                    f"workflow {self.name!r}: branch of {b.task!r} names {s!r}, which is not "
                    f"one of its successors ({', '.join(map(repr, succs)) or 'none'})"
                )
        _weights(f"workflow {self.name!r}: branch of {b.task!r}", b.to, list(b.to))
        return b

    def _check_fanout(self, f: FanOut) -> FanOut:
        where = f"workflow {self.name!r}: fan-out of {f.task!r}"
        for t in (f.task, f.copies, f.join):
            self._known("a fan-out", t)
        if self.wf.preds(f.copies) != (f.task,) or self.wf.succs(f.copies) != (f.join,):
            raise WorkflowError(
                f"{where}: {f.copies!r} must wait for {f.task!r} alone and be waited for by "
                f"{f.join!r} alone"
            )
        bound = f.max_width
        if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= 1024:
            raise WorkflowError(f"{where}: max_width must be an integer in 1..1024, got {bound!r}")
        _weights(where, self._widths(f), list(range(bound + 1)))
        return f

    @staticmethod
    def _widths(f: FanOut) -> Mapping[int, float]:
        return f.widths if f.widths is not None else dict.fromkeys(range(1, f.max_width + 1), 1.0)

    def _check_loop(self, loop: Loop) -> Loop:
        body = tuple(loop.body)
        where = f"workflow {self.name!r}: loop of {loop.until!r}"
        if not body:
            raise WorkflowError(f"{where}: its body is empty")
        for t in body:
            self._known("a loop", t)
        if loop.until not in body:
            raise WorkflowError(f"{where}: 'until' must be a task of its body {list(body)}")
        bound = loop.max_iter
        if isinstance(bound, bool) or not isinstance(bound, int) or not 1 <= bound <= 256:
            raise WorkflowError(
                f"{where}: a loop needs a bound: max_iter must be an integer in 1..256, "
                f"got {bound!r}"
            )
        if not isinstance(loop.carry, str) or not loop.carry.isidentifier():
            raise WorkflowError(f"{where}: carry must be a parameter name, got {loop.carry!r}")
        inside = set(body)
        entries = [t for t in body if not any(p in inside for p in self.wf.preds(t))]
        if len(entries) != 1:
            raise WorkflowError(
                f"{where}: its body must have one entry (a task waiting for none of the body), "
                f"has {entries}"
            )
        for t in body:
            outside = [s for s in self.wf.succs(t) if s not in inside]
            if outside and t != loop.until:
                raise WorkflowError(
                    f"{where}: {outside[0]!r} waits for body task {t!r}; tasks after a loop "
                    f"may wait only for its 'until' task"
                )
        counts = loop.counts
        _weights(where, counts, list(range(1, bound + 1)))
        return replace(loop, body=body)

    def loops_of(self, task: str) -> tuple[Loop, ...]:
        """The loops ``task`` is in, outermost first (none: outside every loop)."""
        return self.chain.get(task, ())

    def _nest(self) -> dict[str, tuple[Loop, ...]]:
        """Each body task's loops, outermost first; :class:`WorkflowError` unless every two
        loops are apart or one nests inside the other (holding neither its outer loop's entry
        nor its 'until'), and the iterations of nested loops multiply to at most
        :data:`MAX_NESTED_ITERATIONS`."""
        where = f"workflow {self.name!r}"
        bodies = [set(loop.body) for loop in self.loops]
        for a, loop in enumerate(self.loops):
            for b in range(a):
                other, shared = self.loops[b], bodies[a] & bodies[b]
                if not shared or bodies[a] < bodies[b] or bodies[b] < bodies[a]:
                    continue
                what = "the same body" if bodies[a] == bodies[b] else "overlapping bodies"
                raise WorkflowError(
                    f"{where}: the loops of {other.until!r} and {loop.until!r} have {what} "
                    f"(both hold {sorted(shared)[0]!r}): a loop must be apart from another "
                    "or nested in its body"
                )
        for a, inner in enumerate(self.loops):
            for b, outer in enumerate(self.loops):
                if not bodies[a] < bodies[b]:
                    continue
                if inner.until == outer.until:
                    raise WorkflowError(
                        f"{where}: two loops share the 'until' task {inner.until!r} (bodies "
                        f"{list(outer.body)} and {list(inner.body)}): a task decides one loop; "
                        "give the nested loop an 'until' of its own, before the outer one's"
                    )
                held = [t for t in (self._entry(outer), outer.until) if t in bodies[a]]
                if held:
                    role = "'until'" if held[0] == outer.until else "entry"
                    raise WorkflowError(
                        f"{where}: the loop of {inner.until!r}, nested in the loop of "
                        f"{outer.until!r}, holds its {role} {held[0]!r}: a nested loop must "
                        "sit inside its outer loop's body, after its entry and before its "
                        "'until'"
                    )
        chain: dict[str, tuple[Loop, ...]] = {}
        for t in self.wf.order:
            holding = [k for k, body in enumerate(bodies) if t in body]
            holding.sort(key=lambda k: -len(bodies[k]))
            loops = tuple(self.loops[k] for k in holding)
            if not loops:
                continue
            chain[t] = loops
            total = math.prod(loop.max_iter for loop in loops)
            if total > MAX_NESTED_ITERATIONS:
                bounds = " x ".join(str(loop.max_iter) for loop in loops)
                raise WorkflowError(
                    f"{where}: task {t!r} would unroll to {bounds} = {total} instances, over "
                    f"the bound of {MAX_NESTED_ITERATIONS} (MAX_NESTED_ITERATIONS): lower "
                    "the max_iter of its loops"
                )
        return chain

    def _entry(self, loop: Loop) -> str:
        """The body task of ``loop`` that waits for none of its body."""
        inside = set(loop.body)
        return next(t for t in loop.body if not any(p in inside for p in self.wf.preds(t)))

    def _body_sinks(self, loop: Loop) -> list[str]:
        """The body tasks no body task waits for: the next iteration's entry waits for them."""
        return [b for b in loop.body if not any(s in loop.body for s in self.wf.succs(b))]

    # -- building -------------------------------------------------------------------------------

    def _name(self, task: str, index: tuple[int, ...]) -> str:
        """The instance of ``task`` at iteration ``index`` of its loops (outermost first)."""
        return f"{task}{_AT}{_LEVEL.join(map(str, index))}" if index else task

    def _indices(self, task: str, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
        """The iterations of ``task``'s instances that start with ``prefix``, in order."""
        inner = self.loops_of(task)[len(prefix) :]
        return [prefix + rest for rest in itertools.product(*(range(x.max_iter) for x in inner))]

    def _shared(self, a: str, b: str) -> int:
        """How many loops, from the outermost, ``a`` and ``b`` are both in."""
        k = 0
        for x, y in zip(self.loops_of(a), self.loops_of(b), strict=False):
            if x is not y:
                break
            k += 1
        return k

    def build(self, options: Mapping[str, Any]) -> Workflow:
        nodes: dict[str, _Node] = {}
        for t in self.wf.order:
            task = self.wf.tasks[t]
            loops = self.loops_of(t)
            loop = loops[-1] if loops else None
            entry = loop is not None and t == self._entry(loop)
            for index in self._indices(t):
                node = nodes[self._name(t, index)] = _Node(task, root=not task.after)
                if entry and index[-1] > 0:  # from the previous iteration's last output
                    assert loop is not None
                    before = (*index[:-1], index[-1] - 1)
                    sinks = [
                        self._name(b, i)
                        for b in self._body_sinks(loop)
                        for i in self._indices(b, before)
                    ]
                    mode = "one" if len(sinks) == 1 else "any"
                    node.sources = [(s, loop.carry, mode) for s in sinks]
                    node.root = False
                    continue
                for p in task.after:
                    param = task.params.get(p, p)
                    k = self._shared(p, t)
                    # a loop p is in and t is not: t gets its last output, of those that ran
                    mode = "one" if len(self.loops_of(p)) == k else "any"
                    group = [self._name(p, i) for i in self._indices(p, index[:k])]
                    node.sources += [(n, param, mode) for n in group]
                    if loop is not None and not entry and k < len(loops):
                        node.side.update(group)  # from outside t's innermost loop
        copies_of: dict[str, tuple[str, ...]] = {}
        for fan in self.fanouts.values():
            for index in self._indices(fan.task):
                old = self._name(fan.copies, index)
                template = nodes.pop(old)
                names = tuple(f"{old}{_COPY}{k}" for k in range(fan.max_width))
                copies_of[self._name(fan.task, index)] = names
                for name in names:
                    nodes[name] = _Node(template.origin, list(template.sources))
                join = nodes[self._name(fan.join, index)]
                kept = [s for s in join.sources if s[0] != old]
                param = next(s[1] for s in join.sources if s[0] == old)
                join.sources = kept + [(n, param, "list") for n in names]
        succs: dict[str, list[str]] = {n: [] for n in nodes}
        for n, node in nodes.items():
            for source, _, _ in node.sources:
                succs[source].append(n)
        points = self._points(nodes, succs, copies_of)
        built = [self._task(n, node) for n, node in nodes.items()]
        workflow = Workflow(self.name, built, **options)
        origin = {n: node.origin.name for n, node in nodes.items()}
        preds = {t: workflow.preds(t) for t in workflow.order}
        succ_map = {t: workflow.succs(t) for t in workflow.order}
        declared = Declared(
            tuple(self.wf.tasks[t] for t in self.wf.order),
            tuple(self.branches.values()),
            tuple(self.fanouts.values()),
            tuple(self.loops),
        )
        side = {n: frozenset(node.side) for n, node in nodes.items() if node.side}
        workflow.unfold = Unfolding(points, origin, preds, succ_map, declared, side)
        return workflow

    def _points(
        self,
        nodes: Mapping[str, _Node],
        succs: Mapping[str, list[str]],
        copies_of: Mapping[str, tuple[str, ...]],
    ) -> dict[str, ChoicePoint]:
        points: dict[str, ChoicePoint] = {}
        for fan in self.fanouts.values():
            widths = _weights("", self._widths(fan), list(range(fan.max_width + 1)))
            for n, names in copies_of.items():
                if nodes[n].origin.name != fan.task:
                    continue
                options = tuple(frozenset(names[:k]) for k in range(fan.max_width + 1))
                labels = tuple(str(k) for k in range(fan.max_width + 1))
                points[n] = ChoicePoint("fanout", options, labels, widths, names)
        for b in self.branches.values():
            loops = self.loops_of(b.task)
            if loops and loops[-1].until == b.task:
                continue  # the loop's point holds its branches
            weights = _weights("", b.to, list(b.to))
            for index in self._indices(b.task):
                name = self._name(b.task, index)
                options = tuple(_instances_of(s, succs[name]) for s in b.to)
                points[name] = ChoicePoint("branch", options, tuple(b.to), weights)
        for loop in self.loops:
            points.update(self._loop_points(loop, succs))
        return points

    def _loop_points(self, loop: Loop, succs: Mapping[str, list[str]]) -> dict[str, ChoicePoint]:
        """The until task of each iteration (of each iteration of the loops around): go on
        (through its branch, if it has one) or stop; at the last iteration, stop only. The
        chance to stop after iteration ``i`` is ``P(N = i+1) / P(N > i)`` for the declared
        counts ``N``, so the draws give them, in every iteration of an outer loop afresh."""
        counts = _weights("", loop.counts, list(range(1, loop.max_iter + 1)))
        branch = self.branches.get(loop.until)
        points: dict[str, ChoicePoint] = {}
        stops: list[float] = []
        left = 1.0
        for i in range(loop.max_iter):
            stops.append(1.0 if i == loop.max_iter - 1 or left <= 0 else min(1.0, counts[i] / left))
            left -= counts[i]
        for index in self._indices(loop.until):
            name, stop_p = self._name(loop.until, index), stops[index[-1]]
            exits = frozenset(
                s for s in succs[name] if not any(x is loop for x in self.loops_of(_origin(s)))
            )
            onward = [s for s in succs[name] if s not in exits]
            if index[-1] == loop.max_iter - 1:  # the bound: stop only, and the body after
                # 'until' never runs (in no option, it would always run: the skip rule)
                points[name] = ChoicePoint(
                    "loop", (exits,), ("stop",), (1.0,), stop=0, never=frozenset(onward)
                )
                continue
            # before the bound, going on stays an option (of weight 0 where the declared
            # counts end earlier: what is not an option would always run)
            if branch is None:
                options, labels, weights = [frozenset(onward)], ["again"], [1.0 - stop_p]
            else:
                chosen = {s: _instances_of(s, succs[name]) for s in branch.to}
                always = frozenset(s for s in onward if not any(s in c for c in chosen.values()))
                share = _weights("", branch.to, list(branch.to))
                options = [always | chosen[s] for s in branch.to]
                labels = list(branch.to)
                weights = [(1.0 - stop_p) * p for p in share]
            points[name] = ChoicePoint(
                "loop", (*options, exits), (*labels, "stop"), (*weights, stop_p), stop=len(options)
            )
        return points

    def _task(self, name: str, node: _Node) -> Task:
        """The unrolled task: the declared one renamed, with its sources; a function that
        gathers groups of them (a join's list, a loop's last output) is wrapped to do so."""
        task = node.origin
        after = tuple(s for s, _, _ in node.sources)
        groups = [s for s in node.sources if s[2] != "one"]
        profile = task.profile
        if not node.root and not task.after and profile.input_bytes:  # a loop's entry, again
            profile = TaskProfile(profile.exec_ms, profile.output_bytes, 0,
                                  profile.batch_scale, profile.steps)  # fmt: skip
        fn = task.fn
        params: dict[str, str] = {}
        if fn is not None and groups:
            wrapped = _Gathered(name, fn, node.sources)
            fn = wrapped.generator if is_stepwise(task.fn) else wrapped
            params = dict(wrapped.params)
        elif fn is not None and node.sources:
            params = {s: p for s, p, _ in node.sources if s != p}
        elif node.root:
            params = dict(task.params)
        return replace(
            task,
            name=name,
            after=after,
            profile=profile,
            fn=fn,
            inputs=task.inputs if node.root else None,
            params=params,
        )


def _origin(name: str) -> str:
    return name.split(_COPY, 1)[0].split(_AT, 1)[0]


def _instances_of(task: str, names: Iterable[str]) -> frozenset[str]:
    """Those of ``names`` unrolled from declared ``task``."""
    return frozenset(n for n in names if _origin(n) == task)


class _Gathered:
    """A task function whose inputs come in groups: each source is passed to it under a
    private keyword; a group becomes the one keyword the function declares (a list of what
    ran, or the first that ran), and skipped inputs are dropped from groups."""

    def __init__(self, task: str, fn: Callable[..., Any], sources: list[tuple[str, str, str]]):
        if inspect.isasyncgenfunction(fn):
            raise WorkflowError(
                f"task {task!r}: an async generator cannot gather a fan-out or loop's outputs"
            )
        self.fn = fn
        self.params = {s: f"in_{k}" for k, (s, _, _) in enumerate(sources)}
        self.groups: dict[str, tuple[str, list[str]]] = {}
        for source, param, mode in sources:
            self.groups.setdefault(param, (mode, []))[1].append(self.params[source])
        try:
            inspect.signature(fn).bind(None, **dict.fromkeys(self.groups))
        except TypeError as exc:
            raise WorkflowError(
                f"task {task!r}: {getattr(fn, '__qualname__', fn)} cannot be called with "
                f"({', '.join(['module', *self.groups])}): {exc}"
            ) from None
        except ValueError:  # no signature to check
            pass

    def _kwargs(self, given: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for param, (mode, keys) in self.groups.items():
            values = [given[k] for k in keys]
            ran = [v for v in values if not is_skipped(v)]
            if mode == "list":
                out[param] = ran
            elif mode == "any":
                out[param] = ran[0] if ran else SKIPPED
            else:
                out[param] = values[0]
        return out

    def __call__(self, module: Any, **given: Any) -> Any:
        return self.fn(module, **self._kwargs(given))

    def generator(self, module: Any, **given: Any) -> Any:
        return (yield from self.fn(module, **self._kwargs(given)))
