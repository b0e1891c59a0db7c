"""Write deploy/k8s/components/prometheus-operator/prometheusrule.yaml from deploy/alerts.yml,
so the Prometheus Operator loads the very rules promtool tests (tests/fast/test_alert_rules.py;
tests/fast/test_k8s.py fails when the two differ).

    python deploy/render_prometheusrule.py
"""

from __future__ import annotations

from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
TARGET = DEPLOY / "k8s" / "components" / "prometheus-operator" / "prometheusrule.yaml"
HEADER = ("# Generated from deploy/alerts.yml by deploy/render_prometheusrule.py: edit the alert\n"
          "# rules there, then run the script (tests/fast/test_k8s.py checks they are equal).\n")


def prometheus_rule() -> dict[str, object]:
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "inboxcrm", "labels": {"app.kubernetes.io/name": "inboxcrm"}},
        "spec": {"groups": rules["groups"]},
    }


def render() -> str:
    return HEADER + yaml.safe_dump(prometheus_rule(), sort_keys=False, width=100,
                                   allow_unicode=True)


if __name__ == "__main__":
    TARGET.write_text(render())
    print(f"wrote {TARGET.relative_to(DEPLOY.parent)}")  # noqa: T201
