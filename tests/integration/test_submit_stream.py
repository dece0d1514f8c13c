"""``compass submit --stream`` against a real worker process: a step-wise task's partial
outputs printed as they come (text as it comes), then the result on a line of its own; bad
combinations refused in one line."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path

import pytest

from compass.cluster import LocalCluster

from .conftest import app_environment, compass_argv

STREAM_APP = """
import compass

app = compass.App("words")
tell = app.workflow("tell", inputs=["n"])

@tell.task(steps=4, step_ms=1.0)
def words(model, n):
    text = []
    for i in range(n):
        text.append(f"w{i} ")
        yield text[-1]
    return "".join(text).strip()

numbers = app.workflow("numbers", inputs=["n"])

@numbers.task(steps=4, step_ms=1.0)
def count(model, n):
    for i in range(n):
        yield i
"""


@pytest.fixture
def stream_env(tmp_path: Path) -> dict[str, str]:
    return app_environment(tmp_path, "stream_app", STREAM_APP)


@pytest.mark.asyncio
async def test_submit_stream_prints_partial_outputs_then_the_result(
    stream_env: dict[str, str],
) -> None:
    async with LocalCluster(1, args=["--app", "stream_app"], env=stream_env) as cluster:
        address = cluster.addresses[0]
        env = {**stream_env, "COMPASS_TOKEN": cluster.token}

        def run(*more: str) -> subprocess.CompletedProcess[str]:
            argv = compass_argv("submit", address, *more)
            return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                                  check=False)  # fmt: skip

        async def cli(*more: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(run, *more)

        text = await cli("tell", "-i", "n=4", "--stream")
        assert text.returncode == 0, text.stderr
        # the text as it comes, then the result as compass submit prints any (JSON)
        assert text.stdout == 'w0 w1 w2 w3 \n"w0 w1 w2 w3"\n'
        numbers = await cli("numbers", "-i", "n=3", "--stream")
        assert numbers.returncode == 0, numbers.stderr
        assert numbers.stdout.splitlines() == ["0", "1", "2", "2"]  # each, then the result
        plain = await cli("tell", "-i", "n=2")  # the same job unstreamed: its result alone
        assert plain.stdout == '"w0 w1"\n'
        urgent = await cli("tell", "-i", "n=2", "--stream", "--priority", "3")
        assert urgent.returncode == 0 and urgent.stdout.endswith('"w0 w1"\n')
        refused = await cli("tell", "-i", "n=2", "--stream", "--trace")
        assert refused.returncode == 2 and "--stream takes no --trace" in refused.stderr
        unknown = await cli("nope", "--stream")
        assert unknown.returncode == 1 and "nope" in unknown.stderr
