"""The app's tasks as step-wise tasks: generators that give partial outputs as they go.

compass runs generator tasks (issue 34): :mod:`examples.tinylm.app` declares ``tell_steps``
with :func:`write_steps`, whose tokens a caller reads as they are made (``Client.stream``), and
``speak_steps`` with :func:`declare_steps`: three stages joined by streamed edges, so the
translator starts on the first word written and the speaker on the first sentence translated.

The rule these follow (issue 34, item 1): each ``yield`` ends a step and gives a partial
output; the function's ``return`` value is its final output, what a successor on a plain edge
and the caller's final result get. A successor on a streamed edge gets an iterator of its
predecessor's partial outputs instead; :func:`translate_steps` and :func:`synthesize_steps`
take any iterable of text pieces, so they work on both kinds of edge (a whole string is an
iterable of one-character pieces).

:func:`write_batched` is the same generation as a step function over a batch's seats
(``@compass.step_batch``): one model call a step for every job seated then, jobs joining and
leaving between two calls (continuous batching, issue 35). Each job's text is
:func:`~examples.tinylm.model.generate`'s for its prompt, whatever it shared its steps with.

The edges of :func:`declare_steps` are streamed (``after={"generate": Stream("text")}``);
:func:`stream_locally` chains the three generators in this process the same way, the reference
a cluster's answer is checked against.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import nn

import compass

from .model import TinyLM, generate, prompt_ids
from .speech import PigLatin, Sentences, speak

__all__ = [
    "declare_steps",
    "stream_locally",
    "synthesize_steps",
    "translate_steps",
    "write_batched",
    "write_steps",
]

T = TypeVar("T")


def write_steps(model: nn.Module, prompt: str, max_new_tokens: int) -> Generator[str, None, str]:
    """One step per generated token: yields each new piece, returns the whole text."""
    assert isinstance(model, TinyLM)
    pieces: list[str] = []
    for piece in generate(model, prompt, max_new_tokens):
        pieces.append(piece)
        yield piece
    return "".join(pieces)


@dataclass(slots=True)
class _Writing:
    """One seat's generation: its byte ids so far, how many it still makes, its text."""

    ids: list[int]
    left: int
    decoder: codecs.IncrementalDecoder
    pieces: list[str] = field(default_factory=list)


@compass.step_batch
def write_batched(model: nn.Module, seats: list[compass.Seat]) -> list[Any]:
    """One token for every seated job (greedy): their byte ids right-padded into one batch of
    one model call, each job's next byte read at its own last position (a causal model's
    padding after a sequence never changes what it computes before). A seat's item is its
    new piece of text, or ``Done(text)`` once it made ``max_new_tokens`` bytes; a bad prompt
    fails its job alone."""
    assert isinstance(model, TinyLM)
    items: list[Any] = [None] * len(seats)
    live: list[tuple[int, _Writing]] = []
    for i, seat in enumerate(seats):
        if seat.state is None:
            try:
                seat.state = _start(model, seat.inputs["prompt"], seat.inputs["max_new_tokens"])
            except ValueError as exc:
                items[i] = exc
                continue
        writing: _Writing = seat.state
        if writing.left == 0:
            items[i] = compass.Done(_text(writing))
        else:
            live.append((i, writing))
    if live:
        width = max(len(w.ids) for _, w in live)
        device = model.embed.weight.device
        batch = torch.zeros((len(live), width), dtype=torch.long, device=device)
        for row, (_, writing) in enumerate(live):
            batch[row, : len(writing.ids)] = torch.tensor(writing.ids, device=device)
        logits = model(batch)
        for row, (i, writing) in enumerate(live):
            token = int(logits[row, len(writing.ids) - 1].argmax())
            writing.ids.append(token)
            writing.left -= 1
            piece = writing.decoder.decode(bytes([token]))
            writing.pieces.append(piece)
            items[i] = compass.Done(_text(writing)) if writing.left == 0 else piece
    return items


