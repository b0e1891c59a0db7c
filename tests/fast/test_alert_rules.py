"""The alert rules are unit-tested by promtool (`deploy/alerts.test.yml`), every alert has a
case there and a runbook line in the README, so an alert cannot be added untested."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

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
