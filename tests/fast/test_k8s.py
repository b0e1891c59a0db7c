"""Kubernetes as operators run it: the overlays an operator applies (deploy/k8s/overlays,
rendered by kubectl's kustomize), the bootstrap as an idempotent init container (no Job to
delete between releases), disruption budgets, Prometheus Operator scraping and the alert rules
of deploy/alerts.yml as a PrometheusRule, Temporal Cloud through a client profile, and
autoscaling on the task-queue backlog."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import connect_config
from tests.helpers.deploy_files import DEPLOY, K8S, KUBECTL, OVERLAYS, k8s_documents, renderings

needs_kubectl = pytest.mark.skipif(not KUBECTL, reason="kubectl (kustomize) is not installed")


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return doc


def config_of(docs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(one(docs, "ConfigMap", "inboxcrm-config")["data"])


def test_the_prometheus_rule_is_alerts_yml() -> None:
    """The operator loads the very rules promtool tests (tests/fast/test_alert_rules.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "render_prometheusrule", DEPLOY / "render_prometheusrule.py")
    assert spec and spec.loader
    renderer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(renderer)
    committed = K8S / "components" / "prometheus-operator" / "prometheusrule.yaml"
    assert committed.read_text() == renderer.render(), "run python deploy/render_prometheusrule.py"
    rule = yaml.safe_load(committed.read_text())
    alerts = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["spec"]["groups"] == alerts["groups"]


@pytest.mark.parametrize("rendering", renderings())
def test_bootstrap_runs_before_each_pod_and_needs_no_manual_step(rendering: str) -> None:
    docs = k8s_documents(rendering)
    assert not [d for d in docs if d["kind"] == "Job"], "a Job must be deleted before re-apply"
    for name, must in (("inboxcrm-worker", []), ("inboxcrm-relay", ["--migrations-only"])):
        pod = one(docs, "Deployment", name)["spec"]["template"]["spec"]
        [init] = pod["initContainers"]
        assert init["command"][:2] == ["python", "deploy/bootstrap.py"]
        assert all(flag in init["command"] for flag in must)
        main = pod["containers"][0]
        assert init["envFrom"] == main["envFrom"] and init["image"] == main["image"]


@pytest.mark.parametrize("rendering", renderings())
def test_disruption_budgets_cover_workers_and_relays(rendering: str) -> None:
    docs = k8s_documents(rendering)
    for name in ("inboxcrm-worker", "inboxcrm-relay"):
        budget = one(docs, "PodDisruptionBudget", name)["spec"]
        labels = one(docs, "Deployment", name)["spec"]["template"]["metadata"]["labels"]
        assert budget["selector"]["matchLabels"].items() <= labels.items()
        assert budget.get("maxUnavailable") == 1 or budget.get("minAvailable") == 1


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_set_image_scrape_and_alert(overlay: str) -> None:
    docs = k8s_documents(f"overlays/{overlay}")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert [d for d in docs if d["kind"] == kind], f"{overlay}: no {kind}"
    for doc in docs:
        assert doc["metadata"].get("namespace") in ("inboxcrm", None)
        for container in (doc.get("spec", {}).get("template", {}).get("spec", {})
                          .get("containers", []) if isinstance(doc.get("spec"), dict) else []):
            repository, _, tag = container["image"].rpartition(":")
            assert repository.endswith("/inboxcrm") and tag, container["image"]
    assert not [d for d in docs if d["kind"] == "Secret"], "secrets are referenced, never written"


@needs_kubectl
def test_temporal_cloud_overlay_connects_through_its_profile(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    """The rendered ConfigMap and the profile file, read by the real connect function: Temporal
    Cloud with the API key from the Secret; nothing left that would override the profile."""
    docs = k8s_documents("overlays/temporal-cloud")
    config = config_of(docs)
    assert "TEMPORAL_ADDRESS" not in config and "INBOXCRM_TEMPORAL_NAMESPACE" not in config
    profile_map = one(docs, "ConfigMap", "inboxcrm-temporal-profile")
    mount = Path(config["TEMPORAL_CONFIG_FILE"]).parent
    for deployment in ("inboxcrm-worker", "inboxcrm-relay"):
        pod = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in [*pod["initContainers"], *pod["containers"]]:
            mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
            assert str(mount) in mounted, f"{deployment}/{container['name']}: no profile"
            volume = volumes[mounted[str(mount)]]
            assert volume["configMap"]["name"] == profile_map["metadata"]["name"]
    profile = tmp_path / Path(config["TEMPORAL_CONFIG_FILE"]).name
    profile.write_text(profile_map["data"][profile.name])
    for key in list(os.environ):
        if key.startswith(("INBOXCRM_", "TEMPORAL_")):
            monkeypatch.delenv(key)
    for key, value in config.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(profile))
    monkeypatch.setenv("TEMPORAL_API_KEY", "from-inboxcrm-secrets")
    monkeypatch.setenv("INBOXCRM_MAIL_FROM", "Sales <sales@your-domain.example>")  # the operator's
    connect = connect_config(Settings())
    assert connect.target_host.endswith(".api.temporal.io:7233")
    assert (connect.api_key, connect.tls) == ("from-inboxcrm-secrets", True)
    worker = one(docs, "Deployment", "inboxcrm-worker")["spec"]["template"]["spec"]
    assert "--skip-search-attributes" in worker["initContainers"][0]["command"]
    # KEDA scales on the same namespace's queue with the same key.
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    [trigger] = one(docs, "ScaledObject", "inboxcrm-worker")["spec"]["triggers"]
    assert trigger["type"] == "temporal"
    assert trigger["metadata"]["namespace"] == connect.namespace
    assert trigger["metadata"]["endpoint"] == connect.target_host
    assert trigger["metadata"]["taskQueue"] == config.get(
        "INBOXCRM_TASK_QUEUE", Settings.model_fields["task_queue"].default)
    auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
    [ref] = auth["spec"]["secretTargetRef"]
    assert (ref["parameter"], ref["name"], ref["key"]) == (
        "apiKey", "inboxcrm-secrets", "TEMPORAL_API_KEY")


@needs_kubectl
def test_self_hosted_overlay_points_at_its_cluster() -> None:
    docs = k8s_documents("overlays/self-hosted")
    config = config_of(docs)
    assert config["TEMPORAL_ADDRESS"].endswith(":7233")
    assert "TEMPORAL_CONFIG_FILE" not in config
    hpa = one(docs, "HorizontalPodAutoscaler", "inboxcrm-worker")
    assert hpa["spec"]["minReplicas"] >= 2
