"""Cost tables: vector rows agree with the scalar profile, caching follows versions."""

from __future__ import annotations

from pathlib import Path

import pytest

from compass.sched import CostCache, TransferModel, WorkflowCosts
from compass.workflow import Profiles, load_workload

PAPER = Path(__file__).resolve().parents[3] / "bench" / "workloads" / "paper.json"
WORKLOAD = load_workload(PAPER)
NAMES = ("a", "b", "c", "d")


def check_rows(p: Profiles) -> None:
    model = TransferModel(p, NAMES)
    for src, sender in enumerate(NAMES):
        row = model.row(src, 3_000_000, 7.0)
        for dst, receiver in enumerate(NAMES):
            assert row[dst] == pytest.approx(7.0 + p.transfer_s(sender, receiver, 3_000_000))
    outside = model.row(-1, 1000, 0.0)
    assert outside.tolist() == pytest.approx([p.transfer_s("elsewhere", n, 1000) for n in NAMES])


def test_transfer_rows_match_transfer_s_on_one_network() -> None:
    p = Profiles.from_workload(WORKLOAD)
    assert TransferModel(p, NAMES).uniform
    check_rows(p)


def test_transfer_rows_match_transfer_s_with_measured_links() -> None:
    p = Profiles.from_workload(WORKLOAD)
    p.set_h2d("b", 3e9)
    p.set_d2h("c", 2e9)
    p.set_link("a", "d", 1e8, 1e-3)
    p.set_link("d", "elsewhere", 1e7)  # a destination outside the view is ignored
    assert not TransferModel(p, NAMES).uniform
    check_rows(p)


def test_rank_order_puts_every_predecessor_first() -> None:
    p = Profiles.from_workload(WORKLOAD)
    for wf in WORKLOAD.workflows.values():
        costs = WorkflowCosts(wf, p, NAMES)
        position = {t: i for i, t in enumerate(costs.rank_order)}
        for t, preds in enumerate(costs.preds):
            for q in preds:
                assert position[q] < position[t]
    tr = WorkflowCosts(WORKLOAD.workflows["translation"], p, NAMES)
    order = [WORKLOAD.workflows["translation"].order[t] for t in tr.rank_order]
    # the longer translator ranks first: it is on the critical path
    assert order == ["generate", "mt5_b", "mt5_a", "marian", "aggregate"]


def test_cache_reuses_until_profiles_or_workers_change() -> None:
    p = Profiles.from_workload(WORKLOAD)
    wf = WORKLOAD.workflows["question_answer"]
    cache = CostCache()
    first = cache.get(wf, p, NAMES)
    assert cache.get(wf, p, NAMES) is first
    assert cache.get(wf, p, tuple(NAMES)) is first
    p.observe_exec("question_answer", "nli", "a", 0.5)
    second = cache.get(wf, p, NAMES)
    assert second is not first
    assert second.exec_rows[1][0] > first.exec_rows[1][0]
    p.set_network(1e9, 0.0)
    assert cache.get(wf, p, NAMES) is not second
    assert cache.get(wf, p, NAMES[:2]).exec_rows[0].shape == (2,)
