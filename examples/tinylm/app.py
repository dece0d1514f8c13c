"""A generating model on compass: a tiny byte-level transformer writes, a translator and a
speaker follow. Everything is made on this machine; nothing is downloaded::

    OMP_NUM_THREADS=1 compass worker start --app examples.tinylm.app
    compass submit tell -i 'prompt=The ship' -i max_new_tokens=60

The models: ``tinylm`` (:class:`~examples.tinylm.model.TinyLM`, about 130 thousand parameters)
gets its weights from :func:`~examples.tinylm.train.ensure_weights`: trained on first use on the
corpus shipped beside this file, with fixed seeds, and cached under the system's temporary
folder (:func:`~examples.tinylm.train.default_weights`); a worker that finds the file loads it.
``speaker`` (:class:`~examples.tinylm.speech.Speaker`) is built from a seed. One intra-op thread
suits models this small (``OMP_NUM_THREADS=1``): on a busy machine a thread pool's hand-offs
cost far more than the arithmetic.

Workflows (``prompt``: a non-empty string; ``max_new_tokens``: how many bytes to write; the
prompt and the new bytes together fit the model's 256-byte context):

- ``tell``: task ``generate``: the generated text, greedy (the same prompt gives the same text
  on every worker and in :func:`~examples.tinylm.model.generate` run directly).
- ``speak``: ``generate`` -> ``translate`` (pig latin) -> ``synthesize``:
  ``{"sentences": [str], "audio": [tensor]}``, one waveform-like tensor per translated sentence.

Each task there returns its whole output (``write`` collects what
:func:`~examples.tinylm.model.generate` yields).

- ``tell_steps``: the same generation a token a step (:func:`~.steps.write_steps`, a
  generator): ``Client.stream`` (or ``compass submit --stream``) gets each token as it is made,
  then the whole text.
- ``speak_steps``: ``speak`` with the step-wise versions of its three tasks
  (:mod:`examples.tinylm.steps`), each reading the one before through a streamed edge: the
  speaker says the first sentence while the rest is written. Its answer is ``speak``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from torch import nn

import compass

from .model import TinyConfig, TinyLM, generate
from .speech import build_speaker, pig_latin, speak, split_sentences
from .steps import declare_steps, write_batched, write_steps
from .train import Training, default_weights, ensure_weights, full_state

__all__ = ["app", "build_app", "synthesize", "translate", "write"]


def write(model: nn.Module, prompt: str, max_new_tokens: int) -> str:
    """``generate`` collected: the whole continuation of ``prompt`` (greedy)."""
    assert isinstance(model, TinyLM)
    return "".join(generate(model, prompt, max_new_tokens))


def translate(model: None, text: str) -> str:
    return pig_latin(text)


def synthesize(model: nn.Module, text: str) -> dict[str, Any]:
    sentences = split_sentences(text)
    return {"sentences": sentences, "audio": [speak(model, s) for s in sentences]}


class WeightsLoader:
    """The ``tinylm`` model's loader: the cached weights, trained first if missing."""

    def __init__(self, training: Training | None) -> None:
        self.training = training

    def __call__(self, path: Path) -> dict[str, Any]:
        return full_state(load_file(str(ensure_weights(path, training=self.training))))


def build_app(weights: str | Path | None = None, training: Training | None = None) -> compass.App:
    """The app, its weights cached at ``weights`` (default: :func:`default_weights`) and made
    with ``training`` (default :class:`Training`) when the file is missing."""
    app = compass.App("tinylm")
    path = Path(weights) if weights is not None else default_weights(TinyConfig(), training)
    app.model("tinylm", TinyLM, weights=path, loader=WeightsLoader(training))
    app.model("speaker", build_speaker)
    # expected times are for a CPU and about a hundred bytes; measurements take over at run time
    tell = app.workflow("tell", inputs=["prompt", "max_new_tokens"])
    tell.task(write, name="generate", model="tinylm", expected_ms=100.0, output_bytes=256)
    # the same generation a token a step: Client.stream and `compass submit --stream` get each
    # token as it is made (examples/tinylm/steps.py)
    steps = app.workflow("tell_steps", inputs=["prompt", "max_new_tokens"])
    steps.task(write_steps, name="generate", model="tinylm", steps=60, step_ms=2.0,
               output_bytes=256)  # fmt: skip
    # the same generation as one step function over every job seated: jobs that come while it
    # runs join it at its next token (continuous batching)
    batched = app.workflow("tell_batched", inputs=["prompt", "max_new_tokens"])
    batched.task(write_batched, name="generate", model="tinylm", steps=60, step_ms=2.0,
                 batch=8, batch_item=0.1, output_bytes=256)  # fmt: skip
    # the same pipeline, each stage reading the one before as it comes (streamed edges)
    declare_steps(app)
    spoken = app.workflow("speak", inputs=["prompt", "max_new_tokens"])
    spoken.task(write, name="generate", model="tinylm", expected_ms=100.0, output_bytes=256)
    spoken.task(translate, after={"generate": "text"}, expected_ms=0.1, output_bytes=384)
    spoken.task(
        synthesize,
        model="speaker",
        after={"translate": "text"},
        expected_ms=2.0,
        output_bytes=384 * 32 * 4,
    )
    return app


app = build_app()
