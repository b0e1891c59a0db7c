"""The deploy files agree with the code. Every expectation here is derived from the code as it
is — the Settings model (its fields, aliases, which are required, which are secret), the
relay's routes as its app really matches them, the console scripts of pyproject.toml, the
modules `python -m` runs, the variables the code reads outside Settings — so a change to the
code that the deploy files do not follow fails here, and a change that they do follow needs
no edit of this test.

Complements tests/fast/test_deploy_config.py (schemas, no literal secrets, Settings loading
from the compose environment)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import shlex
import tomllib
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from fastapi import FastAPI
from pydantic import AliasChoices, SecretStr
from starlette.routing import Match

from inboxcrm.platform.config import Settings
from tests.helpers.deploy_files import (
    COMPOSE,
    DEPLOY,
    ENV_EXAMPLE,
    KUBECTL,
    OVERLAYS,
    ROOT,
    app_containers,
    compose_services,
    container_env,
    env_example,
    filled_env,
    interpolate,
    k8s_documents,
    referenced_variables,
    renderings,
    strings,
)

# Code whose environment reads count as "variables the code reads" (tests and bench read
# tool switches such as INBOXCRM_CAPTURE_HISTORIES that the deploy README mentions).
CODE_DIRS = ("inboxcrm", "deploy", "tests", "bench")
# Text in deploy/ that an operator copies from: commands, module names, paths in it must work.
# The renderings the codec endpoint is looked for in (the overlays only where kubectl is).
RENDERED = ["base", *(f"overlays/{name}" for name in OVERLAYS if KUBECTL)]
DEPLOY_TEXT = [DEPLOY / "README.md", ENV_EXAMPLE, COMPOSE, ROOT / "Dockerfile",
               *sorted((DEPLOY / "k8s").rglob("*.yaml")),
               *sorted((DEPLOY / "k8s").rglob("*.toml")),
               *sorted((DEPLOY / "temporal").glob("*"))]


# --- what the code says -------------------------------------------------------------------------
@cache
def settings_env() -> dict[str, str]:
    """Every environment name Settings reads -> the field it sets."""
    prefix = Settings.model_config.get("env_prefix", "")
    names: dict[str, str] = {}
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, AliasChoices):
            names.update({a: name for a in alias.choices if isinstance(a, str)})
        elif isinstance(alias, str):
            names[alias] = name
        else:
            names[f"{prefix}{name}".upper()] = name
    return names


def required_settings() -> set[str]:
    """The environment names of the settings without a default (a process cannot start
    without them); the preferred name of each (the first alias)."""
    preferred = {}
    for env, field in settings_env().items():
        preferred.setdefault(field, env)
    return {preferred[name] for name, field in Settings.model_fields.items()
            if field.is_required()}


def secret_settings() -> set[str]:
    """Environment names of settings typed as secrets."""
    secret_fields = {name for name, field in Settings.model_fields.items()
                     if SecretStr in _types(field.annotation)}
    return {env for env, field in settings_env().items() if field in secret_fields}


def _types(annotation: Any) -> set[Any]:
    args = getattr(annotation, "__args__", None)
    return {annotation} if not args else {t for arg in args for t in _types(arg)}


@cache
def code_env_reads() -> set[str]:
    """Environment variables the code reads outside Settings (os.environ.get / [] / getenv)."""
    found: set[str] = set()
    for folder in CODE_DIRS:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                name = _env_read(node)
                if name:
                    found.add(name)
    return found


def _env_read(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        func = node.func
        text = ast.unparse(func)
        if text in ("os.environ.get", "os.getenv", "environ.get", "os.environ.setdefault"):
            value = node.args[0].value
            return value if isinstance(value, str) else None
    if isinstance(node, ast.Subscript) and ast.unparse(node.value) in ("os.environ", "environ"):
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            return key.value
    return None


def read_by_code() -> set[str]:
    return set(settings_env()) | code_env_reads()


@cache
def relay_app() -> FastAPI:
    from inboxcrm.ingress.app import create_app

    return create_app(Settings())


def relay_serves(method: str, path: str) -> bool:
    """Whether the relay's app routes this request (as Starlette matches it, so routers
    included without an OpenAPI entry count too)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "",
             "headers": [], "query_string": b""}
    return any(route.matches(scope)[0] == Match.FULL for route in relay_app().router.routes)


