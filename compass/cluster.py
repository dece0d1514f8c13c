"""A local cluster of worker processes on loopback, for ``compass up``, tests and benchmarks."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from compass.client import Client
from compass.config import TLSConfig
from compass.errors import CompassError, CompassTimeout, ConfigError
from compass.supervisor import Supervisor

__all__ = ["LocalCluster", "WorkerProcess"]

LISTENING = "compass worker listening on "

log = logging.getLogger("compass.cluster")


class WorkerProcess:
    """One ``compass worker start`` subprocess."""

    def __init__(
        self,
        name: str,
        process: asyncio.subprocess.Process,
        log_path: Path,
        argv: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.process = process
        self.log_path = log_path
        #: the command it was started with (a restart runs it again, bound to the same port)
        self.argv = list(argv)
        self.address = ""
        #: the reader of its stdout past the address (a full pipe would block the worker)
        self._tasks = Supervisor(f"worker process {name}", log)

    async def read_address(self, timeout: float) -> str:
        assert self.process.stdout is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:  # an app module may print before the worker listens: skip its lines
            try:
                line = await asyncio.wait_for(
                    self.process.stdout.readline(), max(deadline - loop.time(), 0.0)
                )
            except TimeoutError:
                raise CompassTimeout(
                    f"worker {self.name} did not start within {timeout:.0f} s; see {self.log_path}"
                ) from None
            if not line:
                break
            text = line.decode(errors="replace").strip()
            if text.startswith(LISTENING):
                self.address = text[len(LISTENING) :]
                # read to the end, not cancelled, when it stops: the pipe ends as it exits
                self._tasks.spawn(self._drain_stdout(), f"{self.name}-stdout", finish=True)
                return self.address
        # stdout closed: the worker exited, and says why in one line, the last of its log
        try:
            code = await asyncio.wait_for(self.process.wait(), max(deadline - loop.time(), 1.0))
        except TimeoutError:
            raise CompassTimeout(
                f"worker {self.name} closed its stdout without listening; see {self.log_path}"
            ) from None
        lines = self.log_path.read_text(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit code {code}"
        raise CompassError(
            f"worker {self.name} failed to start: {reason} (log: {self.log_path.resolve()})"
        )

    async def _drain_stdout(self) -> None:
        assert self.process.stdout is not None
        while await self.process.stdout.read(65536):
            pass

    @property
    def running(self) -> bool:
        return self.process.returncode is None

    def kill(self) -> None:
        """SIGKILL: the worker gets no chance to say goodbye (failure tests)."""
        if self.running:
            self.process.kill()

    async def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (the worker drains, then leaves), then SIGKILL after ``timeout``; returns
        the exit code."""
        if self.running:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            self.process.kill()
            code = await self.process.wait()
        await self._tasks.aclose()  # a failure of its stdout's reader is logged, not raised
        return code


class LocalCluster:
    """``workers`` worker processes on 127.0.0.1, joined into one cluster.

    ``args`` are passed to every ``compass worker start`` (``--workload``, ``--policy``, ...).
    ``tls``: every worker serves (and dials its peers) with this certificate, and the cluster's
    own clients present it too.
    """

    def __init__(
        self,
        workers: int,
        *,
        token: str | None = None,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_dir: str | Path | None = None,
        startup_timeout: float = 60.0,
        host: str = "127.0.0.1",
        tls: TLSConfig | None = None,
    ) -> None:
        if workers < 1:
            raise ConfigError(f"a cluster needs at least one worker, got {workers}")
        self.size = workers
        self.token = token if token is not None else secrets.token_hex(16)
        self.args = list(args)
        self.env = env
        self.host = host
        self.tls = tls
        self.startup_timeout = startup_timeout
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if log_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="compass-cluster-")
            log_dir = self._tmp.name
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.workers: list[WorkerProcess] = []

    @property
    def addresses(self) -> list[str]:
        return [w.address for w in self.workers]

    async def start(self) -> LocalCluster:
        try:
            first = await self.spawn("w0")
            await asyncio.gather(
                *(self.spawn(f"w{i}", join=first.address) for i in range(1, self.size))
            )
            await self.wait_joined()
        except BaseException:
            await self.aclose()
            raise
        return self

    async def spawn(
        self, name: str, join: str | None = None, extra: Sequence[str] = (), port: int = 0
    ) -> WorkerProcess:
        """Start one more worker (joined to ``join``, on ``port``: 0 for any free one) and
        wait until it listens."""
        argv = [
            sys.executable,
            "-m",
            "compass",
            "worker",
            "start",
            "--host",
            self.host,
            "--port",
            str(port),
            "--name",
            name,
            *self.args,
            *extra,
        ]
        if self.tls is not None:
            argv += ["--tls-cert", self.tls.cert, "--tls-key", self.tls.key]
            argv += ["--tls-ca", self.tls.ca]
        if join:
            argv += ["--join", join]
        return await self._start(name, argv)

    async def restart(self, index: int, *, kill: bool = False) -> WorkerProcess:
        """Stop worker ``index`` and start it again as a supervisor would: the same name, port
        and flags. ``kill``: SIGKILL (a crash) instead of SIGTERM (a drain, waited for)."""
        old = self.workers[index]
        if kill:
            old.kill()
        await old.stop()
        port = old.address.rsplit(":", 1)[1]
        argv = list(old.argv)
        argv[argv.index("--port") + 1] = port
        return await self._start(old.name, argv, index=index)

    async def _start(self, name: str, argv: list[str], index: int | None = None) -> WorkerProcess:
        env = dict(os.environ if self.env is None else self.env)
        env["COMPASS_TOKEN"] = self.token
        env.setdefault("PYTHONUNBUFFERED", "1")
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("ab") as log:  # opening a local log file is instant
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                stdin=asyncio.subprocess.DEVNULL,
                env=env,
            )
        worker = WorkerProcess(name, process, log_path, argv)
        if index is None:
            self.workers.append(worker)
        else:
            self.workers[index] = worker
        await worker.read_address(self.startup_timeout)
        return worker

    async def wait_joined(self, timeout: float | None = None) -> None:
        """Wait until every running worker is connected to, and has had a heartbeat from, every
        other running worker (so that its first plan already sees the whole cluster)."""
        deadline = asyncio.get_running_loop().time() + (timeout or self.startup_timeout)
        live = [w for w in self.workers if w.running]
        delay = 0.01
        for worker in live:
            async with Client(worker.address, token=self.token, tls=self.tls) as client:
                while True:
                    status = await client.status()
                    if len(status.peers) >= len(live) - 1 and len(status.cluster) >= len(live):
                        break
                    if asyncio.get_running_loop().time() > deadline:
                        raise CompassTimeout(
                            f"worker {worker.name} sees {len(status.peers)} of "
                            f"{len(live) - 1} peers after startup"
                        )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 0.2)

    async def aclose(self) -> list[int]:
        codes = list(await asyncio.gather(*(w.stop() for w in self.workers)))
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        return codes

    def client(self, index: int = 0) -> Client:
        return Client(self.workers[index].address, token=self.token, tls=self.tls)

    async def __aenter__(self) -> LocalCluster:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
