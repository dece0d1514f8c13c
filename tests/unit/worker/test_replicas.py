"""The worker's side of hot-model replication (compass/worker/replicas.py): which fields of the
view feed the rule, and a worker acts only where the rule names it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from cli.format import status_lines
from compass.config import WorkerConfig
from compass.core.events import Heard, Tick
from compass.elastic.replicate import Holding, ReplicaConfig, Replicator
from compass.sched.heartbeat import Heartbeat
from compass.sched.view import ClusterView
from compass.sim.settings import SimSettings
from compass.worker.process import build_worker
from compass.worker.replicas import (
    MAX_WATCHED,
    HotReplicas,
    holdings,
    objective_slack_s,
    warm_here,
)
from compass.worker.requests import describe

GB = 10**9
SLACK_S = 1.0  # the rule warms past 0.5 s of holders' mean wait; headroom is under 0.1 s


def state(
    name: str,
    wait_s: float,
    models: str = "",
    loading: str = "",
    seq: int = 1,
    recent: str | None = None,
) -> Heartbeat:
    """A worker's heartbeat; it uses every model it holds unless ``recent`` says which."""
    return Heartbeat(
        name, wait_s, frozenset(models.split()), GB, 2 * GB, seq=seq,
        loading=frozenset(loading.split()),
        recent=frozenset((models if recent is None else recent).split()),
    )  # fmt: skip


class Core:
    """A worker's core as the rule sees it: the Ticks fed, and its state, which shows a hot
    model loading once fed one (unless it declines); ``view``: the peers it heard."""

    def __init__(self, own: Heartbeat, view: ClusterView, *, declines: bool = False) -> None:
        self.own = own
        self.view = view
        self.declines = declines
        self.fed: list[Tick] = []
        self.was_fed = asyncio.Event()

    def apply(self, event: Tick) -> None:
        self.fed.append(event)
        self.was_fed.set()
        if not self.declines:
            self.own = state(self.own.name, self.own.wait_s, " ".join(self.own.models), event.hot)

    def own_state(self, now: float) -> Heartbeat:
        return self.own


def replicas_of(
    own: Heartbeat,
    peers: list[Heartbeat],
    *,
    declines: bool = False,
    watch: object = None,
    heard_at: float = 0.0,
) -> tuple[HotReplicas, Core]:
    """The rule on ``own``'s worker, whose view heard ``peers`` at ``heard_at``."""
    view = ClusterView(own.name)
    view.update_self(own)
    for peer in peers:
        assert view.apply_heartbeat(peer, heard_at)
    core = Core(own, view, declines=declines)
    replicas = HotReplicas(
        own.name, ReplicaConfig(), own_state=core.own_state, view=view, apply=core.apply,
        slack_s=lambda: SLACK_S, watch=watch,  # type: ignore[arg-type]
    )  # fmt: skip
    return replicas, core


def test_holdings_read_each_workers_wait_and_the_models_it_holds_or_loads() -> None:
    own = state("w2", 0.0, "n")
    peers = [state("w0", 0.8, "m", "k"), state("w1", 0.6, "m"), state("w2", 9.0, "x")]
    got = holdings(own, peers)
    m, n = frozenset({"m"}), frozenset({"n"})
    assert got == [
        Holding("w2", 0.0, n, False, n),
        Holding("w0", 0.8, frozenset({"m", "k"}), True, m),  # loading k: held, and busy loading
        Holding("w1", 0.6, m, False, m),
    ]  # a stale state of itself among the peers is not read: its own state is


def test_every_worker_computes_the_same_pairs_and_only_the_one_named_acts() -> None:
    workers = holdings(state("w0", 0.8, "m"), [state("w1", 0.6, "m"), state("w2", 0.0, "n")])
    rules = {name: Replicator() for name in ("w0", "w1", "w2")}
    assert warm_here("w2", workers, SLACK_S, rules["w2"], 1.0) == ["m"]
    assert warm_here("w0", workers, SLACK_S, rules["w0"], 1.0) == []
    assert warm_here("w1", workers, SLACK_S, rules["w1"], 1.0) == []
    # and every worker remembers the same pair asked for
    assert {name: dict(rule.cooling) for name, rule in rules.items()} == {
        name: {("w2", "m"): 1.0} for name in rules
    }
    # the holders' mean wait under half the slack: nothing is hot enough
    calm = holdings(state("w0", 0.5, "m"), [state("w1", 0.4, "m"), state("w2", 0.0, "n")])
    assert warm_here("w2", calm, SLACK_S, Replicator(), 1.0) == []


