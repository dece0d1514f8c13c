"""A workflow decided at run time: a small torch router picks one of two experts, and a
refiner loops until its own output says it is done (issue 38).

Start workers with it (``compass worker start --app examples.router_app``) and submit
``route`` jobs with ``x``, a float tensor of shape ``[4, 8]``:

- ``route`` (the ``router`` model) scores ``x`` and returns ``compass.choose(x, expert)``: only
  the chosen expert runs; the other is skipped.
- ``expert_a`` / ``expert_b`` (a model each) transform ``x``.
- ``refine`` (the ``refiner`` model) starts from whichever expert ran and repeats, at most
  :data:`MAX_STEPS` times, until the norm of its output falls under :data:`DONE_NORM`: it
  returns ``compass.stop(...)`` then, its plain output otherwise (go on).
- ``finish`` gets the loop's last output and answers ``{"y": tensor, "expert": name,
  "steps": n}``.

Every model is built with a fixed seed (no weights file), so :func:`reference` runs the same
task functions directly, in this process and without compass, and must give the same answer
(the integration test compares the two).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

import compass
from compass.workflow.choices import Decision, is_skipped

#: the refiner's most iterations, and the output norm under which it stops
MAX_STEPS = 6
DONE_NORM = 0.6
FEATURES = 8


def build(seed: int, out_features: int) -> nn.Module:
    """A linear layer with weights fixed by ``seed`` (its own RNG stream)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return nn.Linear(FEATURES, out_features).eval()


def build_router() -> nn.Module:
    return build(1, 2)


def build_expert_a() -> nn.Module:
    return build(2, FEATURES)


def build_expert_b() -> nn.Module:
    return build(3, FEATURES)


def build_refiner() -> nn.Module:
    return build(4, FEATURES)


app = compass.App("router")
app.model("router", build_router)
app.model("expert_a", build_expert_a)
app.model("expert_b", build_expert_b)
app.model("refiner", build_refiner)

flow = app.workflow("route", inputs=["x"])


@flow.task(model="router", output_bytes=256)
def route(model: nn.Module, x: torch.Tensor) -> Decision:
    """Pick the expert whose score, summed over the rows, is higher."""
    scores = model(x.float()).sum(dim=0)
    return compass.choose(x.float(), "expert_a" if scores[0] >= scores[1] else "expert_b")


@flow.task(model="expert_a", after=["route"], output_bytes=256)
def expert_a(model: nn.Module, route: torch.Tensor) -> dict[str, Any]:
    return {"y": torch.tanh(model(route)), "expert": "expert_a", "steps": 0}


@flow.task(model="expert_b", after=["route"], output_bytes=256)
def expert_b(model: nn.Module, route: torch.Tensor) -> dict[str, Any]:
    return {"y": torch.relu(model(route)), "expert": "expert_b", "steps": 0}


@flow.task(model="refiner", after=["expert_a", "expert_b"], output_bytes=256)
def refine(model: nn.Module, expert_a: Any = None, expert_b: Any = None, carry: Any = None) -> Any:
    """One refining step: halve the refiner's output; stop once its norm is small."""
    state = carry if carry is not None else (expert_b if is_skipped(expert_a) else expert_a)
    y = 0.5 * torch.tanh(model(state["y"]))
    out = {"y": y, "expert": state["expert"], "steps": state["steps"] + 1}
    return compass.stop(out) if float(y.norm()) < DONE_NORM else out


@flow.task(after=["refine"], output_bytes=256)
def finish(module: None, refine: dict[str, Any]) -> dict[str, Any]:
    return refine


flow.branch("route", {"expert_a": 1, "expert_b": 1})
flow.loop(["refine"], until="refine", max_iter=MAX_STEPS)


def reference(x: torch.Tensor) -> dict[str, Any]:
    """The answer of a ``route`` job, from the same task functions run here directly."""
    with torch.inference_mode():
        chosen = route(build_router(), x)
        expert = expert_a if chosen.to == "expert_a" else expert_b
        build_expert = build_expert_a if chosen.to == "expert_a" else build_expert_b
        state: Any = {"carry": None, chosen.to: expert(build_expert(), chosen.value)}
        other = "expert_b" if chosen.to == "expert_a" else "expert_a"
        state[other] = compass.SKIPPED
        refiner = build_refiner()
        for _ in range(MAX_STEPS):
            out = refine(refiner, **state)
            if isinstance(out, Decision):
                return finish(None, out.value)
            state = {"carry": out}
        return finish(None, out)
