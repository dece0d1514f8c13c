"""A bounded view's spreading rules, without sockets: watch leases, and rumors that reach every
worker in O(log n) periods for a constant number of messages per worker."""

from __future__ import annotations

import math
import random

import pytest

from compass.errors import ConfigError
from compass.gossip.spread import (
    MAX_RUMORS,
    Ends,
    Rumors,
    Watchers,
    Watching,
    cache_changed,
    sync_period_s,
)
from compass.sched.heartbeat import Heartbeat


def state(name: str, seq: int = 1, incarnation: int = 0, **kw: object) -> Heartbeat:
    fields: dict[str, object] = {
        "wait_s": 0.0,
        "models": frozenset(),
        "free_bytes": 10,
        "capacity_bytes": 10,
    }
    fields.update(kw)
    return Heartbeat(name=name, seq=seq, incarnation=incarnation, **fields)  # type: ignore[arg-type]


def test_a_watch_holds_until_its_lease_ends_and_a_longer_one_extends_it() -> None:
    watchers = Watchers()
    assert watchers.watch("a", until=10.0)
    assert not watchers.watch("a", until=5.0)  # an earlier end does not shorten it
    assert watchers.watch("b", until=3.0)
    assert sorted(watchers.live(2.0)) == ["a", "b"]
    assert watchers.live(4.0) == ["a"]  # b's lease ended: dropped
    watchers.watch("a", until=20.0)
    assert watchers.live(15.0) == ["a"]
    watchers.drop("a")
    assert watchers.live(15.0) == [] and len(watchers) == 0


def test_watchers_keyed_by_index_drop_each_ended_lease_whatever_the_order_of_the_ends() -> None:
    watchers = Watchers(int)  # the simulator's: workers by index
    assert watchers.watch(1, until=5.0)
    assert watchers.watch(2, until=3.0)  # ends before the lease set before it
    assert watchers.watch(3, until=4.0)
    assert not watchers.watch(1, until=6.0)  # extended: its end at 5.0 no longer counts
    assert watchers.count(3.5) == 2 and watchers.live(3.5) == [1, 3]
    assert watchers.live(5.5) == [1]  # 3's lease ended at 4.0, 1's holds until 6.0
    watchers.drop(1)
    assert watchers.count(5.5) == 0
    assert watchers.watch(1, until=6.0)  # watching anew, until the same end as before
    assert watchers.count(5.9) == 1 and watchers.count(6.5) == 0
    watching = Watching(2.0, int)
    assert watching.due([0, 1], now=0.0) == [0, 1] and watching.due([1, 2], now=0.5) == [2]


def test_a_planner_asks_again_only_when_half_its_lease_is_gone() -> None:
    watching = Watching(lease_s=2.0)
    assert watching.due(["a", "b"], now=0.0) == ["a", "b"]
    assert watching.due(["a", "b", "c"], now=0.5) == ["c"]  # a, b: 1.5 s of lease left
    assert watching.due(["a"], now=1.01) == ["a"]  # under half a lease left: renewed
    assert sorted(watching.watched(2.5)) == ["a", "c"]  # b's lease ended at 2.0
    watching.drop("a")
    assert watching.due(["a"], now=1.2) == ["a"]  # dropped (gone, or a new instance)
    with pytest.raises(ConfigError, match="lease"):
        Watching(lease_s=0.0)


def test_only_a_change_of_the_cache_is_a_rumor() -> None:
    base = state("a", models=frozenset({"m"}))
    assert cache_changed(None, base)
    assert not cache_changed(base, state("a", seq=2, models=frozenset({"m"}), wait_s=5.0))
    assert cache_changed(base, state("a", seq=2, models=frozenset()))
    assert cache_changed(base, state("a", seq=2, models=frozenset({"m"}), loading=frozenset("x")))
    assert cache_changed(base, state("a", seq=2, models=frozenset({"m"}), h2d_bytes_per_s=1e9))
    assert cache_changed(base, state("a", seq=1, incarnation=1, models=frozenset({"m"})))


