"""View gossip, sans-IO: the bounded view's watches, leases and rumors (:mod:`.spread`).

The asyncio loop that sends and receives states is :mod:`compass.worker.gossip`. Nothing is
imported here: import the module you need.
"""
