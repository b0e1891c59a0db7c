"""The Temporal SDK metrics the dashboards graph are what a real worker exports: one item runs
through the stack's worker, its /metrics is scraped, and every worker metric a dashboard names
must be in it. With INBOXCRM_CAPTURE_WORKER_METRICS=1 the scrape is written to
deploy/grafana/worker-metrics.txt, the list the fast tier checks the dashboards against
(tests/fast/test_dashboards.py)."""

from __future__ import annotations

import json
import os
import re

from prometheus_client.parser import text_string_to_metric_families

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.metric_names import (
    WORKER_METRICS_FILE,
    committed_worker_metrics,
    exported_series,
    expression_metrics,
)
from tests.helpers.stack import ROOT


def dashboard_expressions() -> list[str]:
    return [target["expr"] for path in (ROOT / "deploy" / "grafana").glob("*.json")
            for panel in json.loads(path.read_text())["panels"]
            for target in panel.get("targets", [])]


def dashboard_worker_metrics() -> set[str]:
    names = set().union(*(expression_metrics(expr) for expr in dashboard_expressions()))
    return {name for name in names if name.startswith("temporal_")}


async def test_the_worker_exports_what_the_dashboards_graph(env: StackClient, stack: Stack
                                                            ) -> None:
    workflow_id = await env.deliver(message_from(unique_email("graphed")))
    await env.wait_state(workflow_id, "completed")
    response = await env.http.get(
        f"http://{stack.env['INBOXCRM_WORKER_METRICS_ADDRESS']}/metrics")
    assert response.status_code == 200
    scraped = exported_series(response.text)
    if os.environ.get("INBOXCRM_CAPTURE_WORKER_METRICS"):
        WORKER_METRICS_FILE.write_text(
            "# Series a real worker exported after one item (tests/test_dashboard_metrics.py,\n"
            "# INBOXCRM_CAPTURE_WORKER_METRICS=1). The dashboards' metric names are checked\n"
            "# against this list in the fast tier.\n"
            + "\n".join(sorted(scraped)) + "\n")
    missing = dashboard_worker_metrics() - scraped
    assert not missing, f"dashboards graph worker metrics the worker does not export: {missing}"
    # The labels a panel groups the SDK's series by are labels those series carry.
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    for expr in dashboard_expressions():
        grouped = {label.strip() for group in re.findall(r"by \(([^)]*)\)", expr)
                   for label in group.split(",")} - {"le", ""}
        for name in expression_metrics(expr) & set(labels):
            assert grouped <= labels[name], f"{expr}: {name} has labels {labels[name]}"
    assert {n for n in committed_worker_metrics() if n.startswith("temporal_")} <= scraped
