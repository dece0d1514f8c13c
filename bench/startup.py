"""``compass bench startup``: how soon a new worker is of use, and where its start goes.

A worker is ready when it prints ``compass worker listening on HOST:PORT``: it has bound its
port, joined its cluster (``--join``) and serves. :class:`~compass.cluster.LocalCluster`,
``compass up`` and the tests wait for that line. Each round, per tree and bytecode setting, the
workers run ``--workload`` emulated on loopback:

- *alone*: one worker, the seed of the others;
- *one after another*: ``workers`` workers joining the seed, each started once the one before
  is ready;
- *at once*: ``together`` workers joining the seed, started together (they share the CPUs).

Per start: the wall seconds from spawning the process to its line, and the CPU seconds the
process had used by then (its threads' time on a CPU, from ``/proc``; steadier than wall time
on a shared machine, and what a start costs the host). Then one more worker per round and
tree starts with ``PYTHONPROFILEIMPORTTIME``, and its stderr says what the imports cost (the
least of the rounds): in all, per package, and the costliest modules that compass code (or
the top level: the interpreter's start, ``-m``) imports.

Trees: this checkout's workers, and with ``worker_pythonpath`` another checkout's (the same
flags; a before/after), round by round in turn so that both meet the same background load.
Bytecode: ``cached`` (``PYTHONPYCACHEPREFIX``: the environment's where it names one, else a
folder of the run's; a start that is not counted fills it), or ``none``
(``PYTHONDONTWRITEBYTECODE=1`` and no prefix: every start compiles compass's sources anew, as
where the environment sets it and nothing redirects it).

Run: ``compass bench startup [--workers 5] [--together 3] [--rounds 3] [--bytecode both]
[--worker-pythonpath TREE] [--json results/startup.json]``.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from compass.cluster import LocalCluster, WorkerProcess
from compass.errors import ConfigError
from compass.wire.transport import new_event_loop

from .report import machine, print_table, write_json

__all__ = ["ImportLine", "cpu_seconds", "import_profile", "parse_importtime", "run"]

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = str(ROOT / "bench" / "workloads" / "paper.json")
MODES = ("alone", "one after another", "at once")
BYTECODE = ("cached", "none")
#: modules listed in the import table, the costliest first
TOP_IMPORTS = 12
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class Start:
    """One worker's start: to its ``listening`` line, in wall and CPU seconds."""

    tree: str
    bytecode: str
    mode: str
    round: int
    wall_s: float
    cpu_s: float | None


@dataclass(frozen=True)
class ImportLine:
    """One line of ``-X importtime``: a module, its own and its subtree's microseconds, how
    deep it sits, and the module whose import brought it in ("" at the top)."""

    module: str
    self_us: int
    cumulative_us: int
    depth: int
    importer: str


def parse_importtime(text: str) -> list[ImportLine]:
    """The ``import time:`` lines of ``text`` (a process's stderr), each with its importer.
    The lines come in post-order: a module's importer is the next line less deep."""
    raw: list[tuple[str, int, int, int]] = []
    for line in text.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        fields = line[len("import time:") :].split("|", 2)
        name = fields[2].rstrip()
        depth = (len(name) - len(name.lstrip(" "))) // 2
        raw.append((name.strip(), int(fields[0]), int(fields[1]), depth))
    lines: list[ImportLine] = []
    later: list[tuple[str, int]] = []  # (module, depth) of the lines after, nearest last
    for module, own, cumulative, depth in reversed(raw):
        while later and later[-1][1] >= depth:
            later.pop()
        lines.append(ImportLine(module, own, cumulative, depth, later[-1][0] if later else ""))
        later.append((module, depth))
    lines.reverse()
    return lines


