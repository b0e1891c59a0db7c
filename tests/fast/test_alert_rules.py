"""The alert rules are unit-tested by promtool (`deploy/alerts.test.yml`), every alert has a
case there and a runbook line in the README, so an alert cannot be added untested. And the
rules cannot go quiet when what they watch dies: every scrape job has a target-down rule,
every relay gauge is read once per installation, the code-bug and notice counters and the
gauges' own age are watched."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.deploy_files import KUBECTL, OVERLAYS, k8s_documents
from tests.helpers.metric_names import expression_metrics, relay_metric_names

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "alerts.yml"
RULE_TESTS = ROOT / "deploy" / "alerts.test.yml"
README = ROOT / "README.md"
# Debian's `prometheus` package puts promtool here; `.ci/run` installs it with apt-get.
DEBIAN_PROMTOOL = Path("/usr/bin/promtool")


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def _alerts() -> list[dict[str, Any]]:
    return [rule for group in _load(RULES)["groups"] for rule in group["rules"]
            if "alert" in rule]


def _cases() -> list[dict[str, Any]]:
    return [case for test in _load(RULE_TESTS)["tests"] for case in test["alert_rule_test"]]


def _runbook_section() -> str:
    text = README.read_text()
    start = text.index("## Alerts and runbooks")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    names = {rule["alert"] for rule in _alerts()}
    cases = _cases()
    assert {case["alertname"] for case in cases} == names, \
        "deploy/alerts.test.yml must test exactly the alerts of deploy/alerts.yml"
    for name in sorted(names):
        outcomes = [bool(c.get("exp_alerts")) for c in cases if c["alertname"] == name]
        assert True in outcomes and False in outcomes, f"{name}: needs a firing and a quiet case"


def test_every_alert_has_a_runbook_line() -> None:
    section = _runbook_section()
    rows = [line for line in section.splitlines() if line.startswith("| Inboxcrm")]
    for rule in _alerts():
        name = rule["alert"]
        assert rule["annotations"]["runbook"] == f"README.md#alerts-and-runbooks ({name})"
        assert [row for row in rows if re.search(rf"\b{name}\b", row.split("|")[1])], \
            f"README 'Alerts and runbooks' has no row for {name}"


def _promtool() -> str:
    found = shutil.which("promtool") or (str(DEBIAN_PROMTOOL) if DEBIAN_PROMTOOL.exists()
                                         else None)
    if found is None:
        # `make test-fast` runs pytest with -rs: the reason is printed in the summary.
        pytest.skip("promtool not found: Debian's `prometheus` package is not installed and "
                    "could not be installed here (`.ci/run` installs it with apt-get)")
    return found


def test_promtool_checks_and_unit_tests_the_rules() -> None:
    promtool = _promtool()
    for argv in ([promtool, "check", "rules", str(RULES)],
                 [promtool, "test", "rules", str(RULE_TESTS)]):
        result = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                check=False, cwd=ROOT)
        assert result.returncode == 0, f"{' '.join(argv[1:])}:\n{result.stdout}{result.stderr}"


def _exprs() -> dict[str, str]:
    return {rule["alert"]: " ".join(str(rule["expr"]).split()) for rule in _alerts()}


def scrape_jobs(overlay: str) -> set[str]:
    """The `job` label of the series the overlay's ServiceMonitors scrape: the Service's
    `jobLabel` label, or the Service's name (Prometheus Operator's rule)."""
    docs = k8s_documents(f"overlays/{overlay}")
    services = [d for d in docs if d["kind"] == "Service"]
    jobs = set()
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        for service in services:
            labels = service["metadata"].get("labels", {})
            if selector.items() <= labels.items() and any(
                    p.get("name") == e["port"] for e in monitor["spec"]["endpoints"]
                    for p in service["spec"]["ports"]):
                job_label = monitor["spec"].get("jobLabel")
                jobs.add(labels[job_label] if job_label else service["metadata"]["name"])
    return jobs


@pytest.mark.skipif(not KUBECTL, reason="kubectl (kustomize) is not installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_scrape_job_has_a_rule_that_fires_when_it_is_gone(overlay: str) -> None:
    """With every relay dead or unscraped, the gauges vanish and every rule on them resolves;
    `absent(up{job=...} == 1)` is the one that fires then. It names the jobs the
    ServiceMonitors really create."""
    jobs = scrape_jobs(overlay)
    assert len(jobs) == 2, jobs
    exprs = _exprs().values()
    for job in jobs:
        assert f'absent(up{{job="{job}"}} == 1)' in exprs, f"nothing fires when {job} is gone"
    named = {job for expr in exprs for job in re.findall(r'\bup\{job=~?"([^"]+)"', expr)}
    assert {j for name in named for j in name.split("|")} == jobs


def test_relay_gauges_alert_once_per_installation() -> None:
    """Every relay replica exports the same store gauges: a rule on one of them aggregates the
    replicas away, or it fires once per replica (deploy/alerts.test.yml feeds two)."""
    from inboxcrm.ingress.metrics import DELIVERIES, SIGNATURE_FAILURES, UNIQUE_CONFLICTS

    counters = {f"{name}{suffix}" for name in (DELIVERIES, SIGNATURE_FAILURES, UNIQUE_CONFLICTS)
                for suffix in ("_total", "_created")}
    gauges = relay_metric_names() - counters
    checked = 0
    for name, expr in _exprs().items():
        used = expression_metrics(expr) & gauges
        if not used or name == "InboxcrmStoreGaugesStale":  # per relay: whose refresh died
            continue
        checked += 1
        for metric in used:
            assert re.search(rf"(max|min) without \(instance, pod\) \((\w+\()?{metric}\b",
                             expr), f"{name}: {metric} fires once per relay replica"
    assert checked >= 10


def test_the_watch_signals_have_rules() -> None:
    """Exported and watched by nothing, a signal is a log line nobody reads."""
    used = {metric for expr in _exprs().values() for metric in expression_metrics(expr)}
    assert {"inboxcrm_step_bugs_total", "inboxcrm_review_notice_messages_total",
            "inboxcrm_store_gauges_read_timestamp_seconds", "up"} <= used
