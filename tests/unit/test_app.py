"""App: real checkpoints (strict, keys, loader, relative paths), per-process resources, and the
task calling convention (selective job inputs, renamed sources, one function as several tasks).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import compass
from compass._bench.leases import LeasingCache
from compass.app import Resource, load_app
from compass.cache import Model
from compass.config import CacheConfig
from compass.errors import CacheError, ConfigError, InvalidInputs, WorkflowError
from compass.workflow.dag import Task, TaskProfile

HERE = Path(__file__).resolve().parent


class Tiny(nn.Module):
    """A linear layer plus a non-persistent buffer, as transformers' ``position_ids`` now is."""

    position_ids: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)
        self.register_buffer("position_ids", torch.arange(4), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(x + self.position_ids)
        return out


def trained_state(seed: int = 7) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in Tiny().state_dict().items()}


async def loaded(model: Model) -> dict[str, torch.Tensor]:
    """The state of ``model`` loaded the way a worker loads it: staged, copied into slabs,
    assembled."""
    config = CacheConfig(capacity_bytes=1 << 20, slab_bytes=4096, backend="host")
    async with LeasingCache({model.name: model}, config) as cache:
        with await cache.ensure(model.name) as lease:
            module = lease.module
            assert module is not None
            # copied out: the slabs go when the cache closes
            return {k: v.clone() for k, v in module.state_dict().items()}


def assert_holds(got: dict[str, torch.Tensor], state: dict[str, torch.Tensor]) -> None:
    assert got.keys() == state.keys()
    for key, value in state.items():
        assert torch.equal(got[key], value), key


# -- checkpoints ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_strict_load_refuses_an_extra_key_and_strict_false_loads_it_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state = trained_state()
    path = tmp_path / "tiny.safetensors"
    save_file({**state, "position_ids": torch.arange(4)}, str(path))  # what older code saved
    with pytest.raises(CacheError, match=r"do not fit model 'strict'.*position_ids"):
        await loaded(Model("strict", Tiny, path))
    with caplog.at_level(logging.DEBUG, logger="compass.cache.weights"):
        module = await loaded(Model("loose", Tiny, path, strict=False))
    assert_holds(module, state)
    assert any(
        "position_ids" in r.getMessage() and r.levelno == logging.DEBUG for r in caplog.records
    )


@pytest.mark.asyncio
async def test_strict_false_keeps_the_builders_value_for_a_missing_key(tmp_path: Path) -> None:
    state = trained_state()
    path = tmp_path / "partial.safetensors"
    save_file({"proj.weight": state["proj.weight"]}, str(path))

    def half_bias() -> nn.Module:
        module = Tiny()
        nn.init.constant_(module.proj.bias, 0.5)
        return module

    got = await loaded(Model("partial", half_bias, path, strict=False))
    assert torch.equal(got["proj.weight"], state["proj.weight"])
    assert torch.equal(got["proj.bias"], torch.full((3,), 0.5))  # the builder's own
    with pytest.raises(CacheError, match=r"proj\.bias"):
        await loaded(Model("strict", Tiny, path))


@pytest.mark.asyncio
async def test_keys_rename_and_drop_checkpoint_keys(tmp_path: Path) -> None:
    state = trained_state()
    path = tmp_path / "prefixed.safetensors"
    save_file({**{f"encoder.{k}": v for k, v in state.items()}, "pooler": torch.ones(2)}, str(path))

    def strip(key: str) -> str | None:
        return key.removeprefix("encoder.") if key.startswith("encoder.") else None

    assert_holds(await loaded(Model("fn", Tiny, path, keys=strip)), state)
    mapping: dict[str, str | None] = {f"encoder.{k}": k for k in state} | {"pooler": None}
    assert_holds(await loaded(Model("map", Tiny, path, keys=mapping)), state)
    with pytest.raises(CacheError, match=r"maps two checkpoint keys to 'proj\.bias'"):
        await loaded(Model("clash", Tiny, path, keys=lambda k: "proj.bias"))


