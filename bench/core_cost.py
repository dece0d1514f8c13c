"""What the worker core costs per job and per chain task, counted in executed Python bytecode
instructions (which the machine's load does not move) and timed in CPU seconds.

Three measurements:

- ``job``: one no-op job through a real worker over loopback. The worker runs in a thread of
  its own, with its own event loop, and only that thread is counted (``sys.settrace`` with
  ``f_trace_opcodes``): the worker's framing, requests, core, lanes, task runner and event
  loop, not the client's. Its CPU time is that thread's (``time.thread_time``). The client's
  thread is counted apart, in runs of its own (``client_instructions``).
- ``core-job``: the same job through the cores alone: a ``Submit`` to a worker's
  :class:`~compass.core.state.WorkerCore`, the ``RunTask`` it answers with carried out at
  once as a ``TaskDone``, up to the ``Answer``. No sockets, no loop.
- ``core-chain``: a ``chain_100`` job of ``compass bench chain`` (``round_robin``: every task
  on the other worker) between the cores of two workers in one process, each ``Send``
  delivered at once as the peer's ``Received``; per task.

The cores are those of real workers (:func:`~compass.worker.process.build_worker`, app
``compass._bench.apps``, not emulated, so they learn from every run and push), never started.
What an adapter pays beside the core (framing, the wire, gossip) is left out of the core
measurements. The tool also measures trees from before issue 19 (388075e), where the worker,
not the core, learned from a task's run and a push's transfer time: there it pays that
learning itself, as the worker did, so that both sides count the same work.

``--view mesh`` measures the workers with a full view (every peer's heartbeats, no candidate
sampling), the only view before issue 24 made the bounded one the default; a tree without the
``view`` setting has only the mesh.

``--by-function`` also counts per code object and prints the 25 that executed most (their own
instructions, not their callees'), per job or task: where the instructions go, to compare two
trees function by function.

Run: ``python -m compass._bench.core_cost [--what job,core-job,core-chain] [--rounds 5]
[--view bounded|mesh] [--by-function] [--json out.json]``; with ``PYTHONPATH`` pointing at
another tree, that tree is measured.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import CodeType, FrameType
from typing import Any, TypeVar

from compass.client import Client
from compass.config import SchedConfig, WorkerConfig
from compass.wire.transport import new_event_loop
from compass.worker.process import build_worker

from .report import machine, print_table, write_json

_T = TypeVar("_T")

__all__ = ["count_instructions", "run"]

APP = "compass._bench.apps"
CHAIN = 100
WHAT = ("job", "core-job", "core-chain")
TOP = 25


def _sched(view: str | None, **settings: Any) -> SchedConfig:
    """The scheduling settings with ``view`` (None: the tree's default); a tree without the
    setting (before issue 24) has only the mesh."""
    if view is not None:
        if any(f.name == "view" for f in dataclasses.fields(SchedConfig)):
            settings["view"] = view
        elif view != "mesh":
            raise SystemExit(f"--view {view}: this tree has only the mesh")
    return SchedConfig(**settings)


class _Counter:
    """Counts the bytecode instructions executed in the thread it traces."""

    def __init__(self) -> None:
        self.n = 0

    def call(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        frame.f_trace_opcodes = True
        return self.step

    def step(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.n += 1
        return self.step


class _ByFunction(_Counter):
    """Counts as :class:`_Counter` does, and per code object (a function's own instructions,
    not those of what it calls)."""

    def __init__(self) -> None:
        super().__init__()
        self.by: dict[CodeType, int] = {}
        self.made: dict[CodeType, str] = {}  # generated code (a dataclass's __init__): whose

    def call(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        code = frame.f_code
        if code.co_filename == "<string>" and code not in self.made and "self" in frame.f_locals:
            self.made[code] = type(frame.f_locals["self"]).__qualname__
        return super().call(frame, event, arg)

    def step(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if event == "opcode":
            self.n += 1
            code = frame.f_code
            self.by[code] = self.by.get(code, 0) + 1
        return self.step

    def top(self, per: float) -> list[list[Any]]:
        """Every code object that executed, most first, per ``per`` (jobs or tasks): name,
        where, instructions."""
        rows = sorted(self.by.items(), key=lambda item: -item[1])
        return [[*self.where(code), count / per] for code, count in rows]

    def where(self, code: CodeType) -> tuple[str, str]:
        """A code object's qualified name and its file (under ``compass``, or from
        ``asyncio`` or the last two parts of the path) and first line."""
        if code in self.made:
            return f"{self.made[code]}.{code.co_name}", "(generated)"
        parts = code.co_filename.replace("\\", "/").split("/")
        for anchor, skip in (("compass", 1), ("bench", 0), ("asyncio", 0)):
            if anchor in parts:
                parts = parts[parts.index(anchor) + skip :]
                break
        else:
            parts = parts[-2:]
        return code.co_qualname, f"{'/'.join(parts)}:{code.co_firstlineno}"


@contextmanager
def count_instructions(counter: _Counter | None = None) -> Iterator[_Counter]:
    """Count the Python bytecode instructions this thread executes inside the block (the
    count is read from the counter it yields, ``counter`` or a new one; tracing slows the
    block down about 30x)."""
    counter = counter or _Counter()
    previous = sys.gettrace()
    sys.settrace(counter.call)
    try:
        yield counter
    finally:
        sys.settrace(previous)


# -- the cores alone ---------------------------------------------------------------------------


class _Cores:
    """The cores of ``names`` (real workers, never started), each in the others' views, and
    the events of this tree's core (the vocabulary moved to ``compass.core.events`` in
    issue 19; before it, the worker learned outside the core)."""

    def __init__(self, names: list[str], view: str | None = None) -> None:
        try:
            events: Any = importlib.import_module("compass.core.events")
            self.learns_outside = False
        except ImportError:
            events = importlib.import_module("compass.core.state")
            self.learns_outside = True
        self.ev = events
        stats: Any = importlib.import_module("compass.core.stats")
        self.payload_bytes: Callable[[Any], int] = stats.payload_bytes
        sched = _sched(view, policy="round_robin")
        self.workers = {
            n: build_worker(WorkerConfig(name=n, app=APP, sched=sched, token="x" * 32))
            for n in names
        }
        for name, worker in self.workers.items():
            for peer in self.workers:
                if peer != name:
                    state = self._state(worker.gossip)
                    worker.gossip.port.view.apply_heartbeat(replace(state, name=peer, seq=1), 0.0)
        self.now = 0.0
        self.jobs = 0
        self.threshold = getattr(
            importlib.import_module("compass.worker.requests"), "MEASURED_TRANSFER_BYTES", 0
        )

    @staticmethod
    def _state(gossip: Any) -> Any:
        """A worker's own state (its heartbeat), to stand for a peer's."""
        try:
            return gossip.own_state(0.0)
        except TypeError:  # before issue 19 the gossip read its own clock
            return gossip.own_state()

    def job(self, workflow: str, ingress: str) -> Any:
        """Submit one job of ``workflow`` at ``ingress`` and carry every instruction out at
        once, in order; returns its answer's value."""
        self.jobs += 1
        ev = self.ev
        todo: deque[tuple[str, Any]] = deque()
        todo.append(
            (ingress, ev.Submit(self.now, f"{ingress}-{self.jobs}", workflow, {"x": 0}, 8, 0.0))
        )
        answer: Any = None
        while todo:
            name, event = todo.popleft()
            worker = self.workers[name]
            self.now += 1e-5
            steps: list[Any] = worker.core.handle(event)  # this tree's instructions or 388075e's
            for step in steps:
                kind = type(step).__name__
                if kind == "Send":
                    todo.append((step.peer, self._received(step.peer, name, step.msg)))
                elif kind == "RunTask":
                    todo.append((name, self._done(worker, step.entry)))
                elif kind == "Answer":
                    if step.error is not None:
                        raise step.error
                    answer = step.value
                elif kind not in ("Watch", "StopTask"):  # a watch is the adapter's send
                    raise AssertionError(f"unexpected instruction {step!r}")
        return answer

    def _received(self, to: str, sender: str, msg: Any) -> Any:
        transfer_s = 1e-5
        if self.learns_outside and type(msg).__name__ == "TaskMsg":
            nbytes = self.payload_bytes(msg.value)  # what the worker did before the core
            if nbytes >= self.threshold:
                self.workers[to].profiles.observe_transfer(sender, to, nbytes, transfer_s)
        return self.ev.Received(self.now, sender, msg, transfer_s, 0.0)

    def _done(self, worker: Any, entry: Any) -> Any:
        task = worker.app.get_workflow(entry.workflow).tasks[entry.task]
        output, exec_s = task.fn(None, **entry.inputs), 1e-6
        if self.learns_outside:  # what the worker did before the core learned
            worker.profiles.observe_batch(entry.workflow, entry.task, worker.name, 1, exec_s)
            worker.profiles.observe_output(entry.workflow, entry.task, self.payload_bytes(output))
            return self.ev.TaskDone(self.now, entry, output)
        return self.ev.TaskDone(self.now, entry, output, exec_s)


