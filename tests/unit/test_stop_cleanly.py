"""SIGTERM stops a benchmark as Ctrl-C does (``compass._cli.bench.stop_cleanly``): under
``asyncio.Runner`` it cancels the main task rather than raise ``KeyboardInterrupt`` wherever the
main thread is, where it could be swallowed (in a finalizer, or in logging's release after a
fork) and the benchmark run on, deaf to it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal
    from compass._cli.bench import stop_cleanly

    class SignalledInAFinalizer:  # an exception raised in __del__ is printed and ignored
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)

    async def main():
        SignalledInAFinalizer()
        await asyncio.sleep(10)
        print("ran on")

    stop_cleanly()
    try:
        with asyncio.Runner() as runner:
            runner.run(main())
    except KeyboardInterrupt:
        print("stopped")
    """
)


def test_a_sigterm_in_a_finalizer_still_stops_the_benchmark() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.strip() == "stopped", (done.stdout, done.stderr[-2000:])
