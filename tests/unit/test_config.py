from __future__ import annotations

import os

import pytest

from compass.cache.backend import host_memory_bytes, probe_memory, resolve_cache
from compass.config import (
    DEFAULT_CACHE_BYTES,
    JOB_ENVELOPE_BYTES,
    CacheConfig,
    DeviceMemory,
    Limits,
    SchedConfig,
    SwimConfig,
    Timeouts,
    WorkerConfig,
    frame_carries,
    parse_address,
)
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
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="drain_timeout_s"):
            WorkerConfig(drain_timeout_s=bad)
    assert WorkerConfig(drain_timeout_s=0).drain_timeout_s == 0  # stop at once
    assert Timeouts(request=None).request is None


MiB = 1 << 20
GiB = 1 << 30


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        # 80% of free GPU memory on CuPy, whole slabs
        (DeviceMemory("cupy", free_gpu_bytes=10 * GiB), 8 * GiB),
        (DeviceMemory("cupy", free_gpu_bytes=4000 * MiB), 2944 * MiB),  # 1 GiB left: 46 slabs
        # 25% of host memory on the host backend
        (DeviceMemory("host", host_bytes=16 * GiB), 4 * GiB),
        (DeviceMemory("host", host_bytes=23 * GiB, free_gpu_bytes=80 * GiB), 5888 * MiB),
        # unknown figures, or the capacity backend: the fixed default
        (DeviceMemory("cupy"), DEFAULT_CACHE_BYTES),
        (DeviceMemory("host", free_gpu_bytes=80 * GiB), DEFAULT_CACHE_BYTES),
        (DeviceMemory("capacity", free_gpu_bytes=80 * GiB, host_bytes=64 * GiB), 2 * GiB),
    ],
)
def test_the_default_cache_follows_the_device(memory: DeviceMemory, expected: int) -> None:
    resolved = CacheConfig(slab_bytes=64 * MiB).resolved(memory=memory)
    assert resolved.capacity_bytes == expected
    assert resolved.capacity == expected


def test_a_configured_or_workload_capacity_wins_over_the_device() -> None:
    memory = DeviceMemory("cupy", free_gpu_bytes=40 * GiB)
    assert CacheConfig(capacity_bytes=GiB).resolved(memory=memory).capacity_bytes == GiB
    # an emulated worker's cache is its workload's GPU memory, whatever this machine has
    assert CacheConfig().resolved(14 * 10**9, memory=memory).capacity_bytes == 14 * 10**9


def test_a_default_cache_smaller_than_a_slab_says_what_to_do() -> None:
    # a GPU with less free than the headroom left for activations: no default cache at all
    assert DeviceMemory("cupy", free_gpu_bytes=1000 * MiB).default_cache_bytes() == 0
    with pytest.raises(ConfigError, match="--cache-mb"):
        CacheConfig(slab_bytes=MiB).resolved(memory=DeviceMemory("cupy", free_gpu_bytes=GiB))
    tiny = DeviceMemory("host", host_bytes=100 * MiB)  # 25 MiB: less than one 64 MiB slab
    with pytest.raises(ConfigError, match="--cache-mb"):
        CacheConfig(slab_bytes=64 * MiB).resolved(memory=tiny)
    assert CacheConfig(slab_bytes=MiB).resolved(memory=tiny).capacity_bytes == 25 * MiB


