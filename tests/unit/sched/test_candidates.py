"""Planning over candidates: the rule (the planner, the input holders, the model holders, k
sampled), a snapshot cut down to them, and cost tables indexed down instead of rebuilt."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from compass.errors import ConfigError
from compass.sched import Heartbeat, ViewSnapshot
from compass.sched import candidates as module
from compass.sched.candidates import CandidateRule, PlanScope, candidates, pick
from compass.sched.cost import CostCache, WorkflowCosts
from compass.workflow import Profiles, Workflow, parse_workload

GB = 1_000_000_000
MB = 1_000_000


def workload(workers: int = 12) -> tuple[Workflow, Profiles]:
    spec = parse_workload(
        {
            "name": "pair",
            "cluster": {
                "workers": workers,
                "gpu_memory_mb": 10_000,
                "h2d_gbps": 10,
                "d2h_gbps": 5,
                "net_gbps": 1,
                "net_fixed_us": 100,
            },
            "models": {"a": {"size_mb": 2000}, "b": {"size_mb": 3000}, "c": {"size_mb": 500}},
            "workflows": {
                "pair": {
                    "tasks": {
                        "first": {
                            "model": "a",
                            "exec_ms": 50,
                            "input_kb": 2000,
                            "output_kb": 1000,
                            "after": [],
                        },
                        "second": {
                            "model": "b",
                            "exec_ms": 80,
                            "output_kb": 10,
                            "after": ["first"],
                        },
                    }
                }
            },
        }
    )
    return spec.workflows["pair"], Profiles.from_workload(spec)


def view(n: int, holds: dict[str, set[int]]) -> ViewSnapshot:
    """``n`` workers, worker ``i`` waiting ``i`` ms, holding the models ``holds`` gives it."""
    return ViewSnapshot.build(
        Heartbeat(
            f"w{i:02d}",
            i / 1000,
            frozenset(m for m, at in holds.items() if i in at),
            10 * GB - i * MB,
            10 * GB,
        )
        for i in range(n)
    )


def test_the_planner_the_input_holders_and_every_model_holder_are_kept() -> None:
    wf, _ = workload()
    snap = view(12, {"a": {3, 4}, "b": {9}, "c": {0, 1, 2}})  # c: not a model of the job
    scope = PlanScope(wf, frozenset({"w05", "w07"}))  # the planner, a predecessor's worker
    shown = candidates(snap, scope, CandidateRule(0), random.Random(0))
    assert shown == ("w03", "w04", "w05", "w07", "w09")


def test_k_more_are_sampled_from_the_others_and_never_twice() -> None:
    wf, _ = workload()
    snap = view(12, {"a": {3, 4}, "b": {9}})
    scope = PlanScope(wf, frozenset({"w05"}))
    base = {"w03", "w04", "w05", "w09"}
    for seed in range(20):
        shown = candidates(snap, scope, CandidateRule(3), random.Random(seed))
        assert len(shown) == len(set(shown)) == 7
        assert base <= set(shown)
        assert list(shown) == sorted(shown)
    # never more than there are: with k past the others, everyone, once
    every = candidates(snap, scope, CandidateRule(50), random.Random(0))
    assert every == snap.names


def test_the_sample_is_deterministic_per_seed_and_varies_between_seeds() -> None:
    wf, _ = workload()
    snap = view(40, {"a": {3}, "b": {9}})
    scope = PlanScope(wf, frozenset({"w05"}))
    rule = CandidateRule(4)

    def draws(seed: int) -> list[tuple[str, ...]]:
        rng = random.Random(seed)
        return [candidates(snap, scope, rule, rng) for _ in range(5)]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    assert len(set(draws(1))) > 1  # one generator: each job draws afresh


def test_holders_per_model_are_capped_counting_those_already_kept() -> None:
    wf, _ = workload()
    a_holders = set(range(10, 30))
    snap = view(40, {"a": a_holders, "b": {1, 2}})
    for seed in range(10):
        shown = candidates(
            snap,
            PlanScope(wf, frozenset({"w10"})),
            CandidateRule(0, holders=3),
            random.Random(seed),
        )
        idx = {snap.index(w) for w in shown}
        assert 10 in idx  # the planner, a holder of a: it counts among the three
        assert len(idx & a_holders) == 3
        assert idx & {1, 2} == {1, 2}  # b has only two holders: both
        assert len(idx) == 5


def test_pick_over_indices_matches_candidates_by_name() -> None:
    wf, _ = workload()
    snap = view(30, {"a": {3, 7, 21}, "b": {9, 28}})
    scope = PlanScope(wf, frozenset({"w11", "w12"}))
    rule = CandidateRule(5, holders=2)
    by_name = candidates(snap, scope, rule, random.Random(4))
    held = [snap.holds(m) for m in scope.models]
    index = pick(len(snap), held, [11, 12], rule, random.Random(4))
    assert by_name == tuple(snap.names[i] for i in index)


def test_a_small_view_is_taken_whole_as_the_rule_would_take_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A view no larger than k is answered without the masks when the rule would choose every
    worker without a draw: the same workers, and the generator left as the full rule leaves
    it (a holder cap that must sample still samples)."""
    wf, _ = workload()
    cases = []
    for seed in range(200):
        draw = random.Random(seed)
        n = draw.randint(1, 6)
        holds = {m: {i for i in range(n) if draw.random() < 0.5} for m in ("a", "b")}
        rule = CandidateRule(draw.randint(0, 6), draw.choice([None, 1, 2, 3]))
        keep = [f"w{draw.randrange(n):02d}"]
        cases.append((view(n, holds), PlanScope(wf, keep), rule, seed))

    def run() -> list[tuple[tuple[str, ...], list[int], object]]:
        out: list[tuple[tuple[str, ...], list[int], object]] = []
        for snap, scope, rule, seed in cases:
            rng = random.Random(seed)
            held = [snap.holds(m) for m in scope.models]
            keep = [snap.index(w) for w in scope.keep]
            picked = pick(len(snap), held, keep, rule, rng).tolist()
            out.append((candidates(snap, scope, rule, rng), picked, rng.getstate()))
        return out

    rule_of = module._all_chosen
    answers: list[bool] = []

    def spied(*args: Any) -> bool:
        answers.append(rule_of(*args))
        return answers[-1]

    monkeypatch.setattr(module, "_all_chosen", spied)
    fast = run()
    assert 40 < sum(answers) < len(answers)  # the shortcut taken, and not always
    monkeypatch.setattr(module, "_all_chosen", lambda *args: False)
    assert fast == run()