def _core_cost(
    what: str, rounds: int, repeats: int, view: str | None, by_function: bool = False
) -> dict[str, Any]:
    """Instructions per job (``core-job``) or per chain task (``core-chain``), and CPU
    microseconds (best of ``rounds`` rounds of ``repeats`` jobs); with ``by_function``, the
    code objects that executed most, per job or task."""
    cores = _Cores(["w0", "w1"], view)
    workflow, per = ("noop", 1) if what == "core-job" else (f"chain_{CHAIN}", CHAIN)
    expected = 0 if what == "core-job" else CHAIN  # noop answers x, a chain adds 1 per task
    for _ in range(20):  # warm up: the cost tables, the profiles' first measurements
        if cores.job(workflow, "w0") != expected:
            raise AssertionError(f"{workflow} answered wrong")
    counts = []
    by = _ByFunction()
    for _ in range(3):
        with count_instructions(by if by_function else None) as counter:
            before = counter.n
            cores.job(workflow, "w0")
        counts.append((counter.n - before) / per)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(repeats):
            cores.job(workflow, "w0")
        best = min(best, (time.process_time() - t0) / repeats / per)
    result: dict[str, Any] = {"instructions": counts, "cpu_us": best * 1e6}
    if by_function:
        result["by_function"] = by.top(3 * per)
    return result


