"""collector_eased: the simulator's run freezes what exists and collects the young less often,
and leaves the collector as it found it."""

from __future__ import annotations

import gc
import weakref

import pytest

from compass.sim.collector import EASED_THRESHOLD, collector_eased


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_run_freezes_what_exists_and_restores_the_collector() -> None:
    before = gc.get_threshold()
    assert gc.get_freeze_count() == 0
    with collector_eased():
        assert gc.get_freeze_count() > 0  # the setup is frozen: never rescanned
        assert gc.get_threshold() == (max(EASED_THRESHOLD, before[0]), *before[1:])
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def test_cycles_made_during_the_run_are_still_collected_on_their_own() -> None:
    """Eased, not off: cycles made during the run (well past the threshold's worth of
    allocations) are collected by the collector itself, no gc.collect() called."""
    with collector_eased():
        first = _Cycle()
        gone = weakref.ref(first)
        del first
        for _ in range(3 * EASED_THRESHOLD):
            _Cycle()
        assert gone() is None


def test_it_restores_the_collector_when_the_run_fails() -> None:
    before = gc.get_threshold()
    with pytest.raises(RuntimeError), collector_eased():
        raise RuntimeError("the simulation failed")
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0


def _frozen(obj: object) -> bool:
    """Whether the collector skips ``obj`` (a tracked container): frozen objects are in no
    generation that ``gc.get_objects`` walks. (The frozen count cannot tell: a frozen object
    that another thread lets go of leaves it, as a full test run's leftover threads do.)"""
    return not any(o is obj for o in gc.get_objects())


def test_objects_someone_else_froze_stay_frozen() -> None:
    mine = [object()]
    gc.freeze()
    try:
        assert _frozen(mine)
        with collector_eased():
            assert _frozen(mine)
        assert _frozen(mine)
    finally:
        gc.unfreeze()
    assert not _frozen(mine)
