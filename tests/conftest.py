"""Settings for the whole suite: how its tests share the processes of ``pytest -n`` (xdist).

``make test`` runs the suite on two processes (``-n 2 --dist loadgroup``). Tests that must run in
one process are put in one group here, so no test file has to know about xdist:

- the tests of a module with a module-scoped fixture (a shared cluster, a built wheel) stay
  together, so that the fixture is built once, not once per process;
- the tests that make network namespaces and fixed addresses in them (``NETNS``) run one after
  another: they share the root namespace's routes and ``/run/netns``.

Without ``-n`` the groups are not made.

Where ``PYTHONDONTWRITEBYTECODE`` is set (as on this project's shared development machine), each
of the several hundred worker and CLI processes the tests start would compile compass and the
modules it imports from source again, and pytest would rewrite every test module again: about a
third of a worker's start. The bytecode is written instead where it litters no source folder,
under ``.pytest_cache/pycache`` (``PYTHONPYCACHEPREFIX``), unless a prefix is set already.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _bytecode_outside_the_sources() -> None:
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = str(ROOT / ".pytest_cache" / "pycache")
    del os.environ["PYTHONDONTWRITEBYTECODE"]
    os.environ["PYTHONPYCACHEPREFIX"] = prefix  # the processes the tests start
    sys.dont_write_bytecode = False  # and this one: its imports and pytest's rewritten tests
    sys.pycache_prefix = prefix


_bytecode_outside_the_sources()

# modules that make network namespaces (tests/integration/netns.py, bench/netns.py)
NETNS = frozenset(
    {
        "tests/integration/test_campaign.py",
        "tests/integration/test_multihost.py",
        "tests/integration/test_multihost_faults.py",
        "tests/integration/test_rejoin.py",
    }
)


def _group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` must run in, or None where any process may run it."""
    path = item.nodeid.split("::", 1)[0]
    if path in NETNS:
        return "netns"
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if any(d.scope in ("module", "package", "class") for d in defs):
            return path
    return None


def _name_the_group_in_the_id(item: pytest.Item, group: str) -> None:
    """``item``'s id ends in ``@group``: how xdist's controller tells a group (``--dist
    loadgroup``). xdist (3.8) appends it itself as ``item._nodeid``, which pytest 9.2 no longer
    reads: it keeps an id in ``item._id``. Unnamed, every group was spread over both processes:
    each module-scoped fixture was built in both, and the NETNS modules ran at once."""
    if not item.nodeid.endswith(f"@{group}") and hasattr(item, "_id"):
        item._id = type(item._id).parse(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks (--dist loadgroup)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    in_a_worker = getattr(config.option, "loadgroup", False)  # set in xdist's worker processes
    for item in items:
        group = _group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            if in_a_worker:
                _name_the_group_in_the_id(item, group)
