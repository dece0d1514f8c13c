"""Import hygiene: sans-IO modules load without an event loop or torch; the package is lazy.

Each check runs in a fresh interpreter, since this one has long since imported everything.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import compass

REPO = Path(__file__).resolve().parents[2]

SANS_IO = [
    "compass.wire.frames",
    "compass.wire.protocol",
    "compass.wire.codec",
    "compass.sched.planner",
    "compass.cache.policy",
    "compass.worker.state",
]


def loaded_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``statement``."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(modules)


@pytest.mark.parametrize("module", SANS_IO)
def test_a_sans_io_module_imports_neither_asyncio_nor_torch(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} does not exist yet")
    loaded = loaded_after(f"import {module}")
    assert module in loaded
    assert "asyncio" not in loaded
    assert "torch" not in loaded


def test_importing_compass_imports_nothing_heavy() -> None:
    loaded = loaded_after("import compass")
    assert {"asyncio", "torch", "numpy", "compass.app", "compass.client"}.isdisjoint(loaded)


def test_the_channel_and_the_handler_table_do_not_import_each_other() -> None:
    # the callback types live in compass.wire.handlers, which both of them import
    assert "compass.wire.channel" not in loaded_after("import compass.wire.rpc")
    handlers_only = loaded_after("import compass.wire.handlers")
    assert {"compass.wire.channel", "compass.wire.rpc", "asyncio"}.isdisjoint(handlers_only)


def test_lazy_names_resolve_to_the_defining_objects() -> None:
    from compass.app import App
    from compass.client import Client
    from compass.errors import CompassError

    assert compass.Client is Client
    assert compass.App is App
    assert compass.CompassError is CompassError
    assert compass.__version__ == "0.1.0"


def test_a_lazy_name_resolves_in_a_fresh_interpreter() -> None:
    loaded = loaded_after(
        "import compass\nassert compass.Client.__name__ == 'Client'\n"
        "assert compass.App.__name__ == 'App'"
    )
    assert {"compass.client", "compass.app"} <= loaded


def test_dir_lists_every_public_name() -> None:
    assert set(compass.__all__) <= set(dir(compass))


def test_an_unknown_name_is_a_clear_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'compass' has no attribute 'Clinet'"):
        _ = compass.Clinet
    with pytest.raises(ImportError, match="cannot import name 'Clinet'"):
        exec("from compass import Clinet", {})


def test_the_transport_module_re_exports_the_split_modules() -> None:
    from compass.wire import channel, eventloop, handlers, rpc, tcp, transport

    homes = (channel, eventloop, handlers, tcp)
    for name in transport.__all__:
        assert any(getattr(home, name, None) is getattr(transport, name) for home in homes), name
    assert rpc.Immediate is handlers.Immediate
