"""The user's side of compass: an :class:`App` holds models and workflows.

Every worker imports the same app module (``compass worker start --app mypkg.app``), so functions
are referenced by name and never shipped over the wire::

    app = compass.App()
    app.model("encoder", build=make_encoder, weights="encoder.safetensors")  # beside this file
    app.resource("tokenizer", load_tokenizer)    # built once per worker process, on first use
    wf = app.workflow("match", inputs=["query", "docs"])

    @wf.task(model="encoder", inputs={"query": "texts"}, resources=["tokenizer"], name="q")
    @wf.task(model="encoder", inputs={"docs": "texts"}, resources=["tokenizer"], name="d")
    def encode(model, texts, tokenizer):   # one function, two tasks
        return model(tokenizer(texts))

    @wf.task(after={"q": "query", "d": "docs"})
    def score(model, query, docs):         # predecessors' outputs, renamed
        return docs @ query.T

How a task is called: a root task takes the job inputs named in ``inputs`` (every job input
when it names none), any other task its predecessors' outputs, one per task in ``after``. Each
comes under its own name when given as a list, or under the parameter a dict maps it to
(``{source: parameter}``). Resources named in ``resources`` come as keywords of their own.

A task with a model may batch: queued tasks of the same function and model, from any jobs, then
run as one call. It declares the most items a call takes and what a batch costs, per extra item
(``batch_item``, a fraction of one run) or per size (``batch_ms``)::

    @wf.task(model="encoder", batch=8, batch_item=0.15)
    def encode(model, image):              # image: a list, one tensor per job
        return model(torch.stack(image))   # one output per item, in order: a row each

A batched task's function always gets each keyword as a list with one item per job (a list of
one when it runs alone; resources come once, not in lists) and returns one output per item: a
list, or a tensor whose first dimension is the batch. Lists, not stacked tensors: the function
stacks (or pads, or concatenates) as its model needs, so jobs may send inputs of different
shapes. An output that is an ``Exception`` instance (returned, not raised) fails that item's
job alone with :class:`~compass.errors.JobFailed`; a raise fails every job of the batch with
``JobFailed``, its message saying ``in a batch of N``.
"""

from __future__ import annotations

import importlib
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict, TypeVar, Unpack, overload

from compass.cache.weights import KeyMap, Model
from compass.errors import ConfigError, UnknownWorkflow, WorkflowError
from compass.front.declare import Declarations, OpenAIKind, OpenAIModel
from compass.workflow.dag import Task, TaskProfile, Workflow, linear_scale
from compass.workflow.spec import Workload
from compass.workflow.unfold import Branch, FanOut, Loop, unfold_workflow

__all__ = ["App", "Resource", "Stream", "TaskOptions", "WorkflowBuilder", "load_app"]

F = TypeVar("F", bound=Callable[..., Any])


class Resource:
    """Something tasks share within one worker process that is not a model: a tokenizer, a
    label table, a client. ``factory()`` runs on first use, once per process (a forked child
    builds its own), under a lock; the instance is then shared by every task thread, so it must
    be safe to use from several threads at once (or guard itself). A factory that raises fails
    the task that asked, and the next use tries again.
    """

    __slots__ = ("_lock", "_pid", "_value", "factory", "name")

    def __init__(self, name: str, factory: Callable[[], Any]) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"a resource name must be a Python identifier, got {name!r}")
        if not callable(factory):
            raise ConfigError(f"resource {name!r}: the factory must be callable, got {factory!r}")
        self.name = name
        self.factory = factory
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._value: Any = None

    @property
    def built(self) -> bool:
        """Whether this process has built the instance."""
        return self._pid == os.getpid()

    def get(self) -> Any:
        """This process's instance, built on the first call."""
        if self._pid == os.getpid():  # the common case takes no lock
            return self._value
        with self._lock:
            if self._pid != os.getpid():
                self._value = self.factory()
                self._pid = os.getpid()
            return self._value

    def __repr__(self) -> str:
        return f"Resource({self.name!r}, {'built' if self.built else 'not built'})"


@dataclass(frozen=True, slots=True)
class Stream:
    """An edge that streams: in ``after={"generate": Stream("text")}`` the task takes
    ``generate``'s partial outputs as they come, as an iterator passed as ``text`` (its own
    name, ``generate``, when ``param`` is None), and starts at ``generate``'s first step instead
    of its end. The iterator is sync and async alike (``for`` or ``async for``): it yields the
    predecessor's items in order and ends when the predecessor ends (its final output is not
    among them); a job that fails or ends meanwhile makes it raise
    :class:`~compass.errors.JobFailed`. The predecessor must run in steps (a generator)."""

    param: str | None = None


