"""Slab backends: choice, host arena views, the capacity backend, sans-IO import hygiene."""

from __future__ import annotations

import ast
import contextlib
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

import compass.cache
from compass.cache.backend import (
    CapacityBackend,
    CupyBackend,
    HostBackend,
    cuda_available,
    gpu_device_nodes,
    make_backend,
)
from compass.config import CacheConfig
from compass.errors import CacheError, ConfigError

KiB = 1024


def test_make_backend_by_name():
    assert isinstance(make_backend(CacheConfig(64 * KiB, 4 * KiB, "host")), HostBackend)
    assert isinstance(make_backend(CacheConfig(64 * KiB, 4 * KiB, "capacity")), CapacityBackend)
    auto = make_backend(CacheConfig(64 * KiB, 4 * KiB, "auto"))
    assert auto.kind == ("cupy" if cuda_available() else "host")


@pytest.mark.skipif(cuda_available(), reason="checks the error raised without CuPy or a GPU")
def test_cupy_backend_without_a_gpu_fails_clearly():
    with pytest.raises(ConfigError, match="cupy backend needs"):
        make_backend(CacheConfig(64 * KiB, 4 * KiB, "cupy"))


def test_slab_size_must_suit_tensor_alignment():
    with pytest.raises(ConfigError, match="multiple of 256"):
        HostBackend(64 * KiB, 1000)


def test_host_arena_views_and_copies():
    backend = HostBackend(64 * KiB + 5, 4 * KiB)
    assert backend.capacity_bytes == 64 * KiB  # whole slabs only
    source = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    backend.copy_in([(8 * KiB, source)])
    view = backend.tensor_view(8 * KiB, torch.float32, (3, 4), source.nbytes)
    assert torch.equal(view, source)
    start, end = backend.address_range()
    assert start <= view.data_ptr()
    assert view.data_ptr() + view.nbytes <= end
    # a view is the arena: writing through numpy shows in the tensor
    backend.array[8 * KiB : 8 * KiB + 4] = 0
    assert view[0, 0].item() == 0.0
    empty = backend.tensor_view(0, torch.float16, (0, 5), 0)
    assert empty.shape == (0, 5)
    with pytest.raises(CacheError, match="outside"):
        backend.tensor_view(63 * KiB, torch.float32, (1024,), 4 * KiB)
    backend.close()
    with pytest.raises(CacheError, match="closed"):
        backend.arena()


def test_capacity_backend_holds_no_bytes():
    backend = CapacityBackend(14 * 10**9, 64 * 2**20)
    assert not backend.holds_bytes
    assert backend.capacity_bytes == 14 * 10**9 // (64 * 2**20) * (64 * 2**20)
    with pytest.raises(CacheError, match="holds no bytes"):
        backend.arena()
    with pytest.raises(CacheError, match="holds no bytes"):
        backend.copy_in([(0, torch.zeros(1))])


