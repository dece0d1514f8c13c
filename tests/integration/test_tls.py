"""Mutual TLS between real worker processes and clients, with certificates made per test.

The cluster's CA signs one certificate for the workers (IP SAN 127.0.0.1) and one for the
clients; a second CA, another cluster's, signs a stranger's.
"""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import trustme

from compass import Client
from compass.cluster import LocalCluster
from compass.config import Timeouts, TLSConfig
from compass.errors import CompassError, ConfigError, ConnectFailed
from compass.wire.channel import Channel
from compass.wire.options import ChannelOptions
from compass.wire.tcp import connect, serve

from .conftest import cluster_on_its_own_loop, compass_argv, worker_environment

TOKEN = "tls-test-token-" + "5f0c9a7e3d1b8e2f4a6c0d9b7e1f3a5c"
FAST = Timeouts(connect=5.0, handshake=5.0, request=20.0)

# two tasks in a chain: round_robin puts them on different workers, so the first one's output
# travels between the workers over their TLS connection
APP_SOURCE = """\
import compass

app = compass.App("tls")
chain = app.workflow("chain", inputs=["x"])


@chain.task(expected_ms=1)
def double(model, x):
    return 2 * x


@chain.task(after=["double"], expected_ms=1)
def add_one(model, double):
    return double + 1
"""
APP = ["--app", "tls_app", "--policy", "round_robin", "--host-lanes", "0"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    worker: TLSConfig
    client: TLSConfig
    #: a certificate another cluster's CA signed, with this cluster's CA to verify workers
    stranger: TLSConfig
    #: the stranger's own CA, which did not sign the workers' certificate
    other_ca: Path


def _issue(authority: trustme.CA, folder: Path, name: str, *identities: str) -> tuple[str, str]:
    issued = authority.issue_cert(*identities)
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return str(cert), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    cluster_ca, other_ca = trustme.CA(), trustme.CA()
    ca, other = folder / "ca.pem", folder / "other-ca.pem"
    cluster_ca.cert_pem.write_to_path(str(ca))
    other_ca.cert_pem.write_to_path(str(other))
    worker = _issue(cluster_ca, folder, "worker", "127.0.0.1", "localhost")
    client = _issue(cluster_ca, folder, "client", "client.compass.test")
    stranger = _issue(other_ca, folder, "stranger", "127.0.0.1")
    return Pki(
        ca=ca,
        worker=TLSConfig(*worker, ca=str(ca)),
        client=TLSConfig(*client, ca=str(ca)),
        stranger=TLSConfig(*stranger, ca=str(ca)),
        other_ca=other,
    )


@pytest.fixture(scope="module")
def app_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("app")
    (folder / "tls_app.py").write_text(APP_SOURCE)
    env = worker_environment()
    return {**env, "PYTHONPATH": f"{folder}:{env['PYTHONPATH']}"}


@pytest.fixture(scope="module")
def tls_cluster(pki: Pki, app_env: dict[str, str]) -> Iterator[LocalCluster]:
    """Two workers in mutual TLS, shared by the module's tests that leave them serving (their
    start is most of such a test's time): a test counts from what a status said before it."""
    with cluster_on_its_own_loop(2, APP, env=app_env, token=TOKEN, tls=pki.worker) as cluster:
        yield cluster


async def _tasks_run(cluster: LocalCluster, tls: TLSConfig) -> list[int]:
    counts = []
    for address in cluster.addresses:
        async with Client(address, token=TOKEN, tls=tls, timeouts=FAST) as client:
            counts.append((await client.status()).stats["tasks_run"])
    return counts


def _flags(tls: TLSConfig) -> list[str]:
    return ["--tls-cert", tls.cert, "--tls-key", tls.key, "--tls-ca", tls.ca]


@pytest.mark.asyncio
async def test_a_mutual_tls_cluster_runs_jobs_for_a_tls_client(
    pki: Pki, tls_cluster: LocalCluster
) -> None:
    # LocalCluster waits until the two workers have joined each other: over TLS, both ways
    cluster = tls_cluster
    before = await _tasks_run(cluster, pki.client)
    async with Client(cluster.addresses, token=TOKEN, tls=pki.client, timeouts=FAST) as client:
        assert [await client.submit("chain", x=x, timeout=20) for x in range(6)] == [
            2 * x + 1 for x in range(6)
        ]
    for address in cluster.addresses:
        async with Client(address, token=TOKEN, tls=pki.client.client_context()) as one:
            status = await one.status()
        assert [p["name"] for p in status.peers] == [
            w.name for w in cluster.workers if w.address != address
        ]
    tasks_run = [a - b for a, b in zip(await _tasks_run(cluster, pki.client), before, strict=True)]
    # both workers ran tasks, so outputs crossed between them over TLS
    assert sum(tasks_run) == 12 and min(tasks_run) > 0


@pytest.mark.asyncio
async def test_clients_a_tls_worker_refuses_say_why(pki: Pki, tls_cluster: LocalCluster) -> None:
    no_certificate = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    no_certificate.check_hostname = False
    no_certificate.load_verify_locations(cafile=str(pki.ca))
    address = tls_cluster.addresses[0]
    for tls in (no_certificate, pki.stranger):
        with pytest.raises(ConnectFailed, match="refused this client's TLS certificate"):
            async with Client(address, token=TOKEN, tls=tls, timeouts=FAST) as client:
                await client.ping()
    with pytest.raises(ConnectFailed, match="requires TLS"):
        async with Client(address, token=TOKEN, timeouts=FAST) as client:
            await client.ping()
    # a client that trusts another CA than the one that signed the worker's certificate
    trusting_other = TLSConfig(pki.client.cert, pki.client.key, str(pki.other_ca))
    with pytest.raises(ConnectFailed, match="could not verify the TLS certificate"):
        async with Client(address, token=TOKEN, tls=trusting_other, timeouts=FAST) as client:
            await client.ping()
    # the worker was unharmed by all of that
    async with Client(address, token=TOKEN, tls=pki.client, timeouts=FAST) as client:
        assert await client.submit("chain", x=20, timeout=20) == 41


@pytest.mark.asyncio
async def test_a_tls_client_against_a_plain_worker_says_why(
    pki: Pki, app_env: dict[str, str]
) -> None:
    async with LocalCluster(1, token=TOKEN, args=APP, env=app_env) as cluster:
        with pytest.raises(ConnectFailed, match="serving plain TCP"):
            async with Client(
                cluster.addresses[0], token=TOKEN, tls=pki.client, timeouts=FAST
            ) as client:
                await client.ping()


@pytest.mark.asyncio
async def test_a_plain_worker_cannot_join_a_tls_cluster(
    pki: Pki, app_env: dict[str, str], tls_cluster: LocalCluster
) -> None:
    seed, other = tls_cluster.workers
    plain = await asyncio.create_subprocess_exec(
        *compass_argv("worker", "start", "--port", "0", "--name", "plain", *APP,
                      "--join", seed.address, "--join-timeout", "1"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        env={**app_env, "COMPASS_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        _, stderr = await asyncio.wait_for(plain.communicate(), 60)
    finally:
        if plain.returncode is None:
            plain.kill()
            await plain.wait()
    assert plain.returncode != 0
    assert "could not join the cluster" in stderr.decode()
    async with Client(seed.address, token=TOKEN, tls=pki.client, timeouts=FAST) as client:
        assert [p["name"] for p in (await client.status()).peers] == [other.name]


def test_status_cli_with_tls_flags_and_variables(pki: Pki, app_env: dict[str, str]) -> None:
    worker = subprocess.Popen(
        compass_argv("worker", "start", "--port", "0", "--name", "solo", *APP,
                     *_flags(pki.worker)),
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**app_env, "COMPASS_TOKEN": TOKEN},
    )  # fmt: skip
    try:
        assert worker.stdout is not None
        first = worker.stdout.readline().strip()
        assert first.startswith("compass worker listening on 127.0.0.1:"), first
        address = first.rsplit(" ", 1)[1]

        def status(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                compass_argv("status", address, "--json", "--token", TOKEN, *args),
                capture_output=True, text=True, env={**app_env, **env}, timeout=30,
            )  # fmt: skip

        by_flags = status(*_flags(pki.client))
        assert by_flags.returncode == 0, by_flags.stderr
        assert json.loads(by_flags.stdout)["name"] == "solo"
        by_env = status(
            COMPASS_TLS_CERT=pki.client.cert,
            COMPASS_TLS_KEY=pki.client.key,
            COMPASS_TLS_CA=pki.client.ca,
        )
        assert by_env.returncode == 0, by_env.stderr
        plain = status()
        assert plain.returncode == 1
        assert len(plain.stderr.strip().splitlines()) == 1
        assert "requires TLS" in plain.stderr
        half = status("--tls-cert", pki.client.cert)
        assert half.returncode == 2
        assert half.stderr.strip().endswith("missing --tls-key, --tls-ca")
        submitted = subprocess.run(
            compass_argv("submit", address, "chain", "--input", "x=4", "--token", TOKEN,
                         *_flags(pki.client)),
            capture_output=True, text=True, env=app_env, timeout=30,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        assert submitted.stdout.strip() == "9"
    finally:
        worker.terminate()
        assert worker.wait(timeout=20) == 0
        if worker.stdout is not None:
            worker.stdout.close()


def test_a_worker_with_a_missing_certificate_does_not_start(
    pki: Pki, app_env: dict[str, str], tmp_path: Path
) -> None:
    missing = TLSConfig(str(tmp_path / "nope.pem"), pki.worker.key, pki.worker.ca)
    done = subprocess.run(
        compass_argv("worker", "start", "--port", "0", *APP, *_flags(missing)),
        capture_output=True, text=True, env={**app_env, "COMPASS_TOKEN": TOKEN}, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert "nope.pem" in done.stderr.strip().splitlines()[-1]


def test_tls_config_names_the_file_it_cannot_use(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"TLSConfig\.key must be a file path"):
        TLSConfig(pki.client.cert, "", str(pki.ca))
    with pytest.raises(ConfigError, match=r"TLS CA file '/nonexistent/ca\.pem' not found"):
        TLSConfig(pki.client.cert, pki.client.key, "/nonexistent/ca.pem").client_context()
    # a key that does not match the certificate
    with pytest.raises(ConfigError, match="could not load the TLS certificate"):
        TLSConfig(pki.client.cert, pki.worker.key, str(pki.ca)).server_context()
    with pytest.raises(ConfigError, match="could not load the TLS CA"):
        TLSConfig(pki.client.cert, pki.client.key, __file__).client_context()


@pytest.mark.asyncio
async def test_a_weak_token_is_refused_unless_allowed(app_env: dict[str, str]) -> None:
    with pytest.raises(CompassError, match="token is too weak"):
        async with LocalCluster(1, token="right-token", args=APP, env=app_env):
            pass
    weak = [*APP, "--allow-weak-token"]
    async with (
        LocalCluster(1, token="right-token", args=weak, env=app_env) as cluster,
        cluster.client() as client,
    ):
        assert await client.submit("chain", x=1, timeout=20) == 3


@pytest.mark.asyncio
async def test_check_hostname_checks_the_dialed_address_against_the_sans(pki: Pki) -> None:
    async def echo(channel: Channel, op: str, body: Any) -> Any:
        return body

    def options(name: str, tls: ssl.SSLContext) -> ChannelOptions:
        return ChannelOptions(name=name, token=TOKEN, ssl=tls)

    server = await serve("127.0.0.1", 0, options("w", pki.worker.server_context()), handler=echo)
    try:
        by_san = replace(pki.client, check_hostname=True)
        channel = await connect(server.address, options("c", by_san.client_context()))
        try:
            assert await channel.request("x", 7) == 7
        finally:
            await channel.aclose()
        elsewhere = ("localhost", server.address[1])  # in the SANs too: accepted
        channel = await connect(elsewhere, options("c", by_san.client_context()))
        await channel.aclose()
        # the client's certificate names client.compass.test only: as a server it fails the check
        as_client = TLSConfig(pki.client.cert, pki.client.key, str(pki.ca)).server_context()
        misnamed = await serve("127.0.0.1", 0, options("m", as_client), handler=echo)
        try:
            with pytest.raises(ConnectFailed, match="IP address mismatch"):
                await connect(misnamed.address, options("c", by_san.client_context()))
            # without the check, the CA alone decides
            channel = await connect(misnamed.address, options("c", pki.client.client_context()))
            await channel.aclose()
        finally:
            await misnamed.aclose()
    finally:
        await server.aclose()


def test_compass_up_starts_a_mutual_tls_cluster(
    pki: Pki, app_env: dict[str, str], tmp_path: Path
) -> None:
    up = subprocess.Popen(
        compass_argv("up", "--workers", "2", "--token", TOKEN, "--app", "tls_app",
                     *_flags(pki.worker), "--host-lanes", "0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=app_env, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert up.stdout is not None
        addresses = [up.stdout.readline().split()[1] for _ in range(2)]

        async def peers() -> list[int]:
            counts = []
            for address in addresses:
                async with Client(address, token=TOKEN, tls=pki.client) as client:
                    counts.append(len((await client.status()).peers))
            return counts

        assert asyncio.run(peers()) == [1, 1]
    finally:
        up.send_signal(signal.SIGTERM)
        _, err = up.communicate(timeout=30)
        assert up.returncode == 0, err
