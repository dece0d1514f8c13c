"""A worker's asyncio adapter, around the sans-IO worker core (:mod:`compass.core`).

:mod:`.server` (the :class:`~compass.worker.server.Worker`) carries the core's instructions out
with sockets, threads and timers, with :mod:`.executor` (tasks' code), :mod:`.gossip` (the
loops that send states), :mod:`.outbox` (messages to peers), :mod:`.membership` (the
membership service: its member table and :mod:`.peer_channels`), :mod:`.requests` (what
clients and peers may ask) and :mod:`.process`. Nothing is imported here: import the module
you need.
"""
