"""Choice frequencies learned online: how often each decision task of a workflow decided at
run time takes each of its options (a branch's successors, a fan-out's widths, a loop's going
on or stopping at each iteration), as the ingress hears the choices of the jobs it planned.

Like the learned task times (:mod:`compass.workflow.profile`), each estimate is an
exponential moving average that starts from the declaration: a decision task's weights begin
as its declared ones (the prior) and move by :data:`ALPHA` toward each choice heard, so a
declaration matters for the first few dozen jobs and the traffic after that. What planning
uses of them is the likely path (:meth:`ChoiceFrequencies.likely`): the tasks a job runs when
every choice takes its most likely option; it changes, and its :meth:`version` with it, only
when some decision task's most likely option does.

**Spread.** Every worker ranks the tasks it queues by their workflow's best time, which for a
workflow decided at run time is its likely path's; so what one ingress learned must reach the
workers that run its jobs. As the learned task times do, it rides on the heartbeats
(:attr:`~compass.sched.heartbeat.Heartbeat.choices`): a worker spreads, of what it learned
itself, each decision task whose most likely option is not the declared one, as
``(workflow, task, option)`` (:meth:`ChoiceFrequencies.spread`, at most
:data:`~compass.workflow.profile.LEARNED_SPREAD`: the ones that change the likely path, a few
bytes each); a peer takes them in (:meth:`ChoiceFrequencies.adopt`) for the decision tasks
it learned nothing of itself (its own traffic wins; among peers, the last in name order).

Memory is bounded by the app: one weight per option of each decision task of the workflows
the worker knows (a choice of a task or label it does not know is ignored), and one small
tuple per peer. Sans-IO; the worker's :class:`~compass.workflow.profile.Profiles` holds one
(``Profiles.choices``), fed by the ingress (:meth:`Ingress.chose
<compass.core.ingress.Ingress.chose>`). The simulator's workers share one ``Profiles``, so
they share what any of them learned at once (heartbeats spread it within milliseconds, which
is nothing against the dozens of jobs learning takes).
"""

from __future__ import annotations

from collections.abc import Callable

from compass.workflow.dag import Workflow

__all__ = ["ALPHA", "MOST_SPREAD", "ChoiceFrequencies", "Likely"]

#: one learned choice as it spreads: ``(workflow, decision task, index of its most likely
#: option)``
Likely = tuple[str, str, int]

#: the most learned choices a worker spreads of itself (as many as learned task times)
MOST_SPREAD = 16

#: the weight of one choice heard: the estimate remembers about the last ``1 / ALPHA`` choices
#: of a decision task (the declared weights weigh ``(1 - ALPHA) ** n`` after ``n``)
ALPHA = 0.05


class _Learned:
    """What is known of one workflow's decision tasks: learned here, and taken from peers."""

    __slots__ = ("adopted", "likely", "version", "weights", "wf")

    def __init__(self, workflow: Workflow) -> None:
        assert workflow.unfold is not None
        self.wf = workflow
        #: decision task -> its options' weights, learned here
        self.weights: dict[str, list[float]] = {}
        #: decision task -> its most likely option as a peer learned it
        self.adopted: dict[str, int] = {}
        self.likely = workflow.unfold.likely
        self.version = 0

    def relikely(self) -> None:
        """The likely path again, from what is known now; a new version if it moved."""
        unfolding = self.wf.unfold
        assert unfolding is not None
        known: dict[str, list[float]] = {}
        for task, option in self.adopted.items():
            one_hot = [0.0] * len(unfolding.points[task].options)
            one_hot[option] = 1.0
            known[task] = one_hot
        known.update(self.weights)  # its own traffic wins
        likely = unfolding.likely_under(known)
        if likely != self.likely:
            self.likely = likely
            self.version += 1


