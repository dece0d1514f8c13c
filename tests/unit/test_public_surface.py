"""The typed public surface (issue 33): every error exported, the reports a worker sends typed
and checked, job inputs that cannot be mistaken for options, the transport private, and
``WorkflowBuilder.task`` typed for both its uses (checked by mypy: ``assert_type``)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, assert_type

import pytest

import compass
from compass import errors
from compass.app import App
from compass.client import Client
from compass.errors import ConfigError, ConnectionClosed, InvalidInputs, ProtocolError
from compass.observe.timeline import LOAD_FIELDS, SPAN_FIELDS
from compass.reports import JobRecord, WorkerStatus, WorkerTimeline
from compass.submission import (
    OPTION_NAMES,
    USE_CLIENT_DEFAULT,
    JobOptions,
    job_inputs,
    job_options,
    objective_fields,
    resolve_timeout,
)
from compass.sync_client import SyncClient

STATUS: dict[str, Any] = {
    "name": "w0", "address": "127.0.0.1:7341", "version": "0.1.0", "uptime_s": 1.5,
    "policy": "compass", "emulate": False, "instance": "ab12", "draining": False,
    "advertised": "127.0.0.1:7341", "peers": [{"name": "w1", "address": "127.0.0.1:7342"}],
    "peer_channels": 1, "peer_handshakes": {"join": 1}, "lost": [], "cluster": [],
    "view": {"kind": "mesh"}, "workflows": ["a", "b"], "queue": {"ready": 0},
    "jobs_in_flight": 0, "cache": {"resident": []}, "stats": {"tasks_run": 3},
    "batches": {}, "slo": {}, "metrics": None, "traces": {"kept": 0}, "process": {},
    "tables": {}, "added_by_a_newer_worker": 7,
}  # fmt: skip

RECORD: dict[str, Any] = {
    "job": "w0-ab12-1", "workflow": "wf", "plan": {"t": "w0"}, "attempts": 1, "key": "k-0",
    "priority": 2, "deadline_s": None, "ok": True, "latency_s": 0.01,
}  # fmt: skip


# -- errors ------------------------------------------------------------------------------------


def test_every_public_error_class_is_exported_from_compass_and_compass_errors() -> None:
    defined = {
        name
        for name, value in inspect.getmembers(errors, inspect.isclass)
        if value.__module__ == errors.__name__ and not name.startswith("_")
    }
    assert "StaleHandle" in defined and "UnknownOperation" in defined  # the two once missing
    assert defined <= set(errors.__all__)
    assert defined <= set(compass.__all__)
    for name in defined:
        assert getattr(compass, name) is getattr(errors, name)


# -- what a worker reports ---------------------------------------------------------------------


def test_a_status_is_typed_frozen_and_keeps_what_a_newer_worker_adds() -> None:
    status = WorkerStatus.from_wire(STATUS)
    assert status.name == "w0" and status.uptime_s == 1.5 and status.metrics is None
    assert status.workflows == ("a", "b") and status.peer_names == ["w1"]
    assert status.stats["tasks_run"] == 3
    assert status.to_json() == STATUS  # ``compass status --json``: the whole map
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.name = "w9"  # type: ignore[misc]


def test_a_status_read_by_key_still_answers_and_says_it_is_deprecated() -> None:
    status = WorkerStatus.from_wire(STATUS)
    with pytest.warns(DeprecationWarning, match=r"status\.peers"):
        assert status["peers"] == STATUS["peers"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", None, "'name'"),
        ("uptime_s", True, "'uptime_s'"),
        ("peers", [1], "'peers'"),
        ("queue", [], "'queue'"),
        ("metrics", 7, "'metrics'"),
    ],
)
def test_a_malformed_status_is_a_protocol_error_naming_the_field(
    field: str, value: object, message: str
) -> None:
    with pytest.raises(ProtocolError, match=message):
        WorkerStatus.from_wire({**STATUS, field: value})
    with pytest.raises(ProtocolError, match="with a list"):
        WorkerStatus.from_wire([STATUS])
    missing = {k: v for k, v in STATUS.items() if k != "instance"}
    with pytest.raises(ProtocolError, match="nothing as 'instance'"):
        WorkerStatus.from_wire(missing)


def test_a_status_without_the_parts_an_older_worker_did_not_send_has_them_empty() -> None:
    who = ("name", "address", "version", "uptime_s", "instance")
    status = WorkerStatus.from_wire({k: STATUS[k] for k in who})
    assert status.peers == () and status.queue == {} and status.metrics is None
    assert status.jobs_in_flight == 0 and status.policy == "" and not status.draining


def test_a_job_record_round_trips_and_a_bad_one_is_refused() -> None:
    record = JobRecord.from_wire(RECORD)
    assert record.plan == {"t": "w0"} and record.key == "k-0" and record.priority == 2
    assert record.to_json() == RECORD
    with pytest.raises(ProtocolError, match="'ok'"):
        JobRecord.from_wire({**RECORD, "ok": "yes"})
    with pytest.raises(ProtocolError, match="'key'"):
        JobRecord.from_wire({**RECORD, "key": 5})


def _part(seqs: list[int], *, more: bool, extra_field: bool = False) -> dict[str, Any]:
    fields = [*SPAN_FIELDS, "from_the_future"] if extra_field else list(SPAN_FIELDS)
    row = {
        "job": "j", "attempt": 0, "workflow": "wf", "task": "t", "model": None, "queued": 1.0,
        "start": 1.0, "end": 2.0, "fetch_s": 0.0, "transfer_s": 0.0, "batch": 1,
        "cache_hit": None, "error": "", "lane": 0, "exec_s": 1.0, "from_the_future": 1,
    }  # fmt: skip
    return {
        "span_fields": fields,
        "load_fields": list(LOAD_FIELDS),
        "spans": [[seq if f == "seq" else row[f] for f in fields] for seq in seqs],
        "loads": [[1, "m", 0.0, 0.5, False, ""]],
        "more": more, "lost": False, "now": 3.0, "name": "w0", "instance": "ab12",
        "time_scale": 1.0, "lanes": 1, "host_lanes": 1,
    }  # fmt: skip


def test_a_timeline_joins_its_pages_and_ignores_fields_it_does_not_know() -> None:
    timeline = WorkerTimeline.from_parts(
        [_part([1, 2], more=True), _part([3], more=False, extra_field=True)]
    )
    assert [span.seq for span in timeline.spans] == [1, 2, 3]
    assert timeline.spans[0].task == "t" and timeline.loads[0].model == "m"
    assert timeline.name == "w0" and not timeline.lost
    short = _part([1], more=False)
    short["spans"][0].pop()
    with pytest.raises(ProtocolError, match="wrong length"):
        WorkerTimeline.from_parts([short])


# -- a submission's arguments ------------------------------------------------------------------


def test_inputs_come_from_a_mapping_keywords_or_both() -> None:
    assert job_inputs("submit", None, {"x": 1}) == {"x": 1}
    both = job_inputs("submit", {"priority": "high", "timeout": 3}, {"x": 1})
    assert both == {"priority": "high", "timeout": 3, "x": 1}


@pytest.mark.parametrize("option", sorted(OPTION_NAMES - {"inputs"}))
def test_a_keyword_named_like_another_methods_option_points_to_inputs(option: str) -> None:
    with pytest.raises(TypeError, match=rf"inputs=\{{'{option}': \.\.\.\}}"):
        job_inputs("submit", None, {option: 1})


def test_inputs_that_are_not_a_mapping_of_names_or_name_one_twice_are_refused() -> None:
    with pytest.raises(TypeError, match="mapping of input names"):
        job_inputs("submit", [("x", 1)], {})
    with pytest.raises(TypeError, match="named by strings"):
        job_inputs("submit", {1: "x"}, {})
    with pytest.raises(TypeError, match="'x' twice"):
        job_inputs("submit", {"x": 1}, {"x": 2})


def test_the_timeout_sentinel_is_typed_and_a_bad_timeout_points_to_inputs() -> None:
    assert resolve_timeout(USE_CLIENT_DEFAULT, 7.0) == 7.0
    assert resolve_timeout(None, 7.0) is None and resolve_timeout(2, 7.0) == 2.0
    assert repr(USE_CLIENT_DEFAULT) == "USE_CLIENT_DEFAULT"
    with pytest.raises(TypeError, match=r"inputs=\{'timeout'"):
        resolve_timeout("soon", 7.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="timeout must be"):
        resolve_timeout(True, 7.0)


def test_a_bad_objective_fails_before_sending_and_says_where_an_input_goes() -> None:
    assert objective_fields(None, 0, "drop") == {}
    assert objective_fields(50.0, 3, "finish") == {
        "deadline_ms": 50.0,
        "priority": 3,
        "on_miss": "finish",
    }
    with pytest.raises(InvalidInputs, match=r"priority must be .*inputs=\{'priority'"):
        objective_fields(None, "high", "drop")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputs, match="on_miss"):
        objective_fields(None, 0, "retry")  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_colliding_keyword_fails_before_the_client_connects() -> None:
    client = Client("127.0.0.1:9")  # nothing listens there: nothing may be dialed
    with pytest.raises(TypeError, match=r"inputs=\{'trace'"):
        await client.submit("wf", trace=True)
    with pytest.raises(TypeError, match=r"inputs=\{'concurrency'"):
        await client.submit_job("wf", concurrency=2)
    with pytest.raises(TypeError, match="mapping of input names"):
        await client.submit_many("wf", [{"x": 1}, ["x"]])  # type: ignore[list-item]
    assert client._channel is None  # nothing was dialed
    await client.aclose()


def test_submit_jobs_old_option_keywords_warn_and_become_its_options() -> None:
    keywords: dict[str, Any] = {"trace": True, "priority": 2, "x": 1}
    with pytest.warns(DeprecationWarning, match=r"options=JobOptions\(priority=, trace="):
        options = job_options("submit_job", None, keywords)
    assert options == JobOptions(priority=2, trace=True) and keywords == {"x": 1}
    assert job_options("submit_job", None, {}) == JobOptions()
    with pytest.raises(TypeError, match="options= and trace="):
        job_options("submit_job", JobOptions(), {"trace": True})


@pytest.mark.asyncio
async def test_submit_job_takes_its_options_as_one_object_or_warns() -> None:
    client = Client("127.0.0.1:9")  # nothing listens there: nothing may be dialed
    bad = JobOptions(traceparent="not a context")
    with pytest.raises(ConfigError, match="not a W3C trace context"):
        await client.submit_job("wf", options=bad)
    # the old keyword is the option still (checked as one), not a job input
    with (
        pytest.warns(DeprecationWarning, match="submit_job"),
        pytest.raises(ConfigError, match="not a W3C trace context"),
    ):
        await client.submit_job("wf", traceparent="not a context")
    with pytest.raises(TypeError, match=r"inputs=\{'options'"):
        await client.submit("wf", options=JobOptions())
    assert client._channel is None  # nothing was dialed
    await client.aclose()


def test_the_sync_client_refuses_a_colliding_keyword_too() -> None:
    client = SyncClient("127.0.0.1:9")  # nothing listens there: nothing may be dialed
    try:
        with pytest.raises(TypeError, match=r"inputs=\{'trace'"):
            client.submit("wf", {"x": 1}, trace=True)
        with pytest.raises(TypeError, match="'x' twice"):
            client.submit_job("wf", {"x": 1}, x=2)
    finally:
        client.close()


# -- the transport -----------------------------------------------------------------------------


def test_the_transport_is_private_and_its_old_names_warn() -> None:
    client = Client("127.0.0.1:9")
    with (
        pytest.warns(DeprecationWarning, match="Client.channel"),
        pytest.raises(ConnectionClosed, match="not connected"),
    ):
        _ = client.channel
    with pytest.warns(DeprecationWarning, match="bulk_channel"):
        assert client.bulk_channel is None


# -- WorkflowBuilder.task ----------------------------------------------------------------------


def test_task_gives_back_the_function_it_declares_bare_or_with_arguments() -> None:
    app = App("typed")
    wf = app.workflow("wf", inputs=["x"])

    def first(model: None, x: int) -> int:
        return x + 1

    bare = wf.task(first)
    assert_type(bare(None, 1), int)  # not Any: the function's own type came back

    @wf.task(name="third", after=["first"])
    def third(model: None, first: int) -> str:
        return str(first)

    assert_type(third(None, 1), str)
    assert bare is first and third(None, 2) == "2"
    assert [t.name for t in app.get_workflow("wf").tasks.values()] == ["first", "third"]
