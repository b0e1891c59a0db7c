"""Grafana dashboards (deploy/grafana/*.json) and the alert rules graph only what the code
exports: the relay's metrics from its own registry, the worker's app counters from the code
that creates them, the Temporal SDK's from a real scrape (deploy/grafana/worker-metrics.txt,
re-checked live by tests/test_dashboard_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.metric_names import (
    committed_worker_metrics,
    expression_metrics,
    relay_metric_names,
    worker_app_metric_names,
)
from tests.helpers.stack import ROOT

GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARDS = sorted(GRAFANA.glob("*.json"))


def exported() -> set[str]:
    app = {f"{name}{suffix}" for name in worker_app_metric_names()
           for suffix in ("_total", "_created")}
    return relay_metric_names() | app | committed_worker_metrics()


def panels(path: Path) -> list[dict[str, Any]]:
    return [p for p in json.loads(path.read_text())["panels"] if p["type"] != "row"]


def test_the_metric_sources_are_derived_from_the_code() -> None:
    relay = relay_metric_names()
    assert {"inboxcrm_items", "inboxcrm_deliveries_received_total", "inboxcrm_drift_findings",
            "inboxcrm_review_oldest_age_seconds"} <= relay
    assert {"inboxcrm_operations_completed", "inboxcrm_store_waits",
            "inboxcrm_operations_parked"} <= worker_app_metric_names()
    assert expression_metrics(
        'histogram_quantile(0.95, sum by (le, task_queue) (rate(x_bucket{a="b"}[5m]))) '
        '> on (job) group_left y and time() - z offset 5m') == {"x_bucket", "y", "z"}


def test_the_committed_worker_scrape_is_honest() -> None:
    """Its app metrics are ones the code creates (a stale list fails here)."""
    committed = committed_worker_metrics()
    assert any(name.startswith("temporal_workflow_task_schedule_to_start") for name in committed)
    app = {name for name in committed if name.startswith("inboxcrm_")}
    assert app and app <= {f"{n}_total" for n in worker_app_metric_names()}


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_graphs_metrics_the_code_exports(path: Path) -> None:
    dashboard = json.loads(path.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    names = exported()
    for panel in panels(path):
        assert panel["description"] and panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            used = expression_metrics(target["expr"])
            assert used, f"{panel['title']}: no metric in {target['expr']!r}"
            unknown = used - names
            assert not unknown, f"{path.name} / {panel['title']}: {unknown} is not exported"


def test_the_dashboards_cover_what_operators_ask() -> None:
    rows = {path.name: [p["title"] for p in json.loads(path.read_text())["panels"]
                        if p["type"] == "row"] for path in DASHBOARDS}
    assert rows["inboxcrm-product.json"] == ["Intake", "States", "Review queue",
                                             "Ambiguous and blocked", "Destination drift",
                                             "Parking"]
    assert rows["inboxcrm-temporal-sdk.json"] == ["Schedule-to-start", "Task latencies",
                                                  "Slots and pollers"]


# Series Prometheus itself writes for every scrape target (the target-down rules read it).
PROMETHEUS_SERIES = {"up"}


def test_the_alert_rules_name_metrics_the_code_exports() -> None:
    names = exported() | PROMETHEUS_SERIES
    rules = [rule for group in yaml.safe_load((ROOT / "deploy" / "alerts.yml").read_text())[
        "groups"] for rule in group["rules"]]
    assert rules
    for rule in rules:
        unknown = expression_metrics(rule["expr"]) - names
        assert not unknown, f"{rule['alert']}: {unknown} is not exported"
