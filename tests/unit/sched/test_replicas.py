"""Cache warming choices: demand per model, and which model an idle worker should load."""

from __future__ import annotations

from compass.sched import Heartbeat, ViewSnapshot, model_demand, warm_order
from compass.workflow import Profiles, Task, TaskProfile, Workflow

GB = 1_000_000_000


def t(name: str, model: str | None, ms: float, *after: str) -> Task:
    return Task(name, model, after, TaskProfile(exec_ms=ms, output_bytes=10))


def state(name: str, models: tuple[str, ...] = (), loading: tuple[str, ...] = ()) -> Heartbeat:
    return Heartbeat(name, 0.0, frozenset(models), GB, 10 * GB, loading=frozenset(loading))


def test_demand_is_the_expected_time_each_model_is_used_per_job() -> None:
    one = Workflow("one", [t("a", "x", 100), t("b", "y", 50, "a"), t("c", None, 10, "a")])
    two = Workflow("two", [t("a", "x", 300)])
    p = Profiles(
        h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, model_sizes={"x": GB, "y": GB}, workflows=[]
    )
    demand = model_demand([one, two], p)
    assert demand.keys() == {"x", "y"}
    assert abs(demand["x"] - 0.4) < 1e-12
    assert abs(demand["y"] - 0.05) < 1e-12


def test_the_least_held_model_for_its_demand_comes_first() -> None:
    view = ViewSnapshot.build(
        [state("a"), state("b", ("x", "y")), state("c", ("x",), loading=("z",))]
    )
    demand = {"x": 2.0, "y": 1.0, "z": 1.0, "w": 0.5, "unused": 0.0}
    # per unit of demand: w 0/0.5, y 1/1, x 2/2 (tie with y), z 1/1 (loading counts as held)
    order = warm_order(view, "a", demand)
    assert order[0] == "w"
    assert set(order) == {"w", "x", "y", "z"}  # never a model nobody uses
    # what the worker holds or is loading is never proposed
    assert warm_order(view, "b", demand)[0] == "w"
    assert "x" not in warm_order(view, "b", demand)
    assert "z" not in warm_order(view, "c", demand)


def test_idle_workers_with_the_same_view_spread_their_first_choice() -> None:
    names = [f"w{i}" for i in range(8)]
    view = ViewSnapshot.build([state(n) for n in names])
    demand = dict.fromkeys("abcdefgh", 1.0)  # all tied
    firsts = {warm_order(view, n, demand)[0] for n in names}
    assert len(firsts) >= 3
    # and each worker's choice is stable
    assert warm_order(view, "w0", demand) == warm_order(view, "w0", demand)
