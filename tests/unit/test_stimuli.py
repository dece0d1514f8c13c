"""The bounded stimulus log both cores keep (:mod:`compass.stimuli`): a ring of the last
``keep`` entries, looked up by what they are about or by their cause id."""

from __future__ import annotations

import pytest

from compass.errors import ConfigError
from compass.stimuli import KEEP_STIMULI, Stimulus, StimulusLog


def entry(i: int, *about: str) -> Stimulus:
    return Stimulus(f"ev#{i}", float(i), f"event {i}", (f"did {i}",), about)


def test_the_log_keeps_the_last_keep_entries_and_drops_the_oldest() -> None:
    log = StimulusLog(keep=3)
    for i in range(10):
        log.add(entry(i, "job-1" if i % 2 else "job-2"))
    assert len(log) == 3  # filled past its bound: the bound holds
    assert [e.cause for e in log] == ["ev#7", "ev#8", "ev#9"]
    # the story of a key: the entries kept that are about it, oldest first
    assert [e.cause for e in log.story("job-1")] == ["ev#7", "ev#9"]
    assert [e.cause for e in log.story("job-2")] == ["ev#8"]
    # a cause id seen in a log line finds its event
    assert [e.event for e in log.story("ev#8")] == ["event 8"]
    assert log.story("ev#1") == [] and log.story("job-3") == []


def test_keep_zero_keeps_nothing_and_a_bad_bound_is_a_config_error() -> None:
    log = StimulusLog(keep=0)
    log.add(entry(1, "j"))
    assert len(log) == 0 and log.story("j") == []
    assert StimulusLog().keep == KEEP_STIMULI
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ConfigError, match="integer >= 0"):
            StimulusLog(keep=bad)  # type: ignore[arg-type]


def test_an_entry_goes_on_the_wire_as_plain_data() -> None:
    wire = entry(4, "b", "a").to_wire()
    assert wire == {"cause": "ev#4", "now": 4.0, "event": "event 4", "did": ["did 4"],
                    "about": ["a", "b"]}  # fmt: skip
