"""The worker core, sans-IO: a worker's rules as events in, instructions out.

:mod:`.state` (:class:`~compass.core.state.WorkerCore`), its events and instructions
(:mod:`.events`, :mod:`.lanes`), the ready queue, the ingress's records and what it refuses
(:mod:`.queue`, :mod:`.jobs`, :mod:`.admission`, :mod:`.answers`, :mod:`.links`), estimates,
typed peer messages, the counters and :func:`~compass.core.assemble.build_core`. Nothing here
does I/O or imports an event loop: the asyncio adapter (:mod:`compass.worker`) and the simulator
(:mod:`compass.sim`) drive it alike. Nothing is imported here: import the module you need.
"""
