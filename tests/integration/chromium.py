"""A real headless browser for tests: Debian's ``chromium``, driven over the DevTools protocol
on a pipe (``--remote-debugging-pipe``: JSON messages, each ended by a NUL byte, written to
its fd 3 and read from its fd 4), so no WebSocket client or other package is needed.

Synchronous: an async test calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Any

#: where Debian installs it (.ci/run installs it there)
CHROMIUM = "/usr/bin/chromium"

FLAGS = (
    "--headless",
    "--no-sandbox",  # as root in a container: chromium's sandbox needs user namespaces
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def chromium_path() -> str | None:
    """The browser, or None where none is installed."""
    if os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    return shutil.which("chromium")


class BrowserError(Exception):
    """The browser answered a command with an error, or went away."""


class Chromium:
    """One headless browser with one page: ``with Chromium(profile) as page: page.open(url)``."""

    def __init__(self, profile: Path, size: tuple[int, int] = (1400, 1000)) -> None:
        path = chromium_path()
        if path is None:
            raise BrowserError(f"no chromium at {CHROMIUM} nor on PATH")
        commands, self._to_browser = os.pipe()
        self._from_browser, answers = os.pipe()
        self.log_path = profile / "chromium.log"
        profile.mkdir(parents=True, exist_ok=True)
        argv = [
            "/bin/bash",  # dash takes one-digit fds only
            "-c",
            # the protocol's fds are 3 (commands) and 4 (answers), whatever ours are
            'exec "$0" "$@" 3<&"$CDP_IN" 4>&"$CDP_OUT"',
            path,
            *FLAGS,
            f"--user-data-dir={profile / 'profile'}",
            f"--window-size={size[0]},{size[1]}",
            "--remote-debugging-pipe",
            "about:blank",
        ]
        env = {**os.environ, "CDP_IN": str(commands), "CDP_OUT": str(answers)}
        with self.log_path.open("wb") as log:
            self._process = subprocess.Popen(
                argv,
                pass_fds=(commands, answers),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        os.close(commands)
        os.close(answers)
        self._buffer = b""
        self._id = 0
        self._session = ""
        self.size = size

    # -- the protocol ---------------------------------------------------------------------------
    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 20.0) -> Any:
        """Run ``method`` (on the page once :meth:`start` attached to it) and return its
        result; events that arrive meanwhile are dropped."""
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if self._session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self._session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._next(deadline, method)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _next(self, deadline: float, method: str) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise BrowserError(f"{method}: no answer in time; see {self.log_path}")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium exited; see {self.log_path}")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        reply: dict[str, Any] = json.loads(message)
        return reply

    def start(self) -> Chromium:
        """Attach to a new page of the window's size."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        width, height = self.size
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )
        return self

    # -- what tests do --------------------------------------------------------------------------
    def open(self, url: str) -> None:
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able)."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} raised: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 10.0, every: float = 0.01) -> float:
        """Seconds until ``expression`` is true in the page (one that raises is false);
        :class:`BrowserError` past ``timeout``."""
        started = time.monotonic()
        # false, not an error, while the page is still loading (no body yet)
        check = f"(() => {{ try {{ return Boolean({expression}); }} catch {{ return false; }} }})()"
        while not self.evaluate(check):
            if time.monotonic() - started > timeout:
                raise BrowserError(f"{expression!r} still false after {timeout:g} s")
            time.sleep(every)
        return time.monotonic() - started

    def screenshot(self, path: Path) -> None:
        """A PNG of the whole page, not only the window."""
        metrics = self.send("Page.getLayoutMetrics")
        content = metrics.get("cssContentSize") or metrics["contentSize"]
        clip = {"x": 0, "y": 0, "width": self.size[0], "height": content["height"], "scale": 1}
        shot = self.send(
            "Page.captureScreenshot",
            {"format": "png", "clip": clip, "captureBeyondViewport": True},
        )
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            if self._process.poll() is None:
                self.send("Browser.close", timeout=5.0)
            self._process.wait(timeout=10)
        except (BrowserError, OSError, subprocess.TimeoutExpired):
            self._process.kill()
            self._process.wait(timeout=10)
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)

    def __enter__(self) -> Chromium:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
