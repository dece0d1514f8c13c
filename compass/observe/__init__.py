"""Observability: what a worker shows of itself, and how.

Metrics and the Prometheus endpoint (:mod:`.metrics`), the live dashboard (:mod:`.dashboard`),
job traces (:mod:`.tracing`, sans-IO) and their OpenTelemetry export (:mod:`.otel`), rings of
recent spans (:mod:`.timeline`) and the process's usage (:mod:`.usage`). They read the worker
through the protocols they declare. Nothing is imported here: import the module you need.
"""