# -- a real worker over loopback ---------------------------------------------------------------


class WorkerThread:
    """A real worker (``config``) in a thread of its own, with its own event loop, for the
    counting tools: its ``address``, its thread's CPU ``clock``, and :meth:`trace`, which
    turns counting on or off in that thread (``sys.settrace`` is per thread). A context
    manager: the worker is started on entry, closed and its thread joined on exit."""

    def __init__(self, config: WorkerConfig) -> None:
        self._config = config
        self._ready = threading.Event()
        self._box: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._serve_thread, name="compass-worker",
                                        daemon=True)  # fmt: skip
        self.address = ""
        self.clock = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _serve(self) -> None:
        worker = build_worker(self._config)
        await worker.start()
        box = self._box
        box["done"] = done = asyncio.Event()
        box["loop"] = asyncio.get_running_loop()
        box["address"] = worker.address
        self._ready.set()
        try:
            await done.wait()
        finally:
            await worker.aclose()

    def _serve_thread(self) -> None:
        loop = new_event_loop()
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._box["failure"] = exc
            self._ready.set()
        finally:
            sys.settrace(None)
            loop.close()

    def __enter__(self) -> WorkerThread:
        self._thread.start()
        if not self._ready.wait(60) or "failure" in self._box:
            raise RuntimeError(f"the worker did not start: {self._box.get('failure')}")
        self._loop = self._box["loop"]
        self.address = self._box["address"]
        assert self._thread.ident is not None
        self.clock = time.pthread_getcpuclockid(self._thread.ident)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._box["done"].set)
        self._thread.join(30)

    def trace(self, call: Callable[..., Any] | None) -> None:
        """Count with ``call`` in the worker's thread from its next loop turn (None: stop)."""
        assert self._loop is not None
        flipped = threading.Event()

        def flip() -> None:
            sys.settrace(call)
            flipped.set()

        self._loop.call_soon_threadsafe(flip)
        flipped.wait(10)


def _job_cost(
    jobs: int, rounds: int, view: str | None, by_function: bool = False
) -> dict[str, Any]:
    """A real worker in a thread of its own, with its own event loop (counted and timed:
    that thread only), its client in this one, over loopback; with ``by_function``, the
    code objects that executed most in that thread, per job."""
    token = secrets.token_hex(16)
    config = WorkerConfig(name="w0", app=APP, token=token, sched=_sched(view))
    counter = _ByFunction() if by_function else _Counter()
    client_counter = _ByFunction() if by_function else _Counter()
    with WorkerThread(config) as worker:
        return _run_client(_job_client(worker, token, counter, client_counter, jobs, rounds))


def _run_client(side: Coroutine[Any, Any, _T]) -> _T:
    """Run ``side`` (the client's) on a loop of its own in this thread."""
    loop = new_event_loop()
    try:
        return loop.run_until_complete(side)
    finally:
        loop.close()


async def _job_client(
    worker: WorkerThread,
    token: str,
    counter: _Counter,
    client_counter: _Counter,
    jobs: int,
    rounds: int,
) -> dict[str, Any]:
    """The client's side of :func:`_job_cost`."""
    clock = worker.clock

    def trace(on: bool) -> None:
        worker.trace(counter.call if on else None)

    async with Client(worker.address, token=token) as client:
        for i in range(200):  # warm up
            await client.submit("noop", x=i)
        best = float("inf")
        for _ in range(rounds):
            t0 = time.clock_gettime(clock)
            for i in range(jobs):
                await client.submit("noop", x=i)
            best = min(best, (time.clock_gettime(clock) - t0) / jobs)
        counts, client_counts, traced_s = [], [], []
        for _ in range(3):
            trace(True)
            before, t0 = counter.n, time.perf_counter()
            for i in range(jobs):
                await client.submit("noop", x=i)
            counts.append((counter.n - before) / jobs)
            traced_s.append((time.perf_counter() - t0) / jobs)
            trace(False)
        for _ in range(3):  # the client's side, its thread alone (this one)
            with count_instructions(client_counter):
                before = client_counter.n
                for i in range(jobs):
                    await client.submit("noop", x=i)
            client_counts.append((client_counter.n - before) / jobs)
        top = counter.top(3 * jobs) if isinstance(counter, _ByFunction) else None
        # what the idle worker runs meanwhile (its timers), slowed down as much
        trace(True)
        before = counter.n
        await asyncio.sleep(1.0)
        idle = counter.n - before
        trace(False)
        result: dict[str, Any] = {
            "instructions": counts,
            "client_instructions": client_counts,
            "cpu_us": best * 1e6,
            "idle_per_s": idle,
            "traced_s_per_job": min(traced_s),
        }
        if top is not None:
            result["by_function"] = top
        if isinstance(client_counter, _ByFunction):
            result["client_by_function"] = client_counter.top(3 * jobs)
        return result


def run(
    what: tuple[str, ...] = WHAT,
    rounds: int = 5,
    repeats: int = 20,
    jobs: int = 300,
    json_path: str | None = None,
    view: str | None = None,
    by_function: bool = False,
) -> dict[str, Any]:
    """Measure ``what`` (see the module docstring) with the workers' ``view`` (None: the
    tree's default); print a table (with ``by_function``, one more per measurement: the
    code objects that executed most), write ``json_path``."""
    result: dict[str, Any] = {}
    for name in what:
        if name == "job":
            result[name] = _job_cost(jobs, rounds, view, by_function)
        else:
            result[name] = _core_cost(name, rounds, repeats, view, by_function)
    rows = [
        [name, min(r["instructions"]), max(r["instructions"]), r.get("cpu_us")]
        for name, r in result.items()
    ]
    if "job" in result:
        counts = result["job"]["client_instructions"]
        rows.append(["job, the client's thread", min(counts), max(counts), None])
    print_table(
        "worker cost per job (job, core-job) and per chain task (core-chain), "
        f"{view or 'default'} view",
        ["what", "instructions (min)", "(max)", "CPU us (best)"],
        rows,
    )
    for name, r in result.items():
        per = "task" if name == "core-chain" else "job"
        for key, whose in (("by_function", name), ("client_by_function", f"{name}, client")):
            if key in r:
                print_table(
                    f"{whose}: the {TOP} code objects that executed most "
                    f"(own instructions per {per})",
                    ["function", "where", "instructions"],
                    r[key][:TOP],
                )
    result["view"] = view or "default"
    result["machine"] = machine()
    write_json(json_path, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--what", default=",".join(WHAT), help="of " + ", ".join(WHAT))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--view", choices=("bounded", "mesh"), default=None, help="default: the tree's"
    )
    parser.add_argument(
        "--by-function",
        action="store_true",
        help=f"also print the {TOP} code objects that executed most (their own instructions)",
    )
    args = parser.parse_args()
    chosen = tuple(args.what.split(","))
    unknown = [w for w in chosen if w not in WHAT]
    if unknown:
        parser.error(f"--what: unknown {unknown}; choose from {', '.join(WHAT)}")
    run(chosen, args.rounds, args.repeats, args.jobs, args.json, args.view, args.by_function)


if __name__ == "__main__":
    main()