@pytest.mark.asyncio
async def test_a_loader_returns_a_state_dict_or_a_module(tmp_path: Path) -> None:
    state = trained_state()
    path = tmp_path / "tiny.pt"
    torch.save(state, path)
    assert_holds(await loaded(Model("pt", Tiny, path, loader=torch.load)), state)

    def trained() -> nn.Module:
        module = Tiny()
        module.load_state_dict(state)
        return module

    assert_holds(await loaded(Model("module", Tiny, loader=trained)), state)
    with pytest.raises(CacheError, match="returned list, not a state dict"):
        await loaded(Model("bad", Tiny, loader=lambda: [1, 2]))
    with pytest.raises(CacheError, match=r"cannot read weights of model 'boom'.*OSError: disk"):
        await loaded(Model("boom", Tiny, path, loader=lambda p: _raise(OSError("disk"))))


def _raise(exc: Exception) -> Any:
    raise exc


def test_bad_checkpoint_options_are_one_line_errors() -> None:
    with pytest.raises(ConfigError, match="loader must be callable"):
        Model("m", Tiny, loader="torch.load")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="keys must be a mapping or a function"):
        Model("m", Tiny, keys=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="strict must be True or False"):
        Model("m", Tiny, strict="no")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_relative_weights_resolve_against_the_app_module_not_the_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(3)
    state = nn.Linear(4, 3).state_dict()
    folder = tmp_path / "deploy"
    (folder / "weights").mkdir(parents=True)
    save_file(state, str(folder / "weights" / "tiny.safetensors"))
    (folder / "tiny_app.py").write_text(
        "import torch\n"
        "import compass\n"
        "app = compass.App()\n"
        "app.model('tiny', lambda: torch.nn.Linear(4, 3), weights='weights/tiny.safetensors')\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # a worker started from another directory
    try:
        app = load_app("tiny_app", app_dir=folder)
        model = app.models["tiny"]
        assert model.weights == folder / "weights" / "tiny.safetensors"
        assert_holds(await loaded(model), state)
    finally:
        sys.modules.pop("tiny_app", None)


def test_relative_weights_default_to_the_calling_file_and_root_overrides(tmp_path: Path) -> None:
    app = compass.App()
    here = app.model("here", Tiny, weights="w.safetensors")
    there = app.model("there", Tiny, weights="w.safetensors", root=tmp_path)
    absolute = app.model("abs", Tiny, weights=tmp_path / "x.safetensors", root=HERE)
    assert here.weights == HERE / "w.safetensors"
    assert there.weights == tmp_path / "w.safetensors"
    assert absolute.weights == tmp_path / "x.safetensors"


# -- resources --------------------------------------------------------------------------------


class Counter:
    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def make(self) -> dict[str, int]:
        with self.lock:
            self.calls += 1
        time.sleep(0.05)  # wide open for a second builder, were there no lock
        return {"pid": os.getpid()}


def test_a_resource_is_built_once_per_process_on_first_use_from_any_thread() -> None:
    counter = Counter()
    app = compass.App()
    app.resource("vocab", counter.make)
    wf = app.workflow("w", inputs=["x"])

    @wf.task(resources=["vocab"])
    def look(model: None, x: int, vocab: dict[str, int]) -> tuple[int, int]:
        return x, id(vocab)

    task = app.get_workflow("w").tasks["look"]
    assert counter.calls == 0  # lazily: declaring and building workflows builds nothing
    start = threading.Barrier(8)

    def run(i: int) -> tuple[int, int]:
        start.wait()
        out: tuple[int, int] = task.call(None, {"x": i})
        return out

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(run, range(8)))
    assert counter.calls == 1
    assert [x for x, _ in results] == list(range(8))
    assert len({ident for _, ident in results}) == 1
    assert app.resources["vocab"].built


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_builds_its_own_resource() -> None:
    counter = Counter()
    resource = Resource("vocab", counter.make)
    parent = resource.get()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it got, and leave without pytest's cleanup
        try:
            child = resource.get()
            os.write(write, f"{child['pid']} {counter.calls} {resource.get() is child}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child_pid, calls, same = pipe.read().split()
    os.waitpid(pid, 0)
    assert parent["pid"] == os.getpid()
    assert int(child_pid) == pid
    assert int(calls) == 2  # the parent's build, then the child's own
    assert same == "True"
    assert counter.calls == 1


def test_a_resource_factory_that_fails_is_tried_again() -> None:
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("vocab file not there yet")
        return "vocab"

    resource = Resource("vocab", flaky)
    with pytest.raises(OSError, match="not there yet"):
        resource.get()
    assert not resource.built
    assert resource.get() == "vocab"
    assert resource.get() == "vocab"
    assert len(attempts) == 2


def test_resource_mistakes_are_one_line_errors() -> None:
    app = compass.App()
    with pytest.raises(ConfigError, match="must be a Python identifier"):
        app.resource("my tokenizer", object)
    with pytest.raises(ConfigError, match="factory must be callable"):
        app.resource("tok", "not callable")  # type: ignore[arg-type]
    app.resource("tok", object)
    with pytest.raises(WorkflowError, match="resource 'tok' is registered twice"):
        app.resource("tok", object)
    wf = app.workflow("w")

    @wf.task(resources=["tokenizer"])
    def f(model: None, tokenizer: Any) -> None:
        return None

    with pytest.raises(WorkflowError, match=r"task 'f' uses unknown resource\(s\) 'tokenizer'"):
        app.get_workflow("w")


# -- calling convention -----------------------------------------------------------------------


def test_a_root_takes_only_the_job_inputs_it_names() -> None:
    app = compass.App()
    wf = app.workflow("w", inputs=["text", "image", "lang"])

    @wf.task(inputs=["text"])
    def words(model: None, text: str) -> int:  # would fail on image= and lang=
        return len(text.split())

    @wf.task(inputs={"image": "pixels", "lang": "lang"})
    def size(model: None, pixels: list[int], lang: str) -> str:
        return f"{len(pixels)} {lang}"

    @wf.task
    def everything(model: None, **inputs: Any) -> list[str]:
        return sorted(inputs)

    tasks = app.get_workflow("w").tasks
    job = {"text": "a b c", "image": [1, 2], "lang": "en"}
    assert tasks["words"].call(None, job) == 3
    assert tasks["size"].call(None, job) == "2 en"
    assert tasks["everything"].call(None, job) == ["image", "lang", "text"]
    assert tasks["words"].take_inputs(job) == {"text": "a b c"}
    with pytest.raises(InvalidInputs, match=r"task 'words' takes job input\(s\) 'text'"):
        tasks["words"].call(None, {"image": [1]})


def test_one_function_serves_several_tasks_with_different_mappings() -> None:
    calls: list[tuple[str, str]] = []
    app = compass.App()
    app.resource("prefix", lambda: ">")
    wf = app.workflow("pair", inputs=["query", "docs"])

    @wf.task(name="embed_query", inputs={"query": "texts"}, resources=["prefix"])
    @wf.task(name="embed_docs", inputs={"docs": "texts"}, resources=["prefix"])
    def embed(model: None, texts: str, prefix: str) -> str:
        calls.append((texts, prefix))
        return prefix + texts.upper()

    @wf.task(after={"embed_query": "query", "embed_docs": "docs"})
    def join(model: None, query: str, docs: str) -> str:
        return f"{query}|{docs}"

    workflow = app.get_workflow("pair")
    assert set(workflow.roots) == {"embed_query", "embed_docs"}
    assert workflow.preds("join") == ("embed_query", "embed_docs")
    job = {"query": "q", "docs": "d"}
    q = workflow.tasks["embed_query"].call(None, job)
    d = workflow.tasks["embed_docs"].call(None, job)
    assert (q, d) == (">Q", ">D")
    assert calls == [("q", ">"), ("d", ">")]
    assert workflow.tasks["join"].call(None, {"embed_query": q, "embed_docs": d}) == ">Q|>D"


def test_a_successor_given_a_list_gets_each_output_under_its_task_name() -> None:
    task = Task("t", None, ("a", "b"), TaskProfile(1.0, 0), fn=lambda m, a, b: a - b)
    assert task.call(None, {"b": 1, "a": 5}) == 4


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        (
            {"after": ["a"], "inputs": ["x"]},
            "only a root task takes job inputs",
        ),
        ({"inputs": ["nope"]}, "takes job input\\(s\\) 'nope', which the workflow does not"),
        ({"inputs": {"x": "two words"}}, "must be passed as a parameter name"),
        ({"inputs": {"x": "y", "y": "y"}}, "would pass parameter\\(s\\) 'y' twice"),
        ({"inputs": ["x"], "resources": ["x"]}, "would pass parameter\\(s\\) 'x' twice"),
        ({"after": "a"}, "'after' must be a list of names or a dict, not the string 'a'"),
        ({"inputs": "x"}, "'inputs' must be a list of names or a dict"),
    ],
)
def test_bad_parameter_mappings_are_one_line_errors(declare: dict[str, Any], message: str) -> None:
    app = compass.App()
    app.resource("x", object)
    wf = app.workflow("w", inputs=["x", "y"])
    wf.task(lambda model, x: x, name="a", inputs=["x"])

    def declare_and_build() -> None:  # some mistakes show at declaration, some at build
        wf.task(lambda model, **kw: kw, name="b", **declare)
        app.get_workflow("w")

    with pytest.raises(WorkflowError, match=message):
        declare_and_build()


