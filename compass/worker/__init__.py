"""A worker: its core and the asyncio adapter around it.

The sans-IO core (:mod:`.state`, the worker's rules: events in, instructions out; :mod:`.lanes`,
its queues, lanes and model residency; :mod:`.queue`, :mod:`.jobs`, :mod:`.messages`,
:mod:`.members`) imports no event loop, and the simulator drives it unchanged. The adapter
(:mod:`.server`, with :mod:`.executor`, :mod:`.gossip`, :mod:`.membership`, :mod:`.requests`,
:mod:`.metrics`, :mod:`.process`) carries its instructions out with sockets, threads and
timers. Nothing is imported here: import the module you need.
"""
