"""What issue 39's items 2 and 3 cost a worker, each beside what it rides on (``compass bench
versions``):

- **Learned times in its state.** A heartbeat (the state a worker pushes to its watchers and
  rumors to all) with no learned times, as an emulated worker's, and with the most a worker
  spreads (:data:`~compass.workflow.profile.LEARNED_SPREAD`): bytes on the wire, and CPU
  microseconds to encode (``to_wire`` and msgpack) and to decode (msgpack and ``from_wire``).
  Then a peer's core taking them in (``Estimates.adopt``): new times, and the same times again
  (what most heartbeats repeat).
- **The weights' fingerprint at start.** A model of ``--model-mb`` staged in host memory
  (built, then copied into its staging buffer: what every worker does at start) against
  hashing what was staged (:meth:`ModelCache.digest`), each timed once per round, the best of
  the rounds kept.

Ratios compare the two sides of one run on this machine.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack

from compass.config import CacheConfig
from compass.core.estimates import Estimates
from compass.sched import make_policy
from compass.sched.heartbeat import Heartbeat
from compass.workflow import Profiles, Task, TaskProfile, Workflow
from compass.workflow.profile import LEARNED_SPREAD

from .report import best_cpu_us, machine, print_table, write_json

__all__ = ["run"]

MB = 1 << 20


def _workflow() -> Workflow:
    profile = TaskProfile(exec_ms=50, output_bytes=1000)
    tasks = [Task(f"task_{i:02d}", None, (), profile) for i in range(LEARNED_SPREAD)]
    return Workflow("pipeline", tasks)


def _heartbeats(count: int, rounds: int) -> list[dict[str, Any]]:
    learned = tuple(
        ("pipeline", f"task_{i:02d}", 0.05 + i / 1000, 10) for i in range(LEARNED_SPREAD)
    )
    rows = []
    for label, entries in (("none", ()), (f"{LEARNED_SPREAD} learned times", learned)):
        state = Heartbeat("w1", 0.012, frozenset({"a", "b"}), 3 * MB, 16 * MB, seq=9,
                          h2d_bytes_per_s=12e9, version="0123456789ab",
                          learned=entries)  # fmt: skip
        packed = msgpack.packb(state.to_wire())

        def encode(_: int, state: Heartbeat = state) -> None:
            msgpack.packb(state.to_wire())

        def decode(_: int, packed: bytes = packed) -> None:
            Heartbeat.from_wire(msgpack.unpackb(packed))

        rows.append({"learned": label, "bytes": len(packed),
                     "encode_us": best_cpu_us(encode, count, rounds),
                     "decode_us": best_cpu_us(decode, count, rounds)})  # fmt: skip
    profiles = Profiles(h2d_bytes_per_s=1e9, net_bytes_per_s=1e9, workflows=[_workflow()])
    estimates = Estimates("w0", make_policy("compass"), profiles, host_lanes=True)
    beats = [
        Heartbeat("w1", 0.0, frozenset(), 0, 0, seq=k, learned=tuple(
            (wf, task, seconds * (1 + (k % 7) / 10), n) for wf, task, seconds, n in learned))
        for k in range(64)
    ]  # fmt: skip
    fresh = best_cpu_us(lambda k: estimates.adopt(beats[k % 64]), count // 10, rounds)
    estimates.adopt(beats[0])
    # the same times again, as a peer's next heartbeat decodes them: equal, not the same objects
    again = [Heartbeat.from_wire(beats[0].to_wire()) for _ in range(2)]
    same = best_cpu_us(lambda k: estimates.adopt(again[k % 2]), count, rounds)
    rows.append({"learned": "adopt new times", "adopt_us": fresh})
    rows.append({"learned": "adopt the same again", "adopt_us": same})
    return rows


def _fingerprint(model_mb: int, rounds: int) -> dict[str, Any]:
    import asyncio

    from torch import nn

    from compass.cache import Model
    from compass.cache.models import ModelCache

    width = 1024
    layers = max(1, model_mb * MB // (width * width * 4))
    model = Model(
        "m", lambda: nn.Sequential(*(nn.Linear(width, width, bias=False) for _ in range(layers)))
    )
    config = CacheConfig(capacity_bytes=2 * model.size_bytes + 64 * MB, slab_bytes=64 * MB,
                         backend="host")  # fmt: skip
    stage_s, hash_s = float("inf"), float("inf")
    for _ in range(rounds):
        cache = ModelCache({"m": model}, config)
        start = time.perf_counter()
        cache._staged("m")
        stage_s = min(stage_s, time.perf_counter() - start)
        start = time.perf_counter()
        cache.digest("m")
        hash_s = min(hash_s, time.perf_counter() - start)
        asyncio.run(cache.aclose())
    size = model.size_bytes
    return {
        "model_mb": size / MB,
        "stage_s": stage_s,
        "hash_s": hash_s,
        "hash_gb_per_s": size / hash_s / 1e9,
        "hash_over_stage": hash_s / stage_s,
    }


def run(
    *, quick: bool = False, model_mb: int = 256, json_path: str | None = None
) -> dict[str, Any]:
    """Measure both; print two tables; write JSON to ``json_path`` if given."""
    count, rounds = (2000, 3) if quick else (20000, 7)
    beats = _heartbeats(count, rounds)
    prints = _fingerprint(32 if quick else model_mb, 2 if quick else 3)
    rows: list[list[Any]] = [
        [r["learned"], r.get("bytes"), r.get("encode_us"), r.get("decode_us"), r.get("adopt_us")]
        for r in beats
    ]
    none, full = beats[0], beats[1]
    ratios = [full[key] / none[key] for key in ("bytes", "encode_us", "decode_us")]
    rows.append(["ratio, full / none", *ratios, None])
    print_table(
        "A worker's state with the times it learned",
        ["learned", "bytes", "encode us", "decode us", "adopt us"],
        rows,
    )
    keys = ("model_mb", "stage_s", "hash_s", "hash_gb_per_s", "hash_over_stage")
    print_table(
        "Fingerprinting the weights at start",
        ["model MB", "stage s", "hash s", "hash GB/s", "hash / stage"],
        [[prints[key] for key in keys]],
    )
    out = {"machine": machine(), "heartbeats": beats, "fingerprint": prints}
    write_json(json_path, out)
    return out
