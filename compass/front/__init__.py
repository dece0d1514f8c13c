"""The HTTP front door: the Open Inference Protocol (KServe v2) and an OpenAI-compatible API.

A worker started with ``--http-port`` serves them from its own event loop
(:mod:`compass.front.server`, over aiohttp's low-level server); every request becomes a job
submitted at that worker as ingress, exactly like the native client's ``submit``. The
protocols themselves are sans-IO: :mod:`compass.front.tensors` (tensors in and out),
:mod:`compass.front.openai` (OpenAI bodies in and out), :mod:`compass.front.errors` (compass
errors as HTTP statuses) and :mod:`compass.front.declare` (what an app declares for them).
Nothing is imported here, so that ``compass.app`` can import the declarations cheaply.
"""
