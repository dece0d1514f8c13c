"""Membership, sans-IO: who is in the cluster, SWIM failure detection, joins and retries.

:mod:`.table` (the member table), :mod:`.detector` (SWIM probes and suspicion),
:mod:`.events` (their events and decisions), :mod:`.swim` (probe order, piggyback queue,
suspicion timing). The asyncio service that carries their decisions out over channels is
:mod:`compass.worker.membership`. Nothing is imported here: import the module you need.
"""
