"""The desired worker count on a running worker: :class:`LiveDesired`, sans-IO.

A worker feeds it what its view already holds of every worker (its own state and its peers'
last heartbeats: queue wait, lanes, lanes busy) whenever it is asked (a Prometheus scrape of
``compass_desired_workers``, ``compass status``), and gets :class:`~compass.elastic.rule.
ScaleRule`'s decision. Load is measured as GPU lanes busy: at a job rate ``r`` of ``E``
lane-seconds each, ``r * E`` lanes are busy on average, which is the rule's capacity term
with the rate and ``E`` folded together, so no worker needs the others' arrival counts.
Every worker sees the same heartbeats, so any two agree once a gossip round has spread them
(up to the samples each took: the windows average what it was asked at).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from compass.elastic.rule import Decision, ScaleConfig, ScaleRule, Signals

__all__ = ["LiveDesired", "Seen"]


@dataclass(frozen=True, slots=True)
class Seen:
    """One worker as the view shows it: expected queue wait, lanes, lanes busy."""

    wait_s: float
    lanes: int
    busy: int


class LiveDesired:
    """Samples of the cluster's busy lanes over a short and a long window, and the rule.
    ``slack_s``: the queueing a job can take within its objective (default 1 s)."""

    def __init__(
        self,
        config: ScaleConfig | None = None,
        *,
        slack_s: float = 1.0,
        short_s: float = 30.0,
        long_s: float = 300.0,
    ) -> None:
        self.rule = ScaleRule(config)
        self.slack_s = slack_s
        self.short_s = short_s
        self.long_s = long_s
        self._samples: deque[tuple[float, float]] = deque()
        self.last: Decision | None = None

    def update(self, now: float, workers: Sequence[Seen]) -> Decision:
        """The decision at ``now`` for the serving ``workers`` (this one among them)."""
        busy = float(sum(w.busy for w in workers))
        self._samples.append((now, busy))
        while self._samples and self._samples[0][0] < now - self.long_s:
            self._samples.popleft()
        short = [b for t, b in self._samples if t >= now - self.short_s]
        lanes = max(1, round(sum(w.lanes for w in workers) / max(1, len(workers))))
        signals = Signals(
            now=now,
            current=len(workers),
            rate_short=sum(short) / len(short),
            rate_long=sum(b for _, b in self._samples) / len(self._samples),
            lane_s_per_job=1.0,  # the rate is already in busy lanes
            lanes=lanes,
            waits={0: [w.wait_s for w in workers]},
            slack_s=self.slack_s,
        )
        self.last = self.rule.decide(signals)
        return self.last