def _start(model: TinyLM, prompt: Any, max_new_tokens: Any) -> _Writing:
    """A seat's generation, its inputs checked as :func:`generate` checks them."""
    ids = prompt_ids(model, prompt, max_new_tokens)
    return _Writing(ids, max_new_tokens, codecs.getincrementaldecoder("utf-8")(errors="replace"))


def _text(writing: _Writing) -> str:
    return "".join(writing.pieces) + writing.decoder.decode(b"", final=True)


def translate_steps(model: None, text: Iterable[str]) -> Generator[str, None, str]:
    """One step per piece that completes something: yields the translation of each finished
    word (and what follows it), returns the whole translation."""
    translator = PigLatin()
    done: list[str] = []
    for piece in text:
        out = translator.feed(piece)
        if out:
            done.append(out)
            yield out
    last = translator.flush()
    if last:
        done.append(last)
        yield last
    return "".join(done)


def synthesize_steps(
    model: nn.Module, text: Iterable[str]
) -> Generator[dict[str, Any], None, dict[str, Any]]:
    """One step per sentence: yields ``{"sentence", "audio"}`` as each sentence ends, returns
    ``{"sentences", "audio"}`` (what the collecting ``synthesize`` returns)."""
    cutter = Sentences()
    sentences: list[str] = []
    audio: list[Any] = []

    def spoken(sentence: str) -> dict[str, Any]:
        sentences.append(sentence)
        audio.append(speak(model, sentence))
        return {"sentence": sentence, "audio": audio[-1]}

    for piece in text:
        for sentence in cutter.feed(piece):
            yield spoken(sentence)
    for sentence in cutter.flush():
        yield spoken(sentence)
    return {"sentences": sentences, "audio": audio}


def declare_steps(app: compass.App, name: str = "speak_steps") -> None:
    """Declare the step-wise pipeline as workflow ``name`` (inputs ``prompt`` and
    ``max_new_tokens``): each stage reads the one before through a streamed edge."""
    flow = app.workflow(name, inputs=["prompt", "max_new_tokens"])
    flow.task(write_steps, name="generate", model="tinylm", steps=60, step_ms=2.0,
              output_bytes=256)  # fmt: skip
    flow.task(
        translate_steps, name="translate", after={"generate": compass.Stream("text")},
        steps=12, step_ms=0.01, output_bytes=384,
    )  # fmt: skip
    flow.task(
        synthesize_steps, name="synthesize", model="speaker",
        after={"translate": compass.Stream("text")}, steps=3, step_ms=1.0,
        output_bytes=384 * 32 * 4,
    )  # fmt: skip


def _relay(
    task: str, steps: Generator[T, None, Any], made: deque[tuple[str, Any]], finals: dict[str, Any]
) -> Iterator[T]:
    """``steps``'s partial outputs, each also noted in ``made`` under ``task``; its return
    value goes to ``finals[task]``."""
    while True:
        try:
            part = next(steps)
        except StopIteration as stop:
            finals[task] = stop.value
            return
        made.append((task, part))
        yield part


def stream_locally(
    tinylm: nn.Module, speaker: nn.Module, prompt: str, max_new_tokens: int
) -> Generator[tuple[str, Any], None, dict[str, Any]]:
    """The pipeline with streamed edges, in this process: yields ``(task, partial output)`` in
    the order they are made (each sentence's audio right after the sentence is translated, not
    after the whole text is written); returns the speaker's final output."""
    made: deque[tuple[str, Any]] = deque()
    finals: dict[str, Any] = {}
    written = _relay("generate", write_steps(tinylm, prompt, max_new_tokens), made, finals)
    translated = _relay("translate", translate_steps(None, written), made, finals)
    for _ in _relay("synthesize", synthesize_steps(speaker, translated), made, finals):
        while made:
            yield made.popleft()
    while made:
        yield made.popleft()
    result: dict[str, Any] = finals["synthesize"]
    return result
