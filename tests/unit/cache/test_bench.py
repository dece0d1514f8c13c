"""The cache benchmark runs end to end (it measures; this only checks it works)."""

from __future__ import annotations

import json

import pytest

from compass._bench import cache
from compass.cache.backend import cuda_available, cuda_problem


def test_cache_benchmark_quick_run_writes_json(tmp_path, capsys):
    path = tmp_path / "cache.json"
    result = cache.run(json_path=str(path), quick=True)
    assert json.loads(path.read_text())["operations"].keys() == result["operations"].keys()
    for row in result["operations"].values():
        assert row["p50_us"] <= row["p99_us"]
    assert "plan eviction" in capsys.readouterr().out


def _compass(capsys, *argv: str) -> tuple[int, str, str]:
    from compass._cli.main import main

    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


@pytest.mark.skipif(cuda_available(), reason="checks the run where there is no CUDA")
def test_bench_gpu_skips_in_one_line_without_cuda(tmp_path, capsys):
    path = tmp_path / "gpu.json"
    code, out, err = _compass(capsys, "bench", "gpu", "--json", str(path))
    assert code == 0
    assert err == ""
    assert len(out.splitlines()) == 1
    assert out.startswith("compass bench gpu: skipped, no CUDA device for the cupy backend: ")
    assert json.loads(path.read_text())["skipped"] == cuda_problem()


def test_up_refuses_bad_gpus_in_one_line(capsys):
    code, _, err = _compass(capsys, "up", "--gpus", "zero,one")
    assert code == 2
    assert err.strip().endswith("expected comma-separated device numbers, e.g. 0,1,2,3")
    assert len(err.strip().splitlines()) == 1
    code, _, err = _compass(capsys, "up", "--gpus", "0,1", "--device", "1")
    assert code == 2
    assert "not both" in err


def test_worker_device_must_be_a_device_number(capsys):
    code, _, err = _compass(capsys, "worker", "start", "--device", "-1")
    assert code == 2
    assert "--device" in err
    assert len(err.strip().splitlines()) == 1
