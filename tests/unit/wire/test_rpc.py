"""Router dispatch and the exception -> wire error conversion."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from compass.errors import (
    ConfigError,
    RemoteError,
    UnknownOperation,
    UnknownWorkflow,
    error_from_wire,
)
from compass.wire.rpc import Later, Router, exception_to_wire
from compass.wire.transport import Immediate

# the router reads only these two attributes of a channel
CHANNEL = cast(Any, SimpleNamespace(local_name="w1", peer_name="c1"))


@pytest.mark.asyncio
async def test_router_dispatches_requests_and_notifies():
    router = Router()
    seen = []

    @router.request("double")
    async def double(channel, body):
        return body * 2

    @router.notify("note")
    def note(channel, body):
        seen.append((channel.peer_name, body))

    outcome = router.handle_request(CHANNEL, "double", 21)
    assert not isinstance(outcome, Immediate | Later)
    assert await outcome == 42
    router.handle_notify(CHANNEL, "note", "x")
    assert seen == [("c1", "x")]
    assert router.request_ops == {"double"}
    assert router.notify_ops == {"note"}


@pytest.mark.asyncio
async def test_unknown_request_op_names_the_op():
    with pytest.raises(UnknownOperation, match="'w1' has no handler for request 'nope'"):
        Router().handle_request(CHANNEL, "nope", None)


def test_unknown_notify_op_is_logged_and_dropped(caplog):
    with caplog.at_level(logging.WARNING, logger="compass.wire"):
        Router().handle_notify(CHANNEL, "mystery", 1)
    assert "mystery" in caplog.text


def test_an_op_has_one_handler():
    router = Router()
    router.add_request("x", lambda ch, body: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ConfigError, match="'x' already has a handler"):
        router.add_request("x", lambda ch, body: None)  # type: ignore[arg-type,return-value]


def test_compass_errors_keep_their_class_across_the_wire():
    code, message, detail = exception_to_wire(UnknownWorkflow("no vqa", detail={"w": "vqa"}))
    again = error_from_wire(code, message, detail)
    assert type(again) is UnknownWorkflow
    assert (again.message, again.detail) == ("no vqa", {"w": "vqa"})


def test_other_exceptions_become_internal_with_the_traceback():
    def fail() -> None:
        raise KeyError("k")

    try:
        fail()
    except KeyError as exc:
        code, message, detail = exception_to_wire(exc, context="handling 'op'")
    assert code == "internal"
    assert message == "KeyError while handling 'op': 'k'"
    assert "in fail" in detail["traceback"]
    assert type(error_from_wire(code, message, detail)) is RemoteError
