"""import_torch_soon: a worker imports torch beside its loop, not before it listens."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_torch_is_imported_in_a_thread_of_its_own_once():
    result = _run(
        """
        import sys, threading
        from compass.worker.devices import import_torch_soon

        assert "torch" not in sys.modules
        thread = import_torch_soon()
        assert thread is not None and thread is not threading.current_thread()
        assert thread.daemon  # a worker stopping meanwhile does not wait for it
        thread.join(55)
        assert "torch" in sys.modules
        assert import_torch_soon() is None  # imported already: nothing more to do
        """
    )
    assert result.returncode == 0, result.stderr


def test_a_broken_torch_is_logged_and_the_worker_goes_on():
    result = _run(
        """
        import logging, sys
        import importlib.abc

        class Broken(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "torch":
                    raise ImportError("torch is broken here")
                return None

        sys.meta_path.insert(0, Broken())
        logging.basicConfig(level=logging.INFO)
        from compass.worker.devices import import_torch_soon

        import_torch_soon().join(30)
        print("still here")
        """
    )
    assert result.returncode == 0, result.stderr
    assert "still here" in result.stdout
    assert "importing torch failed" in result.stderr
    assert "torch is broken here" in result.stderr
