"""The device convention of tasks with a model: inputs arrive on the model's device, outputs
leave on the host (compass/worker/executor.py)."""

from __future__ import annotations

from collections import namedtuple

import torch
from torch import nn

from compass.worker.devices import device_of as _device_of
from compass.worker.devices import moved as _moved


def test_every_tensor_in_nested_inputs_moves_and_nothing_else_changes():
    Pair = namedtuple("Pair", "a b")
    value = {
        "x": torch.ones(2),
        "items": [torch.zeros(1), ("text", torch.arange(3))],
        "n": 3,
        "pair": Pair(1, 2),
    }
    moved = _moved(value, torch.device("meta"))
    assert moved["x"].device.type == "meta"
    assert moved["items"][0].device.type == "meta"
    assert moved["items"][1][0] == "text"
    assert moved["items"][1][1].device.type == "meta"
    assert moved["n"] == 3
    assert moved["pair"] is value["pair"]  # a namedtuple is the user's type: left alone
    back = _moved({"y": torch.ones(2)}, torch.device("cpu"))
    assert back["y"].device.type == "cpu"


def test_the_device_of_a_module_is_that_of_its_tensors():
    assert _device_of(None) is None
    assert _device_of(nn.ReLU()) is None  # no tensors
    assert _device_of(nn.Linear(2, 2)) == torch.device("cpu")
    with torch.device("meta"):
        assert _device_of(nn.Linear(2, 2)) == torch.device("meta")
