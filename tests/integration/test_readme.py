"""The README's shell commands, run as written from the repo root.

Every line of its ```sh blocks runs in bash, in order, with the environment the lines before it
exported (``. .venv/bin/activate``, ``export COMPASS_TOKEN=...``). Servers (``compass worker
start``, ``compass up``) run in the background, as in their own terminal, until they print that
they listen; every other line must exit 0, and print what a trailing ``# prints X`` says.
Only the ports change: 7341 and 7342 become free ones. ``make`` lines are left out: they build
the environment and run the whole suite or the demo.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROOT

SERVERS = {"compass worker start": "compass worker listening on ", "compass up": "ready: "}
ENV_MARK = "--readme-test-env--"


def readme_commands(text: str) -> list[str]:
    """The command lines of every ```sh block, blank lines and whole-line comments left out."""
    blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.S | re.M)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _run_line(line: str, env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Run ``line`` in bash; its output, and the environment it leaves."""
    script = f"{line}\nstatus=$?\nprintf '\\0{ENV_MARK}\\0'\nenv -0\nexit $status"
    done = subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{line!r} exited {done.returncode}: {done.stderr[-2000:]}"
    output, _, dump = done.stdout.partition(f"\0{ENV_MARK}\0")
    after = dict(item.split("=", 1) for item in dump.split("\0") if "=" in item)
    return output, after


def _start_server(line: str, ready: str, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {line}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    while True:
        out = proc.stdout.readline()
        if not out:
            _, err = proc.communicate(timeout=30)
            pytest.fail(f"{line!r} exited {proc.returncode} before it was ready: {seen} {err}")
        seen.append(out)
        if out.startswith(ready):
            return proc


def test_readme_lists_the_commands_a_newcomer_types() -> None:
    commands = readme_commands((ROOT / "README.md").read_text())
    assert commands[0].startswith("make demo")
    assert any(c.startswith("compass worker start") for c in commands)
    assert any(c.startswith("compass submit") for c in commands)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_readme_shell_commands_run_as_written() -> None:
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("no .venv in the repo: the README's commands start by activating it")
    first, second = _free_ports(2)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("COMPASS")}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p)
    servers: list[tuple[str, subprocess.Popen[str]]] = []
    ran = []
    try:
        for line in readme_commands((ROOT / "README.md").read_text()):
            if line.startswith("make "):
                continue
            line = line.replace("7341", str(first)).replace("7342", str(second))
            server = next(
                (ready for start, ready in SERVERS.items() if line.startswith(start)), None
            )
            if server is not None:
                servers.append((line, _start_server(line, server, env)))
            else:
                output, env = _run_line(line, env)
                expected = re.search(r"#\s*prints\s+(.+)$", line)
                if expected:
                    assert expected.group(1).strip() in output.split(), (line, output)
            ran.append(line)
    finally:
        codes = []
        for line, proc in reversed(servers):
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, err = proc.communicate()
            codes.append((line, proc.returncode, err[-2000:]))
    assert all(code == 0 for _, code, _ in codes), codes
    assert sum(line.startswith("compass worker start") for line in ran) == 2
    # the activated environment is the one these tests run in
    assert Path(env["VIRTUAL_ENV"]).resolve() == Path(sys.prefix).resolve()
