"""Learned choice frequencies (issue 38, item 2): the likely path follows the choices heard,
the declared weights as the prior; what moved it spreads to peers in heartbeats; a workload
spec's ``prior`` plans from other weights than the emulated draws follow."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cli.format import status_lines
from compass.config import WorkerConfig
from compass.core.assemble import CoreOptions, build_core
from compass.core.events import Heard
from compass.errors import ProtocolError, WorkflowError
from compass.gossip.port import GossipPort
from compass.sched import make_policy
from compass.sched.heartbeat import Heartbeat
from compass.workflow import Profiles, Task, TaskProfile
from compass.workflow.spec import parse_workload, workload_to_dict
from compass.workflow.unfold import Branch, unfold_workflow

from ..worker.test_state import GB, resident_cache
from .test_spec import small


def router(to: dict[str, float] | None = None) -> Any:
    tasks = [Task("route", "m", (), TaskProfile(10, 100))] + [
        Task(name, "m", ("route",), TaskProfile(ms, 100)) for name, ms in (("p", 50), ("q", 20))
    ]
    return unfold_workflow("router", tasks, branches=[Branch("route", to or {"p": 3, "q": 1})])


def profiles(*workflows: Any) -> Profiles:
    return Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=workflows, model_sizes={"m": GB}
    )


def test_the_likely_path_follows_the_choices_heard_from_the_declared_prior() -> None:
    wf = router()
    learned = profiles(wf).choices
    assert learned.likely(wf) == {"route", "p"}  # declared: p three times in four
    for _ in range(5):  # a few contrary choices do not outvote a strong prior
        learned.observe(wf, "route", "q")
    assert learned.likely(wf) == {"route", "p"} and learned.version("router") == 0
    for _ in range(30):
        learned.observe(wf, "route", "q")
    assert learned.likely(wf) == {"route", "q"} and learned.version("router") == 1
    weights = learned.weights(wf, "route")
    assert weights[1] > weights[0] and sum(weights) == pytest.approx(1.0)
    learned.observe(wf, "route", "nowhere")  # a label it does not know: nothing learned
    learned.observe(wf, "p", "q")  # nor a task that chooses nothing
    assert learned.heard == 35


def test_what_moved_the_likely_path_spreads_and_a_peer_plans_with_it() -> None:
    wf = router()
    a, b = profiles(wf), profiles(wf)
    for _ in range(40):
        a.choices.observe(wf, "route", "q")
    spread = a.choices.spread()
    assert spread == (("router", "route", 1),)  # only what differs from the declaration
    beat = Heartbeat("a", 0.0, frozenset(), 0, 0, choices=spread)
    assert Heartbeat.from_wire(beat.to_wire()) == beat
    assert "lc" not in Heartbeat("a", 0.0, frozenset(), 0, 0).to_wire()  # none: no bytes
    b.choices.adopt("a", spread)
    assert b.choices.likely(wf) == {"route", "q"} and b.choices.version("router") == 1
    b.choices.adopt("a", ())  # a's traffic went back to the declared: so does b
    assert b.choices.likely(wf) == {"route", "p"}
    c = profiles(wf)
    for _ in range(40):  # what a worker learned of its own traffic wins over a peer's
        c.choices.observe(wf, "route", "p")
    c.choices.adopt("a", spread)
    assert c.choices.likely(wf) == {"route", "p"}
    b.choices.adopt("a", (("router", "route", 7), ("other", "x", 0)))  # unknown: ignored
    assert b.choices.likely(wf) == {"route", "p"}


def test_learned_choices_off_the_wire_are_checked() -> None:
    wire = Heartbeat("a", 0.0, frozenset(), 0, 0, choices=(("w", "t", 1),)).to_wire()
    for bad in ([["w", "t", -1]], [["w", "t"]], [["w", 3, 1]], [["w", "t", True]], "x",
                [["w", "t", 0]] * 65):  # fmt: skip
        with pytest.raises(ProtocolError, match=r"'lc'|learned choice"):
            Heartbeat.from_wire({**wire, "lc": bad})


def test_a_spec_prior_plans_from_other_weights_than_the_draws_follow() -> None:
    spec = small()
    spec["models"]["m2"] = {"size_mb": 10}
    spec["workflows"]["wf"] = {
        "tasks": {
            "route": {"model": "m2", "exec_ms": 5, "input_kb": 1, "output_kb": 1, "after": []},
            "p": {"model": "m2", "exec_ms": 50, "output_kb": 1, "after": ["route"]},
            "q": {"model": "m2", "exec_ms": 20, "output_kb": 1, "after": ["route"]},
        },
        "branches": {"route": {"p": 3, "q": 1}},
        "prior": {"branches": {"route": {"q": 9, "p": 1}}},
    }
    wf = parse_workload(spec).workflows["wf"]
    assert wf.unfold is not None
    point = wf.unfold.points["route"]
    assert point.weights == (0.75, 0.25) and point.prior == (0.1, 0.9)
    assert wf.unfold.likely == {"route", "q"}  # planning starts from the prior
    drawn = [wf.unfold.route("route", None, f"j{k}", emulated=True).label for k in range(400)]
    assert 0.65 < drawn.count("p") / 400 < 0.85  # the draws follow the weights
    # written back with its prior
    again = parse_workload(json.loads(json.dumps(workload_to_dict(parse_workload(spec)))))
    assert again.workflows["wf"].unfold is not None
    assert again.workflows["wf"].unfold.points["route"].prior == (0.1, 0.9)
    spec["workflows"]["wf"]["prior"] = {"branches": {"route": {"p": 1}}}
    with pytest.raises(WorkflowError):
        parse_workload(spec)


def test_a_worker_s_heartbeat_carries_what_it_learned_to_a_peer_s_core() -> None:
    """Through the real pieces: a core whose ingress learned (its gossip port's own state
    carries it) and a peer core that hears that state and ranks with the learned path."""
    wf = router()
    cores, ports = {}, {}
    for name in ("a", "b"):
        prof = profiles(wf)
        ports[name] = GossipPort(name, WorkerConfig(name=name), profiles=prof)
        cores[name] = build_core(
            name, workflows={"router": wf}, policy=make_policy("compass"), profiles=prof,
            view=ports[name], cache=resident_cache("m"), options=CoreOptions(warm=False),
        )  # fmt: skip
        ports[name].attach(cores[name])
    best_declared = cores["b"].estimates.best_s(wf)
    for _ in range(40):
        cores["a"].estimates.choices.observe(wf, "route", "q")
    state = ports["a"].own_state(0.0)
    assert state.choices == (("router", "route", 1),)
    cores["b"].handle(Heard(0.0, Heartbeat.from_wire(state.to_wire())))
    assert cores["b"].estimates.choices.likely(wf) == {"route", "q"}
    assert cores["b"].estimates.best_s(wf) < best_declared  # q (20 ms), not p (50 ms)


def test_compass_status_names_the_choices_a_worker_spread() -> None:
    wf = router()
    learned = profiles(wf).choices
    assert learned.label("router", "route", 1) == "q"
    assert learned.label("router", "route", 9) == "9" and learned.label("x", "y", 0) == "0"
    row = {"name": "a", "wait_ms": 0.0, "models": [], "age_ms": 1.0, "placements_counted": 0,
           "choices": [{"workflow": "router", "task": "route", "likely": "q"}]}  # fmt: skip
    info = {"name": "a", "address": "x:1", "version": "0", "uptime_s": 1.0, "peers": [],
            "cluster": [row]}  # fmt: skip
    assert any("learned choices router/route q" in line for line in status_lines(info))