def _sources(
    what: str, value: Iterable[str] | Mapping[str, str | Stream]
) -> tuple[tuple[str, ...], dict[str, str], frozenset[str]]:
    """A list of names (each passed under its own name) or a dict ``{source: parameter}``
    (a :class:`Stream` for a streamed source of ``after``); and the streamed sources."""
    if isinstance(value, Mapping):
        renames: dict[str, str] = {}
        streamed = set()
        for source, param in value.items():
            if isinstance(param, Stream):
                if what != "after":
                    raise WorkflowError(f"only 'after' streams; {what!r} maps {source!r} to one")
                streamed.add(source)
                param = source if param.param is None else param.param
            if param != source:
                renames[source] = param
        return tuple(value), renames, frozenset(streamed)
    if isinstance(value, str):
        raise WorkflowError(f"{what!r} must be a list of names or a dict, not the string {value!r}")
    return tuple(value), {}, frozenset()


#: the largest batch a ``batch_item`` curve gets when ``batch`` is not given (as in specs)
DEFAULT_BATCH = 8


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _batch_profile(
    task: str,
    model: str | None,
    expected_ms: float | None,
    batch: int | None,
    item: float | None,
    table: Sequence[float] | None,
) -> tuple[float, int, tuple[float, ...]]:
    """A task's ``exec_ms``, its largest batch and its batch curve, from :meth:`task`'s
    arguments (the rules of workload specs' ``batch``, ``batch_item`` and ``batch_ms``)."""
    if expected_ms is not None and (not _is_number(expected_ms) or not expected_ms >= 0):
        raise WorkflowError(
            f"task {task!r}: expected_ms must be a number of milliseconds >= 0, got {expected_ms!r}"
        )
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise WorkflowError(
            f"task {task!r}: batch must be an integer >= 1 (the most items one run takes), "
            f"got {batch!r}"
        )
    curve = item is not None or table is not None
    if curve and model is None:
        raise WorkflowError(
            f"task {task!r}: batch_item and batch_ms need a model (only a task with a model "
            "batches)"
        )
    if item is not None and table is not None:
        raise WorkflowError(f"task {task!r}: give batch_item or batch_ms, not both")
    exec_ms = 1.0 if expected_ms is None else float(expected_ms)
    if table is not None:
        if (
            isinstance(table, str | bytes)
            or not isinstance(table, Sequence)
            or not table
            or not all(_is_number(x) for x in table)
        ):
            raise WorkflowError(
                f"task {task!r}: batch_ms must be a list of the milliseconds of a batch of 1, "
                f"2, ... items, got {table!r}"
            )
        if not table[0] > 0 or any(b < a for a, b in itertools.pairwise(table)):
            raise WorkflowError(
                f"task {task!r}: batch_ms must start above 0 and never fall, got {list(table)!r}"
            )
        if expected_ms is None:
            exec_ms = float(table[0])
        size = len(table) if batch is None else batch
        return exec_ms, size, tuple(float(x) / float(table[0]) for x in table)
    if item is not None:
        if not _is_number(item) or not 0 <= item <= 1:
            raise WorkflowError(
                f"task {task!r}: batch_item must be the fraction of one run each item past the "
                f"first adds, in [0, 1], got {item!r}"
            )
        size = DEFAULT_BATCH if batch is None else batch
        return exec_ms, size, linear_scale(float(item), max(size, 2))
    if batch is not None and batch > 1 and model is not None:
        raise WorkflowError(
            f"task {task!r}: batch={batch} needs a cost curve, batch_item=<fraction of a run "
            "each extra item adds> or batch_ms=[ms of a batch of 1, 2, ...]: without one a "
            "batch costs as many runs as it has items, so none would form"
        )
    return exec_ms, 1 if batch is None else batch, ()


class TaskOptions(TypedDict, total=False):
    """What a task is declared with (:meth:`WorkflowBuilder.task`, which says what each does):
    every option is a keyword, and none is required."""

    name: str | None
    model: str | None
    after: Iterable[str] | Mapping[str, str | Stream]
    inputs: Iterable[str] | Mapping[str, str] | None
    resources: Iterable[str]
    expected_ms: float | None
    output_bytes: int
    input_bytes: int
    timeout_ms: float | None
    batch: int | None
    batch_item: float | None
    batch_ms: Sequence[float] | None
    steps: int | None
    step_ms: float | None
    on_loop: bool


