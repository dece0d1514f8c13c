from __future__ import annotations

import pytest

from compass.config import CacheConfig, Limits, SchedConfig, Timeouts, WorkerConfig, parse_address
from compass.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7000", ("127.0.0.1", 7000)),
        ("localhost", ("localhost", 7341)),
        ("[::1]:9", ("::1", 9)),
        ("[::1]", ("::1", 7341)),
        (" host:1 ", ("host", 1)),
    ],
)
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("host:port", "not a number"),
        ("host:0", "1..65535"),
        ("host:70000", "1..65535"),
        ("[::1", "unclosed"),
        (":80", "no host"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_address(text)


def test_configs_validate_on_construction() -> None:
    with pytest.raises(ConfigError, match="max_frame_bytes"):
        Limits(max_frame_bytes=0)
    with pytest.raises(ConfigError, match="max_header_bytes"):
        Limits(max_frame_bytes=10, max_header_bytes=20)
    with pytest.raises(ConfigError, match="request"):
        Timeouts(request=-1)
    with pytest.raises(ConfigError, match="backend"):
        CacheConfig(backend="gpu")
    with pytest.raises(ConfigError, match="smaller than one slab"):
        CacheConfig(capacity_bytes=1, slab_bytes=2)
    with pytest.raises(ConfigError, match="peer_timeout_ms"):
        SchedConfig(heartbeat_ms=100, peer_timeout_ms=50)
    with pytest.raises(ConfigError, match="heartbeat_min_ms"):
        SchedConfig(heartbeat_ms=10, heartbeat_min_ms=20)
    with pytest.raises(ConfigError, match="heartbeat_min_ms"):
        SchedConfig(heartbeat_min_ms=0)
    with pytest.raises(ConfigError, match="heartbeat_max_rate"):
        SchedConfig(heartbeat_max_rate=0)
    with pytest.raises(ConfigError, match="port"):
        WorkerConfig(port=70000)
    with pytest.raises(ConfigError, match="host_lanes"):
        WorkerConfig(host_lanes=-1)
    with pytest.raises(ConfigError, match="not a number"):
        WorkerConfig(join=("a:b",))
    assert Timeouts(request=None).request is None