def test_the_worker_picked_feeds_its_own_core_a_hot_tick_and_counts_the_copy() -> None:
    replicas, core = replicas_of(
        state("w2", 0.0, "n"), [state("w0", 0.9, "m"), state("w1", 0.7, "m")], heard_at=12.0
    )
    assert replicas.step(12.5) == ["m"]
    assert core.fed == [Tick(12.5, hot="m")]
    assert replicas.warmed == {"m": 1}
    assert replicas.describe({"m", "n"}) == {
        "warmed": 1, "models": {"m": 1}, "held": ["m"], "failures": 0, "watching": [],
    }  # fmt: skip
    assert replicas.describe({"n"})["held"] == []  # evicted since
    (family,) = replicas.collect()
    assert family.name == "compass_replicas_warmed"
    assert [(s.name, s.labels, s.value) for s in family.samples if s.name.endswith("_total")] == [
        ("compass_replicas_warmed_total", {"model": "m"}, 1.0)
    ]
    # loading now: no second load while that one runs
    assert replicas.step(14.5) == [] and len(core.fed) == 1


def test_a_holder_or_a_busy_worker_in_the_same_view_feeds_nothing() -> None:
    peers = [state("w1", 0.7, "m"), state("w2", 0.0, "n")]
    holder, core = replicas_of(state("w0", 0.9, "m"), peers)
    assert holder.step(1.0) == [] and core.fed == []
    # w2 busy (above a tenth of the slack): no worker has headroom, nobody warms
    busy, core = replicas_of(state("w2", 0.2, "n"), [state("w0", 0.9, "m"), state("w1", 0.7, "m")])
    assert busy.step(1.0) == [] and core.fed == []


def test_a_load_the_core_declines_is_not_counted() -> None:
    replicas, core = replicas_of(
        state("w2", 0.0, "n"), [state("w0", 0.9, "m"), state("w1", 0.7, "m")], declines=True
    )
    assert replicas.step(1.0) == []
    assert core.fed == [Tick(1.0, hot="m")] and replicas.warmed == {}


def test_a_worker_whose_core_declined_is_not_asked_again_in_its_cool_down() -> None:
    """w2's core declines (its cache is full of models used lately): every worker's rule asks
    w3 next round, and w2 only once the cool-down has passed."""
    pressed = [state("w0", 0.9, "m"), state("w1", 0.7, "m"), state("w3", 0.05, "k")]
    w2, core2 = replicas_of(state("w2", 0.0, "n"), pressed, declines=True)
    w3, core3 = replicas_of(state("w3", 0.05, "k"), [*pressed[:2], state("w2", 0.0, "n")])
    assert w2.step(1.0) == [] and w3.step(1.0) == []
    assert core2.fed == [Tick(1.0, hot="m")] and core3.fed == []
    assert w2.step(3.0) == [] and w3.step(3.0) == ["m"]  # w2 cools down: w3 is asked
    assert core2.fed == [Tick(1.0, hot="m")]
    cooldown = ReplicaConfig().cooldown_s
    for peer in pressed:  # heard again: what they said at 0 no longer says what they use
        assert core2.view.apply_heartbeat(
            state(peer.name, peer.wait_s, " ".join(peer.models), seq=2), cooldown
        )
    w2.step(1.0 + cooldown)
    assert core2.fed[1:] == [Tick(1.0 + cooldown, hot="m")]  # asked again once it passed


def test_a_bounded_view_watches_the_holders_while_it_has_headroom() -> None:
    asked: list[list[str]] = []
    unreachable = {"w1"}

    def watch(peers: list[str]) -> list[str]:
        asked.append(list(peers))
        return [p for p in peers if p in unreachable]

    peers = [state("w0", 0.1, "m"), state("w1", 0.1, "m"), state("w3", 0.0, "n")]
    replicas, _ = replicas_of(state("w2", 0.0, "n"), peers, watch=watch)
    replicas.step(0.0, real_s=100.0)
    assert asked == [["w0", "w1"]]  # w3 holds nothing w2 lacks: its load is not needed
    replicas.step(2.0, real_s=102.0)
    assert asked[1:] == [["w1"]]  # w0's lease holds; w1 had no channel: asked again
    unreachable.clear()
    replicas.step(4.0, real_s=104.0)
    replicas.step(6.0, real_s=106.0)  # w0's lease (10 s) is renewed past its half
    assert asked[2:] == [["w1"], ["w0"]]


