"""The deploy files as the fast tier reads them: the compose file and its interpolation, the
`.env.example` an operator completes, the Kubernetes manifests as kustomize lists them."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import yaml

from tests.helpers.stack import ROOT

DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"
K8S = DEPLOY / "k8s"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)((?::?[-?])([^}]*))?\}")


def load_compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict)
    return data


def compose_services() -> dict[str, dict[str, Any]]:
    services = load_compose()["services"]
    assert isinstance(services, dict)
    return services


def env_example() -> dict[str, str]:
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"bad line: {line!r}"
        assert key not in values, f"{key} documented twice"
        values[key] = value
    return values


def strings(node: Any) -> Iterator[str]:
    if isinstance(node, str):
        yield node
    elif isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key)
            yield from strings(value)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)


def referenced_variables() -> dict[str, str | None]:
    """Every ${VAR...} in the compose file -> its operator (":-", ":?", ...) or None."""
    found: dict[str, str | None] = {}
    text = "\n".join(strings(load_compose()))  # parsed: comments do not count
    for match in _VAR.finditer(text):
        operator = match.group(2)[:2].rstrip("{}") if match.group(2) else None
        found.setdefault(match.group(1), operator)
        if operator and "?" in operator:
            found[match.group(1)] = operator
    return found


class Unset(Exception):
    pass


def interpolate(value: Any, env: Mapping[str, str]) -> str:
    """Compose's interpolation: ${V}, ${V:-d}, ${V-d}, ${V:?msg}, ${V?msg}."""
    text = str(value)

    def one(match: re.Match[str]) -> str:
        name, spec = match.group(1), match.group(2) or ""
        current = env.get(name)
        if spec.startswith(":-"):
            return current if current else spec[2:]
        if spec.startswith("-"):
            return current if current is not None else spec[1:]
        if spec.startswith(":?"):
            if not current:
                raise Unset(name)
            return current
        if spec.startswith("?"):
            if current is None:
                raise Unset(name)
            return current
        return current or ""

    return _VAR.sub(one, text)


def filled_env() -> dict[str, str]:
    """.env.example as an operator would complete it: the empty required values set."""
    env = env_example()
    for name, operator in referenced_variables().items():
        if operator and "?" in operator and not env.get(name):
            env[name] = f"test-{name.lower()}-value"
    env["INBOXCRM_WEBHOOK_SECRET"] = "whsec_dGVzdC1zZWNyZXQtZm9yLWRlcGxveS1jb25maWctdGVzdHM="
    env["INBOXCRM_MAIL_FROM"] = "Sales <sales@operator.example>"
    return env


BASE = K8S / "base"
OVERLAYS = sorted(p.parent.name for p in (K8S / "overlays").glob("*/kustomization.yaml"))
KUBECTL = shutil.which("kubectl")


@cache
def _rendered(rendering: str) -> tuple[dict[str, Any], ...]:
    if rendering == "base":  # read as kustomize lists it: no tool needed
        kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
        docs: list[dict[str, Any]] = []
        for resource in kustomization["resources"]:
            docs.extend(d for d in yaml.safe_load_all((BASE / resource).read_text()) if d)
        return tuple(docs)
    assert KUBECTL, "kubectl (with its built-in kustomize) is needed to render the overlays"
    result = subprocess.run([KUBECTL, "kustomize", str(K8S / rendering)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    return tuple(d for d in yaml.safe_load_all(result.stdout) if d)


def k8s_documents(rendering: str = "base") -> list[dict[str, Any]]:
    """The manifests of the base, or of an overlay as `kubectl kustomize` renders it (the
    kustomize built into kubectl, as `kubectl apply -k` uses it). Fresh copies: callers may
    change them."""
    return copy.deepcopy(list(_rendered(rendering)))


def renderings() -> list[Any]:
    """"base" and each overlay (skipped, with the reason, where kubectl is missing)."""
    import pytest

    no_kubectl = pytest.mark.skipif(not KUBECTL, reason="kubectl (kustomize) is not installed")
    return ["base", *(pytest.param(f"overlays/{name}", marks=no_kubectl) for name in OVERLAYS)]


def container_env(container: Mapping[str, Any], rendering: str = "base") -> dict[str, str]:
    """What the container's environment holds: its ConfigMaps (envFrom), then its env; a
    Secret's keys are not known here."""
    maps = {d["metadata"]["name"]: d.get("data") or {} for d in k8s_documents(rendering)
            if d["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env |= {k: str(v) for k, v in maps[source["configMapRef"]["name"]].items()}
    return env | {e["name"]: str(e.get("value", "<from a reference>"))
                  for e in container.get("env", [])}


def app_containers(rendering: str = "base") -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, container) of every inboxcrm container: Deployments, Jobs, init containers."""
    for doc in k8s_documents(rendering):
        spec = doc.get("spec")
        template = spec.get("template") if isinstance(spec, dict) else None
        if not isinstance(template, dict):
            continue
        pod = template["spec"]
        for key in ("initContainers", "containers"):
            for container in pod.get(key, []):
                if str(container.get("image", "")).split(":")[0].endswith("inboxcrm"):
                    yield f"{doc['kind']} {doc['metadata']['name']} {key}", container
