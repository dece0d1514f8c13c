"""Workload files: models, workflows, a cluster and an arrival process, in one JSON document.

The format is the one of ``bench/workloads/paper.json``. Units: model sizes in MB (10^6 bytes),
``*_kb`` in 10^3 bytes, times in ms, bandwidths in GB/s (10^9 bytes/s), ``net_fixed_us`` in
microseconds. Every object is converted to SI units (bytes, bytes/s, seconds) here, except the
task profile times, which stay in ms as :class:`~compass.workflow.dag.TaskProfile` declares them.

A workflow may carry a ``weight`` (a number > 0, default 1): how often its client submits
relative to the others; its client's mean interval is ``mean_interval_ms_per_client / weight``
(:attr:`Workload.weights`, which :func:`~compass.sim.arrivals.job_arrivals` takes).

A task with a model may batch: ``batch`` is the most items one run takes; its cost curve is
``batch_item`` (each item past the first adds that fraction of one run) or ``batch_ms`` (the
milliseconds of a batch of 1, 2, ... items; its first entry is the task's ``exec_ms`` when that
is not given). With ``batch`` alone a batch costs as many runs as it has items.

A task may run in ``steps`` (an integer, default 1: a generating task, each step a token or a
chunk): ``exec_ms`` is all of them, or ``step_ms`` each (``exec_ms`` is then ``steps *
step_ms``). A job's first output comes at the end of its sink's first step. ``state_kb``:
what its state grows by per step (a KV cache), held in the cache while the task is suspended.
A task's ``streamed`` (a list of names of its ``after``, default none) are the predecessors it
takes a step at a time: it starts at their first step, not at their end (a streamed edge; each
such predecessor must have ``steps`` > 1).

:func:`workload_to_dict` (and :func:`write_workload`) write a parsed workload back in this
format, exactly: :func:`parse_workload` of what they write equals the workload field for field,
batch curves included, so a transformed workload (``compass.workflow.batching``) can be handed
to worker processes as a file.

Every error is a :class:`~compass.errors.WorkflowError` naming the source and the key path of
the offending field (``paper.json: workflows.vqa.tasks.embed.exec_ms: expected a number``).
Keys the format does not know are ignored, except inside a task, where a misspelt key would
otherwise silently drop a field.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from compass.errors import ModelTooLarge, WorkflowError
from compass.workflow.dag import Task, TaskProfile, Workflow, linear_scale
from compass.workflow.unfold import Declared, unfold_workflow
from compass.workflow.unfold_spec import parse_choices

__all__ = [
    "ARRIVAL_PROCESSES",
    "ArrivalSpec",
    "ClusterSpec",
    "Workload",
    "load_workload",
    "parse_workload",
    "workload_to_dict",
    "write_workload",
]

ARRIVAL_PROCESSES = ("uniform", "poisson", "gamma")

_MB = 1_000_000
_KB = 1_000
_GB = 1_000_000_000
_TASK_KEYS = frozenset(
    {
        "model", "exec_ms", "input_kb", "output_kb", "after", "timeout_ms", "batch",
        "batch_item", "batch_ms", "steps", "step_ms", "state_kb", "streamed", "about",
        "note",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The cluster a workload was profiled on: SI units throughout."""

    workers: int
    gpu_memory_bytes: int
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float
    net_bytes_per_s: float
    net_fixed_s: float


@dataclass(frozen=True, slots=True)
class ArrivalSpec:
    """How clients submit jobs: one client per workflow, ``mean_interval_ms_per_client`` apart
    on average, ``jobs`` in all, under each of ``processes``; ``gamma_cv`` is the coefficient of
    variation of the gamma process's inter-arrival times."""

    mean_interval_ms_per_client: float
    jobs: int
    processes: tuple[str, ...]
    gamma_cv: float


@dataclass(frozen=True, slots=True)
class Workload:
    """A parsed workload: ``models`` maps each model to its size in bytes; ``weights`` each
    workflow to its client's relative rate (a workflow missing from it has weight 1)."""

    name: str
    models: Mapping[str, int]
    workflows: Mapping[str, Workflow]
    cluster: ClusterSpec
    arrivals: ArrivalSpec
    about: str = ""
    weights: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def weight_list(self) -> list[float]:
        """The weights in workflow order, as :func:`~compass.sim.arrivals.job_arrivals` takes
        them alongside ``list(workflows)``."""
        return [self.weights.get(name, 1.0) for name in self.workflows]


