"""Metric names as the code really exports them, and as dashboard and alert expressions use
them: the relay's from its own registry (every collector, with a store snapshot that has every
gauge), the worker's app metrics from the code that creates them, the Temporal SDK's from a
real scrape committed in deploy/grafana/worker-metrics.txt (tests/test_dashboard_metrics.py
makes and checks it)."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.stack import ROOT

WORKER_METRICS_FILE = ROOT / "deploy" / "grafana" / "worker-metrics.txt"
# The suffixes a Prometheus exposition adds to a family's samples.
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": (
    "_bucket", "_sum", "_count", "_created"), "summary": ("_sum", "_count", "_created", "")}


def relay_metric_names() -> set[str]:
    """Every series name the relay's /metrics can export (the store gauges included)."""
    from inboxcrm.ingress.metrics import RelayMetrics

    metrics = RelayMetrics()
    snapshot: dict[str, Any] = defaultdict(int)
    snapshot.update(items={"completed": 1}, last_delivery={"standard": 1.0},
                    drift=defaultdict(int, sampled=1))
    metrics._store.snapshot = snapshot  # what a scrape sets from the store
    names = set()
    for family in metrics.registry.collect():
        names.update(f"{family.name}{suffix}" for suffix in SUFFIXES[family.type])
    return names


def worker_app_metric_names() -> set[str]:
    """Names the worker's own code creates on the Temporal runtime's meter (counters:
    `activities.counters.count("…", …)` and `workflow.metric_meter().create_counter("…")`)."""
    names = set()
    for folder in ("inboxcrm",):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                first = node.args[0]
                callee = ast.unparse(node.func)
                if isinstance(first, ast.Constant) and isinstance(first.value, str) and (
                        callee.endswith(".create_counter") or callee == "count"):
                    names.add(first.value)
    return names


def exported_series(text: str) -> set[str]:
    """Series names in a Prometheus text exposition."""
    return {sample.name for family in text_string_to_metric_families(text)
            for sample in family.samples}


def committed_worker_metrics() -> set[str]:
    return {line.strip() for line in WORKER_METRICS_FILE.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan", "le"}


def expression_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (functions, keywords, label names,
    strings and durations removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)                    # label matchers
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)                   # ranges, subqueries
    text = re.sub(r"\$\w+|\$\{[^}]*\}", "", text)            # Grafana variables
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", text):
        word, call = match.group(1), match.group(2)
        if call or word.lower() in PROMQL_WORDS or re.fullmatch(r"\d+\w*", word):
            continue
        names.add(word)
    return names
