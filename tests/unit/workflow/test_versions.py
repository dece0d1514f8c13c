"""Fingerprints of an app and its weights (issue 39, item 3): what two workers compare at join,
and the weights version a planner keeps apart by."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from compass.cache import Model
from compass.cache.models import ModelCache
from compass.config import CacheConfig, WorkerConfig
from compass.errors import ConfigError, ProtocolError
from compass.gossip.port import GossipPort
from compass.sched.heartbeat import Heartbeat
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.versions import AppStamp, workflow_digest

KiB = 1024


def chain(*tasks: str, model: str = "m") -> Workflow:
    made: list[Task] = []
    after: tuple[str, ...] = ()
    for name in tasks:
        made.append(Task(name, model, after, TaskProfile(exec_ms=1, output_bytes=8)))
        after = (name,)
    return Workflow("chain", made)


def test_a_workflows_digest_follows_its_shape_not_its_declared_times() -> None:
    assert workflow_digest(chain("a", "b")) == workflow_digest(chain("a", "b"))
    slow = TaskProfile(exec_ms=9, output_bytes=8)
    slower = Workflow("chain", [Task("a", "m", (), slow), Task("b", "m", ("a",), slow)])
    assert workflow_digest(slower) == workflow_digest(chain("a", "b"))
    assert workflow_digest(chain("a", "b", "c")) != workflow_digest(chain("a", "b"))
    assert workflow_digest(chain("a", "b", model="n")) != workflow_digest(chain("a", "b"))


def test_another_app_is_refused_with_a_line_naming_what_differs() -> None:
    mine = AppStamp.of({"chain": chain("a", "b"), "solo": chain("x")}, {"m": "1"})
    theirs = AppStamp.of({"chain": chain("a", "b", "c"), "extra": chain("y")}, {"m": "1"})
    body = {"name": "w1", "address": "10.0.0.2:5000", **theirs.to_wire()}
    with pytest.raises(ConfigError) as info:
        mine.checked(body)
    message = str(info.value)
    assert "worker w1 at 10.0.0.2:5000 serves another app" in message
    assert "workflow 'chain' differs" in message
    assert "'solo' only here" in message and "'extra' only there" in message
    assert "\n" not in message
    # the same app with other weights joins: the versions are kept apart instead
    reweighted = AppStamp.of({"chain": chain("a", "b"), "solo": chain("x")}, {"m": "2"})
    assert mine.checked({"name": "w1", **reweighted.to_wire()}) is not None
    assert reweighted.version != mine.version != ""
    # a worker that says nothing of its app (not started yet, or older) is not refused
    assert mine.checked({"name": "w1"}) == {"name": "w1"}
    assert AppStamp().checked(body) is body and AppStamp().version == ""


def test_a_malformed_stamp_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="'app'"):
        AppStamp.from_wire({"app": ["chain"]})
    with pytest.raises(ProtocolError, match="'weights'"):
        AppStamp.from_wire({"app": {}, "weights": {"m": 3}})
    stamp = AppStamp.of({"chain": chain("a")}, {"m": "1"})
    assert AppStamp.from_wire(stamp.to_wire()) == stamp


@pytest.mark.asyncio
async def test_a_models_digest_is_of_the_weights_it_serves(tmp_path: Path) -> None:
    config = CacheConfig(capacity_bytes=64 * KiB, slab_bytes=4 * KiB, backend="strict")

    async def digests(w: float) -> dict[str, str]:
        save_file({"weight": torch.full((4, 4), w)}, str(tmp_path / "lin.safetensors"))
        models = {
            "lin": Model("lin", lambda: nn.Linear(4, 4, bias=False), weights="lin.safetensors",
                         root=tmp_path),
            "fake": Model.emulated("fake", 1000),
            # initialized by its builder, at random in every process
            "random": Model("random", lambda: nn.Linear(4, 4, bias=False)),
        }  # fmt: skip
        async with ModelCache(models, config) as cache:
            return await cache.prepare()

    first, again, other = await digests(1.0), await digests(1.0), await digests(2.0)
    assert first == again  # stable across builds (padding between tensors is left out)
    assert first["lin"] != other["lin"] and first["fake"] == other["fake"]
    # a builder's random weights are not told apart: every process would have its own version
    assert first["random"] == other["random"]


def test_a_planner_keeps_workers_of_another_version_apart() -> None:
    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9)
    port = GossipPort("w0", WorkerConfig(name="w0"), profiles=profiles)
    port.version = "old"

    def beat(name: str, version: str, seq: int) -> Heartbeat:
        return Heartbeat(name, 0.0, frozenset(), KiB, KiB, seq=seq, version=version)

    assert port.heard(beat("w1", "old", 1), 0.0)
    assert port.view.get("w1") is not None
    # w1 restarted with new weights: out of the view, no job planned here goes there
    assert not port.heard(beat("w1", "new", 2), 0.0)
    assert port.view.get("w1") is None and port.apart == {"w1": "new"}
    assert not port.heard(beat("w2", "new", 1), 0.0) and port.view.get("w2") is None
    # a worker that says no version (older) is not kept apart; one back on this side rejoins
    assert port.heard(beat("w3", "", 1), 0.0)
    assert port.heard(beat("w1", "old", 3), 0.0) and port.apart == {"w2": "new"}
    port.remove("w2")
    assert port.apart == {}