def test_a_function_that_cannot_take_its_parameters_fails_at_declaration() -> None:
    wf = compass.App().workflow("w", inputs=["text"])
    with pytest.raises(
        WorkflowError, match=r"task 'count'.*cannot be called with \(module, text\)"
    ):

        @wf.task(inputs=["text"])
        def count(model: None, words: str) -> int:
            return len(words)

    with pytest.raises(WorkflowError, match="missing a required argument: 'other'"):
        wf.task(lambda model, text, other: 0, name="two", inputs=["text"])


# -- batching ------------------------------------------------------------------------------------


def test_a_batched_task_declares_its_largest_batch_and_cost_curve() -> None:
    app = compass.App()
    app.model("m", size_bytes=1)
    wf = app.workflow("w", inputs=["x"])
    wf.task(lambda model, x: x, name="mild", model="m", batch=4, batch_item=0.15, expected_ms=10)
    wf.task(lambda model, x: x, name="table", model="m", batch_ms=[10, 12, 13])
    wf.task(lambda model, x: x, name="item_only", model="m", batch_item=0.05)
    wf.task(lambda model, x: x, name="longer", model="m", batch=5, batch_ms=[4, 6], expected_ms=5)
    wf.task(lambda model, x: x, name="alone", model="m")
    tasks = app.get_workflow("w").tasks
    mild = tasks["mild"]
    assert mild.batch == 4 and mild.profile.exec_ms == 10
    assert mild.profile.batch_scale == pytest.approx((1.0, 1.15, 1.3, 1.45))
    assert mild.profile.batch_ms(4) == pytest.approx(14.5)
    table = tasks["table"]  # its first entry is the single run; its length the largest batch
    assert table.batch == 3 and table.profile.exec_ms == 10
    assert table.profile.batch_scale == pytest.approx((1.0, 1.2, 1.3))
    assert tasks["item_only"].batch == 8  # as in workload specs
    longer = tasks["longer"]  # past the table each item adds its last step
    assert longer.batch == 5 and longer.profile.exec_ms == 5
    assert longer.profile.batch_ms(4) == pytest.approx(5 * (1.0 + 0.5 * 3))
    alone = tasks["alone"]
    assert alone.batch == 1 and alone.profile.batch_scale == () and alone.profile.exec_ms == 1.0