def console_scripts() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project.get("scripts", {}))


def runnable_module(name: str) -> bool:
    """`python -m name` would run something: a package with __main__, or a module with a
    `if __name__ == "__main__":` block."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{name}.__main__") is not None
    return "__name__ == \"__main__\"" in Path(spec.origin).read_text()


def default(field: str) -> Any:
    return Settings.model_fields[field].default


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


# --- tests of the derivations themselves (so a broken derivation cannot pass vacuously) ---------
def test_the_derivations_see_the_code() -> None:
    assert {"DATABASE_URL", "TEMPORAL_ADDRESS", "INBOXCRM_RELAY_PORT"} <= set(settings_env())
    assert "INBOXCRM_POLICY_DIR" in code_env_reads()
    assert relay_serves("GET", "/healthz") and not relay_serves("POST", "/healthz")
    assert not relay_serves("GET", "/no-such-route")
    assert runnable_module("inboxcrm.worker") and runnable_module("inboxcrm.ingress.main")
    assert not runnable_module("inboxcrm.platform.config")
    assert "inboxcrm" in console_scripts()


# --- entry points -------------------------------------------------------------------------------
def commands(rendering: str) -> Iterator[tuple[str, list[str]]]:
    """Every command a deploy file runs: (where, argv)."""
    for name, service in compose_services().items():
        if "build" not in service:
            continue  # a third-party image: its programs are its own
        for key in ("command", "entrypoint"):
            if isinstance(service.get(key), list):
                yield f"compose {name}.{key}", [str(a) for a in service[key]]
        test = (service.get("healthcheck") or {}).get("test")
        if isinstance(test, list) and test[0] == "CMD":
            yield f"compose {name}.healthcheck", [str(a) for a in test[1:]]
    for where, container in app_containers(rendering):
        argv = [*container.get("command", []), *container.get("args", [])]
        if argv:
            yield where, argv
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            command = ((container.get(probe) or {}).get("exec") or {}).get("command")
            if command:
                yield f"{where}.{probe}", list(command)
    dockerfile = (ROOT / "Dockerfile").read_text()
    for match in re.finditer(r"^(?:CMD|ENTRYPOINT)\s+(\[.*\])", dockerfile, re.M):
        yield "Dockerfile", list(yaml.safe_load(match.group(1)))


def text_commands() -> Iterator[tuple[str, list[str]]]:
    """Commands written in the deploy documentation and comments an operator copies."""
    pattern = re.compile(r"(?:^|[`$(\s])((?:python|\.venv/bin/python) (?:-m [\w.]+|[\w/]+\.py)"
                         r"[^`\n|;&)]*)")
    for path in DEPLOY_TEXT:
        for match in pattern.finditer(path.read_text()):
            yield str(path.relative_to(ROOT)), shlex.split(match.group(1).rstrip("\\ "))


def check_argv(where: str, argv: list[str]) -> None:
    program = Path(argv[0]).name
    if program.startswith("python"):
        if argv[1] == "-m":
            assert runnable_module(argv[2]), f"{where}: `python -m {argv[2]}` runs nothing"
        elif argv[1] == "-c":
            pass
        else:
            assert (ROOT / argv[1]).is_file(), f"{where}: {argv[1]} does not exist"
    elif program in console_scripts():
        module, _, func = console_scripts()[program].partition(":")
        assert callable(getattr(importlib.import_module(module), func)), where
    else:
        assert program in {"sh", "bash", "temporal", "temporal-sql-tool", "tctl", "pg_isready",
                           "wget"}, f"{where}: unknown program {argv[0]}"


@pytest.mark.parametrize("rendering", renderings())
def test_every_command_the_deploy_files_run_exists(rendering: str) -> None:
    found = list(commands(rendering))
    assert len(found) >= 8
    for where, argv in found:
        check_argv(where, argv)


def test_every_command_the_deploy_documentation_shows_exists() -> None:
    found = list(text_commands())
    assert found
    for where, argv in found:
        check_argv(where, argv)


IMPORT = re.compile(r"from ((?:inboxcrm|schemas|workflows|activities)[\w.]*) import (\w+)"
                    r"|import ((?:inboxcrm|schemas|workflows|activities)[\w.]*)")
# Files the operator creates from the instructions (never in the repository).
OPERATOR_FILES = ("deploy/.env", "deploy/secrets")
REPO_PATH = re.compile(r"(?<![\w/.])((?:inboxcrm|schemas|workflows|activities|deploy|policies)"
                       r"/[\w./-]*\w)")


def test_every_module_and_path_the_deploy_files_name_exists() -> None:
    """`.env.example`, the deploy README and the manifests' comments name modules to import
    and files to read; an operator who copies them must not meet an ImportError."""
    named = 0
    for path in DEPLOY_TEXT:
        text = path.read_text()
        where = path.relative_to(ROOT)
        for module, attribute, plain in IMPORT.findall(text):
            target = module or plain
            assert importlib.util.find_spec(target) is not None, f"{where}: no module {target}"
            if attribute:
                assert hasattr(importlib.import_module(target), attribute), (
                    f"{where}: {target} has no {attribute}")
            named += 1
        for name in REPO_PATH.findall(text):
            if name.startswith(OPERATOR_FILES):
                continue
            assert (ROOT / name).exists(), f"{where}: {name} does not exist"
            named += 1
    assert named >= 5


# --- settings -----------------------------------------------------------------------------------
CONTAINER_VARIABLES = {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PATH"}


@pytest.mark.parametrize("rendering", renderings())
def test_every_variable_given_to_an_app_container_is_read_by_the_code(rendering: str) -> None:
    known = read_by_code() | CONTAINER_VARIABLES
    for name in ("bootstrap", "worker", "relay"):
        for key in compose_services()[name].get("environment") or {}:
            assert key in known, f"compose {name}: {key} is read by no code"
    for where, container in app_containers(rendering):
        for item in container.get("env", []):
            assert item["name"] in known, f"{where}: {item['name']} is read by no code"
    for doc in k8s_documents(rendering):
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].startswith("inboxcrm-config"):
            for key in doc.get("data", {}):
                assert key in known, f"ConfigMap: {key} is read by no code"


def test_every_inboxcrm_name_in_the_deploy_files_exists() -> None:
    """An INBOXCRM_* name in a deploy file is a setting the code reads, or a Compose
    variable of deploy/.env (documented in .env.example and used by the compose file)."""
    compose_variables = set(referenced_variables())
    for path in DEPLOY_TEXT:
        for name in set(re.findall(r"\bINBOXCRM_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())):
            assert name in read_by_code() or name in compose_variables, (
                f"{path.relative_to(ROOT)}: {name} is neither a setting nor a compose variable")


@pytest.mark.parametrize("rendering", renderings())
def test_required_settings_are_given_everywhere(rendering: str) -> None:
    """A setting without a default must reach every app container: in Compose as a literal or
    a `${VAR:?message}` that stops `docker compose` while unset, in Kubernetes through the
    ConfigMap, the container's env or the Secret the deploy README tells operators to create."""
    required = required_settings()
    operators = referenced_variables()
    readme = (DEPLOY / "README.md").read_text()
    for name in ("bootstrap", "worker", "relay"):
        env = compose_services()[name].get("environment") or {}
        for setting in required:
            assert setting in env, f"compose {name}: required {setting} missing"
            refs = re.findall(r"\$\{(\w+)", str(env[setting]))
            for ref in refs:
                assert operators.get(ref) and "?" in str(operators[ref]), (
                    f"compose {name}: {setting} must stop compose when {ref} is unset")
    for where, container in app_containers(rendering):
        given = set(container_env(container, rendering))
        for setting in required - given:
            assert f"{setting}=" in readme, f"{where}: required {setting} is given nowhere"