def test_a_bounded_view_watches_only_while_the_cluster_uses_a_model_it_lacks() -> None:
    """Idle (nobody used a model within cold_s), a worker with headroom asks no watch; once it
    hears a holder run a model it lacks it watches that model's holders; once that word is
    older than cold_s it renews nothing, and its leases run out; a new word of use (a rumor,
    a sync) and it watches again. A model in use that it holds itself is no reason."""
    asked: list[list[str]] = []

    def watch(peers: list[str]) -> list[str]:
        asked.append(list(peers))
        return []

    idle = [state("w0", 0.0, "m", recent=""), state("w1", 0.0, "m", recent="")]
    replicas, core = replicas_of(state("w2", 0.0, "n", recent=""), idle, watch=watch)
    replicas.step(0.0, real_s=100.0)
    assert asked == [] and replicas.watching(100.0) == []
    assert core.view.apply_heartbeat(state("w0", 0.1, "m", seq=2), 2.0)  # w0 runs m
    replicas.step(2.0, real_s=102.0)
    assert asked == [["w0", "w1"]] and replicas.watching(102.0) == ["w0", "w1"]
    # w0's word is 11 s old (cold_s is 10), nobody said more: the leases (10 s) run out
    replicas.step(13.0, real_s=113.0)
    assert asked == [["w0", "w1"]] and replicas.watching(113.0) == []
    assert core.view.apply_heartbeat(state("w1", 0.0, "m", seq=2), 14.0)  # traffic again
    replicas.step(14.0, real_s=114.0)
    assert asked[1:] == [["w0", "w1"]] and replicas.watching(114.0) == ["w0", "w1"]
    # m in use, but w3 holds it: w3 watches nobody for it (it lacks only k, which idles)
    peers = [state("w0", 0.1, "m k", recent="m"), state("w1", 0.0, "m")]
    holder, _ = replicas_of(state("w3", 0.0, "m", recent=""), peers, watch=watch)
    holder.step(0.0, real_s=100.0)
    assert asked[2:] == []


def test_a_peers_word_of_use_older_than_cold_s_makes_no_model_hot() -> None:
    """w0 and w1 said they ran m, queueing past the threshold, 11 s ago (cold_s: 10) and nothing
    since (a bounded view's unwatched peers): m is not hot, so nothing is warmed."""
    pressed = [state("w0", 0.9, "m"), state("w1", 0.7, "m")]
    stale, core = replicas_of(state("w2", 0.0, "n"), pressed, heard_at=0.0)
    assert stale.step(11.0) == [] and core.fed == []
    fresh, core = replicas_of(state("w2", 0.0, "n"), pressed, heard_at=9.0)
    assert fresh.step(11.0) == ["m"] and core.fed == [Tick(11.0, hot="m")]


def test_a_worker_without_headroom_watches_nobody_and_at_most_max_watched() -> None:
    asked: list[list[str]] = []

    def watch(peers: list[str]) -> list[str]:
        asked.append(list(peers))
        return []

    busy, _ = replicas_of(state("w2", 0.5, "n"), [state("w0", 0.9, "m")], watch=watch)
    busy.step(0.0, real_s=0.0)
    assert asked == []
    many = [state(f"p{i:02}", 0.0, f"m{i}") for i in range(MAX_WATCHED + 4)]
    free, _ = replicas_of(state("w2", 0.0, "n"), many, watch=watch)
    free.step(0.0, real_s=0.0)
    assert asked == [[f"p{i:02}" for i in range(MAX_WATCHED)]]