def test_the_watched_are_sampled_first_but_for_the_explorers() -> None:
    """A planner that watches some workers (their load is fresh) samples its k from them,
    all but ``explore``, and a model's holders from the watched ones first."""
    wf, _ = workload()
    snap = view(40, {"a": set(range(20, 40)), "b": {1, 2}})
    watched = {f"w{i:02d}" for i in (3, 4, 5, 6, 7, 25, 26)}
    scope = PlanScope(wf, frozenset({"w00"}))
    for seed in range(20):
        rule = CandidateRule(4, holders=2, explore=1)
        idx = {snap.index(w) for w in candidates(snap, scope, rule, random.Random(seed), watched)}
        assert {25, 26} <= idx  # a's two holders: the watched ones
        sampled = idx - {0, 1, 2, 25, 26}
        assert len(sampled) == 4 and len(sampled & {3, 4, 5, 6, 7}) == 3  # one explorer
        # with fewer watched than asked for, the rest are drawn from the others
        few = candidates(snap, scope, rule, random.Random(seed), {"w03"})
        assert "w03" in few and len(few) == 3 + 2 + 4
    # without explore, who is watched does not matter: the same sample as with none
    plain = CandidateRule(4, holders=2)
    assert candidates(snap, scope, plain, random.Random(7), watched) == candidates(
        snap, scope, plain, random.Random(7)
    )


def _pick_by_masks(
    n: int,
    held: list[np.ndarray[Any, Any]],
    keep: list[int],
    rule: CandidateRule,
    rng: random.Random,
    fresh: np.ndarray[Any, Any] | None,
) -> list[int]:
    """The rule as pick ran it before it drew positions (n-long masks): the reference."""

    def sample(pool: Any, need: int, fresh: Any, explore: int) -> Any:
        if fresh is None:
            return pool[rng.sample(range(len(pool)), need)]
        at = np.flatnonzero(fresh[pool])
        take = min(len(at), max(need - explore, 0))
        if take < len(at):
            at = at[rng.sample(range(len(at)), take)]
        left = np.ones(len(pool), dtype=np.bool_)
        left[at] = False
        others = pool[left]
        if len(others) > need - take:
            others = others[rng.sample(range(len(others)), need - take)]
        return np.concatenate((pool[at], others))

    chosen = np.zeros(n, dtype=np.bool_)
    chosen[keep] = True
    for row in held:
        if rule.holders is None:
            chosen |= row
            continue
        need = rule.holders - int(np.count_nonzero(row & chosen))
        if need > 0:
            more = np.flatnonzero(row & ~chosen)
            if len(more) > need:
                more = sample(more, need, fresh if rule.explore is not None else None, 0)
            chosen[more] = True
    if rule.k:
        rest = np.flatnonzero(~chosen)
        if len(rest) > rule.k:
            watched = None if rule.explore is None else fresh
            rest = sample(rest, rule.k, watched, rule.explore or 0)
        chosen[rest] = True
    return np.flatnonzero(chosen).tolist()


def _same_as_the_masks(
    seed: int,
    n: int,
    held: list[np.ndarray[Any, Any]],
    keep: list[int],
    rule: CandidateRule,
    fresh: np.ndarray[Any, Any] | None,
) -> None:
    fast, slow = random.Random(seed), random.Random(seed)
    picked = pick(n, held, keep, rule, fast, fresh)
    assert picked.dtype == np.intp
    assert picked.tolist() == _pick_by_masks(n, held, keep, rule, slow, fresh), seed
    assert fast.getstate() == slow.getstate(), seed


