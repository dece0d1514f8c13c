"""A small real workflow: two torch models, a join, weights in safetensors.

Start workers with it: ``compass worker start --app examples.vision_app``. The weights are made
once, deterministically, and saved next to this file (``examples/weights/``, not committed), the
way a deployment would ship trained weights.

The tasks follow compass's device convention: a task with a model gets its input tensors on the
model's device (the GPU with ``--backend cupy``) and its output tensors are moved to the host for
it, so the same functions run on every backend (``--backend strict`` checks the GPU's rules on a
CPU).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

import compass

WEIGHTS = Path(__file__).resolve().parent / "weights"


class Encoder(nn.Module):
    """3x32x32 image -> 64 features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.proj = nn.Linear(32 * 4 * 4, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv1(x))
        x = torch.relu(self.conv2(x))
        out: torch.Tensor = self.proj(self.pool(x).flatten(1))
        return out


class Classifier(nn.Module):
    """64 features -> 10 class logits."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.net(x)
        return out


def weights_for(name: str, module_type: type[nn.Module], seed: int) -> Path:
    """The safetensors file of ``name``, created once with deterministic weights."""
    path = WEIGHTS / f"{name}.safetensors"
    if not path.exists():
        WEIGHTS.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(seed)
        state = {k: v.contiguous() for k, v in module_type().state_dict().items()}
        fd, tmp = tempfile.mkstemp(dir=WEIGHTS, suffix=".tmp")
        os.close(fd)
        save_file(state, tmp)
        os.replace(tmp, path)  # atomic: workers importing at once never see half a file
    return path


app = compass.App("vision")
app.model("encoder", Encoder, weights=weights_for("encoder", Encoder, seed=1))
app.model("classifier", Classifier, weights=weights_for("classifier", Classifier, seed=2))

describe = app.workflow("describe", inputs=["image"], best_ms=5.0)


@describe.task(model="encoder", expected_ms=2.0, output_bytes=256)
def encode(model: nn.Module, image: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(image.float())
    return out


@describe.task(model="classifier", after=["encode"], expected_ms=1.0, output_bytes=40)
def classify(model: nn.Module, encode: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(encode)
    return out


@describe.task(after=["encode"], expected_ms=0.1, output_bytes=256)
def normalize(model: None, encode: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(encode, dim=1)


@describe.task(after=["classify", "normalize"], expected_ms=0.1, output_bytes=300)
def report(model: None, classify: torch.Tensor, normalize: torch.Tensor) -> dict[str, Any]:
    return {
        "label": classify.argmax(dim=1),
        "probs": torch.softmax(classify, dim=1),
        "embedding": normalize,
    }


fails = app.workflow("fails", inputs=["x"])


@fails.task(expected_ms=0.1)
def explode(model: None, x: Any) -> Any:
    raise ValueError(f"cannot handle {x!r}")


echo = app.workflow("echo", inputs=["x"])


@echo.task(expected_ms=0.01)
def identity(model: None, x: Any) -> Any:
    return x


def reference(image: torch.Tensor) -> dict[str, torch.Tensor]:
    """The workflow's result computed directly, without compass (tests compare the two)."""
    from safetensors.torch import load_file

    encoder, classifier = Encoder(), Classifier()
    encoder.load_state_dict(load_file(weights_for("encoder", Encoder, 1)))
    classifier.load_state_dict(load_file(weights_for("classifier", Classifier, 2)))
    with torch.inference_mode():
        features = encoder(image.float())
        logits = classifier(features)
        return {
            "label": logits.argmax(dim=1),
            "probs": torch.softmax(logits, dim=1),
            "embedding": torch.nn.functional.normalize(features, dim=1),
        }
