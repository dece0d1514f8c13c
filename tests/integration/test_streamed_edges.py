"""Streamed edges on a real local cluster (three worker processes, loopback TCP): a three-stage
pipeline whose stages read each other's partial outputs as they come.

Each stage notes what it does in a log file shared by the processes (one line appended at a
time), and a stage waits (bounded) after its first item until its successor has read it: so
a successor that did not start before its predecessor ended shows in the log, whatever the
timing. ``round_robin`` placement puts the three stages on three workers, so every stream
crosses the wire.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compass.cluster import LocalCluster
from compass.errors import CompassError, JobFailed, WorkersLost

from .conftest import app_environment

EDGES_APP = '''
import os
import time

import compass
from compass import Stream

app = compass.App("edges")
speak = app.workflow("speak", inputs=["text"])


def note(line):
    """One line of the shared log: what a stage did, from any worker process."""
    with open(os.environ["EDGES_LOG"], "a") as log:
        log.write(line + "\\n")


def seen(line, timeout_s=20.0):
    """Whether ``line`` is in the log within ``timeout_s`` (polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(os.environ["EDGES_LOG"]) as log:
            if line in log.read().splitlines():
                return True
        time.sleep(0.005)
    return False


def announced(items, who):
    """``items``, noting before each read that ``who`` waits for it."""
    i = 0
    while True:
        note(f"{who} wants {i}")
        try:
            yield next(items)
        except StopIteration:
            return
        i += 1


@speak.task(steps=4, step_ms=5.0)
def generate(model, text):
    note(f"generate pid {os.getpid()}")
    words = text.split()
    for i, word in enumerate(words):
        if word == "FAIL":  # once the translator waits for this word
            seen(f"translate wants {i}")
            raise ValueError(f"cannot say word {i}")
        if word == "HOLD":  # wait for the test to let it go on
            seen("go on", timeout_s=60.0)
        yield word.upper()
        if i == 0:
            note(f"generate waited {seen('translate read 0')}")
    note("generate ended")
    return " ".join(words).upper()


@speak.task(after={"generate": Stream("words")}, steps=4, step_ms=5.0)
def translate(model, words):
    note(f"translate pid {os.getpid()}")
    out = []
    try:
        for i, word in enumerate(announced(words, "translate")):
            note(f"translate read {i}")
            out.append(word[::-1])
            yield out[-1]
            if i == 0:
                note(f"translate waited {seen('synthesize read 0')}")
    except compass.CompassError as exc:
        note(f"translate broke {type(exc).__name__}")
        raise
    note("translate ended")
    return "/".join(out)


@speak.task(after={"translate": Stream()}, steps=4, step_ms=5.0)
async def synthesize(model, translate):
    sounds = []
    async for piece in translate:
        note(f"synthesize read {len(sounds)}")
        sounds.append(f"<{piece}>")
        yield sounds[-1]
    note("synthesize ended")
'''

ARGS = ["--app", "edges_app", "--policy", "round_robin", "--lanes", "1", "--host-lanes", "3"]


async def locally(text: str) -> tuple[list[Any], Any]:
    """The same pipeline run in this process, each stage reading the items of the one before."""
    import importlib

    module = importlib.import_module("edges_app")

    async def as_async(items: Iterator[Any]) -> Any:  # what a stream is to an async reader
        for item in items:
            yield item

    words = module.generate(None, text)
    sounds = module.synthesize(None, as_async(module.translate(None, words)))

    items = [item async for item in sounds]
    return items, items[-1]


@pytest.fixture
def edges_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = app_environment(tmp_path, "edges_app", EDGES_APP)
    log = tmp_path / "edges.log"
    log.touch()
    env["EDGES_LOG"] = str(log)
    monkeypatch.setenv("EDGES_LOG", str(log))
    monkeypatch.syspath_prepend(str(tmp_path))
    return env


def log_lines(env: dict[str, str]) -> list[str]:
    return Path(env["EDGES_LOG"]).read_text().splitlines()


def note(env: dict[str, str], line: str | None) -> None:
    """Add ``line`` to the shared log (None: empty it)."""
    with open(env["EDGES_LOG"], "a" if line is not None else "w") as log:
        log.write("" if line is None else line + "\n")


@pytest.mark.asyncio
async def test_the_local_run_of_the_pipeline_is_what_the_cluster_must_give(
    edges_env: dict[str, str],
) -> None:
    items, final = await locally("one two three")
    assert items == ["<ENO>", "<OWT>", "<EERHT>"] and final == "<EERHT>"


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_streamed_pipeline_overlaps_its_stages_and_equals_the_local_run(
    edges_env: dict[str, str],
) -> None:
    text = "one two three four"
    async with LocalCluster(3, args=ARGS, env=edges_env) as cluster, cluster.client() as client:
        streamed = [out async for out in client.stream("speak", {"text": text})]
        log = log_lines(edges_env)
        note(edges_env, None)
        plain = await client.submit("speak", {"text": text})
    note(edges_env, None)
    items, final = await locally(text)
    assert [o.value for o in streamed if not o.final] == items
    assert streamed[-1].final and streamed[-1].value == final and plain == final
    # each successor read its predecessor's first item while the predecessor still ran
    assert "generate waited True" in log and "translate waited True" in log
    assert log.index("translate read 0") < log.index("generate ended")
    assert log.index("synthesize read 0") < log.index("translate ended")
    pids = {line.split()[-1] for line in log if " pid " in line}
    assert len(pids) == 2, "generate and translate ran in two worker processes"


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_predecessor_failing_mid_stream_fails_the_job_and_breaks_the_stream(
    edges_env: dict[str, str],
) -> None:
    async with LocalCluster(3, args=ARGS, env=edges_env) as cluster, cluster.client() as client:
        with pytest.raises(JobFailed, match="generate") as failed:
            await client.submit("speak", {"text": "one two FAIL three"})
        assert "cannot say word 2" in str(failed.value)
        async with asyncio.timeout(30):  # the translator, reading, hears it too: no hang
            while "translate broke JobFailed" not in log_lines(edges_env):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert "translate ended" not in log_lines(edges_env)
        # the workers keep serving
        note(edges_env, None)
        assert await client.submit("speak", {"text": "a b"}) == (await locally("a b"))[1]


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_worker_lost_mid_stream_gives_the_whole_result_or_a_typed_error(
    edges_env: dict[str, str],
) -> None:
    text = "one HOLD two three"
    async with LocalCluster(3, args=ARGS, env=edges_env) as cluster, cluster.client() as client:
        job = asyncio.ensure_future(client.submit("speak", {"text": text}))
        async with asyncio.timeout(60):
            while "translate read 0" not in log_lines(edges_env):  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        (line,) = [ln for ln in log_lines(edges_env) if ln.startswith("translate pid")]
        pid = int(line.split()[-1])
        (victim,) = [w for w in cluster.workers if w.process.pid == pid]
        assert victim is not cluster.workers[0], "the ingress stays"
        os.kill(pid, signal.SIGKILL)
        note(edges_env, "go on")
        try:
            result: Any = await asyncio.wait_for(job, 120)
        except CompassError as exc:
            result = exc
        # planned again on the survivors and whole, or a typed error: never a partial text
        if isinstance(result, CompassError):
            assert type(result) is not CompassError
        else:
            assert result == (await locally(text))[1]


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_a_caller_whose_stream_would_restart_after_a_lost_worker_gets_workers_lost(
    edges_env: dict[str, str],
) -> None:
    """The caller has read two partial outputs of the sink when a worker of the job is killed:
    the job is planned again and its sink starts again from its first step, which the caller
    would get twice; it gets WorkersLost instead, after what it read, each once."""
    text = "one two HOLD three"
    async with LocalCluster(3, args=ARGS, env=edges_env) as cluster, cluster.client() as client:
        got: list[Any] = []
        stream = client.stream("speak", {"text": text})
        error: BaseException | None = None
        try:
            async with asyncio.timeout(120):
                async for out in stream:
                    got.append(out)
                    if len(got) == 2:  # <ENO>, <OWT>: the generator waits at HOLD
                        (line,) = [ln for ln in log_lines(edges_env)
                                   if ln.startswith("translate pid")]  # fmt: skip
                        pid = int(line.split()[-1])
                        (victim,) = [w for w in cluster.workers if w.process.pid == pid]
                        assert victim is not cluster.workers[0], "the ingress stays"
                        os.kill(pid, signal.SIGKILL)
                        note(edges_env, "go on")
        except CompassError as exc:
            error = exc
    # what was read is the sink's steps in order, each once (the old attempt's last ones may
    # have come before the new attempt's first), then the typed error
    assert [o.seq for o in got] == list(range(len(got))) and len(got) >= 2, got
    assert [o.value for o in got[:2]] == ["<ENO>", "<OWT>"], got
    assert isinstance(error, WorkersLost), error
    assert "started again" in str(error)