@pytest.mark.parametrize(
    ("declare", "message"),
    [
        ({"batch": 0, "batch_item": 0.1}, r"task 'b': batch must be an integer >= 1.*got 0"),
        ({"batch": 2.5, "batch_item": 0.1}, r"task 'b': batch must be an integer >= 1.*got 2.5"),
        ({"batch": True, "batch_item": 0.1}, r"task 'b': batch must be an integer.*got True"),
        ({"batch": 8}, r"task 'b': batch=8 needs a cost curve, batch_item=.* or batch_ms="),
        ({"batch_item": 1.5}, r"task 'b': batch_item must be .* in \[0, 1\], got 1.5"),
        ({"batch_item": "mild"}, r"task 'b': batch_item must be .*got 'mild'"),
        ({"batch_ms": [5, 4]}, r"task 'b': batch_ms must start above 0 and never fall.*\[5, 4\]"),
        ({"batch_ms": [0, 4]}, r"task 'b': batch_ms must start above 0"),
        ({"batch_ms": []}, r"task 'b': batch_ms must be a list of the milliseconds.*got \[\]"),
        ({"batch_ms": "10,12"}, r"task 'b': batch_ms must be a list .*got '10,12'"),
        ({"batch_ms": [10, 12], "batch_item": 0.1}, r"task 'b': give batch_item or batch_ms"),
        ({"model": None, "batch_item": 0.1}, r"task 'b': batch_item and batch_ms need a model"),
        ({"model": None, "batch": 2}, r"task 'b': only a task with a model batches \(batch=2\)"),
        ({"expected_ms": -1}, r"task 'b': expected_ms must be a number .*>= 0, got -1"),
    ],
)
def test_bad_batch_declarations_are_one_line_errors_naming_the_task(
    declare: dict[str, Any], message: str
) -> None:
    app = compass.App()
    app.model("m", size_bytes=1)
    wf = app.workflow("w", inputs=["x"])
    with pytest.raises(WorkflowError, match=message) as info:
        wf.task(lambda model, x: x, name="b", **{"model": "m", **declare})
    assert "\n" not in str(info.value)