def _run(code: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert result.returncode == 0, result.stderr


SANS_IO = ("slab.py", "pool.py", "policy.py")
SANS_IO_DEPENDENCIES = {"compass.errors", *(f"compass.cache.{f[:-3]}" for f in SANS_IO)}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("filename", SANS_IO)
def test_sans_io_core_imports_neither_asyncio_nor_torch(filename):
    # checked on the source: the package root (compass/__init__) may pull in asyncio for its
    # client, but these modules must not, so the simulator can reuse them unchanged
    package = Path(compass.cache.__file__).parent
    for name in _imports(package / filename):
        root = name.split(".")[0]
        assert root not in {"asyncio", "torch", "cupy", "numpy", "threading"}, name
        if root == "compass":
            assert name in SANS_IO_DEPENDENCIES, f"{filename} imports non-sans-IO {name}"


def test_emulated_cache_never_imports_torch():
    _run(
        """
        import asyncio, sys
        from compass._bench.leases import LeasingCache
        from compass.cache import Model
        from compass.config import CacheConfig

        async def main():
            cache = LeasingCache({"m": Model.emulated("m", 10**9)},
                               CacheConfig(14 * 10**9, 64 * 2**20, "capacity"))
            with await cache.ensure("m") as lease:
                assert lease.module is None
            await cache.aclose()

        asyncio.run(main())
        assert "torch" not in sys.modules
        """
    )


def test_auto_says_when_it_falls_back_to_host_memory(monkeypatch, caplog):
    import compass.cache.backend as backend_module

    monkeypatch.setattr(backend_module, "cuda_problem", lambda: "CuPy does not import (boom)")
    monkeypatch.setattr(backend_module, "_torch_sees_cuda", lambda: True)
    with caplog.at_level("WARNING", logger="compass.cache.backend"):
        backend = make_backend(CacheConfig(64 * KiB, 4 * KiB, "auto"))
    assert isinstance(backend, HostBackend)
    assert backend.fallback is not None
    assert "torch sees CUDA but CuPy does not import (boom)" in backend.fallback
    assert backend.describe()["fallback"] == backend.fallback
    assert any("falls back" in r.message or "host memory" in r.message for r in caplog.records)
    # no GPU at all: host memory is the plain choice, nothing to warn about
    monkeypatch.setattr(backend_module, "_torch_sees_cuda", lambda: False)
    caplog.clear()
    quiet = make_backend(CacheConfig(64 * KiB, 4 * KiB, "auto"))
    assert quiet.fallback is None
    assert "fallback" not in quiet.describe()
    assert not caplog.records


def test_cuda_problem_names_what_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    problem = compass.cache.backend.cuda_problem()
    assert problem is not None
    assert problem.startswith("CuPy does not import (")
    assert "compass[gpu]" in problem


class _FakeCupy(types.ModuleType):
    """Just enough of CuPy for CupyBackend to reach its allocation: it runs out of memory."""

    class _OutOfMemoryError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("cupy")
        memory = types.SimpleNamespace(OutOfMemoryError=self._OutOfMemoryError)

        def allocate(nbytes: int) -> None:
            raise self._OutOfMemoryError(f"out of memory allocating {nbytes} bytes")

        self.cuda = types.SimpleNamespace(
            Device=lambda device: contextlib.nullcontext(),
            Memory=allocate,
            memory=memory,
            runtime=types.SimpleNamespace(memGetInfo=lambda: (3 * 2**30, 80 * 2**30)),
        )


def test_a_gpu_cache_that_does_not_fit_is_one_clear_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", _FakeCupy())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError) as raised:
        CupyBackend(8 * 2**30, 64 * 2**20, device_id=1)
    message = str(raised.value)
    assert "\n" not in message
    assert "cannot allocate a 8192 MiB model cache on cuda:1" in message
    assert "3072 MiB free" in message
    assert "--cache-mb" in message
    with pytest.raises(ConfigError, match=r"CUDA device 2 does not exist here \(2 visible"):
        CupyBackend(8 * 2**30, 64 * 2**20, device_id=2)


def test_a_worker_without_a_gpu_starts_without_importing_torch_or_the_simulator():
    # importing torch takes seconds and hundreds of MB: a worker on a host without a GPU device
    # node, whose app does not use torch, starts and runs its tasks without it (and `compass
    # worker start` without the simulator)
    if gpu_device_nodes():
        pytest.skip(f"this host has GPU device nodes ({gpu_device_nodes()}): torch is asked")
    _run(
        """
        import sys
        import compass._cli.main  # the command line, as `compass worker start` loads it
        from compass.config import WorkerConfig
        from compass.worker.process import build_worker

        worker = build_worker(WorkerConfig(app="compass._bench.apps"))
        assert worker.cache.backend.kind == "host", worker.cache.backend.kind
        assert worker.cache.backend.fallback is None
        assert "torch" not in sys.modules, "torch was imported"
        assert "compass.sim" not in sys.modules, "the simulator was imported"
        from contextlib import nullcontext
        from compass.worker.calling import call_task

        task = worker.app.workflows["noop"].tasks["nothing"]
        assert call_task(task, task.call, None, {"x": 21}, nullcontext()) == 21
        assert "torch" not in sys.modules, "running a task imported torch"
        """
    )
