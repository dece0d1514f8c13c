"""A busy worker is not a dead one, in the failure detector's rules (sans-IO, no loop): this
worker's own stalls do not count against its peers, a peer that answered late a moment ago
gets that much longer to refute, and local health stretches suspicions, all within the
longest suspicion."""

from __future__ import annotations

import pytest

from compass.membership.detector import LATE_ACKS
from compass.membership.events import (
    Acked,
    AskIndirect,
    Gossiped,
    HeardFrom,
    Nacked,
    PeerDown,
    ProbeAsked,
    SendNack,
    SendProbe,
    Stalled,
    Suspect,
    Tick,
    Update,
)

from .test_swim import PEERS, PROBING, T0, mesh_table, only, probe_of


def test_a_stall_of_its_own_moves_every_deadline_of_its_own_and_counts_against_its_health() -> None:
    t = mesh_table("a", PEERS)
    now = t.detector.probe_at
    probe = probe_of(t.handle(Tick(now)))
    # a peer asks it to probe another for it: that nack is owed within the asker's window
    (relay,) = t.handle(ProbeAsked(now, "b", 77, "c", "c.lan:7341"))
    assert isinstance(relay, SendProbe)
    t.handle(Gossiped(now, "d", (Update("suspect", "e", 0, "e.lan:7341", "d"),)))
    suspicion = t.detector.suspicions["e"]
    deadline = suspicion.deadline
    # the loop stalled 40 ms: under half a probe timeout, no sign against its health
    assert t.handle(Stalled(now + 0.05, 0.04)) == []
    assert t.detector.health == 0 and suspicion.deadline == pytest.approx(deadline + 0.04)
    # 300 ms more: the peers' silence meanwhile is not counted
    t.handle(Stalled(now + 0.35, 0.3))
    assert t.detector.health == 1 and suspicion.stalled == pytest.approx(0.34)
    assert suspicion.deadline == pytest.approx(deadline + 0.34)
    decisions = t.handle(Tick(now + 0.36))
    # the relay's nack goes (its asker's window closed); its own probe still waits for an ack
    assert [(d.to, d.seq) for d in decisions if isinstance(d, SendNack)] == [("b", 77)]
    assert not only(decisions, AskIndirect)
    (ask,) = only(t.handle(Tick(now + PROBING.timeout_s + 0.34)), AskIndirect)
    assert isinstance(ask, AskIndirect) and ask.seq == probe.seq
    # the suspicion ends when its own time, less the stall, is up: dead, saying so
    assert not only(t.handle(Tick(deadline + 0.339)), PeerDown)
    (down,) = only(t.handle(Tick(deadline + 0.34)), PeerDown)
    assert isinstance(down, PeerDown) and "340 ms of it this worker's own stalls" in down.why


def test_a_peer_that_acked_late_gets_that_much_longer_to_refute_within_the_busy_bound() -> None:
    t = mesh_table("a", PEERS)
    members = len(PEERS) + 1
    _, longest = PROBING.suspicion_bounds_s(members)
    quick = PROBING.suspicion_timeout_s(members, 1)
    now = t.detector.probe_at
    probe = probe_of(t.handle(Tick(now)))
    target = probe.target
    t.handle(Acked(now + 0.25, target, probe.seq))  # a quarter of a second late
    assert t.detector.slowness[target] == pytest.approx(0.25)
    # suspected by one, confirmed by another: it lasts the confirmed time, plus twice that
    t.handle(Gossiped(now + 1, "x", (Update("suspect", target, 0, "", "x"),)))
    t.handle(Gossiped(now + 1, "y", (Update("suspect", target, 0, "", "y"),)))
    suspicion = t.detector.suspicions[target]
    slowness = t.detector.slowness_at(now + 1, target)  # 0.25 s, 0.75 s ago
    assert slowness == pytest.approx(0.25 * 0.5 ** (0.75 / longest))
    assert suspicion.deadline == pytest.approx(now + 1 + quick + 2 * slowness)
    # slowness halves every longest suspicion, however many quick acks come meanwhile
    t2 = mesh_table("a", PEERS)
    acked = []
    for rtt in (0.4, 0.01, 0.01):
        p = probe_of(t2.handle(Tick(t2.detector.probe_at)))
        while p.target != target:
            t2.handle(Acked(t2.detector.probe_at, p.target, p.seq))
            p = probe_of(t2.handle(Tick(t2.detector.probe_at)))
        sent = t2.detector.probe_at - PROBING.period_s
        t2.handle(Acked(sent + rtt, target, p.seq))
        acked.append(sent + rtt)
    elapsed = acked[-1] - acked[0]
    assert elapsed < longest  # three acks within one half-life: still more than half of it
    assert t2.detector.slowness[target] == pytest.approx(0.4 * 0.5 ** (elapsed / longest))
    assert t2.detector.slowness_at(acked[0] + 2 * longest, target) == pytest.approx(0.1)
    # past the longest (a busy peer refutes late), but never past the busy bound, however slow
    t.detector.slowness[target] = 60.0
    t.handle(Gossiped(now + 1, "z", (Update("suspect", target, 0, "", "z"),)))
    busy = PROBING.busy_bound_s(members) - longest
    confirmed = min(PROBING.suspicion_timeout_s(members, 2), longest)
    assert suspicion.deadline == pytest.approx(now + 1 + confirmed + busy)
    assert suspicion.deadline - (now + 1) <= PROBING.busy_bound_s(members)


