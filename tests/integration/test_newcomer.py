"""The README's first commands, typed as a newcomer types them: from the folder that holds the
app module, with the installed ``compass`` script, no ``PYTHONPATH`` and no ``--name``."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import compass
from compass import Client

from .conftest import PAPER, ROOT

TOKEN = "newcomer-token-0123456789abcdef0123"


def _compass_script_path() -> str:
    script = Path(sys.executable).with_name("compass")
    return str(script) if script.exists() else shutil.which("compass") or str(script)


def _compass_script() -> str:
    found = _compass_script_path()
    if not Path(found).exists():
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
            assert status.name == f"{socket.gethostname().split('.')[0]}-{port}"
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [[_compass_script_path(), "--version"], [sys.executable, "-m", "compass", "--version"]],
    ids=["script", "python-m"],
)
def test_version(argv: list[str]) -> None:
    if not Path(argv[0]).exists():
        pytest.skip("the compass console script is not installed")
    done = subprocess.run(argv, capture_output=True, text=True, env=_bare_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"compass {compass.__version__}\n"


def test_worker_help_shows_defaults_and_variables() -> None:
    done = subprocess.run(
        [_compass_script(), "worker", "start", "--help"],
        capture_output=True,
        text=True,
        env={**_bare_env(), "COLUMNS": "300"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert "[default: 7341]" in text
    for variable in ("COMPASS_PORT", "COMPASS_NAME", "COMPASS_CACHE_MB", "COMPASS_LOG_LEVEL"):
        assert variable in text
    assert "80% of free GPU memory, or 25% of host memory" in text


@pytest.mark.asyncio
async def test_a_worker_reads_its_flags_from_compass_variables(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **_bare_env(),
        "COMPASS_PORT": str(port),
        "COMPASS_NAME": "from-the-environment",
        "COMPASS_WORKLOAD": PAPER,
    }
    proc = await asyncio.create_subprocess_exec(
        _compass_script(),
        "worker",
        "start",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line == f"compass worker listening on 127.0.0.1:{port}\n"
        async with Client(f"127.0.0.1:{port}", token=TOKEN) as client:
            assert (await client.status()).name == "from-the-environment"
    finally:
        assert await _stop(proc) == 0


def test_compass_up_passes_worker_flags_and_says_where_its_logs_are(tmp_path: Path) -> None:
    up = ["up", "--workers", "1", "--workload", PAPER, "--log-dir", "logs"]
    worker_flags = ["--cache-mb", "15000", "--log-level", "info"]
    proc = subprocess.Popen(
        [_compass_script(), *up, *worker_flags],
        cwd=tmp_path,
        env=_bare_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith("ready:"):
            line = proc.stdout.readline()
            assert line, f"compass up exited: {lines}"
            lines.append(line.strip())
        address = lines[0].split()[1]
        logs = next(line for line in lines if line.startswith("logs in "))
        folder = Path(logs.split()[2])
        assert folder.is_absolute() and folder == tmp_path / "logs"
        assert "free ports" in lines[-1]

        async def capacity() -> int:
            async with Client(address, token=TOKEN) as client:
                return int((await client.status()).cache["capacity_bytes"])

        # --cache-mb reached the worker: whole 64 MiB slabs of 15000 MiB, not the spec's 14 GB
        assert asyncio.run(capacity()) == 15000 // 64 * 64 * (1 << 20)
        assert " INFO " in (folder / "w0.log").read_text()  # and so did --log-level
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