@pytest.mark.asyncio
async def test_a_failed_round_is_counted_and_the_next_one_runs() -> None:
    pressed = [state("w0", 0.9, "m"), state("w1", 0.7, "m")]
    replicas, core = replicas_of(state("w2", 0.0, "n"), pressed)
    rounds: list[float] = []
    failed: list[int] = []

    def clock() -> float:
        rounds.append(float(len(rounds) + 1))
        if len(rounds) == 1:
            raise RuntimeError("a bug")
        return rounds[-1]

    task = asyncio.ensure_future(
        replicas.run(
            clock, 0.001, real=lambda: 0.0, serving=lambda: True,
            failed=lambda: failed.append(len(rounds)),
        )
    )  # fmt: skip
    await asyncio.wait_for(core.was_fed.wait(), 10.0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert failed == [1] and replicas.failures == 1
    assert core.fed == [Tick(2.0, hot="m")]


def test_a_model_its_holders_hold_but_do_not_use_is_never_hot() -> None:
    """w0 and w1 hold a and k but run only k: their queues are k's work, so a copy of a would
    take none of it off them. Only k is warmed, however long a's holders queue (a, first by
    name, would be warmed first were every held model hot)."""
    peers = [state("w0", 0.9, "a k", recent="k"), state("w1", 0.9, "a k", recent="k")]
    workers = holdings(state("w2", 0.0, "n", recent=""), peers)
    assert warm_here("w2", workers, SLACK_S, Replicator(), 1.0) == ["k"]
    # nobody uses a or k now (their last tasks began longer than cold_s ago): nothing is hot
    idle = [state("w0", 0.9, "a k", recent=""), state("w1", 0.9, "a k", recent="")]
    assert warm_here("w2", holdings(state("w2", 0.0, "n"), idle), SLACK_S, Replicator(), 1.0) == []


def test_off_by_default_as_in_the_simulator() -> None:
    assert WorkerConfig().replicate is None
    assert SimSettings(workers=2, policy="compass").replicate is None


PAPER = str(Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json")


@pytest.mark.asyncio
async def test_a_worker_reads_its_peers_heartbeats_and_loads_in_its_own_cache() -> None:
    """On a real worker (not serving: no sockets), the peers' heartbeats it heard feed the rule,
    and the load it starts is its own cache's; status shows it."""
    worker = build_worker(WorkerConfig(name="w2", workload=PAPER, time_scale=0.01))
    try:
        assert describe(worker)["replicas"] == {}  # off: nothing to show
        replicas = HotReplicas.of_worker(worker, ReplicaConfig())
        worker.replicas = replicas
        # on: status says nothing of it until it warmed a copy or watches
        assert not any(line.startswith("hot models") for line in status_lines(describe(worker)))
        # the paper's slack: 2x its workflows' best times, on average
        slack = objective_slack_s(worker.app.workflows.values(), worker.profiles)
        assert 0.5 < slack < 2.0
        now = worker.clock()
        for name, wait in (("w0", slack), ("w1", 0.8 * slack)):
            worker.apply(Heard(now, state(name, wait, "opt marian")))
        # both equally pressed: by name, and one model per worker a round; a bounded view
        # (the default) watches the holders of what it lacks, while they use it
        assert replicas.step(now, time.monotonic()) == ["marian"]
        resident, loading = worker.lanes.cache.residency()
        assert loading == {"marian"} and not resident
        status = describe(worker)
        assert status["replicas"]["models"] == {"marian": 1}
        assert status["replicas"]["held"] == ["marian"]
        assert (
            "hot models warmed here ahead of need: 1 (marian x1); still held: marian; "
            "holders watched: w0, w1"
        ) in status_lines(status)
    finally:
        await worker.aclose()


@pytest.mark.asyncio
async def test_a_real_worker_warms_only_a_model_its_peers_heartbeats_say_they_use() -> None:
    """Off the wire: w0 and w1 hold marian and opt and queue past the rule's threshold, but
    their heartbeats say they run only opt: the worker warms opt, in every round, never
    marian (first by name: the rule's pick were every held model hot)."""
    worker = build_worker(WorkerConfig(name="w2", workload=PAPER, time_scale=0.01))
    try:
        replicas = HotReplicas.of_worker(worker, ReplicaConfig())
        slack = objective_slack_s(worker.app.workflows.values(), worker.profiles)
        now = worker.clock()
        for name in ("w0", "w1"):
            wire = state(name, slack, "opt marian").to_wire() | {"r": ["opt"]}
            worker.apply(Heard(now, Heartbeat.from_wire(wire)))
        warmed = [replicas.step(now + 2.0 * i) for i in range(3)]
        assert warmed == [["opt"], [], []]  # then loading opt, and marian never
        assert worker.lanes.cache.residency()[1] == {"opt"}
    finally:
        await worker.aclose()


@pytest.mark.asyncio
async def test_a_worker_gossips_the_models_it_used_within_cold_s() -> None:
    """Its heartbeat names the models a task began with there within the rule's ``cold_s``
    (``--replicate``'s, else the default); a job's plan reads its state without them."""
    config = WorkerConfig(name="w0", workload=PAPER, replicate=ReplicaConfig(cold_s=5.0))
    worker = build_worker(config)
    try:
        port, now = worker.gossip.port, worker.clock()
        worker.lanes.used.update({"opt": now - 4.0, "marian": now - 6.0})
        assert port.next_state(now).recent == {"opt"}
        assert Heartbeat.from_wire(port.next_state(now).to_wire()).recent == {"opt"}
        assert port.own_state(now).recent == frozenset()
    finally:
        await worker.aclose()
