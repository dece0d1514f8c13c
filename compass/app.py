"""The user's side of compass: an :class:`App` holds models and workflows.

Every worker imports the same app module (``compass worker start --app mypkg.app``), so functions
are referenced by name and never shipped over the wire::

    app = compass.App()
    app.model("encoder", build=make_encoder, weights="encoder.safetensors")
    wf = app.workflow("embed", inputs=["x"])

    @wf.task(model="encoder", expected_ms=5)
    def encode(model, x):
        return model(x)

    @wf.task(after=["encode"])
    def norm(model, encode):          # a successor receives its predecessors' outputs by name
        return encode / encode.norm()
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from compass.cache.models import Model
from compass.errors import ConfigError, UnknownWorkflow, WorkflowError
from compass.workflow.dag import Task, TaskProfile, Workflow
from compass.workflow.spec import Workload, load_workload

__all__ = ["App", "WorkflowBuilder", "load_app"]

F = TypeVar("F", bound=Callable[..., Any])


class WorkflowBuilder:
    """Collects tasks declared with :meth:`task`; the :class:`App` builds and validates them."""

    def __init__(self, name: str, inputs: Sequence[str], best_ms: float | None) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.best_ms = best_ms
        self._tasks: list[Task] = []

    def task(
        self,
        fn: F | None = None,
        *,
        name: str | None = None,
        model: str | None = None,
        after: Iterable[str] = (),
        expected_ms: float = 1.0,
        output_bytes: int = 0,
        input_bytes: int = 0,
    ) -> Any:
        """Declare a task: ``fn(model_module_or_None, **inputs) -> output``.

        Usable bare (``@wf.task``) or with arguments. ``expected_ms`` and ``output_bytes`` seed the
        task's profile; measurements refine them at run time.
        """

        def register(func: F) -> F:
            profile = TaskProfile(
                exec_ms=float(expected_ms), output_bytes=int(output_bytes), input_bytes=input_bytes
            )
            self._tasks.append(
                Task(
                    name=name or func.__name__,
                    model=model,
                    after=tuple(after),
                    profile=profile,
                    fn=func,
                )
            )
            return func

        return register(fn) if fn is not None else register

    def build(self) -> Workflow:
        return Workflow(self.name, self._tasks, inputs=self.inputs, best_ms=self.best_ms)


class App:
    """A registry of models and workflows, shared by every worker and the client side."""

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self._models: dict[str, Model] = {}
        self._builders: dict[str, WorkflowBuilder] = {}
        self._workflows: dict[str, Workflow] = {}

    # -- declaration -------------------------------------------------------------------------
    def model(
        self,
        name: str,
        build: Callable[[], Any] | None = None,
        *,
        weights: str | Path | None = None,
        size_bytes: int | None = None,
    ) -> Model:
        """Register a model: a builder returning a ``torch.nn.Module`` and optional weights."""
        if build is None:
            if size_bytes is None:
                raise ConfigError(f"model {name!r} needs a builder or a size_bytes")
            return self.add_model(Model.emulated(name, size_bytes))
        return self.add_model(Model(name, build, weights=weights))

    def add_model(self, model: Model) -> Model:
        if model.name in self._models:
            raise WorkflowError(f"model {model.name!r} is registered twice")
        self._models[model.name] = model
        return model

    def workflow(
        self, name: str, *, inputs: Sequence[str] = (), best_ms: float | None = None
    ) -> WorkflowBuilder:
        """Start declaring a workflow; add tasks with the returned builder's ``task`` decorator."""
        if name in self._builders or name in self._workflows:
            raise WorkflowError(f"workflow {name!r} is declared twice")
        builder = WorkflowBuilder(name, inputs, best_ms)
        self._builders[name] = builder
        return builder

    def add_workflow(self, workflow: Workflow) -> Workflow:
        if workflow.name in self._builders or workflow.name in self._workflows:
            raise WorkflowError(f"workflow {workflow.name!r} is declared twice")
        self._workflows[workflow.name] = workflow
        return workflow

    # -- use ---------------------------------------------------------------------------------
    @property
    def models(self) -> Mapping[str, Model]:
        return self._models

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        self._build_pending()
        return self._workflows

    def get_workflow(self, name: str) -> Workflow:
        try:
            return self.workflows[name]
        except KeyError:
            known = ", ".join(sorted(self.workflows)) or "none"
            raise UnknownWorkflow(f"unknown workflow {name!r} (known: {known})") from None

    def validate(self, capacity_bytes: int | None = None) -> None:
        """Build every workflow and check its models exist and fit in ``capacity_bytes``."""
        sizes = {name: model.size_bytes for name, model in self._models.items()}
        for workflow in self.workflows.values():
            workflow.check_models(sizes, capacity_bytes)

    def _build_pending(self) -> None:
        while self._builders:
            name, builder = next(iter(self._builders.items()))
            self._workflows[name] = builder.build()
            del self._builders[name]

    @classmethod
    def from_workload(cls, workload: Workload) -> App:
        """An emulated app from a workload spec: models are sizes, tasks are profiles."""
        app = cls(workload.name)
        for name, size in workload.models.items():
            app.add_model(Model.emulated(name, size))
        for workflow in workload.workflows.values():
            app.add_workflow(workflow)
        return app

    @classmethod
    def from_workload_file(cls, path: str | Path) -> App:
        return cls.from_workload(load_workload(path))


def load_app(ref: str, app_dir: str | Path = ".") -> App:
    """Import ``"package.module"`` or ``"package.module:attribute"`` and return its :class:`App`.

    Without an attribute the module's ``app`` is used. ``app_dir`` (default: the current
    directory, as ``uvicorn module:app`` does) goes first on the import path, so an app module
    beside the shell that starts the worker imports without ``PYTHONPATH``.
    """
    module_name, _, attr = ref.partition(":")
    folder = str(Path(app_dir).resolve())
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a missing module, a syntax error, or the module's own raise
        raise ConfigError(
            f"cannot import app module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from exc
    obj = getattr(module, attr or "app", None)
    if not isinstance(obj, App):
        raise ConfigError(
            f"{module_name!r} has no compass.App named {attr or 'app'!r} "
            f"(found {type(obj).__name__})"
        )
    return obj