def _package(module: str) -> str:
    """What a module's time is summed under: compass's by subpackage, others by top level."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "compass" and len(parts) > 1 else parts[0]


def import_profile(lines: Sequence[ImportLine]) -> dict[str, Any]:
    """What one start's imports cost, in milliseconds: ``total``; ``packages``, each
    package's own time summed; ``entries``, the cumulative time of each module that compass
    code or the top level imports from another package (where a cost enters)."""
    packages: dict[str, float] = defaultdict(float)
    entries: dict[str, float] = {}
    for line in lines:
        packages[_package(line.module)] += line.self_us / 1e3
        from_compass = line.importer == "" or line.importer.startswith("compass")
        if from_compass and _package(line.module) != _package(line.importer):
            entries[f"{line.module} <- {line.importer or '(top)'}"] = line.cumulative_us / 1e3
    return {
        "total": sum(line.self_us for line in lines) / 1e3,
        "modules": len(lines),
        "packages": dict(packages),
        "entries": entries,
    }


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` has used: the scheduler's own count for each of its threads
    (``se.sum_exec_runtime``, milliseconds to the nanosecond, where the kernel keeps it),
    else user plus system time in clock ticks (10 ms each); None off Linux."""
    try:
        runtime_ms = 0.0
        for sched in Path(f"/proc/{pid}/task").glob("*/sched"):
            for line in sched.read_text().splitlines():
                if line.startswith("se.sum_exec_runtime"):
                    runtime_ms += float(line.split(":", 1)[1])
        if runtime_ms > 0:
            return runtime_ms / 1e3
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, ValueError):
        return None
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class _Side:
    """One tree under one bytecode setting: its environment, and a folder of its own for its
    workers' logs (one start's stderr is its import profile: no other side's may join it)."""

    def __init__(
        self, tree: str, bytecode: str, pythonpath: str | None, cache: Path, log_dir: Path
    ) -> None:
        self.tree, self.bytecode, self.log_dir = tree, bytecode, log_dir
        env = dict(os.environ)
        env.pop("PYTHONPROFILEIMPORTTIME", None)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
            env["PYTHONSAFEPATH"] = "1"  # `python -m` would put the working directory first
        if bytecode == "cached":
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(cache)
        else:
            env.pop("PYTHONPYCACHEPREFIX", None)
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.env = env

    def cluster(self, workload: str, env: dict[str, str] | None = None) -> LocalCluster:
        return LocalCluster(
            1, env=env or self.env, args=["--workload", workload], log_dir=self.log_dir
        )


async def _timed(
    cluster: LocalCluster, name: str, join: str | None
) -> tuple[WorkerProcess, float, float | None]:
    start = time.perf_counter()
    worker = await cluster.spawn(name, join=join)
    wall = time.perf_counter() - start
    return worker, wall, cpu_seconds(worker.process.pid)


async def _round(side: _Side, index: int, settings: dict[str, Any]) -> list[Start]:
    """One round of the three modes for ``side``; every worker is stopped before it returns."""
    cluster = side.cluster(settings["workload"])
    starts: list[Start] = []

    def record(mode: str, wall: float, cpu: float | None) -> None:
        starts.append(Start(side.tree, side.bytecode, mode, index, wall, cpu))

    try:
        seed, wall, cpu = await _timed(cluster, f"r{index}-seed", None)
        record("alone", wall, cpu)
        for i in range(settings["workers"]):
            _, wall, cpu = await _timed(cluster, f"r{index}-n{i}", seed.address)
            record("one after another", wall, cpu)
        together = await asyncio.gather(
            *(_timed(cluster, f"r{index}-t{i}", seed.address) for i in range(settings["together"]))
        )
        for _, wall, cpu in together:
            record("at once", wall, cpu)
    finally:
        await cluster.aclose()
    return starts


