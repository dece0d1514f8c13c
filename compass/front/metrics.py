"""The front door's HTTP metrics, served in the worker's Prometheus scrape (``--metrics-port``):

- ``compass_http_requests_total{route, status}``: requests answered;
- ``compass_http_requests_in_flight``: requests being answered now (a streamed one until its
  last chunk);
- ``compass_http_request_duration_seconds{route}``: head read to answer written, a histogram.

Labels are bounded whatever clients send: ``route`` is the template a request matched
(``/v2/models/{model}/infer``), never its path, else ``other`` (a path no route serves) or
``malformed`` (a request the HTTP parser refused, which has no duration); ``status`` is the one
answered, or 499 where the client hung up first and its handler was cancelled (nginx's
convention; no answer was sent).

Counting is a dict increment and a bisect per request, whether or not anything scrapes: a
scrape reads the counts (:meth:`HttpMetrics.collect`, on the worker's loop, with the worker's
own metrics), and nothing is kept per request.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

__all__ = ["BUCKETS", "CLIENT_GONE", "MALFORMED", "NO_ROUTE", "HttpMetrics"]

#: upper bounds (seconds) of the duration histogram: from a health probe's tenth of a
#: millisecond to a generation streamed for a minute
BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
_BOUNDS = (*map(str, BUCKETS), "+Inf")  # "le" labels, as Histogram writes them
#: the route of a path that no route serves, and of a request the parser refused
NO_ROUTE = "other"
MALFORMED = "malformed"
#: the status counted for a request whose client hung up before its answer
CLIENT_GONE = 499


class HttpMetrics(Collector):
    """The counts of one front door; a collector the worker's scrape reads."""

    def __init__(self) -> None:
        #: (route, status) -> requests answered
        self.requests: dict[tuple[str, int], int] = {}
        self.in_flight = 0
        #: route -> requests per bucket of :data:`BUCKETS` (the last: over the largest)
        self._buckets: dict[str, list[int]] = {}
        self._seconds: dict[str, float] = {}

    def answered(self, route: str, status: int, seconds: float) -> None:
        """A request to ``route`` answered ``status`` after ``seconds``."""
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        counts = self._buckets.get(route)
        if counts is None:
            counts = self._buckets[route] = [0] * (len(BUCKETS) + 1)
            self._seconds[route] = 0.0
        counts[bisect_left(BUCKETS, seconds)] += 1  # the first bound >= seconds: "le"
        self._seconds[route] += seconds

    def refused(self, status: int) -> None:
        """A request the parser refused (not HTTP, a head too long) with ``status``."""
        key = (MALFORMED, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "compass_http_requests",
            "Requests the HTTP front door answered, by route template and status (499: the "
            "client hung up first; route 'other': no route, 'malformed': refused by the parser).",
            labels=["route", "status"],
        )
        for (route, status), count in sorted(self.requests.items()):
            requests.add_metric([route, str(status)], count)
        yield requests
        yield GaugeMetricFamily(
            "compass_http_requests_in_flight",
            "Requests the HTTP front door is answering now (a stream until its last chunk).",
            value=self.in_flight,
        )
        duration = HistogramMetricFamily(
            "compass_http_request_duration_seconds",
            "Request head read to answer written at the HTTP front door, by route template.",
            labels=["route"],
        )
        for route, counts in sorted(self._buckets.items()):
            cumulative = 0
            buckets = []
            for bound, count in zip(_BOUNDS, counts, strict=True):
                cumulative += count
                buckets.append((bound, float(cumulative)))
            duration.add_metric([route], buckets, sum_value=self._seconds[route])
        yield duration