class WorkflowBuilder:
    """Collects tasks declared with :meth:`task`; the :class:`App` builds and validates them."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[str],
        best_ms: float | None,
        provider: Callable[[str], Any] | None = None,
        slo_ms: float | None = None,
        slo_x: float | None = None,
    ) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.best_ms = best_ms
        self.slo_ms, self.slo_x = slo_ms, slo_x
        self._provider = provider
        self._tasks: list[Task] = []
        self._choices: dict[str, list[Any]] = {"branches": [], "fanouts": [], "loops": []}

    # typed for both uses: ``@wf.task`` (or ``wf.task(fn, ...)``) gives the function back,
    # ``@wf.task(...)`` a decorator that does
    @overload
    def task(self, fn: F, /, **options: Unpack[TaskOptions]) -> F: ...

    @overload
    def task(self, fn: None = None, /, **options: Unpack[TaskOptions]) -> Callable[[F], F]: ...

    def task(self, fn: F | None = None, /, **options: Unpack[TaskOptions]) -> F | Callable[[F], F]:
        """Declare a task: ``fn(model_module_or_None, **keywords) -> output``. Its options
        (:class:`TaskOptions`, all keywords): ``name``, ``model``, ``after``, ``inputs``,
        ``resources``, ``expected_ms``, ``output_bytes``, ``input_bytes``, ``timeout_ms``,
        ``batch``, ``batch_item``, ``batch_ms``, ``steps``, ``step_ms``, ``on_loop``.

        Usable bare (``@wf.task``) or with arguments, and stackable: the same function under
        several names is several tasks. A root task takes the job inputs listed in
        ``inputs`` (all of them when None); any other task one output per task in ``after``.
        A list passes each under its own name, a dict ``{source: parameter}`` under the
        parameter it names. Each name in ``resources`` (see :meth:`App.resource`) is passed as a
        keyword too. ``expected_ms`` (default 1) and ``output_bytes`` seed the task's profile;
        measurements refine them at run time. A run longer than ``timeout_ms`` (default: the
        worker's ``--task-timeout``) fails its job with ``CompassTimeout`` (every job of a
        batch that runs past it).

        Batching (a task with a model): ``batch`` is the most items one call takes, and its
        cost curve is ``batch_item`` (each item past the first adds that fraction of one run:
        0.15 is a mild gain, 0.05 a strong one) or ``batch_ms`` (the milliseconds of a batch of
        1, 2, ... items; ``expected_ms`` defaults to its first entry). ``batch`` defaults to 8
        with ``batch_item`` and to the table's length with ``batch_ms``, as in workload specs.
        A lane batches only while an extra item costs less than a run of its own; the worker
        refines the curve from what it measures. The function then takes lists and returns one
        output per item (see the module docstring).

        Steps: a function that is a generator (``def ... yield``, or ``async def ... yield``)
        runs in steps: each ``yield`` ends one with a partial output, and the task can be
        stopped between two (its job cancelled, failed or past its deadline); its final output
        is what it returns, or its last item if it returns nothing. ``steps`` (expected; default
        1) and ``step_ms`` seed its profile: ``expected_ms`` defaults to ``steps * step_ms``.
        A plain function is one step.

        Streamed edges: ``after={"generate": Stream("text")}`` (:class:`Stream`) passes
        ``generate``'s partial outputs as they come, an iterator, and the task starts at
        ``generate``'s first step, not its end.

        On the loop: a task function runs in a thread of the worker's (an ``async def`` one on
        an event loop of that thread's own), so that nothing it does can stall the worker.
        ``on_loop=True`` runs a model-less ``async def`` task on the worker's own event loop
        instead: no thread, so no hand-off to one and back (about 0.1 ms a task), and a task
        past its timeout is cancelled rather than left running. For code that only awaits (a
        call to another service, a router's lookup): a blocking call in it stalls the worker,
        its heartbeats included.
        """
        unknown = sorted(set(options) - set(TaskOptions.__annotations__))
        if unknown:
            raise TypeError(f"task() got an unexpected keyword argument {unknown[0]!r}")
        name, model = options.get("name"), options.get("model")
        after, inputs = options.get("after", ()), options.get("inputs")
        resources, timeout_ms = options.get("resources", ()), options.get("timeout_ms")
        expected_ms, steps, step_ms = (
            options.get("expected_ms"),
            options.get("steps"),
            options.get("step_ms"),
        )
        output_bytes, input_bytes = options.get("output_bytes", 0), options.get("input_bytes", 0)
        batch, batch_item, batch_ms = (
            options.get("batch"),
            options.get("batch_item"),
            options.get("batch_ms"),
        )
        preds, renames, streamed = _sources("after", after)
        taken: tuple[str, ...] | None = None
        if inputs is not None:
            taken, input_renames, _ = _sources("inputs", inputs)
            renames = {**renames, **input_renames}

        def register(func: F) -> F:
            task_name = name or func.__name__
            first_ms = expected_ms
            if first_ms is None and step_ms is not None:
                first_ms = step_ms * (steps or 1)
            exec_ms, size, scale = _batch_profile(
                task_name, model, first_ms, batch, batch_item, batch_ms
            )
            profile = TaskProfile(
                exec_ms=exec_ms,
                output_bytes=int(output_bytes),
                input_bytes=input_bytes,
                batch_scale=scale,
                steps=1 if steps is None else steps,
            )
            self._tasks.append(
                Task(
                    name=task_name,
                    model=model,
                    after=preds,
                    profile=profile,
                    fn=func,
                    timeout_ms=timeout_ms,
                    inputs=taken,
                    params=renames,
                    resources=tuple(resources),
                    provider=self._provider,
                    batch=size,
                    streamed=streamed,
                    on_loop=bool(options.get("on_loop", False)),
                )
            )
            return func

        return register(fn) if fn is not None else register

    def branch(self, task: str, to: Mapping[str, float]) -> None:
        """Task ``task`` runs one of its successors ``to`` (each with its expected frequency),
        chosen by returning ``compass.choose(value, successor)``: :mod:`compass.workflow.unfold`."""
        self._choices["branches"].append(Branch(task, to))

    def fan_out(
        self,
        task: str,
        copies: str,
        join: str,
        max_width: int,
        widths: Mapping[int, float] | None = None,
    ) -> None:
        """Task ``task`` returns a list of up to ``max_width`` items; ``copies`` runs once per
        item and ``join`` gets the list of their outputs."""
        self._choices["fanouts"].append(FanOut(task, copies, join, max_width, widths))

    def loop(
        self,
        body: Sequence[str],
        until: str,
        max_iter: int,
        counts: Mapping[int, float] | None = None,
        carry: str = "carry",
    ) -> None:
        """Tasks ``body`` repeat until ``until`` returns ``compass.stop(value)``, at most
        ``max_iter`` times; the body's entry gets the last iteration's output as ``carry``.
        A loop whose ``body`` is a part of another loop's runs inside it, afresh in each of its
        iterations (nested loops: :mod:`compass.workflow.unfold`)."""
        self._choices["loops"].append(Loop(tuple(body), until, max_iter, counts, carry))

    def build(self) -> Workflow:
        return unfold_workflow(
            self.name, self._tasks, inputs=self.inputs, best_ms=self.best_ms,
            slo_ms=self.slo_ms, slo_x=self.slo_x, branches=self._choices["branches"],
            fanouts=self._choices["fanouts"], loops=self._choices["loops"],
        )  # fmt: skip


class App:
    """A registry of models and workflows, shared by every worker and the client side."""

    def __init__(self, name: str = "app") -> None:
        self.name = name
        self._models: dict[str, Model] = {}
        self._resources: dict[str, Resource] = {}
        self._builders: dict[str, WorkflowBuilder] = {}
        self._workflows: dict[str, Workflow] = {}
        #: what the HTTP front door serves by OpenAI model name, and tensor metadata
        self.front = Declarations()

    # -- declaration -------------------------------------------------------------------------
    def model(
        self,
        name: str,
        build: Callable[[], Any] | None = None,
        *,
        weights: str | Path | None = None,
        loader: Callable[..., Any] | None = None,
        keys: KeyMap | None = None,
        strict: bool = True,
        root: str | Path | None = None,
        size_bytes: int | None = None,
    ) -> Model:
        """Register a model: a builder returning a ``torch.nn.Module`` and optional weights.

        A relative ``weights`` path is relative to ``root``, by default the folder of the module
        that calls this method (the app module), not the worker's working directory.
        ``loader``, ``keys`` and ``strict`` fit checkpoints made elsewhere: see
        :class:`~compass.cache.models.Model`.
        """
        if build is None:
            if size_bytes is None:
                raise ConfigError(f"model {name!r} needs a builder or a size_bytes")
            return self.add_model(Model.emulated(name, size_bytes))
        if root is None:
            root = _caller_folder()
        return self.add_model(
            Model(name, build, weights=weights, loader=loader, keys=keys, strict=strict, root=root)
        )

    def resource(self, name: str, factory: Callable[[], Any]) -> Resource:
        """Register a per-worker resource: ``factory()`` is built once per worker process, on
        first use, and passed to every task that lists ``name`` in its ``resources``."""
        if name in self._resources:
            raise WorkflowError(f"resource {name!r} is registered twice")
        resource = Resource(name, factory)
        self._resources[name] = resource
        return resource

    def add_model(self, model: Model) -> Model:
        if model.name in self._models:
            raise WorkflowError(f"model {model.name!r} is registered twice")
        self._models[model.name] = model
        return model

    def workflow(
        self,
        name: str,
        *,
        inputs: Sequence[str] = (),
        best_ms: float | None = None,
        slo_ms: float | None = None,
        slo_x: float | None = None,
    ) -> WorkflowBuilder:
        """Start declaring a workflow; add tasks with the returned builder's ``task`` decorator.
        ``slo_ms`` (or ``slo_x``, a multiple of its computed best time): the deadline of a job
        submitted without ``deadline_ms``."""
        if name in self._builders or name in self._workflows:
            raise WorkflowError(f"workflow {name!r} is declared twice")
        builder = WorkflowBuilder(
            name, inputs, best_ms, provider=self._resource_value, slo_ms=slo_ms, slo_x=slo_x
        )
        self._builders[name] = builder
        return builder

    def add_workflow(self, workflow: Workflow) -> Workflow:
        if workflow.name in self._builders or workflow.name in self._workflows:
            raise WorkflowError(f"workflow {workflow.name!r} is declared twice")
        self._workflows[workflow.name] = workflow
        return workflow

    def openai(
        self, model: str, workflow: str, *, kind: OpenAIKind = "chat", owned_by: str = "compass"
    ) -> OpenAIModel:
        """Serve ``workflow`` under the OpenAI model name ``model`` on the HTTP front door:
        ``kind`` "chat" (/v1/chat/completions), "completion" (/v1/completions) or "embedding"
        (/v1/embeddings). compass/front/openai.py says which inputs the workflow gets."""
        return self.front.add_openai(OpenAIModel(model, workflow, kind, owned_by))

    def tensors(
        self,
        workflow: str,
        *,
        inputs: Mapping[str, tuple[str, Sequence[int]]],
        outputs: Mapping[str, tuple[str, Sequence[int]]] | None = None,
    ) -> None:
        """Declare ``workflow``'s tensors for the Open Inference Protocol's metadata:
        ``{name: (datatype, shape)}``, e.g. ``{"image": ("FP32", [3, -1, -1])}``."""
        self.front.add_tensors(workflow, inputs, outputs or {})

    # -- use ---------------------------------------------------------------------------------
    @property
    def models(self) -> Mapping[str, Model]:
        return self._models

    @property
    def resources(self) -> Mapping[str, Resource]:
        return self._resources

    def _resource_value(self, name: str) -> Any:
        try:
            resource = self._resources[name]
        except KeyError:
            known = ", ".join(sorted(self._resources)) or "none"
            raise ConfigError(f"unknown resource {name!r} (known: {known})") from None
        return resource.get()

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
            workflow = builder.build()
            for task in workflow.tasks.values():
                unknown = [r for r in task.resources if r not in self._resources]
                if unknown:
                    known = ", ".join(sorted(self._resources)) or "none"
                    raise WorkflowError(
                        f"workflow {name!r}: task {task.name!r} uses unknown resource(s) "
                        f"{', '.join(map(repr, unknown))} (known: {known}); "
                        "register them with app.resource(name, factory)"
                    )
            self._workflows[name] = workflow
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


def _caller_folder() -> Path:
    """The folder of the module that called into App (two frames up), else the current one."""
    frame = sys._getframe(2)
    file = frame.f_globals.get("__file__")
    return Path(file).resolve().parent if isinstance(file, str) else Path.cwd()


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