def test_an_ack_after_its_probe_failed_still_tells_how_slow_the_peer_is() -> None:
    t = mesh_table("a", PEERS)
    now = t.detector.probe_at
    probe = probe_of(t.handle(Tick(now)))
    (ask,) = t.handle(Tick(now + 0.1))
    assert isinstance(ask, AskIndirect)
    for via in ask.via:
        t.handle(Nacked(now + 0.15, via, probe.seq))
    suspicion = t.detector.suspicions[probe.target]
    first_deadline = suspicion.deadline
    # it answers, 700 ms after the probe: busy, not gone; its suspicion takes that in
    assert t.handle(Acked(now + 0.7, probe.target, probe.seq)) == []
    assert t.detector.slowness[probe.target] == pytest.approx(0.7)
    assert suspicion.deadline >= first_deadline
    # the probes given up on are remembered, a bounded number: none answers any more
    failed = 0
    clock = now + 1
    while failed < LATE_ACKS + 10:
        for decision in t.handle(Tick(clock)):
            if isinstance(decision, AskIndirect):
                for via in decision.via:
                    t.handle(Nacked(clock, via, decision.seq))
                failed += 1
                # the suspect refutes (it stays a peer, to be probed again)
                known = t.members[decision.target]
                alive = Update("alive", known.name, known.incarnation + 1, known.address)
                t.handle(Gossiped(clock, known.name, (alive,)))
        clock += 0.05
        assert clock < now + 1000, "no probe fails"
    assert len(t.detector._given_up) == LATE_ACKS and len(t.live) == len(PEERS)


def test_local_health_stretches_a_confirmed_suspicion_up_to_the_longest() -> None:
    members = len(PEERS) + 1
    _, longest = PROBING.suspicion_bounds_s(members)
    quick = PROBING.suspicion_timeout_s(members, 1)
    for health, expected in ((0, quick), (1, 2 * quick), (8, longest)):
        t = mesh_table("a", PEERS)
        t.detector.health = health
        t.handle(Gossiped(T0, "x", (Update("suspect", "c", 0, "", "x"),)))
        t.handle(Gossiped(T0, "y", (Update("suspect", "c", 0, "", "y"),)))
        assert t.detector.suspicions["c"].deadline == pytest.approx(T0 + min(expected, longest))


def test_a_peer_that_stalled_is_still_slow_at_its_next_stall_after_quick_acks() -> None:
    """A worker that stalls 900 ms, runs 500 ms, and stalls again: its late ack after the
    first stall still stretches the suspicion of the second, though it acked quickly between
    (with slowness halved per ack, two quick acks left a quarter of it, too little)."""
    t = mesh_table("a", ["b", "c"], probing=PROBING)
    _, longest = t.detector.probing.suspicion_bounds_s(3)
    now = t.detector.probe_at
    probe = probe_of(t.handle(Tick(now)))
    while probe.target != "b":
        t.handle(Acked(now + 0.001, probe.target, probe.seq))
        now = t.detector.probe_at
        probe = probe_of(t.handle(Tick(now)))
    t.handle(Acked(now + 0.9, "b", probe.seq))  # its ack, after a 900 ms stall
    resumed = now + 0.9
    for i in range(4):  # quick acks meanwhile
        t.detector._slow(resumed + 0.1 * (i + 1), "b", 0.002)
    since = resumed + 0.5
    confirmed = PROBING.suspicion_timeout_s(3, 1)
    t.handle(Gossiped(since, "c", (Update("suspect", "b", 0, "", "c"),)))
    t.handle(Gossiped(since, "a", (Update("suspect", "b", 0, "", "a"),)))
    slowness = t.detector.slowness_at(since, "b")
    assert slowness == pytest.approx(0.9 * 0.5 ** (0.5 / longest))
    assert t.detector.suspicions["b"].deadline == pytest.approx(since + confirmed + 2 * slowness)
    assert t.detector.suspicions["b"].deadline - since > 0.9 + 2 * PROBING.period_s


def test_a_suspect_heard_from_directly_is_dead_only_after_a_whole_suspicion_of_silence() -> None:
    """A busy peer's own heartbeat, on its own channel, shows it runs: its suspicion counts
    its silence from then. A rumor of it passed on by another worker shows nothing (it may
    be old news), and a peer that says nothing is declared dead when its time is up."""
    for how in ("direct", "rumor", "silent"):
        t = mesh_table("a", ["b", "c"], probing=PROBING)
        since = T0 + 1
        (suspect,) = only(t.handle(Gossiped(since, "c", (Update("suspect", "b", 0, "", "c"),))),
                          Suspect)  # fmt: skip
        assert isinstance(suspect, Suspect)
        heard_at = since + suspect.timeout_s - 0.1
        if how != "silent":
            t.handle(HeardFrom(heard_at, "b", 0, direct=how == "direct"))
        if how == "direct":
            assert not only(t.handle(Tick(since + suspect.timeout_s + 0.5)), PeerDown)
            t.handle(Stalled(heard_at + 0.2, 0.3))  # its own stall after it heard b counts not
            assert not only(t.handle(Tick(heard_at + suspect.timeout_s + 0.299)), PeerDown)
            (down,) = only(t.handle(Tick(heard_at + suspect.timeout_s + 0.3)), PeerDown)
            assert isinstance(down, PeerDown) and "last heard from" in down.why
        else:
            (down,) = only(t.handle(Tick(since + suspect.timeout_s)), PeerDown)
            assert isinstance(down, PeerDown) and "last heard from" not in down.why
        assert "b" not in t.live
