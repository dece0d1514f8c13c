"""The README's first commands, typed as a newcomer types them: from the folder that holds the
app module, with the installed ``compass`` script, no ``PYTHONPATH`` and no ``--name``."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sys
from pathlib import Path

import pytest

from compass import Client

from .conftest import ROOT

TOKEN = "newcomer-token-0123456789abcdef0123"


def _compass_script() -> str:
    script = Path(sys.executable).with_name("compass")
    found = str(script) if script.exists() else shutil.which("compass")
    if found is None:
        pytest.skip("the compass console script is not installed")
    return found


def _bare_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COMPASS_TOKEN")}
    env["COMPASS_TOKEN"] = TOKEN
    return env


async def _start(cwd: Path, app: str) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        _compass_script(),
        "worker",
        "start",
        "--app",
        app,
        "--port",
        "0",
        cwd=cwd,
        env=_bare_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
    if not line.startswith("compass worker listening on "):
        proc.kill()
        _, err = await proc.communicate()
        pytest.fail(f"worker did not start: {line!r} {err.decode()[-2000:]}")
    return proc, line.rsplit(" ", 1)[1].strip()


async def _stop(proc: asyncio.subprocess.Process) -> int:
    proc.terminate()
    return await asyncio.wait_for(proc.wait(), 20)


@pytest.mark.asyncio
async def test_readme_worker_command_from_the_repo_root() -> None:
    proc, address = await _start(ROOT, "examples.vision_app")
    try:
        async with Client(address, token=TOKEN) as client:
            status = await client.status()
            port = address.rsplit(":", 1)[1]
            # named <host>-<port> without --name
            assert status["name"] == f"{socket.gethostname().split('.')[0]}-{port}"
            assert await client.submit("echo", x=[1, 2]) == [1, 2]
    finally:
        assert await _stop(proc) == 0


@pytest.mark.asyncio
async def test_app_module_in_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "myapp.py").write_text(
        "import compass\n"
        "app = compass.App()\n"
        "wf = app.workflow('double', inputs=['x'])\n"
        "@wf.task(expected_ms=1)\n"
        "def double(model, x):\n"
        "    return x * 2\n"
    )
    proc, address = await _start(tmp_path, "myapp")
    try:
        async with Client(address, token=TOKEN) as client:
            assert await client.submit("double", x=21) == 42
    finally:
        assert await _stop(proc) == 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def broken(:\n", "SyntaxError"),
        ("raise RuntimeError('no GPU here')\n", "RuntimeError: no GPU here"),
        ("x = 1\n", "has no compass.App named 'app'"),
    ],
)
async def test_a_bad_app_module_is_one_line_and_exit_2(
    tmp_path: Path, source: str, expected: str
) -> None:
    (tmp_path / "badapp.py").write_text(source)
    proc = await asyncio.create_subprocess_exec(
        _compass_script(),
        "worker",
        "start",
        "--app",
        "badapp",
        "--port",
        "0",
        cwd=tmp_path,
        env=_bare_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert "badapp" in lines[0] and expected in lines[0]
    assert out == b""