def test_pick_draws_as_the_masks_did() -> None:
    """pick draws from each pool's size and looks up only the workers drawn, where the
    reference lists each pool whole: the same workers for the same generator state, and the
    generator left the same, over random views, caps, explorers and watched sets (a
    simulation's results depend on it)."""
    for seed in range(3000):
        draw = random.Random(seed)
        n = draw.choice([3, 8, 20, 60, 200])
        held = [
            np.array([draw.random() < draw.choice([0.05, 0.3, 0.8]) for _ in range(n)])
            for _ in range(draw.randint(0, 3))
        ]
        keep = [draw.randrange(n) for _ in range(draw.randint(0, 4))]
        rule = CandidateRule(
            draw.randint(0, 8), draw.choice([None, 1, 2, 3]), draw.choice([None, 0, 1, 2, 9])
        )
        share = draw.choice([0.02, 0.2, 0.7])
        fresh = draw.choice([None, np.array([draw.random() < share for _ in range(n)])])
        _same_as_the_masks(seed, n, held, keep, rule, fresh)


def test_pick_draws_as_the_masks_did_in_a_large_busy_cluster() -> None:
    """The simulator's case: a thousand workers, two or three models, most workers holding
    them (or a few), a planner watching a few dozen to a few hundred, a handful kept (some
    twice), the rule k=6, two holders, one explorer (and other k, caps and explorers)."""
    for seed in range(300):
        draw = np.random.default_rng(seed)
        n = 1000
        held = [
            draw.random(n) < draw.choice([0.002, 0.2, 0.8, 0.99])
            for _ in range(draw.integers(2, 4))
        ]
        watched = draw.choice([0, 5, 50, 250])
        fresh = np.zeros(n, dtype=np.bool_)
        fresh[draw.choice(n, watched, replace=False)] = True
        keep = draw.integers(0, n, draw.integers(1, 8)).tolist()
        keep += keep[: draw.integers(0, 3)]
        rule = CandidateRule(
            int(draw.choice([6, 1, 30])), int(draw.choice([2, 1, 5])), int(draw.choice([1, 0, 6]))
        )
        _same_as_the_masks(seed, n, held, keep, rule, fresh)


def test_a_rule_needs_sane_counts() -> None:
    with pytest.raises(ConfigError, match="k must be"):
        CandidateRule(-1)
    with pytest.raises(ConfigError, match="holders must be"):
        CandidateRule(2, holders=0)
    with pytest.raises(ConfigError, match="explore must be"):
        CandidateRule(2, explore=-1)


def test_scope_models_are_sorted() -> None:
    wf, _ = workload()
    assert PlanScope(wf, frozenset()).models == ("a", "b")


def test_a_subset_keeps_each_workers_entries_and_names_its_members() -> None:
    snap = view(6, {"a": {1, 4}, "b": {5}})
    sub = snap.subset(["w04", "w01", "w05", "w04"])
    assert sub.names == ("w01", "w04", "w05")
    assert list(sub.wait_s) == [0.001, 0.004, 0.005]
    assert list(sub.free_bytes) == [10 * GB - MB, 10 * GB - 4 * MB, 10 * GB - 5 * MB]
    assert list(sub.holds("a")) == [True, True, False]
    assert list(sub.holds("b")) == [False, False, True]
    assert sub.index("w05") == 2
    assert sub.members is not None
    assert sub.members.names == snap.names
    assert list(sub.members.index) == [1, 4, 5]
    # a part of a part: positions still among all the view's workers
    part = sub.subset(["w05"])
    assert part.members is not None and list(part.members.index) == [5]
    assert not sub.wait_s.flags.writeable
    with pytest.raises(ConfigError, match="w09"):
        snap.subset(["w01", "w09"])


def test_a_full_view_has_no_members() -> None:
    assert view(3, {}).members is None


def test_a_cost_table_over_a_subset_is_the_full_one_indexed_down() -> None:
    wf, profiles = workload(8)
    snap = view(8, {"a": {2}})
    sub = snap.subset(["w01", "w02", "w06"])
    cache = CostCache()
    costs = cache.for_view(wf, profiles, sub)
    fresh = WorkflowCosts(wf, profiles, sub.names)
    assert costs.names == sub.names
    for got, want in zip(costs.exec_rows, fresh.exec_rows, strict=True):
        np.testing.assert_allclose(got, want)
    for got_f, want_f in zip(costs.fetch_rows, fresh.fetch_rows, strict=True):
        assert (got_f is None) == (want_f is None)
        if got_f is not None and want_f is not None:
            np.testing.assert_allclose(got_f, want_f)
    np.testing.assert_allclose(
        costs.transfer.row(1, 5 * MB, 0.1), fresh.transfer.row(1, 5 * MB, 0.1)
    )
    assert costs.rank_order == fresh.rank_order
    # the table over all the members is built once; the same cut is reused
    assert cache.for_view(wf, profiles, sub) is costs
    other = cache.for_view(wf, profiles, snap.subset(["w00", "w07"]))
    assert other.names == ("w00", "w07")
    assert cache.get(wf, profiles, snap.names) is cache.get(wf, profiles, snap.names)
