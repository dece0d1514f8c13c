"""How often a worker may gossip its state."""

from __future__ import annotations

import pytest

from compass.worker.membership import gossip_gap_s


def test_small_clusters_gossip_at_the_least_gap() -> None:
    assert gossip_gap_s(0.001, 0, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 4, 20000.0) == 0.001
    assert gossip_gap_s(0.001, 20, 20000.0) == pytest.approx(0.001)


def test_large_clusters_space_heartbeats_to_keep_the_message_rate() -> None:
    for peers in (40, 100, 239):
        gap = gossip_gap_s(0.001, peers, 20000.0)
        assert gap > 0.001
        assert peers / gap == pytest.approx(20000.0)  # messages a second, over all peers