class ChoiceFrequencies:
    """The choice frequencies of the workflows one worker plans (see the module docstring);
    ``workflow(name)``: the workflow of that name it knows (None: none); ``alpha``: the
    weight of one choice heard."""

    def __init__(self, workflow: Callable[[str], Workflow | None], alpha: float = ALPHA) -> None:
        self._workflow = workflow
        self.alpha = alpha
        #: workflow name -> what is known of it (only workflows with a choice heard or adopted)
        self._learned: dict[str, _Learned] = {}
        #: choices heard and learned from, in all
        self.heard = 0
        #: peer -> what it spread last (compared first: most heartbeats repeat it)
        self._peers: dict[str, tuple[Likely, ...]] = {}
        #: what this worker spreads, kept until it changes (None: make it again)
        self._spread: tuple[Likely, ...] | None = ()

    def _of(self, workflow: Workflow) -> _Learned:
        learned = self._learned.get(workflow.name)
        if learned is None or not _same(learned.wf, workflow):  # a new one, or redeclared
            learned = self._learned[workflow.name] = _Learned(workflow)
        return learned

    def observe(self, workflow: Workflow, task: str, label: str) -> None:
        """Decision task ``task`` of ``workflow`` chose the option labelled ``label``."""
        unfolding = workflow.unfold
        point = None if unfolding is None else unfolding.points.get(task)
        if point is None or label not in point.labels:
            return
        learned = self._of(workflow)
        weights = learned.weights.get(task)
        if weights is None:
            weights = learned.weights[task] = list(point.expected)
        before = _best(weights)
        chosen = point.labels.index(label)
        keep = 1.0 - self.alpha
        for i in range(len(weights)):
            weights[i] = keep * weights[i] + (self.alpha if i == chosen else 0.0)
        self.heard += 1
        if _best(weights) != before:  # the likely path may have moved
            learned.relikely()
            self._spread = None

    def likely(self, workflow: Workflow) -> frozenset[str]:
        """The tasks a job of ``workflow`` (decided at run time) likely runs, by what was
        learned (by the declared weights until then)."""
        learned = self._learned.get(workflow.name)
        if learned is not None and _same(learned.wf, workflow):
            return learned.likely
        assert workflow.unfold is not None
        return workflow.unfold.likely

    def version(self, workflow: str) -> int:
        """Changes whenever :meth:`likely` of ``workflow`` does."""
        learned = self._learned.get(workflow)
        return 0 if learned is None else learned.version

    def weights(self, workflow: Workflow, task: str) -> tuple[float, ...]:
        """Decision task ``task``'s weights of its options, learned here or declared."""
        learned = self._learned.get(workflow.name)
        weights = None if learned is None else learned.weights.get(task)
        if weights is not None:
            return tuple(weights)
        assert workflow.unfold is not None
        return workflow.unfold.points[task].expected

    def likely_successors(self, workflow: Workflow, task: str) -> frozenset[str]:
        """The successors decision task ``task`` of ``workflow`` runs when it takes its most
        likely option: by the weights learned here, else by what a peer spread, else as
        declared (the same order as :meth:`likely`'s)."""
        unfolding = workflow.unfold
        assert unfolding is not None
        learned = self._learned.get(workflow.name)
        weights: list[float] | None = None
        if learned is not None and _same(learned.wf, workflow):
            weights = learned.weights.get(task)
            option = learned.adopted.get(task)
            if weights is None and option is not None:
                weights = [0.0] * len(unfolding.points[task].options)
                weights[option] = 1.0
        return unfolding.likely_successors(task, weights)

    def spread(self) -> tuple[Likely, ...]:
        """What this worker tells its peers: each decision task it learned of whose most
        likely option is not the declared one, at most :data:`MOST_SPREAD`."""
        if self._spread is None:
            out: list[Likely] = []
            for name, learned in sorted(self._learned.items()):
                unfolding = learned.wf.unfold
                assert unfolding is not None
                for task, weights in sorted(learned.weights.items()):
                    best = _best(weights)
                    if best != _best(list(unfolding.points[task].expected)):
                        out.append((name, task, best))
            self._spread = tuple(out[:MOST_SPREAD])
        return self._spread

    def adopt(self, peer: str, spread: tuple[Likely, ...]) -> None:
        """What ``peer`` learned (its :meth:`spread`), for the decision tasks this worker
        learned nothing of itself."""
        if self._peers.get(peer) == spread:
            return
        self._peers[peer] = spread
        merged: dict[str, dict[str, int]] = {}
        for name in sorted(self._peers):  # the last in name order wins
            for workflow, task, option in self._peers[name]:
                merged.setdefault(workflow, {})[task] = option
        touched = set(merged) | {n for n, known in self._learned.items() if known.adopted}
        for name in sorted(touched):
            wf = self._workflow(name)
            unfolding = None if wf is None else wf.unfold
            if wf is None or unfolding is None:
                continue
            adopted = {
                task: option
                for task, option in merged.get(name, {}).items()
                if task in unfolding.points and 0 <= option < len(unfolding.points[task].options)
            }
            learned = self._of(wf)
            if adopted != learned.adopted:
                learned.adopted = adopted
                learned.relikely()

    def label(self, workflow: str, task: str, option: int) -> str:
        """The label of decision task ``task``'s option ``option`` (its index, as spread), or
        the index as text where this worker does not know it."""
        wf = self._workflow(workflow)
        point = None if wf is None or wf.unfold is None else wf.unfold.points.get(task)
        if point is None or not 0 <= option < len(point.labels):
            return str(option)
        return point.labels[option]

    def describe(self, workflow: Workflow) -> dict[str, dict[str, float]]:
        """The weights ``workflow``'s decision tasks learned here, by label (only those that
        heard a choice)."""
        learned = self._learned.get(workflow.name)
        if learned is None or workflow.unfold is None:
            return {}
        points = workflow.unfold.points
        return {
            task: dict(zip(points[task].labels, (round(w, 3) for w in weights), strict=True))
            for task, weights in learned.weights.items()
        }


def _same(known: Workflow, workflow: Workflow) -> bool:
    """Whether ``workflow`` is the one ``known`` is of (the same object, or one of the same
    unrolled tasks: a copy made by a transform such as batching)."""
    return known is workflow or known.order == workflow.order


def _best(weights: list[float]) -> int:
    """The index of the largest weight (the first of equals, as the declared rule)."""
    return max(range(len(weights)), key=weights.__getitem__)