def test_a_rumor_is_kept_only_if_newer_and_sent_a_bounded_number_of_times() -> None:
    rumors = Rumors(retransmit_mult=2, per_message=8)
    assert rumors.retransmits(9) == 2 and rumors.retransmits(10) == 4  # 2 x ceil(log10(n+1))
    assert rumors.heard(state("a", seq=5), members=9)
    assert not rumors.heard(state("a", seq=5), members=9)  # the same news
    assert not rumors.heard(state("a", seq=4), members=9)  # older
    assert rumors.heard(state("a", seq=1, incarnation=1), members=9)  # a newer incarnation
    sent = [rumors.take() for _ in range(3)]
    assert [[s.seq for s in batch] for batch in sent] == [[1], [1], []]
    assert rumors.pending() == 0
    rumors.forget("a")
    assert rumors.heard(state("a", seq=1, incarnation=1), members=9)  # news again once forgotten


def test_the_newest_news_goes_first_and_a_message_holds_a_bounded_number() -> None:
    rumors = Rumors(retransmit_mult=1, per_message=2)
    for i, name in enumerate("abc"):
        rumors.heard(state(name), members=1000 ** (i + 1))  # 3, 6 and 9 transmissions
    assert [s.name for s in rumors.take()] == ["c", "b"]
    with pytest.raises(ConfigError):
        Rumors(per_message=MAX_RUMORS + 1)


@pytest.mark.parametrize("n", [50, 200, 1000])
def test_rumors_reach_every_worker_in_log_n_periods_at_a_constant_cost(n: int) -> None:
    """Five workers of n change their cache at once and start a rumor each; then each period
    every worker sends one message of rumors to each of 2 peers picked at random, and a worker
    passes on what is news to it. Every worker hears all five changes within a few periods
    that grow with log n, and no worker sends more than 2 messages a period."""
    rng = random.Random(n)
    tables = [Rumors() for _ in range(n)]
    changed = rng.sample(range(n), 5)
    heard: list[set[int]] = [set() for _ in range(n)]
    for i in changed:
        tables[i].heard(state(f"w{i}", seq=2), members=n)
        heard[i].add(i)
    periods = 0
    most_sent = 0
    while any(len(h) < 5 for h in heard):
        periods += 1
        assert periods <= 8 * math.log2(n), f"after {periods} periods not all {n} heard"
        outbox = []
        for table in tables:
            sent = 0
            for peer in rng.sample(range(n), 2):
                states = table.take()
                if not states:
                    break
                outbox.append((peer, states))
                sent += 1
            most_sent = max(most_sent, sent)
        for peer, states in outbox:
            for s in states:
                if tables[peer].heard(s, members=n):
                    heard[peer].add(int(s.name[1:]))
    assert most_sent <= 2
    # and the rumors die out: each holder sends one a bounded number of times
    for _ in range(tables[0].retransmits(n)):
        for table in tables:
            table.take()
    assert all(t.pending() == 0 for t in tables)


def test_syncs_grow_rarer_past_32_workers_so_their_cost_does_not_grow() -> None:
    """The worker and the simulator time their whole-view syncs by this one rule."""
    assert sync_period_s(5000.0, 2) == sync_period_s(5000.0, 32) == 5.0
    assert sync_period_s(5000.0, 64) == 10.0
    assert sync_period_s(5000.0, 1000) == 5.0 * 1000 / 32


def test_ends_hands_back_each_item_once_its_end_has_passed_in_any_order() -> None:
    """Ends (the lease ends of Watchers and of the simulator's Heard): items added in the
    order of their ends wait in a queue, earlier ones in a heap; each comes back once, after
    its end (strictly), with it; equal ends never compare the items (dicts do not order)."""
    ends: Ends[object] = Ends()
    items = [(5.0, "a"), (7.0, "b"), (3.0, "c"), (6.0, {"d": 1}), (6.0, {"e": 2}), (9.0, "f")]
    for end, item in items:
        ends.add(end, item)
    assert len(ends) == 6
    assert ends.ended(3.0) == ()  # not strictly before
    early = sorted(ends.ended(6.5), key=lambda e: e[0])
    assert [end for end, _ in early] == [3.0, 5.0, 6.0, 6.0]
    assert ends.ended(6.5) == ()
    assert list(ends.ended(10.0)) == [(7.0, "b"), (9.0, "f")]
    assert len(ends) == 0