def load_workload(path: str | Path) -> Workload:
    """Read and validate a workload JSON file."""
    source = Path(path)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as exc:
        raise WorkflowError(f"cannot read workload file {str(source)!r}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkflowError(
            f"{source.name}: not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}"
        ) from None
    except RecursionError:
        raise WorkflowError(f"{source.name}: JSON nested too deeply for a workload") from None
    return parse_workload(data, source=source.name)


def parse_workload(data: Mapping[str, Any], *, source: str = "workload") -> Workload:
    """Validate a workload already decoded from JSON; ``source`` names it in errors."""
    reader = _Reader(source)
    top = reader.obj(data, "")
    name = reader.opt_str(top, "name", "", source.rsplit(".", 1)[0] or source)
    about = reader.opt_str(top, "about", "", "")
    cluster = _parse_cluster(reader, reader.obj(reader.get(top, "cluster", ""), "cluster"))
    models = _parse_models(reader, reader.obj(reader.get(top, "models", ""), "models"))
    flows = reader.obj(reader.get(top, "workflows", ""), "workflows")
    if not flows:
        raise reader.error("workflows", "no workflows")
    workflows: dict[str, Workflow] = {}
    weights: dict[str, float] = {}
    for wf_name, wf_data in flows.items():
        workflows[wf_name] = _parse_workflow(reader, wf_name, wf_data, models, cluster)
        entry = reader.obj(wf_data, f"workflows.{wf_name}")
        weights[wf_name] = reader.number(
            entry, "weight", f"workflows.{wf_name}", positive=True, default=1.0
        )
    arrivals = _parse_arrivals(reader, top.get("arrivals"))
    return Workload(
        name=name,
        models=MappingProxyType(models),
        workflows=MappingProxyType(workflows),
        cluster=cluster,
        arrivals=arrivals,
        about=about,
        weights=MappingProxyType(weights),
    )


