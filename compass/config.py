"""Configuration: frozen dataclasses, validated when built, passed explicitly.

Nothing here reads the environment or a file at import time; only ``cli/`` turns flags and
``COMPASS_*`` variables into these objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal, get_args

from compass.errors import ConfigError

if TYPE_CHECKING:
    import ssl

    from compass.elastic.replicate import ReplicaConfig

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_PORT",
    "GPU_CACHE_FRACTION",
    "HOST_CACHE_FRACTION",
    "JOB_ENVELOPE_BYTES",
    "PROTOCOL_VERSION",
    "SIM_DIFFERS",
    "SIM_WORKER",
    "VIEWS",
    "CacheConfig",
    "DeviceMemory",
    "Limits",
    "SchedConfig",
    "SwimConfig",
    "TLSConfig",
    "Timeouts",
    "View",
    "WorkerConfig",
    "check_view",
    "frame_carries",
    "parse_address",
]

PROTOCOL_VERSION = 1
DEFAULT_PORT = 7341

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: model cache capacity when none is configured and the device's memory is unknown
DEFAULT_CACHE_BYTES = 2 * GiB
#: share of the GPU's free memory a worker's cache takes by default (the rest: activations)
GPU_CACHE_FRACTION = 0.8
#: GPU memory a default cache always leaves free for activations and the CUDA context, however
#: large the device (the smaller of the two rules wins)
GPU_HEADROOM_BYTES = 1 << 30
#: share of the machine's memory a host-backend cache takes by default
HOST_CACHE_FRACTION = 0.25
#: bytes a frame keeps beside one job's inputs, for the message around them (ids, the job's
#: plan, its objective): a job travels in one frame, so one job's inputs are at most the frame
#: less this (:func:`frame_carries`)
JOB_ENVELOPE_BYTES = 1 * MiB


def frame_carries(frame_bytes: int) -> int:
    """Bytes of one job's inputs a frame of ``frame_bytes`` carries: the frame less
    :data:`JOB_ENVELOPE_BYTES`, or half of it where it is under twice that (a frame of 1 MiB,
    the least ``--max-frame-mb``, or a client's own small ``Limits``). The one rule of both
    sides: a worker takes no more of one job (:attr:`WorkerConfig.job_bytes`), and a client
    sends no more (:func:`compass.submission.check_job_size`)."""
    return frame_bytes - min(JOB_ENVELOPE_BYTES, frame_bytes // 2)


def _positive(owner: object, **values: float | int | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ConfigError(f"{type(owner).__name__}.{name} must be > 0, got {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """Wire limits, each checked before any memory is allocated for what it bounds."""

    max_frame_bytes: int = 1 * GiB
    #: msgpack header bytes of one frame (arrays travel out of band, so headers stay small)
    max_header_bytes: int = 1 * MiB
    max_buffers: int = 4096
    max_depth: int = 64
    #: msgpack objects in one header, containers included: bounds the memory and time decoding
    #: a header takes (an empty array is one wire byte but about 80 bytes of Python objects)
    max_elements: int = 131_072
    #: write-buffer high-water mark for flow control (low-water is a quarter of it)
    write_high_water: int = 4 * MiB
    #: open connections a server holds, authenticated or not; past it, new ones are refused
    max_connections: int = 4096
    #: connections still in the handshake; past it, the oldest of them is closed
    max_unauthenticated: int = 256

    def __post_init__(self) -> None:
        _positive(
            self,
            max_frame_bytes=self.max_frame_bytes,
            max_header_bytes=self.max_header_bytes,
            max_buffers=self.max_buffers,
            max_depth=self.max_depth,
            max_elements=self.max_elements,
            write_high_water=self.write_high_water,
            max_connections=self.max_connections,
            max_unauthenticated=self.max_unauthenticated,
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
class DeviceMemory:
    """The memory a worker's cache could take, measured on its machine.

    ``backend`` is what the cache runs on (``"auto"`` already decided: ``"cupy"``, ``"host"`` or
    ``"capacity"``); ``free_gpu_bytes`` and ``host_bytes`` are ``None`` where unknown.
    :func:`compass.cache.backend.probe_memory` measures it; tests build it by hand.
    """

    backend: str
    free_gpu_bytes: int | None = None
    host_bytes: int | None = None

    def default_cache_bytes(self) -> int:
        """:data:`GPU_CACHE_FRACTION` of free GPU memory on CuPy, less where that would leave
        under :data:`GPU_HEADROOM_BYTES` free; :data:`HOST_CACHE_FRACTION` of host memory on the
        host backends, :data:`DEFAULT_CACHE_BYTES` otherwise."""
        if self.backend == "cupy" and self.free_gpu_bytes:
            free = self.free_gpu_bytes
            return max(0, min(int(free * GPU_CACHE_FRACTION), free - GPU_HEADROOM_BYTES))
        if self.backend in ("host", "strict") and self.host_bytes:
            return int(self.host_bytes * HOST_CACHE_FRACTION)
        return DEFAULT_CACHE_BYTES


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """The worker's model cache: a slab pool of ``capacity_bytes`` on ``backend``.

    ``backend`` is ``"auto"`` (CuPy on a GPU, host memory elsewhere), ``"cupy"``, ``"host"``,
    ``"strict"`` (host memory that checks GPU rules: alignment, copies visible only after a sync,
    no copy into slabs a task may still read) or ``"capacity"`` (accounts slabs, holds no bytes:
    emulated mode). ``device`` is the CUDA device the cupy backend allocates on.
    ``prefetch_depth``: how far the queue's look-ahead loads models (0: no speculative loads).
    ``capacity_bytes=None`` lets the worker choose: the workload's GPU memory when emulated,
    otherwise a share of the device's memory (see :meth:`resolved` and :class:`DeviceMemory`;
    :func:`compass.cache.backend.resolve_cache` measures the device and resolves).
    """

    capacity_bytes: int | None = None
    slab_bytes: int = 64 * MiB
    backend: str = "auto"
    prefetch_depth: int = 3
    #: a prefetch may evict a model needed later; False: free slabs only (the paper's rule)
    prefetch_evicts: bool = True
    device: int = 0

    def __post_init__(self) -> None:
        _positive(self, capacity_bytes=self.capacity_bytes, slab_bytes=self.slab_bytes)
        if self.backend not in ("auto", "cupy", "host", "strict", "capacity"):
            raise ConfigError(
                "CacheConfig.backend must be auto, cupy, host, strict or capacity, "
                f"got {self.backend!r}"
            )
        if self.device < 0:
            raise ConfigError(f"CacheConfig.device must be >= 0, got {self.device}")
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

    def resolved(
        self, default_bytes: int | None = None, *, memory: DeviceMemory | None = None
    ) -> CacheConfig:
        """This config with ``capacity_bytes`` set, if it was ``None``, to ``default_bytes``, or
        else to ``memory``'s default, rounded down to whole slabs. Configuration reads no
        device: :func:`compass.cache.backend.resolve_cache` measures ``memory`` on this
        machine and calls this."""
        if self.capacity_bytes is not None:
            return self
        if default_bytes:
            return replace(self, capacity_bytes=default_bytes)
        if memory is None:
            raise ConfigError(
                "CacheConfig.resolved needs the memory to take a share of (memory=, or "
                "compass.cache.backend.resolve_cache, which measures this machine's)"
            )
        capacity = memory.default_cache_bytes() // self.slab_bytes * self.slab_bytes
        if capacity < self.slab_bytes:
            raise ConfigError(
                f"the default model cache ({memory.default_cache_bytes()} B of {memory.backend} "
                f"memory) is smaller than one slab ({self.slab_bytes} B): give a capacity "
                "(--cache-mb) or a smaller slab (--slab-mb)"
            )
        return replace(self, capacity_bytes=capacity)


#: what a planner may see (SchedConfig.view)
View = Literal["bounded", "mesh"]
VIEWS: tuple[View, ...] = get_args(View)

#: how an ingress admits jobs with deadlines (SchedConfig.admission)
ADMISSIONS = ("plan", "learned")


def check_view(value: str) -> View:
    """``value`` as a :data:`View` (a flag's text); ConfigError naming the choices otherwise."""
    for view in VIEWS:
        if value == view:
            return view
    raise ConfigError(f"--view must be one of {', '.join(VIEWS)}, got {value!r}")


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
    #: a suspected peer that does not refute is declared dead at most this long after it was
    #: first suspected (sooner as other workers confirm the suspicion; see SwimConfig)
    peer_timeout_ms: float = 2000.0
    #: keep a successor on its planned worker while that worker's wait <= this x its exec time
    #: (the paper used 1.5; 0.1 sustains the most load in the simulator, docs/RESULTS.md)
    adjust_threshold: float = 0.1
    #: idle workers fill free cache space with models the cluster is short of (if the policy does)
    warm: bool = True
    #: scheduling at step boundaries: a queued task of a higher priority, or one whose deadline
    #: waiting would miss, takes a running step-wise task's lane between two of its steps, and
    #: a step-wise task whose job is past saving stops there (compass/core/preempt.py)
    preempt: bool = False
    #: how an ingress admits a job with a deadline: "plan", when its plan's estimate makes the
    #: deadline; "learned", besides, only as many of a kind (workflow and priority) as those it
    #: admitted were not mostly dropped on the way (compass/core/admission.py, AdmittedShare)
    admission: str = "plan"
    #: what a planner sees: "bounded" (a job's candidates; load from the workers it watches,
    #: residency from rumors, compass/gossip/spread.py) or "mesh" (every worker, each
    #: heartbeating every peer every heartbeat_ms)
    view: View = "bounded"
    #: a bounded view's workers sampled per job beyond the holders of its models
    candidates: int = 6
    #: a bounded view's holders in view per model the job needs (0: every holder)
    holders: int = 2
    #: of the sampled workers, all but this many are drawn from those the planner already
    #: watches (fresh load), and the holders from them first: a first contact shows only
    #: what was last heard of it, aged (docs/RESULTS.md, "What each planner knows")
    explore: int = 1
    #: a planner watches a candidate's load this long after it last planned over it
    watch_ms: float = 10000.0
    #: a bounded view sends rumors of workers' caches this often, to rumor_fanout peers
    rumor_ms: float = 100.0
    rumor_fanout: int = 2
    #: a bounded view sends every state it holds to one peer picked at random this often
    #: (anti-entropy: a worker that missed a rumor, or joined since, catches up)
    sync_ms: float = 5000.0

    def __post_init__(self) -> None:
        if self.view not in VIEWS:
            raise ConfigError(f"--view must be one of {', '.join(VIEWS)}, got {self.view!r}")
        if self.admission not in ADMISSIONS:
            raise ConfigError(
                f"--admission must be one of {', '.join(ADMISSIONS)}, got {self.admission!r}"
            )
        for name, value, least in (("candidates", self.candidates, 0),
                                   ("holders", self.holders, 0),
                                   ("explore", self.explore, 0),
                                   ("rumor_fanout", self.rumor_fanout, 1)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 1024:
                flag = name.replace("_", "-")
                raise ConfigError(f"--{flag} must be an integer {least}..1024, got {value!r}")
        _positive(
            self,
            watch_ms=self.watch_ms,
            rumor_ms=self.rumor_ms,
            sync_ms=self.sync_ms,
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
class SwimConfig:
    """Failure detection, SWIM-style (compass/membership/table.py): every ``probe_period_ms`` a
    worker probes one peer; without an ack within ``probe_timeout_ms`` it asks
    ``indirect_probes`` others to probe it, then suspects it; a suspicion lasts
    ``suspicion_mult x max(1, log10(workers)) x probe_period_ms`` once another worker confirms
    it, longer unconfirmed, never more than ``SchedConfig.peer_timeout_ms``."""

    probe_period_ms: float = 200.0
    probe_timeout_ms: float = 100.0
    indirect_probes: int = 3
    suspicion_mult: float = 3.0

    def __post_init__(self) -> None:
        if not 0 < self.probe_timeout_ms < self.probe_period_ms < float("inf"):
            raise ConfigError(
                f"--probe-timeout-ms ({self.probe_timeout_ms!r}) must be > 0 and below "
                f"--probe-period-ms ({self.probe_period_ms!r})"
            )
        if isinstance(self.indirect_probes, bool) or not 0 <= self.indirect_probes <= 16:
            raise ConfigError(f"--indirect-probes must be 0..16, got {self.indirect_probes!r}")
        if not 1.0 <= self.suspicion_mult <= 100.0:
            raise ConfigError(f"--suspicion-mult must be in [1, 100], got {self.suspicion_mult!r}")


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """Mutual TLS: this side's certificate and key, and the cluster CA that signs every peer's
    (PEM paths). Host names are not checked unless ``check_hostname``: the CA is the trust
    boundary (see :mod:`compass.security`). Files are read when a context is built."""

    cert: str
    key: str
    ca: str
    check_hostname: bool = False

    def __post_init__(self) -> None:
        for flag, value in (("cert", self.cert), ("key", self.key), ("ca", self.ca)):
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"TLSConfig.{flag} must be a file path, got {value!r}: mutual TLS needs "
                    "a certificate, its key and the cluster CA (--tls-cert, --tls-key, --tls-ca)"
                )

    def server_context(self) -> ssl.SSLContext:
        """Serve this certificate; require clients to present one the CA signed."""
        from compass.security import server_context

        return server_context(self.cert, self.key, self.ca)

    def client_context(self) -> ssl.SSLContext:
        """Present this certificate; trust only servers the CA signed."""
        from compass.security import client_context

        return client_context(self.cert, self.key, self.ca, check_hostname=self.check_hostname)


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
    #: answered jobs an ingress remembers for `trace` (benchmarks read placements from it);
    #: the whole trace is one answer, which must fit the wire's header and element limits
    trace_jobs: int = 2048
    #: jobs in flight this worker accepts as their ingress; more are refused with Overloaded
    #: (each holds its inputs until it is answered, so this bounds the ingress's memory)
    max_jobs: int = 10000
    #: bytes of one job's inputs this worker takes as ingress; a job past them is refused with
    #: JobTooLarge (an HTTP body past them with 413). None: what one frame carries (see
    #: :attr:`job_bytes`); more cannot be given, as a job travels in one frame (a client's
    #: submit, the ingress's task to a root)
    max_job_bytes: int | None = None
    #: bytes of job inputs this worker holds as ingress, all its jobs' together (each job's
    #: until it is answered); a job past them is refused for now with Overloaded
    max_held_bytes: int = 4 * GiB
    #: bytes of answers this worker keeps as ingress for resubmissions of a job's key (a
    #: client's retry); past it the oldest are shed, and a resubmission of theirs gets
    #: AnswerNotKept (the job is not run twice)
    keep_answer_bytes: int = 64 * MiB
    #: seconds a task may run when it declares no timeout_ms of its own; past it the job fails
    #: with CompassTimeout and the task's thread is abandoned (it cannot be interrupted)
    task_timeout_s: float = 300.0
    #: abandoned (stuck) task threads past which the worker stops taking GPU work
    max_stuck_tasks: int = 4
    #: seconds a worker keeps retrying --join (with backoff) before it gives up and exits
    join_timeout_s: float = 60.0
    #: seconds a stopping worker (SIGTERM) drains at most: it takes no new jobs and no new
    #: tasks from its peers' plans, and finishes what it holds; 0 stops at once. The default
    #: fits inside Kubernetes' 30 s grace period
    drain_timeout_s: float = 25.0
    #: ``HOST[:PORT]`` peers reach this worker at, when that differs from where it binds (a
    #: wildcard bind, NAT); "" advertises the bound address (see
    #: :func:`compass.worker.membership.advertised_address`)
    advertise_address: str = ""
    #: serve Prometheus ``/metrics`` and ``/ready`` on this port (0: one the system picks);
    #: None: no metrics endpoint (compass/observe/metrics.py)
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: serve the HTTP front door (Open Inference Protocol, OpenAI API) on this port, on the
    #: worker's host (0: one the system picks); None: off (compass/front/)
    http_port: int | None = None
    #: the front door's health routes need the bearer token too
    http_private_health: bool = False
    #: seconds a front-door connection may stay without a whole request head (idle or slow)
    http_idle_s: float = 15.0
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    cache: CacheConfig = field(default_factory=CacheConfig)
    sched: SchedConfig = field(default_factory=SchedConfig)
    #: failure detection: probe period and timeout, indirect probes, suspicion
    swim: SwimConfig = field(default_factory=SwimConfig)
    #: channels to peers are opened when there is something to send; one that carried nothing
    #: either way for this many seconds is closed (0: never), which is no failure of the peer
    peer_idle_s: float = 30.0
    #: open channels to peers at most (dialed and accepted); past it the least recently used
    #: one with no request under way is closed (0: no cap)
    max_peer_channels: int = 64
    #: mutual TLS for every connection, clients' and peers'; None: plain TCP
    tls: TLSConfig | None = None
    #: the fraction of jobs this worker traces as their ingress (a client's ``trace=True``
    #: traces a job whatever it is); their traces are kept, the last ``trace_keep`` of them
    trace_sample: float = 0.01
    trace_keep: int = 512
    #: export job and task spans of traced jobs by OTLP/HTTP to this URL (``compass[otel]``);
    #: None: no OpenTelemetry export
    otel_endpoint: str | None = None
    #: partial outputs a streamed job's step-wise sink may make ahead of its caller's reading
    #: (a task running on the job's ingress); then its next step waits for the caller
    stream_window: int = 8
    #: seconds one step may wait for the caller to read before the job fails (StreamOverrun):
    #: a caller that stopped reading holds a lane no longer than this
    stream_stall_s: float = 30.0
    #: the utilization-by-size table ``compass_desired_workers`` sizes with
    #: (:mod:`compass.elastic.table`: ``(workers, utilization)`` points and the share of them
    #: aimed at); empty: one utilization for every size
    capacity: tuple[tuple[int, float], ...] = ()
    capacity_margin: float = 1.0
    #: hot models replicated ahead of need: this worker warms a model when the cluster's rule
    #: (:mod:`compass.elastic.replicate`, over its view) picks it (``--replicate``); None: off,
    #: the default, as in the simulator (measured: docs/RESULTS.md, "Hot-model replication on
    #: by default", and why it is off again after it)
    replicate: ReplicaConfig | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {self.port}")
        _positive(
            self,
            lanes=self.lanes,
            time_scale=self.time_scale,
            max_jobs=self.max_jobs,
            max_job_bytes=self.max_job_bytes,
            max_held_bytes=self.max_held_bytes,
            task_timeout_s=self.task_timeout_s,
            max_stuck_tasks=self.max_stuck_tasks,
            join_timeout_s=self.join_timeout_s,
        )
        self._check_job_bytes()
        if self.capacity or self.capacity_margin != 1.0:
            from compass.elastic.table import Capacity

            Capacity(self.capacity, self.capacity_margin)  # validates them
        if self.keep_answer_bytes < 0:
            raise ConfigError(f"keep_answer_bytes must be >= 0, got {self.keep_answer_bytes}")
        if self.advertise_address:
            advertised, _ = parse_address(self.advertise_address, default_port=0)
            if advertised in ("0.0.0.0", "::"):
                raise ConfigError(
                    f"advertise address {self.advertise_address!r}: peers cannot reach a "
                    "wildcard address; give this host's address as others see it"
                )
        if not 0 <= self.drain_timeout_s < float("inf"):
            raise ConfigError(
                f"WorkerConfig.drain_timeout_s must be a number of seconds >= 0, got "
                f"{self.drain_timeout_s!r}"
            )
        if not 0 <= self.peer_idle_s < float("inf"):  # also refuses nan
            raise ConfigError(
                f"--peer-idle-s must be a number of seconds >= 0 (0: never close an idle "
                f"channel), got {self.peer_idle_s!r}"
            )
        if isinstance(self.max_peer_channels, bool) or not 0 <= self.max_peer_channels <= 1_000_000:
            raise ConfigError(
                f"--max-peer-channels must be 0..1000000 (0: no cap), got "
                f"{self.max_peer_channels!r}"
            )
        if self.host_lanes < 0:
            raise ConfigError(f"WorkerConfig.host_lanes must be >= 0, got {self.host_lanes}")
        if not 0.0 <= self.trace_sample <= 1.0:  # also refuses nan
            raise ConfigError(
                f"WorkerConfig.trace_sample (--trace-sample) must be a fraction in [0, 1], got "
                f"{self.trace_sample!r}"
            )
        if isinstance(self.trace_keep, bool) or not 0 <= self.trace_keep <= 1_000_000:
            raise ConfigError(
                f"WorkerConfig.trace_keep (--trace-keep) must be 0..1000000, got "
                f"{self.trace_keep!r}"
            )
        if self.otel_endpoint is not None and not self.otel_endpoint.startswith(
            ("http://", "https://")
        ):
            raise ConfigError(
                f"--otel-endpoint {self.otel_endpoint!r}: expected an http:// or https:// URL "
                "(an OTLP/HTTP collector, e.g. http://127.0.0.1:4318/v1/traces)"
            )
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics port must be in 0..65535, got {self.metrics_port}")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ConfigError(f"http port must be in 0..65535, got {self.http_port}")
        if not self.http_idle_s > 0:
            raise ConfigError(f"--http-idle-s must be > 0, got {self.http_idle_s}")
        if isinstance(self.stream_window, bool) or not (
            isinstance(self.stream_window, int) and self.stream_window >= 1
        ):
            raise ConfigError(f"--stream-window must be an integer >= 1, got {self.stream_window}")
        if not self.stream_stall_s > 0:
            raise ConfigError(f"--stream-stall-s must be > 0, got {self.stream_stall_s}")
        for address in self.join:
            parse_address(address)

    @property
    def job_bytes(self) -> int:
        """Bytes of one job's inputs this worker takes as ingress: ``max_job_bytes``, or where
        it is None what one frame carries (:func:`frame_carries`: ``limits.max_frame_bytes``
        less :data:`JOB_ENVELOPE_BYTES`), within ``max_held_bytes``."""
        if self.max_job_bytes is not None:
            return self.max_job_bytes
        return min(frame_carries(self.limits.max_frame_bytes), self.max_held_bytes)

    def _check_job_bytes(self) -> None:
        """One job's inputs fit the frame they travel in, and what the ingress holds of all
        jobs' together: a limit past either could never be reached, the job refused by the
        other (the wire's frame limit names no flag), so it is refused here, in one line."""
        frame, one, held = self.limits.max_frame_bytes, self.max_job_bytes, self.max_held_bytes
        if one is None:
            return
        carried = frame_carries(frame)
        if one > carried:
            raise ConfigError(
                f"--max-job-mb {one / MiB:g} is more than one frame carries: a job travels in "
                f"one frame, --max-frame-mb {frame / MiB:g}, which keeps "
                f"{(frame - carried) / MiB:g} MiB for the message around its inputs; give "
                f"--max-job-mb {carried / MiB:g} at most, or raise --max-frame-mb"
            )
        if one > held:
            raise ConfigError(
                f"--max-job-mb {one / MiB:g} is more than --max-held-mb {held / MiB:g}, what "
                "an ingress holds of all its jobs' inputs together: such a job could never be "
                "taken; give --max-job-mb at most --max-held-mb"
            )


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


#: where a simulated worker (compass/sim/) differs from a worker's defaults on purpose, and why:
#: the one place (tests/unit/test_config_sources.py fails on any other difference)
SIM_DIFFERS = {
    "host_lanes": "the paper's execution model: model-less tasks share the GPU lanes; every "
    "simulated figure (docs/RESULTS.md) and the reference runs were measured so "
    "(compass sim --host-lanes 1 models a worker's default)",
    "emulate": "a simulated worker is emulated: its timings are the spec's, never learned",
    "max_jobs": "no admission limit is modelled: every job of the arrivals is planned",
    "max_held_bytes": "no admission limit is modelled: every job of the arrivals is planned",
    "cache.backend": "the cache accounts slabs and holds no bytes",
    "sched.view": "the figures were measured with the mesh; compass sim --view auto models "
    "the bounded view from 64 workers on",
}

_WORKER = WorkerConfig()

#: a simulated worker's configuration, before its ``compass.sim.SimSettings`` apply: a
#: worker's defaults but for :data:`SIM_DIFFERS`
SIM_WORKER = replace(
    _WORKER,
    host_lanes=0,
    emulate=True,
    max_jobs=1 << 62,
    max_held_bytes=1 << 62,
    cache=replace(_WORKER.cache, backend="capacity"),
    sched=replace(_WORKER.sched, view="mesh"),
)
