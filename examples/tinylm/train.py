"""The model's weights, made on this machine on first use: a few seconds of training on the
corpus this example ships (``corpus.txt``), with fixed seeds, cached as a safetensors file.

Deterministic: the initial weights and the batches come from seeded generators, and training
runs on the CPU on one thread (a parallel reduction may add in another order with another
thread count), so the same corpus, settings and torch build make the same weights bit for bit.
The cache file's name holds a digest of all three: a change to any is a new file, never a
stale one. Several workers loading at once train once: the first takes a file lock, the others
wait for its file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.nn import functional

from .model import TinyConfig, TinyLM

__all__ = [
    "CORPUS",
    "Training",
    "default_weights",
    "ensure_weights",
    "full_state",
    "load_weights",
    "save_weights",
    "train",
]

CORPUS = Path(__file__).resolve().parent / "corpus.txt"


@dataclass(frozen=True, slots=True)
class Training:
    """How the weights are made: ``steps`` of Adam on random windows of the corpus."""

    steps: int = 120
    batch: int = 16
    window: int = 64
    lr: float = 2e-2
    seed: int = 0


def corpus_bytes() -> bytes:
    return CORPUS.read_bytes()


def digest(config: TinyConfig, training: Training) -> str:
    """What the weights depend on: the corpus, both settings and the torch build."""
    h = hashlib.sha256(corpus_bytes())
    h.update(repr((asdict(config), asdict(training), torch.__version__)).encode())
    return h.hexdigest()[:16]


def default_weights(config: TinyConfig | None = None, training: Training | None = None) -> Path:
    """Where the app caches the weights: the system's temporary folder (never the repo)."""
    key = digest(config or TinyConfig(), training or Training())
    return Path(tempfile.gettempdir()) / "compass-tinylm" / f"tinylm-{key}.safetensors"


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class Adam:
    """Adam, written out: ``torch.optim`` imports torch's compiler on first use, which takes
    longer than this whole training on a busy machine."""

    def __init__(self, parameters: list[torch.Tensor], lr: float) -> None:
        self.parameters = parameters
        self.lr = lr
        self.betas = (0.9, 0.99)
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in parameters]
        self.steps = 0

    @torch.no_grad()
    def step(self) -> None:
        self.steps += 1
        b1, b2 = self.betas
        unbias1, unbias2 = 1 - b1**self.steps, 1 - b2**self.steps
        for p, (m, v) in zip(self.parameters, self.moments, strict=True):
            if p.grad is None:
                continue
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, (v / unbias2).sqrt_().add_(1e-8), value=-self.lr / unbias1)


def train(
    config: TinyConfig | None = None, training: Training | None = None
) -> dict[str, torch.Tensor]:
    """Train a fresh :class:`TinyLM` and return its state (the global RNG is left as it was)."""
    config = config or TinyConfig()
    training = training or Training()
    data = torch.tensor(list(corpus_bytes()), dtype=torch.long)
    if len(data) <= training.window + 1:
        raise ValueError(f"the corpus has {len(data)} bytes, fewer than a training window")
    with torch.random.fork_rng(devices=[]), _one_thread(), torch.enable_grad():
        torch.manual_seed(training.seed)
        model = TinyLM(config).train()
        batches = torch.Generator().manual_seed(training.seed)
        adam = Adam(list(model.parameters()), training.lr)
        offsets = torch.arange(training.window)
        for _ in range(training.steps):
            starts = torch.randint(
                0, len(data) - training.window - 1, (training.batch, 1), generator=batches
            )
            x, y = data[starts + offsets], data[starts + offsets + 1]
            loss = functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            model.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            adam.step()
    # the tied output weight is the embedding: saved once, under the embedding's key
    return {k: v.detach().clone() for k, v in model.state_dict().items() if k != "head.weight"}


def full_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A saved state with the tied output weight put back (saved once, as the embedding)."""
    return {**state, "head.weight": state["embed.weight"]}


def load_weights(path: str | Path, config: TinyConfig | None = None) -> TinyLM:
    """A :class:`TinyLM` with the weights in ``path``, in eval mode."""
    model = TinyLM(config)
    model.load_state_dict(full_state(load_file(str(path))))
    return model.eval()


def ensure_weights(
    path: str | Path | None = None,
    config: TinyConfig | None = None,
    training: Training | None = None,
) -> Path:
    """The weights file at ``path`` (default :func:`default_weights`), trained and written
    first when it does not exist. Written atomically under a lock: a concurrent caller waits
    and then finds the file."""
    target = Path(path) if path is not None else default_weights(config, training)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            save_weights(train(config, training), target)
    return target


def save_weights(state: dict[str, torch.Tensor], path: str | Path) -> Path:
    """Write ``state`` (as :func:`train` returns it) to ``path`` atomically: a reader never
    sees half a file."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".tmp")
    os.close(fd)
    try:
        save_file(state, tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return target
