"""The first run on a GPU: does the cupy backend do what the CPU tests say it does?

One check after another, each reported in one table row, all in under 5 minutes on one H200:

1. **arena**: free device memory drops by the cache's capacity when the backend is made, and
   comes back when it is closed.
2. **dtypes**: f32, f16, bf16, f64, a 0-dim int64, bool, complex64, float8, a transposed and a
   channels_last parameter and a zero-byte buffer go through the cache and come back byte for
   byte, in the arena, 256-byte aligned.
3. **race**: a chain of kernels reads model A's slabs, then model B is copied into those slabs.
   With the compute fence the chain's output equals a reference run; without it (the code
   before issue 22's fix) the copy runs under the kernels. The unfenced row says whether the
   corruption showed (a race need not show on every run; the fenced row must pass).
4. **bandwidth**: a raw pinned host-to-device copy against the cache's load of the same bytes
   (target: at least 80%), and a demand load alone against the same load queued behind an
   8 GiB prefetch (target: at most 1.2x).
5. **pinned**: page-locked host bytes the cache staged against the models' payload (target:
   at most 1.1x).
6. **two workers**: two worker processes on the one device, each with its default capacity:
   both start, both answer, their caches leave the headroom free.
7. **pytest**: ``pytest -m gpu tests/gpu`` where the tests are at hand (a source checkout).

Without a CUDA device usable by both CuPy and torch it prints one line and exits 0.

Run: ``compass bench gpu [--json results/gpu.json] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .report import machine, print_table, write_json

__all__ = ["run"]

MiB = 1 << 20
GiB = 1 << 30
SLAB = 64 * MiB
REPO = Path(__file__).resolve().parents[1]

#: a check: name, passed (None: information only), a one-line result, figures for the JSON
Row = dict[str, Any]


def run(json_path: str | None = None, *, quick: bool = False) -> dict[str, Any]:
    """Run every check (or print one line and return when there is no CUDA)."""
    from compass.cache.backend import cuda_problem

    problem = cuda_problem()
    if problem is not None:
        print(f"compass bench gpu: skipped, no CUDA device for the cupy backend: {problem}")
        result: dict[str, Any] = {"benchmark": "gpu", "skipped": problem, "machine": machine()}
        write_json(json_path, result, announce=False)  # the one line above is all it says
        return result

    import torch

    started = time.perf_counter()
    rows: list[Row] = []
    checks: list[tuple[str, Callable[[], list[Row]]]] = [
        ("arena", _arena),
        ("dtypes", _dtypes),
        ("race", _race),
        ("bandwidth", lambda: _bandwidth(quick)),
        ("pinned", _pinned),
        ("two workers", _two_workers),
        ("pytest", _pytest),
    ]
    for name, check in checks:
        try:
            rows.extend(check())
        except Exception as exc:  # one broken check must not hide the others' results
            rows.append(_row(name, False, f"{type(exc).__name__}: {exc}", error=_tail(exc)))
        gc.collect()
        torch.cuda.empty_cache()
    seconds = time.perf_counter() - started
    props = torch.cuda.get_device_properties(0)
    result = {
        "benchmark": "gpu",
        "machine": machine(),
        "device": {
            "name": props.name,
            "total_bytes": props.total_memory,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "seconds": seconds,
        "passed": all(row["passed"] is not False for row in rows),
        "checks": rows,
    }
    print_table(
        f"compass bench gpu on {props.name} ({seconds:.0f} s)",
        ["check", "result", "detail"],
        [[row["check"], _verdict(row["passed"]), row["detail"]] for row in rows],
    )
    write_json(json_path, result)
    return result


def _row(check: str, passed: bool | None, detail: str, **figures: Any) -> Row:
    return {"check": check, "passed": passed, "detail": detail, **figures}


def _verdict(passed: bool | None) -> str:
    return "info" if passed is None else ("pass" if passed else "FAIL")


def _tail(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))[-2000:]


def _free() -> int:
    import torch

    torch.cuda.synchronize()
    free, _total = torch.cuda.mem_get_info(0)
    return int(free)


# -- 1. the arena --------------------------------------------------------------------------------


def _arena() -> list[Row]:
    from compass.cache.backend import CupyBackend

    capacity = 4 * GiB
    before = _free()
    backend = CupyBackend(capacity, SLAB)
    held = _free()
    backend.close()
    del backend
    gc.collect()
    after = _free()
    drop, back = before - held, after - held
    ok = drop >= capacity and back >= capacity - SLAB
    return [
        _row(
            "arena",
            ok,
            f"free memory fell {drop / MiB:.0f} MiB for a {capacity / MiB:.0f} MiB arena "
            f"and rose {back / MiB:.0f} MiB on close()",
            drop_bytes=drop,
            returned_bytes=back,
            capacity_bytes=capacity,
        )
    ]


# -- 2. dtypes -----------------------------------------------------------------------------------


def dtype_zoo() -> Any:
    """A module with one tensor of each dtype and layout the cache must carry byte for byte
    (f32, f16, bf16, f64, a 0-dim int64, bool, complex, float8, a channels_last conv, a
    transposed parameter, an empty tensor, and a Linear for checkpoint tests), the same on
    every call. The GPU check here and the CPU and GPU tests share it."""
    import torch
    from torch import nn

    class Zoo(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)  # type: ignore[call-overload]
            self.lin = nn.Linear(8, 16)
            self.transposed = nn.Parameter(torch.randn(6, 10).t())
            self.register_buffer("f32", torch.randn(7))
            self.register_buffer("f16", torch.randn(5, 7).half())
            self.register_buffer("bf16", torch.randn(33).bfloat16())
            self.register_buffer("f64", torch.randn(3, 3, dtype=torch.float64))
            self.register_buffer("step", torch.tensor(7, dtype=torch.int64))
            self.register_buffer("mask", torch.rand(17) > 0.5)
            self.register_buffer("cplx", torch.randn(4, dtype=torch.complex64))
            self.register_buffer("f8", torch.randn(9).to(torch.float8_e4m3fn))
            self.register_buffer("empty", torch.empty(0, 4))

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        return Zoo()


def _raw(tensor: Any) -> bytes:
    import torch

    return bytes(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())


def _dtypes() -> list[Row]:
    from compass.cache import Model
    from compass.config import CacheConfig

    from .leases import LeasingCache

    async def main() -> list[str]:
        config = CacheConfig(capacity_bytes=4 * SLAB, slab_bytes=4 * MiB, backend="cupy")
        async with LeasingCache({"zoo": Model("zoo", dtype_zoo)}, config) as cache:
            with await cache.ensure("zoo") as lease:
                assert lease.module is not None
                got = dict(lease.module.state_dict())
                start, end = cache.backend.address_range()
                wrong: list[str] = []
                for key, expected in dtype_zoo().state_dict().items():
                    tensor = got[key]
                    at = tensor.untyped_storage().data_ptr()
                    at += tensor.storage_offset() * tensor.element_size()
                    if (
                        tensor.device.type != "cuda"
                        or (tensor.dtype, tensor.shape, tensor.stride())
                        != (expected.dtype, expected.shape, expected.stride())
                        or _raw(tensor) != _raw(expected)
                        or not start <= at <= end
                        or at % 256
                    ):
                        wrong.append(key)
                return wrong

    wrong = asyncio.run(main())
    count = len(dtype_zoo().state_dict())
    detail = f"{count - len(wrong)} of {count} tensors byte for byte, aligned, in the arena"
    if wrong:
        detail += f"; wrong: {', '.join(wrong)}"
    return [_row("dtypes", not wrong, detail, wrong=wrong)]


# -- 3. the eviction race ------------------------------------------------------------------------


def _race() -> list[Row]:
    import torch
    from torch import nn

    from compass.cache import Model
    from compass.cache.backend import CupyBackend

    width, depth = 4096, 200

    def build(seed: int) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return nn.Linear(width, width, bias=False)  # 64 MiB: one slab

    models = {
        name: Model(name, functools.partial(build, seed)) for name, seed in (("a", 1), ("b", 2))
    }
    backend = CupyBackend(SLAB, SLAB)
    layout = models["a"].layout(SLAB)
    staged = {name: model.stage(layout, backend.host_buffer) for name, model in models.items()}

    def load(name: str) -> nn.Module:
        """Copy ``name`` into the only slab (no fence) and build its module on the slab."""
        writes = [(0, staged[name][start : start + extent]) for start, extent in layout.staging()]
        backend.copy_in(writes, urgent=True).wait()
        views = {
            spec.key: backend.tensor_view(0, spec.dtype, spec.shape, spec.nbytes, spec.stride)
            for spec in models[name].tensor_specs()
        }
        return models[name].assemble(views)

    x = torch.randn(1024, width, device="cuda")
    reference = build(1).cuda().eval()

    def chain(module: nn.Module) -> torch.Tensor:
        out = x
        with torch.inference_mode():
            for _ in range(depth):
                out = nn.functional.normalize(module(out), dim=1)
        return out

    expected = chain(reference)
    torch.cuda.synchronize()
    results: dict[str, float] = {}
    for fenced in (True, False):
        module = load("a")
        with backend.compute_stream():
            out = chain(module)  # queued on this thread's compute stream
            if fenced:
                backend.synchronize_compute()  # what ModelCache.compute does on the way out
        load("b")  # the next load copies into a's slab
        torch.cuda.synchronize()
        results["fenced" if fenced else "unfenced"] = float((out - expected).abs().max())
    backend.close()
    fenced_ok = results["fenced"] <= 1e-5
    shown = results["unfenced"] > 1e-5
    return [
        _row(
            "race: fenced",
            fenced_ok,
            f"a {depth}-layer chain on A's slab, then B copied in: max error "
            f"{results['fenced']:.2g} against the reference",
            max_error=results["fenced"],
        ),
        _row(
            "race: unfenced",
            None,
            f"the same without the fence: max error {results['unfenced']:.2g} "
            f"({'the race corrupted the output' if shown else 'no corruption on this run'})",
            max_error=results["unfenced"],
            reproduced=shown,
        ),
    ]


# -- 4. bandwidth --------------------------------------------------------------------------------


def _blob(nbytes: int) -> Callable[[], Any]:
    """A builder of a module with ``nbytes`` of uninitialized fp32 weights in 64 MiB tensors
    (building it is fast: the bytes are not what is measured)."""

    def build() -> Any:
        import torch
        from torch import nn

        module = nn.Module()
        for i in range(nbytes // SLAB):
            module.register_parameter(f"w{i}", nn.Parameter(torch.empty(SLAB // 4)))
        return module

    return build


def _raw_copy_seconds(nbytes: int) -> float:
    """Best of three raw pinned host-to-device copies of ``nbytes`` (CUDA events)."""
    import torch

    from compass.cache.backend import CupyBackend

    backend = CupyBackend(SLAB, SLAB)
    host = backend.host_buffer(nbytes)
    device = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    best = float("inf")
    with torch.cuda.stream(stream):
        for _ in range(4):  # the first warms up
            start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            start.record(stream)
            device.copy_(host, non_blocking=True)
            end.record(stream)
            end.synchronize()
            best = min(best, start.elapsed_time(end) / 1000.0)
    backend.close()
    return best


def _bandwidth(quick: bool) -> list[Row]:
    from compass.cache import Model
    from compass.config import CacheConfig

    from .leases import LeasingCache

    demand_bytes = 1 * GiB
    prefetch_bytes = (2 if quick else 8) * GiB
    raw_s = _raw_copy_seconds(demand_bytes)
    raw_gbps = demand_bytes / raw_s / 1e9
    models = {
        "demand": Model("demand", _blob(demand_bytes)),
        "demand2": Model("demand2", _blob(demand_bytes)),
        "prefetch": Model("prefetch", _blob(prefetch_bytes)),
    }

    async def main() -> tuple[float, float, float]:
        capacity = 2 * demand_bytes + prefetch_bytes + 2 * SLAB
        config = CacheConfig(capacity_bytes=capacity, slab_bytes=SLAB, backend="cupy")
        async with LeasingCache(models, config) as cache:
            t0 = time.perf_counter()
            with await cache.ensure("demand"):
                pass
            alone_wall = time.perf_counter() - t0
            alone_device = cache.stats.load_seconds
            cache.prefetch(["prefetch"])  # 8 GiB of speculative copies under way
            await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            with await cache.ensure("demand2"):
                pass
            behind_wall = time.perf_counter() - t0
            return alone_device, alone_wall, behind_wall

    alone_device, alone_wall, behind_wall = asyncio.run(main())
    load_gbps = demand_bytes / alone_device / 1e9
    ratio = load_gbps / raw_gbps
    slowdown = behind_wall / alone_wall
    return [
        _row(
            "bandwidth: load",
            ratio >= 0.8,
            f"cache load {load_gbps:.1f} GB/s, raw pinned copy {raw_gbps:.1f} GB/s "
            f"({ratio:.0%}; target >= 80%)",
            load_gbps=load_gbps,
            raw_gbps=raw_gbps,
        ),
        _row(
            "bandwidth: demand behind prefetch",
            slowdown <= 1.2,
            f"1 GiB demand load {alone_wall * 1e3:.0f} ms alone, {behind_wall * 1e3:.0f} ms "
            f"behind a {prefetch_bytes / GiB:.0f} GiB prefetch ({slowdown:.2f}x; target <= 1.2x)",
            alone_s=alone_wall,
            behind_s=behind_wall,
        ),
    ]


# -- 5. pinned host memory -----------------------------------------------------------------------


def _pinned() -> list[Row]:
    from torch import nn

    from compass.cache import Model, ModelCache
    from compass.config import CacheConfig

    def mixed() -> nn.Module:  # tensors of many sizes: alignment padding is part of the cost
        return nn.Sequential(*(nn.Linear(1024 + 37 * i, 1024 + 37 * i) for i in range(24)))

    models = {f"m{i}": Model(f"m{i}", mixed) for i in range(3)}
    payload = sum(model.size_bytes for model in models.values())

    async def main() -> int:
        config = CacheConfig(capacity_bytes=4 * payload, slab_bytes=SLAB, backend="cupy")
        async with ModelCache(models, config) as cache:
            pinned = all(buffer.is_pinned() for buffer in cache._host.values())
            if not pinned:
                raise AssertionError("a staging buffer is not page-locked")
            return cache.staged_bytes()

    staged = asyncio.run(main())
    ratio = staged / payload
    return [
        _row(
            "pinned host memory",
            ratio <= 1.1,
            f"{staged / MiB:.0f} MiB page-locked for {payload / MiB:.0f} MiB of weights "
            f"({ratio:.3f}x; target <= 1.1x)",
            staged_bytes=staged,
            payload_bytes=payload,
        )
    ]


# -- 6. two workers on one device ----------------------------------------------------------------


def _two_workers() -> list[Row]:
    import torch

    from compass.cluster import LocalCluster
    from compass.config import GPU_HEADROOM_BYTES

    env = dict(os.environ)
    env.pop("COMPASS_TOKEN", None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    args = ["--app", "examples.vision_app", "--backend", "cupy", "--device", "0"]

    async def main() -> list[dict[str, Any]]:
        async with LocalCluster(2, args=args, env=env, startup_timeout=120) as cluster:
            statuses = []
            for index in (0, 1):
                async with cluster.client(index) as client:
                    await client.submit("describe", timeout=60, image=torch.randn(1, 3, 32, 32))
                    statuses.append(dict((await client.status()).cache))
            return statuses

    caches = asyncio.run(main())
    total = torch.cuda.get_device_properties(0).total_memory
    held = sum(int(cache["capacity_bytes"]) for cache in caches)
    ok = all(cache["backend"] == "cupy" for cache in caches) and held <= total - GPU_HEADROOM_BYTES
    sizes = ", ".join(f"{int(c['capacity_bytes']) / GiB:.1f}" for c in caches)
    return [
        _row(
            "two workers, one device",
            ok,
            f"both answered; caches {sizes} GiB of {total / GiB:.0f} GiB",
            caches=caches,
        )
    ]


# -- 7. pytest -m gpu ----------------------------------------------------------------------------


def _pytest() -> list[Row]:
    tests = REPO / "tests" / "gpu"
    if not tests.is_dir():
        return [_row("pytest -m gpu", None, "tests/gpu is not here (an installed package)")]
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        str(tests),
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    done = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    return [_row("pytest -m gpu", done.returncode == 0, last, output=done.stdout[-4000:])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", dest="json_path", default=None, help="write results here")
    parser.add_argument("--quick", action="store_true", help="a 2 GiB prefetch, not 8 GiB")
    args = parser.parse_args()
    result = run(json_path=args.json_path, quick=args.quick)
    sys.exit(0 if result.get("passed", True) else 1)


if __name__ == "__main__":
    main()