async def _imports(side: _Side, index: int, workload: str) -> dict[str, Any]:
    """One start with ``PYTHONPROFILEIMPORTTIME``: its import profile."""
    cluster = side.cluster(workload, env={**side.env, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        worker = await cluster.spawn(f"r{index}-imports")
        await worker.stop()
        text = worker.log_path.read_text(errors="replace")
    finally:
        await cluster.aclose()
    return import_profile(parse_importtime(text))


def _spread(values: Sequence[float | None]) -> tuple[float | None, float | None, float | None]:
    known = [v for v in values if v is not None]
    if not known:
        return None, None, None
    return statistics.median(known), min(known), max(known)


def _least_profile(profiles: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Each figure of ``profiles`` (one per round) as its least over the rounds: on a shared
    machine others' work only ever adds to an import's time."""

    def least_of(key: str) -> dict[str, float]:
        names = {name for p in profiles for name in p[key]}
        return {n: min(p[key].get(n, 0.0) for p in profiles) for n in names}

    return {
        "total": min(p["total"] for p in profiles),
        "modules": min(p["modules"] for p in profiles),
        "packages": least_of("packages"),
        "entries": least_of("entries"),
    }


async def _run(settings: dict[str, Any], sides: list[_Side]) -> dict[str, Any]:
    for side in sides:  # the bytecode cache's first filling is no start to count
        await _round(side, -1, {**settings, "workers": 0, "together": 0})
    starts: list[Start] = []
    profiles: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for index in range(settings["rounds"]):
        for side in sides:
            starts += await _round(side, index, settings)
            if side.bytecode == settings["bytecode"][0]:  # compiling would swell them
                profile = await _imports(side, index, settings["workload"])
                profiles[side.tree].append(profile)
            print(
                f"round {index + 1}/{settings['rounds']}: {side.tree}, bytecode {side.bytecode}",
                flush=True,
            )
    return {"starts": starts, "imports": {t: _least_profile(p) for t, p in profiles.items()}}


def _start_rows(starts: Sequence[Start]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[Start]] = defaultdict(list)
    for s in starts:
        groups[(s.tree, s.bytecode, s.mode)].append(s)
    rows = []
    for (tree, bytecode, mode), group in groups.items():
        wall = _spread([s.wall_s for s in group])
        cpu = _spread([s.cpu_s for s in group])
        rows.append(
            {"tree": tree, "bytecode": bytecode, "mode": mode, "starts": len(group),
             "wall_median_s": wall[0], "wall_min_s": wall[1], "wall_max_s": wall[2],
             "cpu_median_s": cpu[0], "cpu_min_s": cpu[1], "cpu_max_s": cpu[2]}
        )  # fmt: skip
    return rows


def _print(rows: list[dict[str, Any]], imports: dict[str, dict[str, Any]]) -> None:
    print_table(
        "worker start -> listening (seconds: median, min-max)",
        ["tree", "bytecode", "mode", "starts", "wall", "wall min-max", "CPU", "CPU min-max"],
        [
            [r["tree"], r["bytecode"], r["mode"], r["starts"], r["wall_median_s"],
             f"{r['wall_min_s']:.2f}-{r['wall_max_s']:.2f}", r["cpu_median_s"],
             "-" if r["cpu_min_s"] is None else f"{r['cpu_min_s']:.2f}-{r['cpu_max_s']:.2f}"]
            for r in rows
        ],
    )  # fmt: skip
    trees = list(imports)
    for key, title in (
        ("packages", "own import time by package"),
        ("entries", "costliest imports, with what imported them"),
    ):
        costs: dict[str, list[float]] = defaultdict(list)
        names = {n for t in trees for n in imports[t][key]}
        for name in names:
            costs[name] = [imports[t][key].get(name, 0.0) for t in trees]
        top = sorted(costs, key=lambda n: -max(costs[n]))[:TOP_IMPORTS]
        rows_out: list[list[Any]] = [["(all imports)", *(imports[t]["total"] for t in trees)]]
        rows_out += [[name, *costs[name]] for name in top]
        print_table(f"{title} (ms, least of rounds)", ["module", *trees], rows_out)


def run(
    *,
    workers: int = 5,
    together: int = 3,
    rounds: int = 3,
    bytecode: Sequence[str] = BYTECODE,
    worker_pythonpath: str | None = None,
    workload: str = WORKLOAD,
    json_path: str | None = None,
) -> dict[str, Any]:
    """Start workers as the module docstring says; print the tables, write JSON."""
    unknown = [b for b in bytecode if b not in BYTECODE]
    if unknown or not bytecode:
        raise ConfigError(f"bytecode {unknown or bytecode!r}: expected cached and/or none")
    if not Path(workload).is_file():
        raise ConfigError(f"workload {workload!r}: no such file")
    settings = {"workers": workers, "together": together, "rounds": rounds,
                "bytecode": list(bytecode), "workload": workload,
                "worker_pythonpath": worker_pythonpath}  # fmt: skip
    trees: dict[str, str | None] = {"this tree": None}
    if worker_pythonpath:
        trees[worker_pythonpath] = worker_pythonpath
    with tempfile.TemporaryDirectory(prefix="compass-startup-") as tmp:
        # a fresh folder would have each run compile the standard library too (2.5 s of CPU)
        cache = Path(os.environ.get("PYTHONPYCACHEPREFIX") or Path(tmp) / "pycache")
        pairs = [(b, tree, path) for b in bytecode for tree, path in trees.items()]
        sides = [
            _Side(tree, b, path, cache, Path(tmp) / f"logs-{n}")
            for n, (b, tree, path) in enumerate(pairs)
        ]
        loop = new_event_loop()
        try:
            measured = loop.run_until_complete(_run(settings, sides))
        finally:
            loop.close()
    rows = _start_rows(measured["starts"])
    _print(rows, measured["imports"])
    results = {
        "config": settings,
        "machine": machine(),
        "summary": rows,
        "starts": [asdict(s) for s in measured["starts"]],
        "imports": measured["imports"],
    }
    write_json(json_path, results)
    return results
