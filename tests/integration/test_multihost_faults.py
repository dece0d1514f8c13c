"""Twelve workers on three hosts with mutual TLS, through a SIGKILL and a partition, while a
client streams jobs (issue 24, item 5).

Hosts 1 to 3 are network namespaces (:mod:`tests.integration.netns`) at 10.203.0.1-3 with four
workers each, on ports 7341-7344, started at once with the same ``--join 10.203.0.1:7341``, as
the recipes in deploy/ run them (each binds as one of the recipes does: the host's address,
0.0.0.0 advertising it, or 0.0.0.0 advertising nothing). Every connection is mutual TLS, with
certificates of a CA made for the test, and the workload is the paper's, emulated at 1/50 of
its time under round robin (:data:`~tests.integration.test_multihost.EMULATED`), with the
default failure detector: thirteen processes on a 2-core machine starve its 100 ms probe
timeout now and then, and the false suspicions that makes, and the links they break
(compass/core/links.py), are part of what is tested. A fourth
namespace is the client's host; run there as ``python -m tests.integration.test_multihost_faults
SETUP`` this module is the client. It waits until every worker sees every other, then streams
jobs, one every :data:`STREAM_GAP_S`, through ingresses on every host (each of its clients
fails over to the next worker), and asks the test (a JSON line on its stdout, answered on its
stdin) for the faults:

1. SIGKILL :data:`VICTIM`, a worker of host 2, an ingress of the stream; it watches every
   other worker drop it;
2. cut host 3 off from hosts 1 and 2 (:meth:`~tests.integration.netns.Hosts.cut`: routes that
   drop every packet between them, both ways, while the client's host still reaches all three)
   and watch the cluster split: no worker of hosts 1 and 2 has one of host 3 as a peer or in
   its view, nor one of host 3 one of theirs;
3. :data:`PARTITION_S` after the cut, heal it, and watch every worker see every other again.

The stream stops once healing is asked. Then jobs through one ingress on each host must
complete and use workers on all three hosts. The client prints what it saw as one JSON line and
the test checks it: every job answered once within its bound (its result, whole, or an error
saying the worker was lost: none hung), every job a worker answered answered once (counted by
job id and by the client's key over the answer records of every surviving worker), the killed
worker dropped everywhere within :data:`DROPPED_WITHIN_S`, the partition split and then rejoined
within its bounds, and no worker counted an internal error.

The test ends every process it started, also on failure (what is left when the test is cut
short, :func:`tests.integration.netns.hosts` kills), and deletes the namespaces, which takes
their links and routes with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trustme

from compass import Client
from compass.cluster import WorkerProcess
from compass.config import TLSConfig
from compass.errors import CompassError
from compass.reports import WorkerStatus

from . import netns
from .netns import Hosts, compass_command
from .test_faults import _sink_bytes
from .test_multihost import EMULATED, PAPER_FLOWS
from .test_rejoin import _cluster, _peers, _statuses, _whole
from .test_tls import _flags, _issue

ROOT = Path(__file__).resolve().parents[2]
SUBNET = "10.203.0"
HOSTS = 3
PER_HOST = 4
CLIENT_HOST = HOSTS  # the namespace after the workers' hosts
PORT = 7341
#: SIGKILLed: a worker of host 2 (not the first, so the seed and host 2's first stay)
VICTIM = "h2w1"
#: the host cut off from the others (index 2: host 3)
ISOLATED = 2
#: the stream: a job every STREAM_GAP_S until healing is asked, at most STREAM_MAX_JOBS
STREAM_GAP_S = 0.1
STREAM_MAX_JOBS = 300
#: jobs answered before the kill, so that the kill and the cut fall among jobs in flight
WARM_JOBS = 20
#: how long host 3 stays cut off (at least; from the cut)
PARTITION_S = 4.0
#: jobs through each of three ingresses (one a host) after healing
HEALED_JOBS = 8
#: a job's answer: a submission's own timeout, and the bound of its whole call (failovers
#: included). The faults delay a job by a few seconds at most (a peer's death is declared
#: within the peer timeout, 2 s, and held messages give up after 2 s); past these it hung.
JOB_TIMEOUT_S = 25.0
JOB_BOUND_S = 40.0
#: the detector's budget is about a second (docs/ARCHITECTURE.md, Failure detection); these
#: leave room for a busy 2-core machine running thirteen processes
DROPPED_WITHIN_S = 10.0
SPLIT_WITHIN_S = 20.0
#: a lost peer is retried on a backoff capped at 5 s, from both sides
REJOINED_WITHIN_S = 30.0
#: every worker sees every other before the stream starts
JOINED_WITHIN_S = 60.0
POLL_S = 0.2
#: errors that say a job was hit by a lost worker: what a client may answer with here
#: (WorkersLost: its ingress planned it again too often, and answered it)
LOST_WORKER_ERRORS = {"WorkerUnavailable", "WorkersLost", "ConnectionLost", "ConnectFailed"}


def _host(name: str) -> int:
    """The host (1 to 3) of worker ``hHwK``."""
    return int(name[1])


def _address(hosts: Hosts, name: str) -> str:
    """Where worker ``hHwK`` listens: host H's address, port 7341 + K."""
    return f"{hosts.address(_host(name) - 1)}:{PORT + int(name[3])}"