def test_probe_memory_measures_this_machine() -> None:
    host = probe_memory("host")
    assert host.backend == "host"
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert host.host_bytes is not None and 0 < host.host_bytes <= physical
    assert host_memory_bytes() == host.host_bytes
    assert probe_memory("capacity") == DeviceMemory("capacity")
    # unset, a host-backend cache takes a quarter of the machine (or container)
    resolved = resolve_cache(CacheConfig(backend="host", slab_bytes=MiB))
    assert resolved.capacity_bytes == host.host_bytes // 4 // MiB * MiB


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"probe_timeout_ms": 200.0}, "--probe-timeout-ms (200.0) must be > 0 and below"),
        ({"probe_timeout_ms": 0.0}, "--probe-timeout-ms"),
        ({"probe_period_ms": float("inf")}, "--probe-period-ms"),
        ({"indirect_probes": -1}, "--indirect-probes must be 0..16, got -1"),
        ({"indirect_probes": True}, "--indirect-probes"),
        ({"suspicion_mult": 0.5}, "--suspicion-mult must be in [1, 100], got 0.5"),
        ({"suspicion_mult": float("nan")}, "--suspicion-mult"),
    ],
)
def test_failure_detection_options_are_checked_with_one_line(
    kwargs: dict[str, float], message: str
) -> None:
    assert WorkerConfig().swim == SwimConfig(200.0, 100.0, 3, 3.0)
    with pytest.raises(ConfigError) as caught:
        SwimConfig(**kwargs)  # type: ignore[arg-type]
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"peer_idle_s": -1.0}, "--peer-idle-s must be a number of seconds >= 0"),
        ({"peer_idle_s": float("inf")}, "--peer-idle-s"),
        ({"peer_idle_s": float("nan")}, "--peer-idle-s"),
        ({"max_peer_channels": -1}, "--max-peer-channels must be 0..1000000 (0: no cap), got -1"),
        ({"max_peer_channels": True}, "--max-peer-channels"),
    ],
)
def test_peer_channel_options_are_checked_with_one_line(
    kwargs: dict[str, float], message: str
) -> None:
    assert (WorkerConfig().peer_idle_s, WorkerConfig().max_peer_channels) == (30.0, 64)
    assert WorkerConfig(peer_idle_s=0, max_peer_channels=0).peer_idle_s == 0  # never, no cap
    with pytest.raises(ConfigError) as caught:
        WorkerConfig(**kwargs)  # type: ignore[arg-type]
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_one_job_s_inputs_are_bounded_by_the_frame_they_travel_in() -> None:
    """Issue 39, item 6: with the defaults a job past the frame met the wire's limit, not the
    job limit. One job's limit is within the frame (less the message around the inputs) and
    within what an ingress holds of all its jobs; the two meanings have two names."""
    default = WorkerConfig()
    assert default.limits.max_frame_bytes == GiB and default.max_held_bytes == 4 * GiB
    assert default.max_job_bytes is None
    assert default.job_bytes == GiB - JOB_ENVELOPE_BYTES < default.limits.max_frame_bytes
    # a smaller frame alone lowers the job limit with it; a smaller total too
    assert WorkerConfig(limits=Limits(max_frame_bytes=64 * MiB)).job_bytes == 63 * MiB
    assert WorkerConfig(max_held_bytes=10 * MiB).job_bytes == 10 * MiB
    assert WorkerConfig(max_job_bytes=5 * MiB).job_bytes == 5 * MiB
    # one that could never be reached is refused, naming the flags and what to give
    with pytest.raises(ConfigError, match=r"--max-job-mb 4096 is more than one frame carries"):
        WorkerConfig(max_job_bytes=4 * GiB)
    with pytest.raises(ConfigError, match=r"give --max-job-mb 1023 at most, or raise"):
        WorkerConfig(max_job_bytes=GiB)
    with pytest.raises(ConfigError, match=r"--max-job-mb 20 is more than --max-held-mb 10"):
        WorkerConfig(max_job_bytes=20 * MiB, max_held_bytes=10 * MiB)
    # the least frame a worker takes (--max-frame-mb 1) keeps half of it for the message
    assert WorkerConfig(limits=Limits(max_frame_bytes=MiB)).job_bytes == MiB // 2
    assert frame_carries(2 * MiB) == MiB and frame_carries(64 * 1024) == 32 * 1024
    with pytest.raises(ConfigError, match="max_held_bytes must be > 0"):
        WorkerConfig(max_held_bytes=0)
