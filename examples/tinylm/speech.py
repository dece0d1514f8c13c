"""The pipeline's later stages, both able to take text piece by piece as it is written.

- :class:`PigLatin` translates: a word is translated once it is whole (the character after it
  is not a letter), so it consumes a stream of pieces and gives translated text back as soon
  as each word ends. Fed in any split, it gives what :func:`pig_latin` gives for the whole.
- :class:`Sentences` cuts text into sentences as they end (``.``, ``!``, ``?`` or a newline).
- :class:`Speaker` is the second torch model, standing in for a speech synthesizer: a sentence
  becomes a waveform-like tensor of :data:`FRAME` samples per byte, from an embedding, a
  convolution over neighbouring bytes and a projection, with weights built from a fixed seed.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "FRAME",
    "PigLatin",
    "Sentences",
    "Speaker",
    "build_speaker",
    "pig_latin",
    "speak",
    "split_sentences",
]

VOWELS = frozenset("aeiouAEIOU")
#: samples per byte of a spoken sentence
FRAME = 32
#: what ends a sentence
ENDINGS = frozenset(".!?\n")


def _is_letter(ch: str) -> bool:
    return ch.isascii() and ch.isalpha()


def _word(word: str) -> str:
    """One word of ASCII letters in pig latin, its capital kept in front: ``The`` -> ``Ethay``,
    ``and`` -> ``andway``."""
    if word[0] in VOWELS:
        out = word + "way"
    else:
        cut = next((i for i, ch in enumerate(word) if ch in VOWELS), len(word))
        out = word[cut:] + word[:cut] + "ay"
    if word[0].isupper() and not word.isupper():
        out = out[0].upper() + out[1:].lower()
    return out


class PigLatin:
    """Incremental pig latin: :meth:`feed` pieces, :meth:`flush` at the end."""

    def __init__(self) -> None:
        self._word: list[str] = []

    def feed(self, piece: str) -> str:
        """The translation of everything in ``piece`` that is complete: every character but a
        word still being written, which waits for its end."""
        out: list[str] = []
        for ch in piece:
            if _is_letter(ch):
                self._word.append(ch)
                continue
            if self._word:
                out.append(_word("".join(self._word)))
                self._word.clear()
            out.append(ch)
        return "".join(out)

    def flush(self) -> str:
        """The last word, if the text ended inside one."""
        word = "".join(self._word)
        self._word.clear()
        return _word(word) if word else ""


def pig_latin(text: str) -> str:
    """The whole of ``text`` in pig latin."""
    translator = PigLatin()
    return translator.feed(text) + translator.flush()


class Sentences:
    """Cuts a stream of text into sentences: :meth:`feed` gives those that ended."""

    def __init__(self) -> None:
        self._open: list[str] = []

    def feed(self, piece: str) -> list[str]:
        done: list[str] = []
        for ch in piece:
            self._open.append(ch)
            if ch in ENDINGS:
                sentence = "".join(self._open).strip()
                self._open.clear()
                if sentence:
                    done.append(sentence)
        return done

    def flush(self) -> list[str]:
        """The unfinished last sentence, if it has anything but blanks."""
        sentence = "".join(self._open).strip()
        self._open.clear()
        return [sentence] if sentence else []


def split_sentences(text: str) -> list[str]:
    sentences = Sentences()
    return sentences.feed(text) + sentences.flush()


class Speaker(nn.Module):
    """Byte ids ``[n]`` -> ``[n * FRAME]`` samples in [-1, 1]."""

    def __init__(self) -> None:
        super().__init__()
        # given its table: Embedding's own init (normal_) imports torch's compiler on the meta
        # device, where compass measures a model
        self.embed = nn.Embedding(256, 24, _weight=torch.empty(256, 24).uniform_(-1.7, 1.7))
        self.blend = nn.Conv1d(24, 24, kernel_size=3, padding=1)  # each byte hears its neighbours
        self.project = nn.Linear(24, FRAME)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).T.unsqueeze(0)  # [1, channels, n]
        x = torch.tanh(self.blend(x))[0].T  # [n, channels]
        return torch.tanh(self.project(x)).flatten()


def build_speaker() -> Speaker:
    """The speaker with its weights from a fixed seed (the global RNG is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        return Speaker()


@torch.inference_mode()
def speak(model: nn.Module, sentence: str) -> torch.Tensor:
    """The samples of one sentence (on the model's device)."""
    device = next(model.parameters()).device
    ids = torch.tensor(list(sentence.encode("utf-8")), device=device)
    out: torch.Tensor = model(ids)
    return out
