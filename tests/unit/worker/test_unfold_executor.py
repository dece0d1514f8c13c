"""A decision task's output leaves its device like any other output: the executor moves the
tensors inside a :class:`~compass.workflow.choices.Decision` (only CPU tensors cross the
wire)."""

from __future__ import annotations

import torch

from compass.worker.devices import moved as _moved
from compass.workflow.choices import choose, fan_out


def test_the_tensors_of_a_decision_move_with_it() -> None:
    meta = torch.device("meta")  # a device of its own, on any machine
    chosen = _moved(choose({"y": torch.ones(2)}, "expert"), meta)
    assert chosen.to == "expert" and chosen.value["y"].device == meta
    fanned = _moved(fan_out([torch.ones(1), torch.zeros(1)]), meta)
    assert fanned.items is not None and all(item.device == meta for item in fanned.items)
    assert all(item.device == meta for item in fanned.value)
