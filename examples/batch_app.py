"""A batched task: queued embeddings of different jobs run as one forward pass.

Start workers with it: ``compass worker start --app examples.batch_app``, then submit
``embed`` jobs (``x``: a float tensor of shape ``[rows, 16]``, any number of rows) from several
clients at once; ``compass status --json`` shows under ``batches`` how many tasks each run took.

``embed`` declares ``batch=8, batch_item=0.15``: up to eight queued ``embed`` tasks run as one
call, and each item past the first is expected to add 15% of a run (the worker learns the real
curve as it measures batches). Its function receives ``x`` as a list, one tensor per job, and
returns one output per job, in order. Jobs may send different numbers of rows, so it
concatenates them and splits the result back rather than stacking. An input of the wrong
shape fails its own job (an ``Exception`` returned in its place), not the others of the batch.

The model is built with a fixed seed (no weights file), so :func:`reference` computes the same
result directly, without compass (tests compare the two).
"""

from __future__ import annotations

import torch
from torch import nn

import compass

#: features per input row, and per output row
IN_FEATURES = 16
OUT_FEATURES = 8


def build_mlp() -> nn.Module:
    """A small MLP with deterministic weights (its own RNG stream: the global one is left as
    it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        return nn.Sequential(
            nn.Linear(IN_FEATURES, 64), nn.GELU(), nn.Linear(64, OUT_FEATURES), nn.Tanh()
        )


app = compass.App("batching")
app.model("mlp", build_mlp)

embed_wf = app.workflow("embed", inputs=["x"])


@embed_wf.task(model="mlp", batch=8, batch_item=0.15, expected_ms=2.0, output_bytes=256)
def embed(model: nn.Module, x: list[torch.Tensor]) -> list[torch.Tensor | Exception]:
    """One ``[rows, 8]`` embedding per job; a bad input fails its own job only."""
    outputs: list[torch.Tensor | Exception] = []
    good: list[tuple[int, torch.Tensor]] = []
    for i, item in enumerate(x):
        if isinstance(item, torch.Tensor) and item.dim() == 2 and item.shape[1] == IN_FEATURES:
            good.append((i, item))
            outputs.append(item)  # replaced below by its embedding
        else:
            shape = tuple(item.shape) if isinstance(item, torch.Tensor) else type(item).__name__
            outputs.append(ValueError(f"x must be a [rows, {IN_FEATURES}] tensor, got {shape}"))
    if good:
        # the inputs arrived on the model's device, and the outputs leave for the host: the
        # worker moves them (the device convention), so this code is the same on CPU and GPU
        out = model(torch.cat([item.float() for _, item in good]))
        parts = out.split([item.shape[0] for _, item in good])
        for (i, _), part in zip(good, parts, strict=True):
            outputs[i] = part
    return outputs


def reference(x: torch.Tensor) -> torch.Tensor:
    """``embed``'s output for one job, computed directly."""
    with torch.inference_mode():
        out: torch.Tensor = build_mlp()(x.float())
        return out