@pytest.mark.parametrize("rendering", renderings())
def test_secret_settings_never_have_literal_values(rendering: str) -> None:
    secrets = secret_settings()
    assert "INBOXCRM_CODEC_TOKEN" in secrets
    for name, service in compose_services().items():
        for key, value in (service.get("environment") or {}).items():
            if key in secrets:
                assert str(value).startswith("${"), f"compose {name}: literal {key}"
    for doc in k8s_documents(rendering):
        if doc["kind"] == "ConfigMap":
            assert not secrets & set(doc.get("data", {})), "a secret setting in a ConfigMap"
    for where, container in app_containers(rendering):
        for item in container.get("env", []):
            assert item["name"] not in secrets or "valueFrom" in item, f"{where}: {item}"


def test_env_example_documents_every_compose_variable_and_nothing_else() -> None:
    documented = set(env_example())
    referenced = set(referenced_variables())
    assert referenced - documented == set(), "undocumented compose variables"
    assert documented - referenced == set(), "documented but unused"


# --- routes, ports, probes, the codec -----------------------------------------------------------
def compose_env(service: str) -> dict[str, str]:
    raw = compose_services()[service].get("environment") or {}
    return {key: interpolate(value, filled_env()) for key, value in raw.items()}


def codec_endpoints() -> Iterator[tuple[str, str]]:
    """Every TEMPORAL_CODEC_ENDPOINT a Temporal UI is given (Compose, Kubernetes)."""
    for name in compose_services():
        value = compose_env(name).get("TEMPORAL_CODEC_ENDPOINT")
        if value is not None:
            yield f"compose {name}", value
    for rendering in RENDERED:
        for doc in k8s_documents(rendering):
            for text in strings(doc):
                match = re.search(r"TEMPORAL_CODEC_ENDPOINT\W+(\S+)", text)
                if match:
                    yield f"{rendering} {doc['kind']} {doc['metadata']['name']}", match.group(1)


