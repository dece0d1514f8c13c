"""A small byte-level decoder-only transformer, and generation one token per step.

:class:`TinyLM` is GPT-shaped: byte and position embeddings, pre-norm blocks of causal
self-attention and an MLP, a final norm and an output layer tied to the byte embedding. With
the default :class:`TinyConfig` it has about 130 thousand parameters.

:func:`generate` is a Python generator: it runs the prompt through the model once, filling a
:class:`KVCache`, then each step feeds only the token it just chose (the keys and values of
the earlier ones are in the cache), so a step costs one token's work. It yields each new piece
of text as it is made; ``cache=False`` recomputes the whole sequence at every step instead (the
tests check both give the same text).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = ["KVCache", "TinyConfig", "TinyLM", "generate", "prompt_ids"]


@dataclass(frozen=True, slots=True)
class TinyConfig:
    """The model's shape. ``context`` bounds a prompt plus what is generated after it."""

    vocab: int = 256  # bytes
    context: int = 256
    width: int = 64
    heads: int = 4
    layers: int = 2

    @property
    def head_width(self) -> int:
        return self.width // self.heads


class KVCache:
    """The keys and values of every position seen so far, per layer, preallocated for the
    whole context: ``keys[layer][:, :, :length]`` are filled."""

    def __init__(self, config: TinyConfig, device: torch.device, dtype: torch.dtype) -> None:
        shape = (config.layers, 1, config.heads, config.context, config.head_width)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def extend(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new positions' keys and values (``[1, heads, new, head_width]``) after the
        cached ones; all of them so far. The caller advances :attr:`length` after the last
        layer."""
        end = self.length + keys.shape[2]
        self.keys[layer, :, :, self.length : end] = keys
        self.values[layer, :, :, self.length : end] = values
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]


class Attention(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.width, 3 * config.width)
        self.out = nn.Linear(config.width, config.width)

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        batch, new, width = x.shape
        q, k, v = (
            part.view(batch, new, self.heads, width // self.heads).transpose(1, 2)
            for part in self.qkv(x).split(width, dim=2)
        )
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.extend(layer, k, v)
        if past == 0:
            y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # the new positions see every cached one and the new ones up to themselves
            rows = torch.arange(new, device=x.device).unsqueeze(1) + past
            mask = torch.arange(past + new, device=x.device).unsqueeze(0) <= rows
            y = functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(batch, new, width))
        return out


class Block(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.width)
        self.attention = Attention(config)
        self.norm2 = nn.LayerNorm(config.width)
        self.up = nn.Linear(config.width, 4 * config.width)
        self.down = nn.Linear(4 * config.width, config.width)

    def forward(self, x: torch.Tensor, cache: KVCache | None, layer: int) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), cache, layer)
        out: torch.Tensor = x + self.down(functional.gelu(self.up(self.norm2(x))))
        return out


#: the standard deviation of the initial weights (GPT-2's)
STD = 0.02


def _small(*shape: int, std: float = STD) -> torch.Tensor:
    """Initial weights of standard deviation ``std``, uniform rather than normal: on the meta
    device (where compass measures a model) ``normal_`` imports torch's compiler, seconds of
    a worker's start, and ``uniform_`` does not."""
    bound = std * math.sqrt(3)
    return torch.empty(shape).uniform_(-bound, bound)


class TinyLM(nn.Module):
    """Byte ids ``[batch, positions]`` -> next-byte logits ``[batch, positions, 256]``."""

    def __init__(self, config: TinyConfig | None = None) -> None:
        super().__init__()
        self.config = config = config or TinyConfig()
        self.embed = nn.Embedding(
            config.vocab, config.width, _weight=_small(config.vocab, config.width)
        )
        self.position = nn.Embedding(
            config.context, config.width, _weight=_small(config.context, config.width)
        )
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.width)
        self.head = nn.Linear(config.width, config.vocab, bias=False)
        self.head.weight = self.embed.weight  # tied: one table of byte vectors
        with torch.no_grad():
            for block in self.blocks:
                assert isinstance(block, Block)
                for linear in (block.attention.qkv, block.up):
                    linear.weight.copy_(_small(*linear.weight.shape))
                    linear.bias.zero_()
                # GPT-2's smaller start for the layers that write into the residual stream
                for linear in (block.attention.out, block.down):
                    linear.weight.copy_(
                        _small(*linear.weight.shape, std=STD / math.sqrt(2 * config.layers))
                    )
                    linear.bias.zero_()

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        start = 0 if cache is None else cache.length
        if start + ids.shape[1] > self.config.context:
            raise ValueError(
                f"{start + ids.shape[1]} positions exceed the model's context of "
                f"{self.config.context}"
            )
        positions = torch.arange(start, start + ids.shape[1], device=ids.device)
        x = self.embed(ids) + self.position(positions)
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += ids.shape[1]
        out: torch.Tensor = self.head(self.norm(x))
        return out


def encode(text: str) -> list[int]:
    """The byte ids of ``text`` (UTF-8)."""
    return list(text.encode("utf-8"))


@torch.inference_mode()
def _last_logits(model: TinyLM, ids: list[int], cache: KVCache | None) -> torch.Tensor:
    """The next-byte logits after ``ids`` (the new ones only when a cache holds the rest).
    Inference mode per call, not around the generator: a context held across a ``yield``
    would leak into whatever the consumer runs between steps."""
    device = model.embed.weight.device
    logits: torch.Tensor = model(torch.tensor([ids], device=device), cache)
    return logits[0, -1].float()


def _choose(logits: torch.Tensor, temperature: float, rng: torch.Generator) -> int:
    if temperature == 0:
        return int(logits.argmax())
    probs = torch.softmax(logits.cpu() / temperature, dim=0)
    return int(torch.multinomial(probs, 1, generator=rng))


def prompt_ids(model: TinyLM, prompt: Any, max_new_tokens: Any) -> list[int]:
    """The byte ids of ``prompt``, checked with ``max_new_tokens`` against the model's context
    (a ValueError that says what is wrong otherwise)."""
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise ValueError(f"max_new_tokens must be an integer, got {max_new_tokens!r}")
    ids = encode(prompt)
    room = model.config.context - len(ids)
    if not 0 <= max_new_tokens <= room:
        raise ValueError(
            f"max_new_tokens must be in [0, {room}]: the {len(ids)}-byte prompt leaves that "
            f"much of the model's {model.config.context}-byte context, got {max_new_tokens}"
        )
    return ids


def generate(
    model: TinyLM,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.0,
    seed: int = 0,
    cache: bool = True,
) -> Iterator[str]:
    """Continue ``prompt`` by ``max_new_tokens`` bytes, yielding each new piece of text.

    One model call per token: the prompt's first, then one call of one token per step.
    ``temperature=0`` is greedy (the likeliest byte each step: the same text every time);
    above 0 it samples with a generator seeded by ``seed`` (the same text for the same seed).
    A piece is one byte's worth of text; a byte that only starts a multi-byte character yields
    nothing until the character is whole, so the pieces joined are always valid text.
    """
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    ids = prompt_ids(model, prompt, max_new_tokens)
    rng = torch.Generator().manual_seed(seed)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kv = None
    if cache:
        weight = model.embed.weight
        kv = KVCache(model.config, weight.device, weight.dtype)
    logits = _last_logits(model, ids, kv)
    for step in range(max_new_tokens):
        token = _choose(logits, temperature, rng)
        piece = decoder.decode(bytes([token]))
        if piece:
            yield piece
        if step + 1 < max_new_tokens:
            ids.append(token)
            logits = _last_logits(model, [token] if kv is not None else ids, kv)
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail
