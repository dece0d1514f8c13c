"""What a preempting worker pays for the reports of a generation's steps (issue 35, item 3):
the same generation job through a real worker over loopback, with ``--preempt`` and without,
counted in executed Python bytecode instructions of the worker's thread (which the machine's
load does not move) and timed in that thread's CPU seconds.

With preemption every step of a step-wise task is reported to the worker's core, which decides
at that boundary (:meth:`Lanes.stepped <compass.core.lanes.Lanes.stepped>`); a real task's
thread waits at its step gate for the core's word (one loop hop a step). Without it, a job that
does not stream reports no step. The job is ``generation`` of ``compass._bench.apps``:
``--steps`` steps of no time (``step_ms`` 0), so what differs between the two sides is the
reports alone; a ``noop`` job is measured beside them for scale. The difference over the steps
is one report's cost: what the simulator charges nothing for.

Run: ``python -m compass._bench.step_cost [--steps 24] [--jobs 100] [--rounds 3] [--json F]``.
"""

from __future__ import annotations

import argparse
import secrets
import time
from typing import Any

from compass.client import Client
from compass.config import SchedConfig, WorkerConfig

from .core_cost import WorkerThread, _Counter, _run_client
from .report import machine, print_table, write_json

__all__ = ["run"]

APP = "compass._bench.apps"


def _worker_cost(preempt: bool, steps: int, jobs: int, rounds: int) -> dict[str, dict[str, float]]:
    """A real worker (``preempt`` on or off) in a thread of its own with its own loop, its
    client in this one: per job of ``noop`` and of ``generation`` (``steps`` steps), the
    instructions its thread executed and its CPU microseconds (best of ``rounds``)."""
    token = secrets.token_hex(16)
    config = WorkerConfig(name="w0", app=APP, token=token, sched=SchedConfig(preempt=preempt))
    counter = _Counter()
    kinds: dict[str, tuple[str, dict[str, Any]]] = {
        "noop": ("noop", {"x": 0}),
        "generation": ("generation", {"steps": steps, "step_ms": 0.0, "chunk": 8}),
    }

    async def client_side(worker: WorkerThread) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        async with Client(worker.address, token=token) as client:
            for name, (workflow, inputs) in kinds.items():
                for _ in range(20):  # warm up
                    await client.submit(workflow, **inputs)
                best = float("inf")
                for _ in range(rounds):
                    t0 = time.clock_gettime(worker.clock)
                    for _ in range(jobs):
                        await client.submit(workflow, **inputs)
                    best = min(best, (time.clock_gettime(worker.clock) - t0) / jobs)
                worker.trace(counter.call)
                before = counter.n
                for _ in range(jobs):
                    await client.submit(workflow, **inputs)
                counted = (counter.n - before) / jobs
                worker.trace(None)
                out[name] = {"instructions": counted, "cpu_us": best * 1e6}
        return out

    with WorkerThread(config) as worker:
        return _run_client(client_side(worker))


def run(
    steps: int = 24, jobs: int = 100, rounds: int = 3, json_path: str | None = None
) -> dict[str, Any]:
    """Measure both sides (see the module docstring); print a table, write ``json_path``."""
    off = _worker_cost(False, steps, jobs, rounds)
    on = _worker_cost(True, steps, jobs, rounds)
    per_step = {
        key: (on["generation"][key] - off["generation"][key]) / steps
        for key in ("instructions", "cpu_us")
    }
    rows: list[list[Any]] = [
        ["noop job, no preemption", off["noop"]["instructions"], off["noop"]["cpu_us"]],
        ["noop job, preemption", on["noop"]["instructions"], on["noop"]["cpu_us"]],
        [
            f"generation ({steps} steps), no preemption",
            off["generation"]["instructions"],
            off["generation"]["cpu_us"],
        ],
        [
            f"generation ({steps} steps), preemption",
            on["generation"]["instructions"],
            on["generation"]["cpu_us"],
        ],
        [
            "one step's report (the difference / steps)",
            per_step["instructions"],
            per_step["cpu_us"],
        ],
    ]
    print_table(
        "a worker's thread per job, with and without preemption",
        ["what", "instructions", "CPU us (best)"],
        rows,
    )
    ratio = on["generation"]["instructions"] / off["generation"]["instructions"]
    print(f"generation with / without preemption: {ratio:.2f}x the instructions")
    result: dict[str, Any] = {
        "steps": steps,
        "off": off,
        "on": on,
        "per_step": per_step,
        "ratio": ratio,
        "machine": machine(),
    }
    write_json(json_path, result)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    run(args.steps, args.jobs, args.rounds, args.json)


if __name__ == "__main__":
    main()
