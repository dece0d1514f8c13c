"""The answers an ingress keeps for job keys are bounded in keys, bytes and time."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from compass.core.answers import KeptAnswers
from compass.errors import AnswerNotKept, JobFailed

MiB = 1 << 20


def array(mib: int) -> np.ndarray:
    return np.zeros(mib * MiB, dtype=np.uint8)


def test_a_kept_answer_is_given_back_until_it_expires() -> None:
    kept = KeptAnswers(keep_s=10.0)
    kept.put("k", "value", None, now=0.0)
    assert kept.get("k", now=10.0) == ("value", None)
    assert kept.get("k", now=10.5) is None  # forgotten: a resubmission runs again
    assert len(kept) == 0


def test_keys_expire_as_a_scan_of_the_oldest_would_expire_them() -> None:
    # expire() looks at the oldest key only when it may be due: the same keys are forgotten
    # as by looking every time, over random puts (new keys and answered ones again) and gets
    class EveryTime(KeptAnswers):
        def expire(self, now: float) -> None:
            self._oldest_at = -math.inf  # always due: the scan runs every time
            super().expire(now)

    rng = random.Random(7)
    kept, every_time = KeptAnswers(max_keys=50, keep_s=3.0), EveryTime(max_keys=50, keep_s=3.0)
    now = 0.0
    for _ in range(3_000):
        now += rng.choice((0.0, 0.01, 0.5, 2.0, 7.0))
        key = f"k{rng.randrange(80)}"
        if rng.random() < 0.5:
            kept.put(key, 1, None, now)
            every_time.put(key, 1, None, now)
        else:
            assert kept.get(key, now) == every_time.get(key, now)
        assert list(kept._kept) == list(every_time._kept)
    assert len(kept) < 50  # keys were forgotten by time, not only by count


def test_the_oldest_keys_are_forgotten_past_the_count() -> None:
    kept = KeptAnswers(max_keys=3)
    for i in range(5):
        kept.put(f"k{i}", i, None, now=float(i))
    assert len(kept) == 3
    assert kept.get("k1", now=5.0) is None
    assert kept.get("k4", now=5.0) == (4, None)


def test_values_past_the_byte_budget_are_shed_and_their_keys_kept() -> None:
    kept = KeptAnswers(max_bytes=3 * MiB)
    for i in range(5):
        kept.put(f"k{i}", array(1), None, now=float(i))
    assert kept.bytes == 3 * MiB and kept.values == 3 and len(kept) == 5
    # the oldest values went first; their keys still say the job ran, and it is not run again
    value, error = kept.get("k0", now=5.0)  # type: ignore[misc]
    assert value is None and isinstance(error, AnswerNotKept)
    assert "k0" in str(error) and error.detail == {"key": "k0"}
    value, error = kept.get("k4", now=5.0)  # type: ignore[misc]
    assert error is None and value.nbytes == MiB


def test_a_value_larger_than_the_budget_is_never_kept() -> None:
    kept = KeptAnswers(max_bytes=MiB)
    kept.put("small", array(1), None, now=0.0)
    kept.put("big", array(2), None, now=1.0)
    assert kept.bytes == MiB  # the small one stays
    assert isinstance(kept.get("big", now=2.0)[1], AnswerNotKept)  # type: ignore[index]
    assert kept.get("small", now=2.0)[1] is None  # type: ignore[index]


def test_forgetting_or_replacing_a_key_gives_its_bytes_back() -> None:
    kept = KeptAnswers(max_keys=2, max_bytes=10 * MiB, keep_s=100.0)
    kept.put("a", array(2), None, now=0.0)
    kept.put("a", array(1), None, now=1.0)
    assert kept.bytes == MiB
    kept.put("b", array(1), None, now=2.0)
    kept.put("c", array(1), None, now=3.0)  # "a" forgotten by count
    assert kept.bytes == 2 * MiB and kept.values == 2
    kept.expire(now=200.0)
    assert (len(kept), kept.bytes, kept.values) == (0, 0, 0)


@pytest.mark.parametrize("raised", [True, False])
def test_a_kept_error_is_a_new_exception_each_time(raised: bool) -> None:
    """An error raised to a waiter takes a traceback whose frames hold that waiter's locals
    (a job's inputs): the kept one must not be the one raised, nor carry one."""
    kept = KeptAnswers()
    error = JobFailed("task 'a' failed", detail={"job_id": "w0-1"})
    if raised:
        try:
            raise error
        except JobFailed:
            pass
    kept.put("k", None, error, now=0.0)
    first, second = kept.get("k", now=1.0), kept.get("k", now=1.0)
    assert first is not None and second is not None
    assert isinstance(first[1], JobFailed) and first[1] is not error
    assert first[1] is not second[1] and first[1].__traceback__ is None
    assert str(first[1]) == str(error) and first[1].detail == error.detail