def test_the_ui_codec_endpoint_is_the_relays_codec_path() -> None:
    """The Temporal UI posts to `{endpoint}/encode` and `{endpoint}/decode`; both must be
    routes of the relay, under the relay's public URL, or of the Compose codec proxy
    (deploy/codec_proxy.py, which forwards the same paths to the relay) at its published
    port."""
    found = list(codec_endpoints())
    assert found, "no Temporal UI is given a codec endpoint"
    public = compose_env("relay")["INBOXCRM_PUBLIC_RELAY_URL"]
    proxy = compose_services()["codec-proxy"]
    [published] = [interpolate(p, filled_env()) for p in proxy["ports"]]
    proxy_url = "http://" + published.rpartition(":")[0]
    relay_arg = proxy["command"][proxy["command"].index("--relay") + 1]
    assert relay_arg == f"http://relay:{relay_port(compose_env('relay'))}"
    for where, endpoint in found:
        path = urlsplit(endpoint).path
        for verb in ("encode", "decode"):
            assert relay_serves("POST", f"{path}/{verb}"), (
                f"{where}: TEMPORAL_CODEC_ENDPOINT={endpoint!r}: the relay does not serve "
                f"POST {path}/{verb}")
        if where.startswith("compose"):
            assert endpoint.startswith((public.rstrip("/"), proxy_url)), where


def relay_port(env: Mapping[str, str]) -> int:
    return int(env.get("INBOXCRM_RELAY_PORT") or default("relay_port"))


def test_compose_relay_port_probe_and_publish_agree() -> None:
    env = compose_env("relay")
    port = relay_port(env)
    published = [str(p) for p in compose_services()["relay"].get("ports", [])]
    assert published and all(p.rsplit(":", 1)[1] == str(port) for p in published)
    assert f"{port}" in re.findall(r"^EXPOSE (.*)$", (ROOT / "Dockerfile").read_text(),
                                   re.M)[0].split()
    # deploy/healthcheck.py relay asks this path on INBOXCRM_RELAY_PORT.
    check = (DEPLOY / "healthcheck.py").read_text()
    [path] = re.findall(r"http://127\.0\.0\.1:\{port\}(/[\w/]*)", check)
    assert relay_serves("GET", path), f"healthcheck.py asks {path}, which the relay lacks"
    assert "INBOXCRM_RELAY_PORT" in check


def test_compose_worker_metrics_port() -> None:
    address = compose_env("worker").get("INBOXCRM_WORKER_METRICS_ADDRESS") or default(
        "worker_metrics_address")
    assert address.split(":")[0] in ("0.0.0.0", "[::]"), "metrics unreachable from outside"
    assert str(port_of(address)) in re.findall(
        r"^EXPOSE (.*)$", (ROOT / "Dockerfile").read_text(), re.M)[0].split()


def metrics_ports(env: Mapping[str, str]) -> set[int]:
    """Ports of the metrics listeners this process's settings open (every setting whose name
    says metrics and whose value is host:port; the defaults where unset)."""
    ports = set()
    for env_name, field in settings_env().items():
        if "metrics" in field and "address" in field:
            value = env.get(env_name, default(field))
            if isinstance(value, str) and re.fullmatch(r".+:\d+", value):
                ports.add(port_of(value))
    return ports