def test_a_batched_task_takes_lists_and_returns_one_output_per_item() -> None:
    """The documented convention, through Task.call_batch as the executor calls it: one list
    per keyword, resources once; a returned Exception stays that item's output."""
    app = compass.App()
    app.model("m", size_bytes=1)
    app.resource("offset", lambda: 100)
    wf = app.workflow("w", inputs=["x", "y"])
    seen: list[dict[str, Any]] = []

    @wf.task(model="m", batch=4, batch_item=0.1, resources=["offset"])
    def add(model: None, x: list[int], y: list[int], offset: int) -> list[int | Exception]:
        seen.append({"x": x, "y": y, "offset": offset})
        pairs = zip(x, y, strict=True)
        return [a + b + offset if a >= 0 else ValueError(f"bad {a}") for a, b in pairs]

    task = app.get_workflow("w").tasks["add"]
    items = [task.arguments({"x": x, "y": 10 * x}) for x in (1, -2, 3)]
    outputs = task.call_batch(None, items)
    assert seen == [{"x": [1, -2, 3], "y": [10, -20, 30], "offset": 100}]
    assert outputs[0] == 111 and outputs[2] == 133
    assert isinstance(outputs[1], ValueError) and str(outputs[1]) == "bad -2"
    # a tensor whose first dimension is the batch is one output per row
    rows = compass.App()
    rows.model("m", size_bytes=1)
    wf2 = rows.workflow("w", inputs=["x"])
    wf2.task(lambda model, x: torch.stack(x) * 2, name="double", model="m", batch_item=0.1)
    double = rows.get_workflow("w").tasks["double"]
    out = double.call_batch(None, [{"x": torch.ones(3)}, {"x": torch.zeros(3)}])
    assert len(out) == 2 and torch.equal(out[0], torch.full((3,), 2.0))
