"""Run-time choices of an unrolled workflow (:mod:`compass.workflow.unfold`): what a decision
task returns, the choice points, and where a finished or skipped task's output goes under the
skip rule. Kept apart from the unrolling so that :class:`~compass.workflow.dag.Workflow` can
hold an :class:`Unfolding` without importing what builds it.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from compass.errors import WorkflowError

__all__ = [
    "SKIPPED",
    "ChoicePoint",
    "Decision",
    "Route",
    "Unfolding",
    "choose",
    "draw",
    "fan_out",
    "is_skipped",
    "stop",
]

#: what a task receives for an input whose producer was skipped (a reserved string, so that it
#: crosses the wire as it is)
SKIPPED: Final = "\x00compass:skipped"


def is_skipped(value: object) -> bool:
    """Whether ``value`` is the mark of a skipped input."""
    return isinstance(value, str) and value == SKIPPED


@dataclass(frozen=True, slots=True)
class Decision:
    """What a decision task returns: its output ``value`` and its choice. ``to``: the declared
    successor a branch runs; ``stop``: a loop's ``until`` task ends the loop; ``items``: a
    fan-out's list, one item per copy. Made by :func:`choose`, :func:`stop`, :func:`fan_out`."""

    value: Any
    to: str | None = None
    stop: bool = False
    items: tuple[Any, ...] | None = None


def choose(value: Any, to: str) -> Decision:
    """Pass ``value`` on to successor ``to`` only (a :class:`Branch`; in a loop, go on)."""
    return Decision(value, to=to)


def stop(value: Any) -> Decision:
    """End the loop with ``value``: the tasks after the loop get it."""
    return Decision(value, stop=True)


def fan_out(items: Iterable[Any]) -> Decision:
    """Run the fan-out's copies once per item, each on its own item."""
    listed = tuple(items)
    return Decision(list(listed), items=listed)


@dataclass(frozen=True, slots=True)
class ChoicePoint:
    """A decision task of the unrolled workflow: the sets of successors it may run
    (``options``, with ``labels`` for traces and prior ``weights``); successors in none of them
    always run, except those in ``never``, which no option runs (a loop's body after its
    ``until`` at the loop's bound, where the loop cannot go on). ``kind``: "branch", "fanout" or
    "loop"; ``copies``: a fan-out's copies, in item order; ``stop``: the index of a loop's stop
    option (-1: none). What runs for an option is :meth:`Unfolding.runs`'s to say."""

    kind: str
    options: tuple[frozenset[str], ...]
    labels: tuple[str, ...]
    weights: tuple[float, ...]
    copies: tuple[str, ...] = ()
    stop: int = -1
    #: the weights planning starts from where they are not ``weights`` (a workload spec's
    #: ``prior``: a deliberately wrong declaration, to test learning); None: ``weights``
    prior: tuple[float, ...] | None = None
    #: successors skipped whichever option is taken
    never: frozenset[str] = frozenset()

    @property
    def expected(self) -> tuple[float, ...]:
        """The weights planning starts from (before anything is learned)."""
        return self.weights if self.prior is None else self.prior


@dataclass(frozen=True, slots=True)
class Route:
    """Where a finished (or skipped) task's output goes: ``sends``, each successor that runs
    with its value; ``skips``, (task, skipped predecessor) marks for tasks that still wait on
    others; ``dead_sinks``, sinks that will not run (the ingress hears so); ``label``, the
    choice made ("" for none)."""

    sends: tuple[tuple[str, Any], ...]
    skips: tuple[tuple[str, str], ...] = ()
    dead_sinks: tuple[str, ...] = ()
    label: str = ""


def _option(point: ChoicePoint, label: str | None) -> int | None:
    """The index of ``point``'s option labelled ``label`` (None: none is)."""
    try:
        return None if label is None else point.labels.index(label)
    except ValueError:
        return None