def _ingress(job_id: str) -> str:
    """The worker a job id names as its ingress (``NAME-INSTANCE-N``)."""
    return job_id.rsplit("-", 2)[0]


# -- the client, run on its own host -------------------------------------------------------------


class _Faults:
    """The client's side of the line protocol: ask the test for a fault (a JSON line on
    stdout), wait until it says ``done`` (on stdin)."""

    def __init__(self) -> None:
        self._stdin: asyncio.StreamReader | None = None
        self._pipe: asyncio.BaseTransport | None = None

    async def ask(self, fault: str) -> float:
        """Ask for ``fault``; the time the test said it was done."""
        if self._stdin is None:
            self._stdin = asyncio.StreamReader()
            protocol = asyncio.StreamReaderProtocol(self._stdin)
            loop = asyncio.get_running_loop()
            self._pipe, _ = await loop.connect_read_pipe(lambda: protocol, sys.stdin)
        print(json.dumps({"ask": fault}), flush=True)
        line = await asyncio.wait_for(self._stdin.readline(), 30.0)
        if line.strip() != b"done":
            raise RuntimeError(f"the test answered {line!r} to {fault!r}")
        return time.monotonic()

    def close(self) -> None:
        if self._pipe is not None:
            self._pipe.close()


def _say(text: str) -> None:
    print(f"[client {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


async def _poll(
    clients: Sequence[Client], ready: Callable[[list[WorkerStatus]], bool], limit_s: float
) -> tuple[float | None, list[WorkerStatus]]:
    """Statuses of ``clients``' workers until ``ready(statuses)``: the seconds it took (None
    past ``limit_s``) and the last statuses. A worker that does not answer in time counts as
    not ready."""
    t0 = time.monotonic()
    statuses: list[WorkerStatus] = []
    while True:
        with contextlib.suppress(CompassError):
            statuses = await _statuses(clients)
            if ready(statuses):
                return time.monotonic() - t0, statuses
        if time.monotonic() - t0 > limit_s:
            return None, statuses
        await asyncio.sleep(POLL_S)


def _views(statuses: Sequence[WorkerStatus]) -> dict[str, dict[str, list[str]]]:
    return {s.name: {"peers": _peers(s), "view": _cluster(s)} for s in statuses}


def _split(sides: Sequence[set[str]]) -> Callable[[list[WorkerStatus]], bool]:
    """No worker has a worker of another side as a peer or in its view. (Not that each sees
    its whole side: on a busy machine a peer may be suspected for a moment, which is not
    what the cut shows.)"""

    def ready(statuses: list[WorkerStatus]) -> bool:
        for status in statuses:
            (side,) = [s for s in sides if status.name in s]
            if not set(_peers(status) + _cluster(status)) <= side:
                return False
        return True

    return ready


class _Stream:
    """Jobs submitted through ``clients`` in turn, each answered once: its outcome."""

    def __init__(self, clients: Sequence[Client], names: Sequence[str]) -> None:
        self.clients = clients
        self.names = names
        self.outcomes: list[dict[str, Any]] = []
        self.answered = 0
        #: set once WARM_JOBS are answered
        self.warm = asyncio.Event()
        self._payload = np.zeros(1000, dtype=np.uint8)

    async def job(self, i: int, via: int, phase: str) -> None:
        flow = PAPER_FLOWS[i % len(PAPER_FLOWS)]
        outcome: dict[str, Any] = {"i": i, "phase": phase, "flow": flow, "via": self.names[via]}
        self.outcomes.append(outcome)
        t0 = time.monotonic()
        outcome["at"] = t0
        try:
            answer = await asyncio.wait_for(
                self.clients[via].submit_job(flow, data=self._payload, timeout=JOB_TIMEOUT_S),
                JOB_BOUND_S,
            )
        except TimeoutError as exc:  # CompassTimeout included: no answer within its bound
            outcome.update(ok=False, hung=True, error=type(exc).__name__, message=str(exc))
            outcome["ingress"] = self.clients[via].address  # where it waited
        except CompassError as exc:
            outcome.update(ok=False, error=type(exc).__name__, message=str(exc), job=exc.job_id)
        else:
            value = answer.value
            outcome.update(
                ok=True,
                job=answer.job_id,
                bytes=value.nbytes if isinstance(value, np.ndarray) else None,
            )
        outcome["s"] = time.monotonic() - t0
        self.answered += 1
        if self.answered >= WARM_JOBS:
            self.warm.set()

    async def run(self, stop: asyncio.Event) -> None:
        """A job every :data:`STREAM_GAP_S` until ``stop``, at most :data:`STREAM_MAX_JOBS`;
        returns when every one is answered."""
        async with asyncio.TaskGroup() as group:
            for i in range(STREAM_MAX_JOBS):
                if stop.is_set():
                    break
                group.create_task(self.job(i, i % len(self.clients), "stream"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), STREAM_GAP_S)


async def _faults_while_streaming(
    setup: Mapping[str, Any],
    faults: _Faults,
    watch: Mapping[str, Client],
    stream: _Stream,
    stop: asyncio.Event,
    report: dict[str, Any],
) -> None:
    """The kill, the cut and the heal, each watched until every worker shows it; stops at the
    first that does not show within its bound (``report`` says which)."""
    victim = setup["victim"]
    isolated = {name for name in watch if _host(name) == ISOLATED + 1}
    survivors = [name for name in watch if name != victim]
    others = set(survivors) - isolated
    alive = [watch[name] for name in survivors]

    with contextlib.suppress(TimeoutError):  # it goes on regardless: the checks will tell
        await asyncio.wait_for(stream.warm.wait(), JOB_BOUND_S)
    await faults.ask("kill")
    _say(f"{victim} killed with {len(stream.outcomes) - stream.answered} jobs in flight")

    def dropped(statuses: list[WorkerStatus]) -> bool:
        return all(victim not in _peers(s) + _cluster(s) for s in statuses)

    report["dropped_s"], statuses = await _poll(alive, dropped, DROPPED_WITHIN_S)
    if report["dropped_s"] is None:
        report["views"] = _views(statuses)
        return
    _say(f"{victim} dropped by every worker {report['dropped_s']:.2f} s after the kill")

    cut_at = await faults.ask("cut")
    try:
        report["split_s"], statuses = await _poll(alive, _split([others, isolated]), SPLIT_WITHIN_S)
        if report["split_s"] is None:
            report["views"] = _views(statuses)
            return
        _say(f"split in two {report['split_s']:.2f} s after the cut")
        await asyncio.sleep(max(0.0, PARTITION_S - (time.monotonic() - cut_at)))
    finally:
        healed_at = await faults.ask("heal")
        report["cut_s"] = healed_at - cut_at
        stop.set()
    report["rejoined_s"], statuses = await _poll(
        alive, _whole(sorted(survivors)), REJOINED_WITHIN_S
    )
    if report["rejoined_s"] is None:
        report["views"] = _views(statuses)
        return
    _say(f"whole again {report['rejoined_s']:.2f} s after healing")


async def scenario(setup: Mapping[str, Any]) -> dict[str, Any]:
    """What the test checks, as seen from the client's host (the token from COMPASS_TOKEN)."""
    token = setup["token"]
    tls = TLSConfig(*setup["tls"])
    addresses: dict[str, str] = setup["addresses"]
    names = list(addresses)
    victim = setup["victim"]
    survivors = [name for name in names if name != victim]
    report: dict[str, Any] = {}
    # one client a worker to watch it; one a worker to submit through it first, then the
    # next worker and on (failover)
    watch = {name: Client(addresses[name], token=token, tls=tls) for name in names}
    order = [addresses[name] for name in names]
    submit = [Client(order[i:] + order[:i], token=token, tls=tls) for i in range(len(order))]
    stream = _Stream(submit, names)
    faults = _Faults()
    try:
        report["joined_s"], statuses = await _poll(
            list(watch.values()), _whole(names), JOINED_WITHIN_S
        )
        if report["joined_s"] is None:
            report["views"] = _views(statuses)
            return report
        _say(f"{len(names)} workers see each other after {report['joined_s']:.2f} s")
        stop = asyncio.Event()
        t0 = time.monotonic()
        async with asyncio.TaskGroup() as group:
            streaming = group.create_task(stream.run(stop))
            try:
                await _faults_while_streaming(setup, faults, watch, stream, stop, report)
            finally:
                stop.set()
            await streaming
        report["stream_s"] = time.monotonic() - t0
        _say(f"stream of {len(stream.outcomes)} jobs answered after {report['stream_s']:.1f} s")
        if report.get("rejoined_s") is not None:
            # through the first worker of each host: every plan deals tasks to all eleven
            firsts = [names.index(f"h{h + 1}w0") for h in range(HOSTS)]
            start = len(stream.outcomes)
            await asyncio.gather(
                *(
                    stream.job(start + k * HEALED_JOBS + j, via, "healed")
                    for k, via in enumerate(firsts)
                    for j in range(HEALED_JOBS)
                )
            )
        alive = [watch[name] for name in survivors]
        after = await _statuses(alive)
        report["internal_errors"] = {s.name: s.stats["internal_errors"] for s in after}
        report["jobs_in_flight"] = {s.name: s.jobs_in_flight for s in after}
        records = await asyncio.gather(*(c.records() for c in alive))
        report["records"] = {
            name: [
                {k: r.to_json()[k] for k in ("job", "key", "ok", "plan", "attempts")} for r in kept
            ]
            for name, kept in zip(survivors, records, strict=True)
        }
    finally:
        faults.close()
        for client in [*watch.values(), *submit]:
            await client.aclose()
    report["outcomes"] = stream.outcomes
    return report


def main(argv: Sequence[str]) -> None:
    """``python -m tests.integration.test_multihost_faults SETUP``: prints :func:`scenario`'s
    report as the last line of its stdout (SETUP: JSON, the token from COMPASS_TOKEN)."""
    setup = {**json.loads(argv[0]), "token": os.environ["COMPASS_TOKEN"]}
    report = asyncio.run(scenario(setup))
    print(json.dumps({"report": report}), flush=True)


# -- the test ------------------------------------------------------------------------------------


def _pki(folder: Path) -> tuple[TLSConfig, TLSConfig]:
    """Certificates for the workers and for the client, of one CA made here."""
    folder.mkdir()
    ca = trustme.CA()
    ca_path = folder / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    hosts = [f"{SUBNET}.{h + 1}" for h in range(HOSTS)]
    worker = _issue(ca, folder, "worker", *hosts)
    client = _issue(ca, folder, "client", "client.compass.test")
    return TLSConfig(*worker, ca=str(ca_path)), TLSConfig(*client, ca=str(ca_path))


def _worker_argv(hosts: Hosts, h: int, k: int, tls: TLSConfig) -> list[str]:
    address, port = hosts.address(h), str(PORT + k)
    how = [
        ["--host", address],  # systemd: bind the host's address
        ["--host", "0.0.0.0", "--advertise-address", f"{address}:{port}"],  # Kubernetes
        ["--host", "0.0.0.0"],  # a container: its primary address
    ][(h + k) % 3]  # fmt: skip
    return [
        *compass_command(), "worker", "start", *EMULATED, *_flags(tls), *how,
        "--name", f"h{h + 1}w{k}", "--port", port, "--join", f"{hosts.address(0)}:{PORT}",
        "--join-timeout", "60", "--drain-timeout", "2", "--log-level", "info",
    ]  # fmt: skip


async def _start_workers(
    hosts: Hosts, tls: TLSConfig, env: dict[str, str], log_dir: Path, into: list[WorkerProcess]
) -> None:
    """Every worker at once (the others wait for the seed), each in ``into`` as it starts."""
    for h in range(HOSTS):
        for k in range(PER_HOST):
            name = f"h{h + 1}w{k}"
            log_path = log_dir / f"{name}.log"
            with log_path.open("ab") as log:
                process = await hosts.spawn(
                    h, _worker_argv(hosts, h, k, tls), env=env,
                    stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL,
                )  # fmt: skip
            into.append(WorkerProcess(name, process, log_path))
    await asyncio.gather(*(w.read_address(60.0) for w in into))


async def _serve_client(
    client: asyncio.subprocess.Process,
    faults: Mapping[str, Callable[[], None]],
    limit_s: float,
) -> dict[str, Any] | None:
    """Carry out the faults the client asks for; its report (None if it ended without one)."""
    assert client.stdout is not None and client.stdin is not None
    deadline = time.monotonic() + limit_s
    while True:
        line = await asyncio.wait_for(client.stdout.readline(), deadline - time.monotonic())
        if not line:
            return None
        message = json.loads(line)
        if "report" in message:
            report: dict[str, Any] = message["report"]
            return report
        faults[message["ask"]]()
        client.stdin.write(b"done\n")
        await client.stdin.drain()


def _log_tails(log_dir: Path, lines: int = 15) -> str:
    parts = []
    for path in sorted(log_dir.glob("*.log")):
        tail = path.read_text(errors="replace").strip().splitlines()[-lines:]
        parts.append(f"--- {path.name}\n" + "\n".join(tail))
    return "\n".join(parts)


def _check(report: Mapping[str, Any], where: Path) -> str:
    """Assert what the report shows (``where``: the workers' logs); returns a summary."""
    views = report.get("views")
    logs = f"(the workers' logs and the client's report are in {where})"
    assert report["joined_s"] is not None, f"never joined: {views}"
    assert report.get("dropped_s") is not None, (
        f"{VICTIM} not dropped by every worker within {DROPPED_WITHIN_S} s: {views}"
    )
    assert report.get("split_s") is not None, (
        f"host 3 cut off, but the views did not split within {SPLIT_WITHIN_S} s: {views}"
    )
    assert report.get("rejoined_s") is not None, (
        f"not whole again within {REJOINED_WITHIN_S} s of healing: {views}\n"
        f"{_log_tails(where)}\n{logs}"
    )

    outcomes = report["outcomes"]
    records = [r for kept in report["records"].values() for r in kept]
    # every job answered once: one outcome each, its call ended within its bound
    assert Counter(o["i"] for o in outcomes) == Counter(range(len(outcomes)))
    hung = [o for o in outcomes if o.get("hung")]
    if hung:
        # A hung job's id is not known here, but its ingress kept a record when the
        # client's timeout cancelled it: the records no client answer names.
        answered_ids = {o.get("job") for o in outcomes}
        unanswered = [r for r in records if r["job"] not in answered_ids]
        pytest.fail(
            f"{len(hung)} jobs had no answer within their bound: {hung[:5]}; their ingresses' "
            f"records (plan, attempts): {unanswered[:5]} {logs}"
        )
    sizes = _sink_bytes()
    wrong = [o for o in outcomes if o["ok"] and o["bytes"] != sizes[o["flow"]]]
    assert not wrong, f"answers that are not their workflow's output: {wrong[:5]}"
    failed = [o for o in outcomes if not o["ok"]]
    unclear = [o for o in failed if o["error"] not in LOST_WORKER_ERRORS]
    assert not unclear, f"jobs failed, not for a lost worker: {unclear[:5]} {logs}"
    healed = [o for o in outcomes if o["phase"] == "healed"]
    assert len(healed) == HOSTS * HEALED_JOBS
    assert all(o["ok"] for o in healed), [o for o in healed if not o["ok"]]

    # every job a worker answered, answered once: the surviving ingresses' answer records,
    # by job id and by the client's key (a key twice would be a job run twice: only a retry
    # after its ingress was lost submits it again, and the killed ingress kept no records)
    by_job = Counter(r["job"] for r in records)
    assert not [j for j, n in by_job.items() if n > 1], by_job.most_common(3)
    by_key = Counter(r["key"] for r in records)
    assert not [k for k, n in by_key.items() if n > 1], by_key.most_common(3)
    # and each is the answer the client got: every job id the client was answered with, of a
    # surviving ingress, has its record, with the same outcome, and no record is of a job no
    # client was answered for
    answered = {
        o["job"]: o["ok"] for o in outcomes if o.get("job") and _ingress(o["job"]) != VICTIM
    }
    kept = {r["job"]: r["ok"] for r in records}
    assert kept == answered, (
        f"records without an answer: {sorted(set(kept) - set(answered))[:5]}, answers "
        f"without a record: {sorted(set(answered) - set(kept))[:5]}, outcomes differing: "
        f"{[j for j in set(kept) & set(answered) if kept[j] != answered[j]][:5]}"
    )

    # after healing, jobs through each host's first worker use workers on all three hosts
    plans = {r["job"]: r["plan"] for r in records}
    for h in range(HOSTS):
        via = f"h{h + 1}w0"
        used = {worker for o in healed if o["via"] == via for worker in plans[o["job"]].values()}
        assert {_host(w) for w in used} == {1, 2, 3}, (via, sorted(used))
    assert set(report["internal_errors"].values()) == {0}, report["internal_errors"]
    phases = Counter(o["phase"] for o in outcomes)
    return (
        f"{phases['stream']} jobs streamed ({len(failed)} answered with an error: "
        f"{dict(Counter(o['error'] for o in failed))}), {phases['healed']} after healing; "
        f"{VICTIM} dropped everywhere {report['dropped_s']:.2f} s after its kill, host 3 split "
        f"off {report['split_s']:.2f} s after the cut ({report['cut_s']:.1f} s cut), whole "
        f"again {report['rejoined_s']:.2f} s after healing"
    )


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_twelve_tls_workers_on_three_hosts_through_a_kill_and_a_partition(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    worker_tls, client_tls = _pki(tmp_path / "pki")
    env = {**worker_env, "COMPASS_TOKEN": secrets.token_hex(16)}
    t0 = time.monotonic()
    with netns.hosts(HOSTS + 1, subnet=SUBNET, prefix="cmf") as hosts:
        workers: list[WorkerProcess] = []
        client: asyncio.subprocess.Process | None = None
        try:
            await _start_workers(hosts, worker_tls, env, tmp_path, workers)
            started_s = time.monotonic() - t0
            by_name = {w.name: w for w in workers}
            others = [h for h in range(HOSTS) if h != ISOLATED]

            def cut() -> None:
                for h in others:
                    hosts.cut(ISOLATED, h)

            def heal() -> None:
                for h in others:
                    hosts.mend(ISOLATED, h)

            faults = {"kill": by_name[VICTIM].kill, "cut": cut, "heal": heal}
            setup = {
                "addresses": {w.name: _address(hosts, w.name) for w in workers},
                "victim": VICTIM,
                "tls": [client_tls.cert, client_tls.key, client_tls.ca],
            }
            with (tmp_path / "client.log").open("wb") as client_log:
                client = await hosts.spawn(
                    CLIENT_HOST,
                    [sys.executable, "-m", "tests.integration.test_multihost_faults",
                     json.dumps(setup)],
                    env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=client_log,
                    cwd=str(ROOT), limit=1 << 24,
                )  # fmt: skip
            report = await _serve_client(client, faults, 180.0)
            code = await asyncio.wait_for(client.wait(), 30.0)
            ran_s = time.monotonic() - t0 - started_s
        finally:
            if client is not None and client.returncode is None:
                client.kill()
                await client.wait()
            t_stop = time.monotonic()
            await asyncio.gather(*(w.stop(timeout=15.0) for w in workers))
            stopped_s = time.monotonic() - t_stop
    client_said = (tmp_path / "client.log").read_text(errors="replace")
    assert code == 0 and report is not None, client_said[-5000:]
    (tmp_path / "report.json").write_text(json.dumps(report, indent=1))
    summary = _check(report, tmp_path)
    print(f"\n{summary}; {time.monotonic() - t0:.1f} s in all: workers up in {started_s:.1f} "
          f"s, the client's run {ran_s:.1f} s, stopped in {stopped_s:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