def pods(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) of every Deployment and Job."""
    for doc in docs:
        spec = doc.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("template"), dict):
            yield doc, spec["template"]


def scrape_targets(rendering: str) -> Iterator[tuple[str, dict[str, Any], int, str]]:
    """(where, container, port, path) of every Prometheus scrape the manifests declare:
    `prometheus.io/*` pod annotations, and ServiceMonitor endpoints (Services chosen by their
    labels, the endpoint's port by the Service port's name, its targetPort in the pods the
    Service selects)."""
    docs = k8s_documents(rendering)
    for doc, template in pods(docs):
        annotations = template.get("metadata", {}).get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            for container in template["spec"]["containers"]:
                yield (doc["metadata"]["name"], container,
                       int(annotations["prometheus.io/port"]),
                       annotations.get("prometheus.io/path", "/metrics"))
    services = [d for d in docs if d["kind"] == "Service"]
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        selector = monitor["spec"]["selector"]["matchLabels"]
        chosen = [s for s in services
                  if selector.items() <= s["metadata"].get("labels", {}).items()]
        assert chosen, f"ServiceMonitor {monitor['metadata']['name']} selects no Service"
        for endpoint in monitor["spec"]["endpoints"]:
            for service in chosen:
                ports = [p for p in service["spec"]["ports"] if p.get("name") == endpoint["port"]]
                if not ports:
                    continue
                target = ports[0].get("targetPort", ports[0]["port"])
                for _, template in pods(docs):
                    if not service["spec"]["selector"].items() <= \
                            template["metadata"]["labels"].items():
                        continue
                    for container in template["spec"]["containers"]:
                        named = {p.get("name"): p["containerPort"]
                                 for p in container.get("ports", [])}
                        yield (f"ServiceMonitor {monitor['metadata']['name']}", container,
                               int(named.get(target, target)), endpoint.get("path", "/metrics"))


@pytest.mark.parametrize("rendering", renderings())
def test_every_scrape_target_serves_metrics(rendering: str) -> None:
    """A scrape hits a port and path the process really serves: the relay's own route on its
    port, or the /metrics of a metrics listener its settings open."""
    found = list(scrape_targets(rendering))
    assert {where for where, *_ in found} >= {"inboxcrm-relay", "inboxcrm-worker"}
    if rendering != "base":
        assert {"ServiceMonitor inboxcrm-relay", "ServiceMonitor inboxcrm-worker"} <= {
            where for where, *_ in found}
    for where, container, port, path in found:
        env = container_env(container, rendering)
        is_relay = "inboxcrm.ingress.main" in container.get("command", [])
        served = port in metrics_ports(env) and path == "/metrics"
        if is_relay and port == relay_port(env):
            served = relay_serves("GET", path)
        assert served, f"{where}: nothing serves {path} on port {port}"
        assert port in {p["containerPort"] for p in container.get("ports", [])}, where


@pytest.mark.parametrize("rendering", renderings())
def test_kubernetes_probes_and_ports_follow_the_settings(rendering: str) -> None:
    for where, container in app_containers(rendering):
        env = container_env(container, rendering)
        ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
        is_relay = "inboxcrm.ingress.main" in container.get("command", [])
        if is_relay:
            assert ports.get("http") == relay_port(env), f"{where}: http port != relay port"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            spec = container.get(probe) or {}
            if "httpGet" in spec:
                assert is_relay, f"{where}.{probe}: HTTP probe on a process without HTTP"
                assert relay_serves("GET", spec["httpGet"]["path"]), f"{where}.{probe}"
                assert ports.get(spec["httpGet"]["port"], spec["httpGet"]["port"]) == \
                    relay_port(env)
            if "tcpSocket" in spec:
                port = ports.get(spec["tcpSocket"]["port"], spec["tcpSocket"]["port"])
                assert port in metrics_ports(env) | ({relay_port(env)} if is_relay else set()), \
                    f"{where}.{probe}: nothing listens on {port}"


@pytest.mark.parametrize("rendering", renderings())
@pytest.mark.parametrize("name", ["worker", "relay"])
def test_compose_and_kubernetes_run_the_same_programs(name: str, rendering: str) -> None:
    compose = [str(a) for a in compose_services()[name]["command"]]
    kube = [c.get("command") for w, c in app_containers(rendering)
            if w.endswith(f"inboxcrm-{name} containers")]
    assert kube and all(k == compose for k in kube)