class _Reader:
    """Typed field access that names the source and key path in every error."""

    def __init__(self, source: str) -> None:
        self.source = source

    def error(self, path: str, problem: str) -> WorkflowError:
        where = f"{self.source}: {path}" if path else self.source
        return WorkflowError(f"{where}: {problem}", detail={"source": self.source, "key": path})

    @staticmethod
    def join(path: str, key: str) -> str:
        return f"{path}.{key}" if path else key

    def obj(self, value: object, path: str) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(path, f"expected an object, got {_kind(value)}")
        return value

    def get(self, parent: Mapping[str, Any], key: str, path: str) -> Any:
        if key not in parent:
            raise self.error(self.join(path, key), "missing")
        return parent[key]

    def number(
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        positive: bool = False,
        default: float | None = None,
    ) -> float:
        if default is not None and key not in parent:
            return default
        value = self.get(parent, key, path)
        where = self.join(path, key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise self.error(where, f"expected a number, got {_kind(value)}")
        if value != value or value in (float("inf"), float("-inf")):
            raise self.error(where, f"expected a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.error(where, f"must be > 0, got {value!r}")
        if value < 0:
            raise self.error(where, f"must be >= 0, got {value!r}")
        return float(value)

    def integer(self, parent: Mapping[str, Any], key: str, path: str, *, minimum: int) -> int:
        value = self.get(parent, key, path)
        where = self.join(path, key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(where, f"expected an integer, got {_kind(value)}")
        if value < minimum:
            raise self.error(where, f"must be >= {minimum}, got {value}")
        return value

    def opt_str(self, parent: Mapping[str, Any], key: str, path: str, default: str) -> str:
        value = parent.get(key, default)
        if not isinstance(value, str):
            raise self.error(self.join(path, key), f"expected a string, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}
    for cls, text in names.items():
        if isinstance(value, cls):
            return f"{text} ({value!r})" if cls in (bool, str) else text
    if isinstance(value, int | float):
        return f"the number {value!r}"
    return type(value).__name__


def _parse_cluster(reader: _Reader, data: Mapping[str, Any]) -> ClusterSpec:
    path = "cluster"
    return ClusterSpec(
        workers=reader.integer(data, "workers", path, minimum=1),
        gpu_memory_bytes=round(reader.number(data, "gpu_memory_mb", path, positive=True) * _MB),
        h2d_bytes_per_s=reader.number(data, "h2d_gbps", path, positive=True) * _GB,
        d2h_bytes_per_s=reader.number(data, "d2h_gbps", path, positive=True) * _GB,
        net_bytes_per_s=reader.number(data, "net_gbps", path, positive=True) * _GB,
        net_fixed_s=reader.number(data, "net_fixed_us", path, default=0.0) / 1e6,
    )


def _parse_models(reader: _Reader, data: Mapping[str, Any]) -> dict[str, int]:
    models: dict[str, int] = {}
    for name, entry in data.items():
        path = f"models.{name}"
        models[name] = round(reader.number(reader.obj(entry, path), "size_mb", path) * _MB)
    return models


def _parse_workflow(
    reader: _Reader,
    name: str,
    data: object,
    models: Mapping[str, int],
    cluster: ClusterSpec,
) -> Workflow:
    path = f"workflows.{name}"
    entry = reader.obj(data, path)
    best_ms = reader.number(entry, "best_ms", path, positive=True) if "best_ms" in entry else None
    slo_ms = reader.number(entry, "slo_ms", path, positive=True) if "slo_ms" in entry else None
    slo_x = reader.number(entry, "slo_x", path, positive=True) if "slo_x" in entry else None
    tasks_path = f"{path}.tasks"
    tasks_data = reader.obj(reader.get(entry, "tasks", path), tasks_path)
    tasks: list[Task] = []
    for task_name, task_data in tasks_data.items():
        tasks.append(_parse_task(reader, task_name, task_data, f"{tasks_path}.{task_name}", models))
    choices = parse_choices(entry, path, reader.error)  # branches, fan-outs and loops
    try:
        workflow = unfold_workflow(name, tasks, best_ms=best_ms, slo_ms=slo_ms, slo_x=slo_x,
                                   **choices)  # fmt: skip
    except WorkflowError as exc:
        raise reader.error(path, exc.message) from None
    for task_name in workflow.order:
        task = workflow.tasks[task_name]
        if task.after and task.profile.input_bytes:
            raise reader.error(
                f"{tasks_path}.{task_name}.input_kb",
                "only a root task (one with an empty 'after') receives the job input",
            )
    try:
        workflow.check_models(models, cluster.gpu_memory_bytes)
    except ModelTooLarge as exc:
        raise ModelTooLarge(f"{reader.source}: {path}: {exc.message}", detail=exc.detail) from None
    return workflow


def _parse_task(
    reader: _Reader, name: str, data: object, path: str, models: Mapping[str, int]
) -> Task:
    entry = reader.obj(data, path)
    unknown = sorted(set(entry) - _TASK_KEYS)
    if unknown:
        raise reader.error(
            reader.join(path, unknown[0]),
            f"unknown key (a task has {', '.join(sorted(_TASK_KEYS - {'about', 'note'}))})",
        )
    model = entry.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise reader.error(
                f"{path}.model", f"expected a model name or null, got {_kind(model)}"
            )
        if model not in models:
            raise reader.error(
                f"{path}.model",
                f"unknown model {model!r} (the file's models: {', '.join(sorted(models))})",
            )
    after = entry.get("after", [])
    if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
        raise reader.error(f"{path}.after", f"expected a list of task names, got {_kind(after)}")
    streamed = entry.get("streamed", [])
    if not isinstance(streamed, list) or not all(isinstance(a, str) for a in streamed):
        raise reader.error(
            f"{path}.streamed", f"expected a list of task names, got {_kind(streamed)}"
        )
    try:
        steps = reader.integer(entry, "steps", path, minimum=1) if "steps" in entry else 1
        if "step_ms" in entry and "exec_ms" not in entry and "batch_ms" not in entry:
            entry = {**entry, "exec_ms": reader.number(entry, "step_ms", path) * steps}
        exec_ms, batch, scale = _parse_batch(reader, entry, path)
        profile = TaskProfile(
            exec_ms=exec_ms,
            output_bytes=round(reader.number(entry, "output_kb", path) * _KB),
            input_bytes=round(reader.number(entry, "input_kb", path, default=0.0) * _KB),
            batch_scale=scale,
            steps=steps,
            state_bytes=round(reader.number(entry, "state_kb", path, default=0.0) * _KB),
        )
        timeout_ms = entry.get("timeout_ms")
        if timeout_ms is not None:
            timeout_ms = reader.number(entry, "timeout_ms", path, positive=True)
        return Task(
            name=name,
            model=model,
            after=tuple(after),
            profile=profile,
            timeout_ms=timeout_ms,
            batch=batch,
            streamed=frozenset(streamed),
        )
    except WorkflowError as exc:
        if exc.detail is not None:  # already names its key path
            raise
        raise reader.error(path, exc.message) from None


def _parse_batch(
    reader: _Reader, entry: Mapping[str, Any], path: str
) -> tuple[float, int, tuple[float, ...]]:
    """A task's ``exec_ms``, its largest batch and its batch curve (see the module docstring)."""
    table = entry.get("batch_ms")
    if table is None:
        exec_ms = reader.number(entry, "exec_ms", path)
    else:
        where = f"{path}.batch_ms"
        if (
            not isinstance(table, list)
            or not table
            or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in table)
        ):
            raise reader.error(where, f"expected a list of milliseconds, got {_kind(table)}")
        if not table[0] > 0 or any(b < a for a, b in itertools.pairwise(table)):
            raise reader.error(where, f"must start above 0 and never fall, got {table!r}")
        exec_ms = reader.number(entry, "exec_ms", path, default=float(table[0]))
        if "batch_item" in entry:
            raise reader.error(f"{path}.batch_item", "give batch_item or batch_ms, not both")
    batch = reader.integer(entry, "batch", path, minimum=1) if "batch" in entry else None
    if table is not None:
        if batch is None:
            batch = len(table)
        return exec_ms, batch, tuple(float(x) / float(table[0]) for x in table)
    if "batch_item" in entry:
        item = reader.number(entry, "batch_item", path)
        if item > 1:
            raise reader.error(f"{path}.batch_item", f"must be at most 1 (one run), got {item}")
        size = 8 if batch is None else batch
        return exec_ms, size, linear_scale(item, max(size, 2))
    return exec_ms, 1 if batch is None else batch, ()


def _parse_arrivals(reader: _Reader, data: object) -> ArrivalSpec:
    """The ``arrivals`` object is optional: a file that only declares workflows gets the
    paper's defaults (2000 ms per client, 1000 jobs, all three processes, CV 10)."""
    if data is None:
        return ArrivalSpec(2000.0, 1000, ARRIVAL_PROCESSES, 10.0)
    path = "arrivals"
    entry = reader.obj(data, path)
    processes = entry.get("processes", list(ARRIVAL_PROCESSES))
    if not isinstance(processes, list) or not processes:
        raise reader.error(f"{path}.processes", "expected a non-empty list of process names")
    for i, process in enumerate(processes):
        if process not in ARRIVAL_PROCESSES:
            raise reader.error(
                f"{path}.processes[{i}]",
                f"unknown arrival process {process!r} (known: {', '.join(ARRIVAL_PROCESSES)})",
            )
    return ArrivalSpec(
        mean_interval_ms_per_client=reader.number(
            entry, "mean_interval_ms_per_client", path, positive=True
        ),
        jobs=reader.integer(entry, "jobs", path, minimum=1),
        processes=tuple(processes),
        gamma_cv=reader.number(entry, "gamma_cv", path, positive=True, default=10.0),
    )


def write_workload(workload: Workload, path: str | Path) -> None:
    """Write ``workload`` as a spec file that :func:`load_workload` reads back exactly."""
    text = json.dumps(workload_to_dict(workload), indent=2) + "\n"
    Path(path).write_text(text, encoding="utf-8")


def workload_to_dict(workload: Workload) -> dict[str, Any]:
    """``workload`` in the JSON layout :func:`parse_workload` reads, chosen so that parsing it
    gives back every field exactly (floats are written as the values that convert back to the
    same bits). Only emulated tasks have a spec form: a task with a function, named inputs,
    parameters or resources is an error."""
    cluster = workload.cluster
    workflows: dict[str, Any] = {}
    for name, wf in workload.workflows.items():
        declared = None if wf.unfold is None else wf.unfold.declared
        tasks = declared.tasks if isinstance(declared, Declared) else wf.tasks.values()
        entry: dict[str, Any] = {
            "weight": workload.weights.get(name, 1.0),
            "tasks": {task.name: _task_to_dict(name, task) for task in tasks},
        }
        if isinstance(declared, Declared):  # declared with choices: written as declared
            entry.update(declared.choices_to_dict())
        if wf.inputs:
            raise WorkflowError(f"workflow {name!r}: named job inputs have no spec form")
        if wf.best_ms is not None:
            entry["best_ms"] = wf.best_ms
        if wf.slo_ms is not None:
            entry["slo_ms"] = wf.slo_ms
        if wf.slo_x is not None:
            entry["slo_x"] = wf.slo_x
        workflows[name] = entry
    arrivals = workload.arrivals
    return {
        "name": workload.name,
        "about": workload.about,
        "cluster": {
            "workers": cluster.workers,
            "gpu_memory_mb": _size(cluster.gpu_memory_bytes, _MB),
            "h2d_gbps": _inverse(cluster.h2d_bytes_per_s, lambda x: x * _GB, _GB),
            "d2h_gbps": _inverse(cluster.d2h_bytes_per_s, lambda x: x * _GB, _GB),
            "net_gbps": _inverse(cluster.net_bytes_per_s, lambda x: x * _GB, _GB),
            "net_fixed_us": _inverse(cluster.net_fixed_s, lambda x: x / 1e6, 1e-6),
        },
        "models": {m: {"size_mb": _size(size, _MB)} for m, size in workload.models.items()},
        "workflows": workflows,
        "arrivals": {
            "mean_interval_ms_per_client": arrivals.mean_interval_ms_per_client,
            "jobs": arrivals.jobs,
            "processes": list(arrivals.processes),
            "gamma_cv": arrivals.gamma_cv,
        },
    }


def _task_to_dict(workflow: str, task: Task) -> dict[str, Any]:
    if task.fn is not None or task.inputs is not None or task.params or task.resources:
        raise WorkflowError(
            f"workflow {workflow!r}: task {task.name!r} has a function, named inputs, "
            "parameters or resources, which a workload spec cannot carry"
        )
    profile = task.profile
    out: dict[str, Any] = {
        "model": task.model,
        "exec_ms": profile.exec_ms,
        "output_kb": _size(profile.output_bytes, _KB),
        "after": list(task.after),
    }
    if profile.input_bytes:
        out["input_kb"] = _size(profile.input_bytes, _KB)
    if task.timeout_ms is not None:
        out["timeout_ms"] = task.timeout_ms
    if profile.steps > 1:
        out["steps"] = profile.steps
    if profile.state_bytes:
        out["state_kb"] = profile.state_bytes / _KB
    if task.streamed:
        out["streamed"] = sorted(task.streamed)
    return {**out, **_batch_to_dict(profile, task.batch)}


def _batch_to_dict(profile: TaskProfile, batch: int) -> dict[str, Any]:
    """The batch keys giving back ``batch`` and ``profile.batch_scale`` (module docstring)."""
    scale = profile.batch_scale
    if not scale:
        return {} if batch == 1 else {"batch": batch}
    size = max(batch, 2)
    if len(scale) == size:
        item = _solve(lambda x: linear_scale(x, size) if 0 <= x <= 1 else None, scale, scale[1] - 1)
        if item is not None:
            return {"batch": batch, "batch_item": item}
    first = profile.exec_ms
    table = [_solve(lambda x: x / first, s, s * first) for s in scale] if first > 0 else [None]
    if all(x is not None for x in table):
        return {"batch": batch, "batch_ms": table}
    # no table in milliseconds gives these ratios back (a 0 ms task): the ratios themselves
    # are a table whose first entry is 1, and exec_ms is given apart
    return {"batch": batch, "batch_ms": list(scale)}


def _size(count: int, unit: int) -> float:
    """``count`` in ``unit``s, as the parser's ``round(x * unit)`` reads it back."""
    return _inverse(count, lambda x: round(x * unit), unit)


def _inverse(value: float, forward: Callable[[float], object], unit: float) -> float:
    """The number ``x`` near ``value / unit`` for which ``forward(x) == value``; the plain
    quotient when none is (a value the parser could not have produced)."""
    guess = value / unit
    found = _solve(forward, value, guess)
    return guess if found is None else found


def _solve(forward: Callable[[float], object], target: object, guess: float) -> float | None:
    """A float within a few steps of ``guess`` that ``forward`` maps to ``target``: a quotient
    rounds, so the exact preimage may sit one or two floats away."""
    candidates = [guess]
    up = down = guess
    for _ in range(4):
        up, down = math.nextafter(up, math.inf), math.nextafter(down, -math.inf)
        candidates += [up, down]
    return next((x for x in candidates if forward(x) == target), None)
