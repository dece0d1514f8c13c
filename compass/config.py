"""Configuration: frozen dataclasses, validated when built, passed explicitly.

Nothing here reads the environment or a file at import time; only ``cli/`` turns flags and
``COMPASS_*`` variables into these objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from compass.errors import ConfigError

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_PORT",
    "PROTOCOL_VERSION",
    "CacheConfig",
    "Limits",
    "SchedConfig",
    "Timeouts",
    "WorkerConfig",
    "parse_address",
]

PROTOCOL_VERSION = 1
DEFAULT_PORT = 7341

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: model cache capacity of a real worker when none is configured
DEFAULT_CACHE_BYTES = 2 * GiB


def _positive(owner: object, **values: float | int | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Wire limits, each checked before any memory is allocated for what it bounds."""

    max_frame_bytes: int = 1 * GiB
    max_header_bytes: int = 16 * MiB
    max_buffers: int = 4096
    max_depth: int = 64
    #: write-buffer high-water mark for flow control (low-water is a quarter of it)
    write_high_water: int = 4 * MiB

    def __post_init__(self) -> None:
        _positive(
            self,
            max_frame_bytes=self.max_frame_bytes,
            max_header_bytes=self.max_header_bytes,
            max_buffers=self.max_buffers,
            max_depth=self.max_depth,
            write_high_water=self.write_high_water,
        )
        if self.max_header_bytes > self.max_frame_bytes:
            raise ConfigError("Limits.max_header_bytes cannot exceed max_frame_bytes")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. ``None`` means wait forever (only sensible for ``request``)."""

    connect: float = 5.0
    handshake: float = 5.0
    request: float | None = 30.0
    close: float = 5.0

    def __post_init__(self) -> None:
        _positive(
            self,
            connect=self.connect,
            handshake=self.handshake,
            request=self.request,
            close=self.close,
        )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The worker's model cache: a slab pool of ``capacity_bytes`` on ``backend``.

    ``backend`` is ``"auto"`` (CuPy on a GPU, host memory elsewhere), ``"cupy"``, ``"host"`` or
    ``"capacity"`` (accounts slabs, holds no bytes: emulated mode). ``capacity_bytes=None`` lets
    the worker choose: the workload's GPU memory when emulated, :data:`DEFAULT_CACHE_BYTES`
    otherwise (see :meth:`resolved`).
    """

    capacity_bytes: int | None = None
    slab_bytes: int = 64 * MiB
    backend: str = "auto"
    prefetch_depth: int = 3

    def __post_init__(self) -> None:
        _positive(self, capacity_bytes=self.capacity_bytes, slab_bytes=self.slab_bytes)
        if self.backend not in ("auto", "cupy", "host", "capacity"):
            raise ConfigError(
                f"CacheConfig.backend must be auto, cupy, host or capacity, got {self.backend!r}"
            )
        if self.capacity_bytes is not None and self.capacity_bytes < self.slab_bytes:
            raise ConfigError(
                f"cache capacity {self.capacity_bytes} B is smaller than one slab "
                f"({self.slab_bytes} B)"
            )
        if self.prefetch_depth < 0:
            raise ConfigError("CacheConfig.prefetch_depth must be >= 0")

    @property
    def capacity(self) -> int:
        """The capacity in bytes, the default when none was chosen."""
        return DEFAULT_CACHE_BYTES if self.capacity_bytes is None else self.capacity_bytes

    def resolved(self, default_bytes: int | None = None) -> CacheConfig:
        """This config with ``capacity_bytes`` set (to ``default_bytes`` if it was ``None``)."""
        if self.capacity_bytes is not None:
            return self
        return replace(self, capacity_bytes=default_bytes or DEFAULT_CACHE_BYTES)


@dataclass(frozen=True, slots=True)
class SchedConfig:
    """Placement policy and its knobs (every worker of a cluster uses the same)."""

    policy: str = "compass"
    #: with nothing new to say, a worker still sends its state this often (liveness)
    heartbeat_ms: float = 10.0
    #: a change to the queue or the cache is sent at once, but never sooner than this after
    #: the previous heartbeat (so a burst of changes costs one message per peer)
    heartbeat_min_ms: float = 1.0
    #: most heartbeat messages a worker sends per second over all its peers: with many peers
    #: this spaces heartbeats beyond heartbeat_min_ms (the mesh is full, so a heartbeat costs
    #: one message per peer); 20,000/s is 1 ms with 20 peers, 12 ms with 240
    heartbeat_max_rate: float = 20000.0
    peer_timeout_ms: float = 2000.0
    #: keep a successor on its planned worker while that worker's wait <= this x its exec time
    #: (the paper used 1.5; 0.25 cut compass's p99 by a third in the simulator, docs/RESULTS.md)
    adjust_threshold: float = 0.25
    #: idle workers fill free cache space with models the cluster is short of (if the policy does)
    warm: bool = True

    def __post_init__(self) -> None:
        _positive(
            self,
            heartbeat_ms=self.heartbeat_ms,
            heartbeat_min_ms=self.heartbeat_min_ms,
            heartbeat_max_rate=self.heartbeat_max_rate,
            peer_timeout_ms=self.peer_timeout_ms,
            adjust_threshold=self.adjust_threshold,
        )
        if self.heartbeat_min_ms > self.heartbeat_ms:
            raise ConfigError(
                f"SchedConfig.heartbeat_min_ms ({self.heartbeat_min_ms}) must not exceed "
                f"heartbeat_ms ({self.heartbeat_ms})"
            )
        if self.peer_timeout_ms <= self.heartbeat_ms:
            raise ConfigError("SchedConfig.peer_timeout_ms must exceed heartbeat_ms")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything a worker process needs; built by ``compass worker start``."""

    host: str = "127.0.0.1"
    port: int = 0
    name: str = ""
    token: str | None = None
    join: tuple[str, ...] = ()
    app: str | None = None
    workload: str | None = None
    lanes: int = 1
    #: lanes for model-less tasks, off the GPU lanes; 0 runs them on the GPU lanes (the paper's
    #: execution model, which the benchmarks reproduce). The whole cluster should agree:
    #: planners assume it of every worker.
    host_lanes: int = 1
    emulate: bool = False
    time_scale: float = 1.0
    #: answered jobs an ingress remembers for `trace` (benchmarks read placements from it)
    trace_jobs: int = 10000
    #: jobs in flight this worker accepts as their ingress; more are refused with Overloaded
    #: (each holds its inputs until it is answered, so this bounds the ingress's memory)
    max_jobs: int = 10000
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        _positive(self, lanes=self.lanes, time_scale=self.time_scale, max_jobs=self.max_jobs)
        if self.host_lanes < 0:
            raise ConfigError(f"WorkerConfig.host_lanes must be >= 0, got {self.host_lanes}")
        for address in self.join:
            parse_address(address)


def parse_address(address: str, default_port: int = DEFAULT_PORT) -> tuple[str, int]:
    """``"host:port"``, ``"[::1]:port"`` or ``"host"`` -> ``(host, port)``, or a clear error."""
    text = address.strip()
    if not text:
        raise ConfigError("empty address: expected HOST:PORT")
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ConfigError(f"bad address {address!r}: unclosed '['")
        host, rest = text[1:end], text[end + 1 :]
        if rest:
            if not rest.startswith(":"):
                raise ConfigError(f"bad address {address!r}: expected ':' after ']'")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise ConfigError(f"bad address {address!r}: no host")
    if not port_text:
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"bad address {address!r}: port {port_text!r} is not a number") from None
    if not 0 < port <= 65535:
        raise ConfigError(f"bad address {address!r}: port must be in 1..65535")
    return host, port
