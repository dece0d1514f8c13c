"""The ``branches``, ``fanouts`` and ``loops`` of a workflow in a workload spec
(:func:`parse_choices`), read into the declarations of :mod:`compass.workflow.unfold`; a loop
nested in another is declared as its own loop whose body is a part of the other's."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from compass.errors import WorkflowError
from compass.workflow.unfold import Branch, FanOut, Loop

__all__ = ["parse_choices"]


def parse_choices(
    entry: Mapping[str, Any], path: str, error: Callable[[str, str], WorkflowError]
) -> dict[str, Any]:
    """The ``branches``, ``fanouts`` and ``loops`` of a workflow in a workload spec, as
    :func:`unfold_workflow` takes them; ``error(key path, problem)`` makes the error to raise.

    ``"branches": {task: {successor: weight, ...}}``; ``"fanouts": {task: {"copies": c,
    "join": j, "max_width": n, "widths": {width: weight} or [low, high]}}``; ``"loops":
    {name: {"body": [...], "until": t, "max_iter": n, "counts": {iterations: weight} or [low,
    high], "carry": keyword}}``. A range ``[low, high]`` is uniform over low..high. ``"prior":
    {"branches": ..., "fanouts": ..., "loops": ...}``: the same choices with the weights
    planning starts from (see :func:`unfold_workflow`)."""
    found: dict[str, Any] = {}
    prior = _object(entry, "prior", path, error)
    if prior:
        found["prior"] = parse_choices(prior, f"{path}.prior", error)
        found["prior"].pop("prior", None)
        for kind in ("branches", "fanouts", "loops"):
            found["prior"].setdefault(kind, [])
    branches = _object(entry, "branches", path, error)
    if branches:
        found["branches"] = [
            Branch(task, _numbers(to, f"{path}.branches.{task}", error))
            for task, to in branches.items()
        ]
    fanouts = _object(entry, "fanouts", path, error)
    if fanouts:
        found["fanouts"] = []
        for task, spec in fanouts.items():
            where = f"{path}.fanouts.{task}"
            spec = _object({"": spec}, "", where, error)
            width = _integer(spec, "max_width", where, error)
            found["fanouts"].append(
                FanOut(
                    task,
                    _string(spec, "copies", where, error),
                    _string(spec, "join", where, error),
                    width,
                    _spread(spec.get("widths"), f"{where}.widths", error),
                )
            )
    loops = _object(entry, "loops", path, error)
    if loops:
        found["loops"] = []
        for name, spec in loops.items():
            where = f"{path}.loops.{name}"
            spec = _object({"": spec}, "", where, error)
            body = spec.get("body")
            if not isinstance(body, list) or not all(isinstance(b, str) for b in body):
                raise error(f"{where}.body", "expected a list of task names")
            found["loops"].append(
                Loop(
                    tuple(body),
                    _string(spec, "until", where, error),
                    _integer(spec, "max_iter", where, error),
                    _spread(spec.get("counts"), f"{where}.counts", error),
                    spec.get("carry", "carry"),
                )
            )
    return found


def _object(
    entry: Mapping[str, Any], key: str, path: str, error: Callable[[str, str], WorkflowError]
) -> Mapping[str, Any]:
    value = entry.get(key, {})
    if not isinstance(value, Mapping):
        raise error(f"{path}.{key}" if key else path, "expected an object")
    return value


def _string(
    spec: Mapping[str, Any], key: str, path: str, error: Callable[[str, str], WorkflowError]
) -> str:
    value = spec.get(key)
    if not isinstance(value, str) or not value:
        raise error(f"{path}.{key}", "expected a task name")
    return value


def _integer(
    spec: Mapping[str, Any], key: str, path: str, error: Callable[[str, str], WorkflowError]
) -> int:
    value = spec.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{path}.{key}", "expected an integer (the declared bound)")
    return value


def _numbers(
    value: object, path: str, error: Callable[[str, str], WorkflowError]
) -> dict[str, float]:
    if not isinstance(value, Mapping) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value.values()
    ):
        raise error(path, "expected an object of names to weights")
    return {str(k): float(v) for k, v in value.items()}


def _spread(
    value: object, path: str, error: Callable[[str, str], WorkflowError]
) -> dict[int, float] | None:
    """Weights by count: an object ``{"3": weight}``, a uniform range ``[low, high]``, or
    absent (None: uniform over the whole range)."""
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != 2 or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise error(path, "expected [low, high], two integers")
        low, high = value
        if low > high:
            raise error(path, f"the range [{low}, {high}] is empty")
        return dict.fromkeys(range(low, high + 1), 1.0)
    weights = _numbers(value, path, error)
    try:
        return {int(k): v for k, v in weights.items()}
    except ValueError:
        raise error(path, f"keys must be integers, got {sorted(weights)}") from None
