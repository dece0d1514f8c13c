"""The member table's convention, the worker core's: every event and decision carries a cause
id, a rule that raises yields a Fault after the decisions made before it, its settings change
through events, and a bounded stimulus log answers ``story(peer)``."""

from __future__ import annotations

import ast
import random
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from compass.membership.events import (
    Acked,
    Fault,
    ForgetAfter,
    Forgot,
    HeardFrom,
    JoinAsked,
    Listens,
    PeerDown,
    PeerUp,
    Remove,
    RetryAt,
    SendProbe,
    Tick,
    Welcome,
)
from compass.membership.table import MemberTable

from .test_members import EXACT, T0, hello, joined, table


def test_a_rule_that_raises_keeps_the_decisions_made_before_it_and_adds_a_fault() -> None:
    t = table("a")

    def broken(now: float, name: str) -> None:
        raise RuntimeError("a bug in the detector")

    t.detector.joined = broken  # type: ignore[method-assign]
    decisions = t.handle(JoinAsked(T0, hello("b")))
    # b became a peer before the detector failed: that decision is kept, the welcome is lost
    up, fault = decisions
    assert type(up) is PeerUp and up.name == "b" and "b" in t.live
    assert isinstance(fault, Fault) and isinstance(fault.error, RuntimeError)
    assert not any(type(d) is Welcome for d in decisions)
    assert {d.cause for d in decisions} == {"join-asked:b#1"}
    (told,) = t.story("b")
    assert told.did[0].startswith("peer-up name=b")
    assert told.did[-1] == "fault: RuntimeError: a bug in the detector"


def test_every_decision_carries_the_cause_of_its_event() -> None:
    t = table("a")
    joined(t, "b", "c")
    down, retry = t.handle(Remove(T0 + 1, "b", "it stopped answering"))
    assert (type(down), type(retry)) == (PeerDown, RetryAt)
    assert down.cause == retry.cause == "remove:b#3"  # the third event this table handled
    # an event with an id of its own (a request's, say) passes it on as it is
    decisions = t.handle(Remove(T0 + 2, "c", "asked", cause="op-9"))
    assert [type(d) for d in decisions] == [PeerDown, RetryAt]
    assert {d.cause for d in decisions} == {"op-9"}
    # its words still begin with the name it would have had
    assert [s.event.split()[0] for s in t.story("op-9")] == ["remove:c#4"]


def test_its_address_and_forget_after_change_through_events() -> None:
    t = table("a")
    assert t.handle(Listens(T0, "10.0.0.7:7341")) == []
    assert t.address == "10.0.0.7:7341" and t.hello().address == "10.0.0.7:7341"
    t.handle(ForgetAfter(T0, 5.0))
    assert t.forget_after_s == 5.0
    joined(t, "b")
    t.handle(Remove(T0 + 1, "b", "gone"))
    forgot = t.handle(Tick(T0 + 7.0))  # lost past the 5 s set by the event: forgotten
    assert [d.name for d in forgot if isinstance(d, Forgot)] == ["b"]
    assert [s.cause for s in t.story("10.0.0.7:7341")] == ["listens:10.0.0.7:7341#1"]


def test_the_story_of_a_peer_is_what_happened_to_it_and_fresh_heartbeats_are_left_out() -> None:
    t = table("a")
    joined(t, "b", "c")
    for i in range(50):  # every few ms in a real cluster: they would push the rest out
        t.handle(HeardFrom(T0 + i / 100, "b", 0))
    # so would the routine probing: a probe of the round, acked
    (probe,) = t.handle(Tick(t.detector.probe_at))
    assert type(probe) is SendProbe and t.handle(Acked(T0, probe.target, probe.seq)) == []
    t.handle(Remove(T0 + 1, "b", "it stopped answering"))
    story = t.story("b")
    assert [s.cause for s in story] == ["join-asked:b#1", "remove:b#55"]
    assert story[0].did[0].startswith("peer-up name=b address=b.lan:7341")
    assert story[1].event == "remove:b#55 name=b why=it stopped answering"
    assert story[1].did[0] == "peer-down name=b address=b.lan:7341 why=it stopped answering"
    assert story[1].now == T0 + 1
    assert all("b" not in s.about for s in t.story("c"))


def test_the_log_keeps_the_last_events_only() -> None:
    t = MemberTable("a", "a.lan:7341", instance="a-1", rng=random.Random(1), backoff=EXACT,
                    keep_stimuli=2)  # fmt: skip
    joined(t, "b", "c", "d", "e")
    assert len(t.log) == 2
    assert t.story("b") == [] and [s.cause for s in t.story("e")] == ["join-asked:e#4"]
    with pytest.raises(Exception, match="integer >= 0"):
        MemberTable("a", "x", instance="a-1", rng=random.Random(1), keep_stimuli=-1)


def test_the_membership_modules_import_one_another_in_no_circle() -> None:
    package = Path(__file__).resolve().parents[3] / "compass" / "membership"
    graph: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        deps = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):  # type-only imports too
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                inside = parts[:2] == ["compass", "membership"] and len(parts) > 2
                if inside and (package / f"{parts[2]}.py").exists() and parts[2] != path.stem:
                    deps.add(parts[2])
    assert graph["table"] >= {"detector", "member"} and "table" not in graph["detector"]
    try:
        list(TopologicalSorter(graph).static_order())
    except CycleError as exc:  # pragma: no cover - the failure message
        pytest.fail(f"an import circle in compass/membership: {exc.args[1]}")
