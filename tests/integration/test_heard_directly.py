"""A busy worker is not a dead one (issue 32): a peer whose answers to the failure detector
never come back in time, but whose own heartbeats arrive on its own channel, is running, and
its suspicion does not end in its death. In-process workers over loopback; the peer's deafness
to probes (what a loop too lagged to answer them in time looks like to its peers) is made by
dropping every probe message it receives."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from compass.membership.events import PROBE_OPS
from compass.wire.channel import Channel

from .test_worker_supervised import two_workers, until


def _deaf(channel: Channel, body: Any) -> None:
    """Drops a probe, an ack, a nack or a probe request: never answered, never heard."""


@pytest.mark.asyncio
@pytest.mark.timeout(60)
async def test_a_peer_deaf_to_probes_that_heartbeats_is_suspected_but_never_declared_dead(
    tmp_path: Path,
) -> None:
    async with two_workers(tmp_path) as (w0, w1):
        for op in PROBE_OPS:
            w1.router._notifies[op] = _deaf
        assert w0.membership is not None and w1.membership is not None
        detector = w0.membership.table.detector
        _, longest = detector.probing.suspicion_bounds_s(2)
        await until(lambda: "w1" in detector.suspicions, "w0 suspects w1", 10 * longest)
        # w1 cannot refute (it never hears it is suspected), but it heartbeats every 10 ms:
        # its silence never lasts a suspicion, so it is never declared dead (nor is w0 by
        # w1, which hears no ack either)
        loop = asyncio.get_running_loop()
        end = loop.time() + 3 * longest
        while loop.time() < end:
            assert "w1" in w0.membership.table.live, "w0 declared w1 dead while hearing it"
            assert "w0" in w1.membership.table.live, "w1 declared w0 dead while hearing it"
            await asyncio.sleep(0.02)
        suspicion = detector.suspicions.get("w1")
        assert suspicion is not None and suspicion.heard > suspicion.since
        assert w1.membership.table.incarnation == 0  # it never refuted, nor rejoined
        assert w0.membership.table.members["w1"].incarnation == 0