def draw(key: str) -> float:
    """A number in [0, 1) fixed by ``key``: the same on every host and in every run."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


class Unfolding:
    """The run-time structure of an unrolled workflow: its choice points, each unrolled task's
    declared ``origin``, and the graph the skip rule walks."""

    def __init__(
        self,
        points: Mapping[str, ChoicePoint],
        origin: Mapping[str, str],
        preds: Mapping[str, tuple[str, ...]],
        succs: Mapping[str, tuple[str, ...]],
        declared: object = None,
        side: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.points = MappingProxyType(dict(points))
        #: each loop body task's inputs from outside its loop (its entry's aside): they do not
        #: keep it alive, so that an iteration that will not come is skipped whole
        self.side = MappingProxyType(dict(side or {}))
        #: what it was unrolled from (a :class:`compass.workflow.unfold.Declared`), for
        #: writing the workflow back in its spec form
        self.declared = declared
        self.origin = MappingProxyType(dict(origin))
        self._preds = preds
        self._succs = succs
        #: the tasks a job runs when every choice takes its most likely option by the
        #: declared weights: what planning counts as load before the choices are made (until
        #: the ingress learned otherwise: :meth:`likely_under`)
        self.likely = self.likely_under({})

    def with_points(self, points: Mapping[str, ChoicePoint], declared: object) -> Unfolding:
        """The same unrolled graph with ``points`` (the same options, other weights) and
        ``declared``."""
        return Unfolding(points, self.origin, self._preds, self._succs, declared, self.side)

    def likely_under(self, weights: Mapping[str, Sequence[float]]) -> frozenset[str]:
        """The tasks a job runs when every choice takes its most likely option, decision task
        ``t``'s options weighing ``weights[t]`` (learned), or as declared where ``t`` is not
        in ``weights``."""
        ran: list[str] = []
        taken: set[str] = set()
        for t, preds in self._preds.items():  # topological order
            if not preds or t in taken:
                ran.append(t)
                taken |= {
                    s for s in self.likely_successors(t, weights.get(t)) if not self.aside(t, s)
                }
        return frozenset(ran)

    def aside(self, source: str, task: str) -> bool:
        """Whether ``source`` is a side input of ``task`` (:attr:`side`)."""
        side = self.side.get(task)
        return side is not None and source in side

    def all_skipped(self, task: str, inputs: Mapping[str, Any]) -> bool:
        """Whether ``task`` is skipped, its ``inputs`` (by source) all here: every one that is
        not a side input is a skip mark."""
        own = [v for source, v in inputs.items() if not self.aside(source, task)]
        return bool(own) and all(is_skipped(v) for v in own)

    def route(self, task: str, output: Any, key: str, *, emulated: bool) -> Route:
        """Where ``task``'s ``output`` goes; a decision task's choice is resolved here (drawn
        from ``key`` when ``emulated``). Raises :class:`WorkflowError` for a decision that is
        not one its task may make."""
        point = self.points.get(task)
        if point is None:
            return Route(tuple((s, output) for s in self._succs[task]))
        if emulated and not isinstance(output, Decision):
            option, value, items = self._drawn(point, key), output, None
        else:
            option, value, items = self._resolved(task, point, output)
        runs = self.runs(task, option)
        others = {s for s in self._succs[task] if s not in runs}
        sends = []
        copy_at = {c: i for i, c in enumerate(point.copies)}
        for succ in self._succs[task]:
            if succ in others:
                continue
            if items is not None and succ in copy_at:
                sends.append((succ, items[copy_at[succ]]))
            else:
                sends.append((succ, value))
        skips, dead_sinks = self._skipped({(task, s) for s in others})
        return Route(tuple(sends), skips, dead_sinks, point.labels[option])

    def runs(self, task: str, option: int) -> frozenset[str]:
        """The successors of decision task ``task`` that run when it takes option ``option``:
        those the option names and those no option names (they always run), but never those
        in its point's ``never``. The one statement of which successors a choice runs: the
        route, the likely path, the planner's estimates and a job's record all ask here."""
        point = self.points[task]
        optional = {s for o in point.options for s in o} | point.never
        chosen = point.options[option]
        return frozenset(s for s in self._succs[task] if s in chosen or s not in optional)

    def skip(self, task: str) -> Route:
        """Where ``task`` (every input of it skipped) sends its skip marks."""
        if not self._succs[task]:
            return Route((), dead_sinks=(task,))
        skips, dead_sinks = self._skipped({(task, s) for s in self._succs[task]})
        return Route((), skips, dead_sinks, "skipped")

    def _skipped(
        self, edges: set[tuple[str, str]]
    ) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
        """Close ``edges`` under the skip rule, as far as they alone decide: a task all of whose
        input edges are skipped is dead, and so are its output edges. Returns the marks for the
        live targets of skipped edges and the dead sinks (both in a fixed order)."""
        skipped = set(edges)
        dead: set[str] = set()
        todo = sorted({s for _, s in edges})
        while todo:
            target = todo.pop()
            if target in dead or any((p, target) not in skipped for p in self._preds[target]):
                continue
            dead.add(target)
            for succ in self._succs[target]:
                skipped.add((target, succ))
                todo.append(succ)
        marks = tuple(sorted((s, p) for p, s in skipped if s not in dead))
        sinks = tuple(sorted(t for t in dead if not self._succs[t]))
        return marks, sinks

    @staticmethod
    def _drawn(point: ChoicePoint, key: str) -> int:
        u = draw(key)
        total = 0.0
        for i, weight in enumerate(point.weights):
            total += weight
            if u < total:
                return i
        return max(range(len(point.weights)), key=point.weights.__getitem__)

    def _resolved(self, task: str, point: ChoicePoint, output: Any) -> tuple[int, Any, Any]:
        """The option a real function's ``output`` chose, the value it passes on and, for a
        fan-out, its items."""
        decision = output if isinstance(output, Decision) else None
        value = output if decision is None else decision.value
        if point.kind == "fanout":
            if decision is not None and decision.items is not None:
                items = decision.items
            elif isinstance(value, list | tuple):
                items = tuple(value)
            else:
                raise WorkflowError(
                    f"fan-out task {task!r} must return a list (or compass.fan_out(items)), "
                    f"got {type(value).__name__}"
                )
            if len(items) > len(point.copies):
                raise WorkflowError(
                    f"fan-out task {task!r} returned {len(items)} items; its declared "
                    f"max_width is {len(point.copies)}"
                )
            return len(items), list(items), items
        if point.stop >= 0 and (
            len(point.options) == 1 or (decision is not None and decision.stop)
        ):
            return point.stop, value, None  # told to stop, or at the loop's bound
        if decision is None or decision.to is None:
            if point.kind == "loop" and len(point.options) == 2:
                return 1 - point.stop, value, None  # a plain output goes on
            raise WorkflowError(
                f"task {task!r} chooses its successor: return compass.choose(value, to) with "
                f"to one of {', '.join(sorted(self._declared(point)))}"
            )
        for i, label in enumerate(point.labels):
            if label == decision.to and i != point.stop:
                return i, value, None
        raise WorkflowError(
            f"task {task!r} chose {decision.to!r}, which is not one of its branches "
            f"({', '.join(sorted(self._declared(point)))})"
        )

    @staticmethod
    def _declared(point: ChoicePoint) -> list[str]:
        return [label for i, label in enumerate(point.labels) if i != point.stop]

    def skipped_by(self, choices: Mapping[str, str]) -> tuple[str, ...]:
        """The tasks a job skipped, from the ``choices`` its decision tasks made (task ->
        label, as :class:`Route` names them), by the skip rule, in topological order. What
        follows a decision task that ran but whose choice is not in ``choices`` is unknown:
        not counted as skipped."""
        ran, dead, unknown = 1, 0, -1
        edge: dict[tuple[str, str], int] = {}
        skipped = []
        for task, preds in self._preds.items():  # topological order
            ins = [edge[(p, task)] for p in preds if not self.aside(p, task)]
            state = ran if not ins or ran in ins else (dead if unknown not in ins else unknown)
            if state == dead:
                skipped.append(task)
            point = self.points.get(task)
            chosen = None if point is None else _option(point, choices.get(task))
            runs = None if point is None or chosen is None else self.runs(task, chosen)
            for succ in self._succs[task]:
                out = state
                if state == ran and point is not None:
                    if runs is not None:
                        out = ran if succ in runs else dead
                    elif succ in point.never:
                        out = dead
                    elif any(succ in option for option in point.options):
                        out = unknown
                edge[(task, succ)] = out
        return tuple(skipped)

    def summary(self, choices: Mapping[str, str]) -> str:
        """The ``choices`` a job's decision tasks made, by declared task, in words:
        ``route: expert_a; llm: 3 iterations (search, code); retrieve: width 5``; a nested
        loop's iterations are counted per iteration of the loops around it (``check: 1, 3
        iterations``: once in the first outer iteration, three times in the second)."""
        made: dict[str, tuple[str, list[str], Counter[str]]] = {}
        for task in self._preds:  # topological order: a loop's iterations in turn
            label = choices.get(task)
            point = self.points.get(task)
            if label is not None and point is not None:
                kind, labels, per = made.setdefault(
                    self.origin.get(task, task), (point.kind, [], Counter())
                )
                labels.append(label)
                index = task.partition("@")[2]
                per[index.rpartition(".")[0]] += 1
        parts = []
        for origin, (kind, labels, per) in made.items():
            if kind == "loop":
                extra = [label for label in labels if label not in ("again", "stop")]
                n = len(labels)
                counts = ", ".join(map(str, per.values())) if len(per) > 1 else str(n)
                text = f"{counts} iteration{'' if n == 1 else 's'}"
                parts.append(f"{origin}: {text}" + (f" ({', '.join(extra)})" if extra else ""))
            else:
                width = "width " if kind == "fanout" else ""
                parts.append(f"{origin}: {width}{', '.join(labels)}")
        return "; ".join(parts)

    def likely_successors(
        self, task: str, weights: Sequence[float] | None = None
    ) -> frozenset[str]:
        """The successors ``task`` runs when its choice takes its most likely option (by
        ``weights``, else as declared)."""
        point = self.points.get(task)
        if point is None:
            return frozenset(self._succs[task])
        expected = point.expected if weights is None else weights
        return self.runs(task, max(range(len(expected)), key=expected.__getitem__))
