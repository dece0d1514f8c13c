"""The front door's HTTP counts as a scrape reads them: cumulative "le" buckets, a bound
counted in its own bucket, statuses per route, parser refusals with no duration."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from compass.front.metrics import BUCKETS, HttpMetrics

INFER = "/v2/models/{model}/infer"


def _samples(metrics: HttpMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_requests_by_route_and_status_and_a_cumulative_histogram() -> None:
    metrics = HttpMetrics()
    metrics.answered(INFER, 200, 0.001)  # exactly a bound: in its bucket ("le")
    metrics.answered(INFER, 200, 0.0011)
    metrics.answered(INFER, 429, 0.00005)
    metrics.answered(INFER, 200, 120.0)  # past the largest bound: +Inf only
    metrics.answered("/v2/health/live", 200, 0.0002)
    metrics.refused(400)
    metrics.in_flight = 2
    samples = _samples(metrics)

    def requests(route: str, status: str) -> float:
        return samples[("compass_http_requests_total", (("route", route), ("status", status)))]

    assert requests(INFER, "200") == 3 and requests(INFER, "429") == 1
    assert requests("/v2/health/live", "200") == 1 and requests("malformed", "400") == 1
    assert samples[("compass_http_requests_in_flight", ())] == 2

    def bucket(route: str, le: str) -> float:
        key = (("le", le), ("route", route))
        return samples[("compass_http_request_duration_seconds_bucket", key)]

    assert bucket(INFER, "0.0001") == 1
    assert bucket(INFER, "0.0005") == 1
    assert bucket(INFER, "0.001") == 2
    assert bucket(INFER, "0.0025") == 3
    assert bucket(INFER, str(BUCKETS[-1])) == 3
    assert bucket(INFER, "+Inf") == 4
    infer = (("route", INFER),)
    assert samples[("compass_http_request_duration_seconds_count", infer)] == 4
    total = samples[("compass_http_request_duration_seconds_sum", infer)]
    assert abs(total - (0.001 + 0.0011 + 0.00005 + 120.0)) < 1e-9
    # a refusal has no duration: no histogram for the parser's route
    assert not any(dict(labels).get("route") == "malformed" for name, labels in samples
                   if name.startswith("compass_http_request_duration"))  # fmt: skip
