"""The ecosystem's tools: the Grafana dashboard (deploy/grafana/compass.json) and the example
Prometheus alert rules (deploy/prometheus/alerts.yml). Their shape, and that every metric they
name, with every label they match on, is one a real worker exports on /metrics."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from compass.cluster import LocalCluster

from .conftest import ROOT, one_worker_workload
from .test_metrics import http_get

DASHBOARD = ROOT / "deploy" / "grafana" / "compass.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"

#: labels Prometheus adds to every scraped series, and the one compass_worker_info lends
#: every per-worker panel through a join
TARGET_LABELS = {"job", "instance"}

#: the sample names a family of each type exposes (a counter's family name has no _total)
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
    "unknown": ("",),
}

#: a metric named in PromQL, and its label matchers if it has any
SELECTOR = re.compile(r"\b(compass_[a-z0-9_]+)\b(\{[^}]*\})?")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def alerts() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml", reason="PyYAML parses the alert rules")
    loaded: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return loaded


def panels(items: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in items:
        yield panel
        yield from panels(panel.get("panels", []))


def dashboard_queries() -> list[str]:
    board = dashboard()
    queries = [t["expr"] for p in panels(board["panels"]) for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in alerts()["groups"] for rule in group["rules"]]


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    board = dashboard()
    assert board["title"] == "compass" and board["uid"] == "compass-cluster"
    assert isinstance(board["schemaVersion"], int)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"job", "worker", "workflow"} <= set(variables)
    ids = [p["id"] for p in panels(board["panels"])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    taken: set[tuple[int, int]] = set()
    titles = set()
    for panel in panels(board["panels"]):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not cells & taken, f"{panel['title']!r} overlaps another panel"
        taken |= cells
        if panel["type"] == "row":
            continue
        assert panel["title"] not in titles, panel["title"]
        titles.add(panel["title"])
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"])
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))
    # what an operator asks of it first
    for wanted in (
        "SLO attainment by workflow",
        "Tasks queued",
        "GPU lanes busy",
        "Cache hit ratio",
        "Job latency p50 / p99 by workflow",
        "Workers in view",
    ):
        assert wanted in titles  # fmt: skip


def test_the_alert_rules_cover_what_goes_wrong() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert re.fullmatch(r"\d+[smh]", rule.get("for", "0s")), rule["alert"]
    for wanted in (
        "CompassWorkerDown",
        "CompassWorkerLost",
        "CompassSLOAttainmentLow",
        "CompassSLOAttainmentFalling",
        "CompassQueueGrowing",
        "CompassStuckTasks",
    ):
        assert wanted in names  # fmt: skip


def grafana_free(query: str) -> str:
    """``query`` with the dashboard's variables replaced by what Grafana would put there."""
    for variable, value in (("$__rate_interval", "1m"), ("$job", ".+"), ("$worker", ".+"),
                            ("$workflow", ".+")):  # fmt: skip
        query = query.replace(variable, value)
    return query


def test_promtool_accepts_the_rules_and_every_dashboard_query(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("no promtool on PATH (apt-get install prometheus) to parse the PromQL")
    yaml = pytest.importorskip("yaml", reason="PyYAML writes the queries as rules")
    queries = [grafana_free(q) for q in dashboard_queries() if not q.startswith("label_values")]
    recorded = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": q} for i, q in enumerate(queries)
                ],
            }
        ]
    }
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump(recorded))
    for path in (ALERTS, tmp_path / "dashboard.yml"):
        done = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr


def selectors(query: str) -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """Each compass metric ``query`` names, with its label matchers (name, operator, value)."""
    for found in SELECTOR.finditer(query):
        yield found.group(1), MATCHER.findall(found.group(2) or "")


def exported(text: str) -> tuple[dict[str, dict[str, set[str]]], dict[str, str]]:
    """Every sample name of a /metrics text (a family declared with no sample yet counts
    too), each with its labels and the values they take; and each one's family."""
    out: dict[str, dict[str, set[str]]] = {}
    family_of: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for suffix in SUFFIXES[family.type]:
            out.setdefault(family.name + suffix, {})
            family_of[family.name + suffix] = family.name
        for sample in family.samples:
            labels = out.setdefault(sample.name, {})
            family_of[sample.name] = family.name
            for label, value in sample.labels.items():
                labels.setdefault(label, set()).add(value)
    return out, family_of


@pytest.mark.asyncio
async def test_every_metric_the_dashboard_and_alerts_name_is_exported(
    worker_env: dict[str, str], tmp_path: Path
) -> None:
    spec = one_worker_workload(tmp_path, quick=("m", 5), plain=(None, 5), words=(None, 4))
    steps = json.loads(Path(spec).read_text())  # noqa: ASYNC240 (before anything runs)
    steps["workflows"]["words"]["tasks"]["t"]["steps"] = 4  # a step-wise task, streamed below
    Path(spec).write_text(json.dumps(steps))  # noqa: ASYNC240
    args = ["--workload", spec, "--metrics-port", "0", "--drain-timeout", "0"]
    async with LocalCluster(2, args=args, env=worker_env) as cluster, cluster.client() as client:
        address = (await client.status()).metrics
        assert address is not None  # the worker serves metrics
        # what makes every family have samples: jobs with a deadline, a model, a peer
        await asyncio.gather(
            *(client.submit("quick", x=i, deadline_ms=10_000, timeout=30) for i in range(4)),
            *(client.submit("plain", x=i, timeout=30) for i in range(2)),
        )
        streamed = [out async for out in client.stream("words", x=0)]  # steps, first output
        assert [out.seq for out in streamed] == [0, 1, 2, 3, -1] and streamed[-1].final
        status, text = await asyncio.to_thread(http_get, f"http://{address}/metrics")
        async with cluster.client(1) as other:  # the step-wise task may have run there
            elsewhere = (await other.status()).metrics
        assert elsewhere is not None
        _, more = await asyncio.to_thread(http_get, f"http://{elsewhere}/metrics")
    assert status == 200
    metrics, family_of = exported(text)
    for name, labels in exported(more)[0].items():  # what only the other worker had
        metrics.setdefault(name, labels)
    family_of.update(exported(more)[1])

    named: dict[str, list[str]] = defaultdict(list)
    for source, queries in (
        (DASHBOARD.name, dashboard_queries()),
        (ALERTS.name, [rule["expr"] for rule in alert_rules()]),
    ):
        for query in queries:
            for metric, matchers in selectors(grafana_free(query)):
                named[metric].append(source)
                assert metric in metrics, f"{source} names {metric}, which no worker exports"
                labels = metrics[metric]
                for label, operator, value in matchers:
                    if label in TARGET_LABELS:
                        continue
                    assert label in labels, f"{source}: {metric} has no label {label!r}"
                    if operator == "=":
                        assert value in labels[label], (
                            f"{source}: {metric}{{{label}={value!r}}} is never exported "
                            f"(seen: {sorted(labels[label])})"
                        )
    # and every family a worker exports is on a panel or in a rule (save prometheus_client's
    # creation times of its histograms)
    families = {f for f in family_of.values() if not f.endswith("_created")}
    unused = families - {family_of[name] for name in named}
    assert not unused, f"exported but on no panel nor in any rule: {sorted(unused)}"
