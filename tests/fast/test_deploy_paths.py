"""The deploy paths as they run, which no schema sees: what each probe reads against what the
overlay sets, what KEDA watches against where the workers poll, which Prometheus loads the
monitors, which sender the manifests ship. Every rendering is what `kubectl kustomize`
gives (the overlays skipped where kubectl is missing, as in tests/fast/test_k8s.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from inboxcrm.platform.config import Settings
from inboxcrm.platform.temporal import connect_config
from tests.helpers.deploy_files import (
    DEPLOY,
    ENV_EXAMPLE,
    K8S,
    KUBECTL,
    OVERLAYS,
    ROOT,
    compose_services,
    env_example,
    filled_env,
    interpolate,
    k8s_documents,
    referenced_variables,
    renderings,
    strings,
)

needs_kubectl = pytest.mark.skipif(not KUBECTL, reason="kubectl (kustomize) is not installed")
# What inboxcrm-secrets holds in the deploy README's recipe (a Secret's values are not in the
# manifests); the probes and the Temporal connection read them from the environment. The API
# key only where the overlay authenticates to Temporal with one (a TriggerAuthentication).
SECRET_SAMPLE = {"DATABASE_URL": "postgresql://inboxcrm:pw@db.internal:5433/inboxcrm"}
# What the operator sets in the overlay's config.yaml (deploy/README.md, "The sender"): no
# manifest ships a sender, and outside INBOXCRM_ENV=local Settings refuse to start without it.
OPERATOR_SAMPLE = {"INBOXCRM_MAIL_FROM": "Sales <sales@your-domain.example>"}
API_KEY_SAMPLE = {"TEMPORAL_API_KEY": "from-inboxcrm-secrets"}
# The selector of a kube-prometheus-stack installed with its default values as release
# `kube-prometheus-stack` (serviceMonitorSelector / ruleSelector: matchLabels release).
KUBE_PROMETHEUS_STACK_SELECTOR = {"release": "kube-prometheus-stack"}


def healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", DEPLOY / "healthcheck.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return doc


def main_container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment", deployment)[
        "spec"]["template"]["spec"]["containers"][0]
    return container


def pod_env(docs: list[dict[str, Any]], container: dict[str, Any], tmp_path: Path
            ) -> dict[str, str]:
    """The container's environment as the pod has it: its ConfigMaps, its env, the Secret's
    sample values; a Temporal profile file named by TEMPORAL_CONFIG_FILE is the mounted
    ConfigMap's file, written under tmp_path."""
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in docs if d["kind"] == "ConfigMap"}
    env = dict(SECRET_SAMPLE) | OPERATOR_SAMPLE
    if any(d["kind"] == "TriggerAuthentication" for d in docs):
        env |= API_KEY_SAMPLE
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= {k: str(v) for k, v in maps[source["configMapRef"]["name"]].items()}
    env |= {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    if "TEMPORAL_CONFIG_FILE" in env:
        name = Path(env["TEMPORAL_CONFIG_FILE"]).name
        [profile] = [data[name] for data in maps.values() if name in data]
        (tmp_path / name).write_text(profile)
        env["TEMPORAL_CONFIG_FILE"] = str(tmp_path / name)
    return env


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Exactly `env` for the settings (nothing of this machine's own Temporal or inboxcrm)."""
    for key in list(os.environ):
        if key.startswith(("INBOXCRM_", "TEMPORAL_")) or key == "DATABASE_URL":
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def probed_addresses(monkeypatch: pytest.MonkeyPatch, check: str) -> list[tuple[str, int]]:
    """The (host, port) pairs deploy/healthcheck.py `check` connects to, every connection
    answered: what the probe asks, not whether this machine can reach it."""
    probed: list[tuple[str, int]] = []

    def connect(address: tuple[str, int], *args: Any, **kwargs: Any) -> Any:
        probed.append((address[0], int(address[1])))
        return contextlib.nullcontext()

    module = healthcheck()
    monkeypatch.setattr(module.socket, "create_connection", connect)
    assert getattr(module, check)() is True
    return probed


def where_the_worker_connects() -> list[tuple[str, int]]:
    """Temporal as the worker's own connect function resolves it, then PostgreSQL."""
    from urllib.parse import urlsplit

    settings = Settings()
    host, _, port = connect_config(settings).target_host.rpartition(":")
    database = urlsplit(settings.database_url)
    return [(host, int(port)), (database.hostname or "", database.port or 5432)]


@pytest.mark.parametrize("rendering", renderings())
def test_worker_readiness_probes_where_the_worker_connects(
        rendering: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The temporal-cloud overlay removes TEMPORAL_ADDRESS and connects through a profile: a
    probe reading only TEMPORAL_ADDRESS asks 127.0.0.1:7233, never answers, and with
    maxUnavailable 0 a rollout never finishes."""
    docs = k8s_documents(rendering)
    worker = main_container(docs, "inboxcrm-worker")
    command = worker["readinessProbe"]["exec"]["command"]
    assert command[:2] == ["python", "deploy/healthcheck.py"]
    use_env(monkeypatch, pod_env(docs, worker, tmp_path))
    expected = where_the_worker_connects()
    assert expected[0][0] not in ("127.0.0.1", "localhost"), "the manifest names no Temporal"
    assert probed_addresses(monkeypatch, command[2]) == expected


def test_compose_worker_health_probes_where_the_worker_connects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    worker = compose_services()["worker"]
    env = {k: interpolate(v, filled_env()) for k, v in worker["environment"].items()}
    use_env(monkeypatch, env)
    test = worker["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python", "deploy/healthcheck.py"]
    assert probed_addresses(monkeypatch, test[3]) == where_the_worker_connects() == [
        ("temporal", 7233), ("postgres", 5432)]


def test_worker_readiness_fails_when_the_settings_cannot_resolve_temporal(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A profile file that does not exist: the worker cannot connect, so it is not ready."""
    use_env(monkeypatch, {**SECRET_SAMPLE,
                          "TEMPORAL_CONFIG_FILE": str(tmp_path / "missing.toml"),
                          "TEMPORAL_PROFILE": "cloud-api-key"})
    module = healthcheck()
    monkeypatch.setattr(module.socket, "create_connection",
                        lambda *args, **kwargs: contextlib.nullcontext())
    assert module.ready() is False


# --- KEDA --------------------------------------------------------------------------------------
def render_with_component(tmp_path: Path, overlay: str, component: str
                          ) -> list[dict[str, Any]]:
    """The overlay as an operator extends it, the way its header says: a copy of deploy/k8s
    with `component` added to the overlay's components."""
    assert KUBECTL
    tree = tmp_path / "k8s"
    shutil.copytree(K8S, tree)
    path = tree / "overlays" / overlay / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    wanted = f"../../components/{component}"
    if wanted not in kustomization.setdefault("components", []):
        kustomization["components"].append(wanted)
    path.write_text(yaml.safe_dump(kustomization, sort_keys=False))
    result = subprocess.run([KUBECTL, "kustomize", str(path.parent)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_keda_watches_the_queue_the_overlays_workers_poll(
        overlay: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With keda-backlog, the scaler asks the endpoint, namespace and task queue the workers
    of that overlay use: a scaler on namespace `default` while the workers poll `inboxcrm`
    sees no backlog and never scales."""
    docs = render_with_component(tmp_path, overlay, "keda-backlog")
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
    worker = main_container(docs, "inboxcrm-worker")
    use_env(monkeypatch, pod_env(docs, worker, tmp_path))
    settings = Settings()
    connect = connect_config(settings)
    scaled = one(docs, "ScaledObject", "inboxcrm-worker")
    assert scaled["metadata"].get("namespace") == one(
        docs, "Deployment", "inboxcrm-worker")["metadata"].get("namespace")
    [trigger] = [t for t in scaled["spec"]["triggers"] if t["type"] == "temporal"]
    assert (trigger["metadata"]["endpoint"], trigger["metadata"]["namespace"],
            trigger["metadata"]["taskQueue"]) == (
        connect.target_host, connect.namespace, settings.task_queue)
    assert bool(connect.api_key) == ("authenticationRef" in trigger)
    if connect.api_key:  # KEDA authenticates with the key the processes read
        auth = one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        [ref] = auth["spec"]["secretTargetRef"]
        secret_refs = {s["secretRef"]["name"] for s in worker["envFrom"] if "secretRef" in s}
        assert ref["name"] in secret_refs and ref["key"] in API_KEY_SAMPLE


def secret_recipe() -> str:
    """The deploy README's `kubectl create secret generic inboxcrm-secrets` command, with the
    comments that list what else goes into it."""
    text = (DEPLOY / "README.md").read_text()
    start = text.index("kubectl create secret generic inboxcrm-secrets")
    return text[start:text.index("kubectl create secret generic inboxcrm-codec-keys", start)]


@needs_kubectl
def test_the_secret_recipe_names_the_key_keda_reads() -> None:
    """Both INBOXCRM_TEMPORAL_API_KEY and TEMPORAL_API_KEY work for the processes; only the
    key the TriggerAuthentication names works for KEDA too."""
    recipe = secret_recipe()
    keys = set()
    for overlay in OVERLAYS:
        for auth in (d for d in k8s_documents(f"overlays/{overlay}")
                     if d["kind"] == "TriggerAuthentication"):
            keys |= {ref["key"] for ref in auth["spec"]["secretTargetRef"]
                     if ref["name"] == "inboxcrm-secrets"}
    assert keys
    for key in keys:
        assert re.search(rf"\b{key}\b", recipe), f"the secret recipe does not name {key}"
    assert "INBOXCRM_TEMPORAL_API_KEY" not in recipe


# --- Prometheus Operator -----------------------------------------------------------------------
@needs_kubectl
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_default_kube_prometheus_stack_loads_the_monitors_and_rules(overlay: str) -> None:
    """kube-prometheus-stack selects ServiceMonitors and PrometheusRules by its release label;
    objects without it are silently ignored."""
    docs = k8s_documents(f"overlays/{overlay}")
    for kind in ("ServiceMonitor", "PrometheusRule"):
        found = [d for d in docs if d["kind"] == kind]
        assert found, f"{overlay}: no {kind}"
        for doc in found:
            labels = doc["metadata"].get("labels", {})
            assert KUBE_PROMETHEUS_STACK_SELECTOR.items() <= labels.items(), (
                f"{overlay}: {kind} {doc['metadata']['name']} is not selected")


# --- the sender ---------------------------------------------------------------------------------
def demo_senders() -> set[str]:
    """The demo tenants' senders and their domains (policies/*.json, `make up` only)."""
    found: set[str] = set()
    for path in (ROOT / "policies").glob("*.json"):
        sender = json.loads(path.read_text()).get("sender", {}).get("from")
        if sender:
            found |= {sender, sender.rpartition("@")[2].rstrip(">")}
    found.add(str(Settings.model_fields["mail_from"].default or ""))
    return {s for s in found if s}


@pytest.mark.parametrize("rendering", renderings())
def test_no_manifest_sends_as_a_demo_tenant(rendering: str) -> None:
    """The sender is the operator's to give: no ConfigMap sets one (the deploy README says
    where to), and nothing in the manifests names a demo tenant's sender or domain."""
    docs = k8s_documents(rendering)
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            assert "INBOXCRM_MAIL_FROM" not in (doc.get("data") or {}), (
                f"{rendering}: ConfigMap {doc['metadata']['name']} ships a sender")
    text = "\n".join(strings(docs))
    for demo in demo_senders():
        assert demo not in text, f"{rendering}: names the demo sender {demo!r}"
    readme = (DEPLOY / "README.md").read_text()
    assert re.search(r"INBOXCRM_MAIL_FROM.{0,200}overlay's `config.yaml`", readme, re.S), (
        "the deploy README does not say where the operator sets the sender")


def test_compose_refuses_to_start_without_a_sender() -> None:
    assert referenced_variables()["INBOXCRM_MAIL_FROM"] == ":?"
    assert env_example()["INBOXCRM_MAIL_FROM"] == ""
    values = "\n".join(line for line in ENV_EXAMPLE.read_text().splitlines()
                       if not line.lstrip().startswith("#"))
    for demo in demo_senders():
        assert demo not in values, f".env.example ships the demo sender {demo!r}"
