"""Temporal client construction and registration of the contract's search attributes."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.envconfig import ClientConfigProfile
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import TLSConfig

from inboxcrm.platform import tracing
from inboxcrm.platform.config import Settings
from inboxcrm.schemas import contract
from inboxcrm.schemas.consent import ConsentSyncInput
from inboxcrm.schemas.drift import DriftCheckInput
from inboxcrm.schemas.notices import ReviewNoticesInput
from inboxcrm.schemas.retention import RetentionInput

log = logging.getLogger("inboxcrm.platform.temporal")

# The contract's search attributes as the server registers them.
SEARCH_ATTRIBUTES: dict[str, IndexedValueType.ValueType] = {
    key.name: IndexedValueType.ValueType(key.indexed_value_type)
    for key in contract.SEARCH_ATTRIBUTES
}

# `temporal server start-dev --search-attribute` spelling of the same set.
DEV_SERVER_FLAGS = [
    f"{name}={'Bool' if kind == IndexedValueType.INDEXED_VALUE_TYPE_BOOL else 'Keyword'}"
    for name, kind in SEARCH_ATTRIBUTES.items()
]


@dataclass(frozen=True)
class ConnectConfig:
    """Where and how a process connects to Temporal, after the profile and the overrides."""

    target_host: str
    namespace: str
    api_key: str | None = None
    tls: TLSConfig | bool | None = None
    rpc_metadata: Mapping[str, str] = field(default_factory=dict)
    profile: str | None = None  # the profile it came from, for the start-up log


# Settings that, once set, override what a profile says about TLS.
_TLS_SETTINGS = ("temporal_tls_cert", "temporal_tls_key", "temporal_tls_ca",
                 "temporal_tls_server_name", "temporal_api_key")


def load_profile(settings: Settings, env: Mapping[str, str] | None = None
                 ) -> ClientConfigProfile:
    """The Temporal client profile (temporalio.envconfig: the temporal.toml the Temporal CLI
    reads, then the standard TEMPORAL_* variables over it). The file is read only when
    TEMPORAL_CONFIG_FILE or TEMPORAL_PROFILE asks for it, so a developer's own CLI profile
    never redirects the local stack."""
    source = Path(settings.temporal_config_file) if settings.temporal_config_file else None
    wants_file = source is not None or bool(settings.temporal_profile)
    return ClientConfigProfile.load(
        profile=settings.temporal_profile or None, config_source=source,
        disable_file=not wants_file, override_env_vars=env)


def connect_config(settings: Settings, env: Mapping[str, str] | None = None
                   ) -> ConnectConfig:
    """One answer for the worker, the relay, the CLI and the bootstrap job: the profile
    (file, then TEMPORAL_* variables), with every INBOXCRM_* / TEMPORAL_ADDRESS setting that
    is set taking precedence; the defaults (local dev server, namespace `default`) last."""
    profile = load_profile(settings, env)
    given = settings.model_fields_set
    from_profile = profile.to_client_connect_config()
    address = (settings.temporal_address if "temporal_address" in given
               else from_profile.get("target_host") or settings.temporal_address)
    namespace = (settings.temporal_namespace if "temporal_namespace" in given
                 else from_profile.get("namespace") or settings.temporal_namespace)
    api_key = from_profile.get("api_key")
    if settings.temporal_api_key is not None:
        api_key = settings.temporal_api_key.get_secret_value()
    tls: TLSConfig | bool | None = from_profile.get("tls")
    if any(getattr(settings, name) for name in _TLS_SETTINGS):
        tls = tls_config(settings)
    return ConnectConfig(
        target_host=address, namespace=namespace, api_key=api_key or None, tls=tls,
        rpc_metadata=dict(from_profile.get("rpc_metadata", {})),
        profile=(settings.temporal_profile or "default")
        if settings.temporal_config_file or settings.temporal_profile else None)


def effective_namespace(settings: Settings) -> str:
    """The namespace this process works in (profile or setting), without reading TLS files."""
    if "temporal_namespace" in settings.model_fields_set:
        return settings.temporal_namespace
    return load_profile(settings).namespace or settings.temporal_namespace


# --- one namespace per tenant (docs/architecture.md §7, Namespaces) ----------------------
# What a Temporal namespace name may be here: letters, digits, `.`, `-`, `_`, starting and
# ending with a letter or digit, at most 255 characters (the server's limit; Temporal Cloud's
# `name.account` form included).
NAMESPACE_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,253}[A-Za-z0-9])?")
TENANT_PLACEHOLDER = "{tenant}"


class NamespaceSettingError(ValueError):
    """INBOXCRM_TENANT_NAMESPACES (or INBOXCRM_WORKER_NAMESPACES) cannot be used."""


@dataclass(frozen=True)
class TenantNamespaces:
    """Which namespace each tenant's workflows live in: an explicit entry, else the
    template, else the shared namespace (INBOXCRM_TEMPORAL_NAMESPACE or the profile's)."""

    shared: str
    named: Mapping[str, str] = field(default_factory=dict)
    template: str | None = None

    @property
    def per_tenant(self) -> bool:
        return bool(self.named) or self.template is not None

    def of(self, tenant: str | None) -> str:
        if tenant is None:
            return self.shared
        if tenant in self.named:
            return self.named[tenant]
        if self.template is not None:
            return self.template.replace(TENANT_PLACEHOLDER, tenant)
        return self.shared

    def check(self, tenants: Iterable[str]) -> dict[str, str]:
        """Each known tenant's namespace, after the start-up checks: every name valid, an
        entry only for a tenant that exists, and no namespace shared by two tenants unless
        it is the shared one. Raises NamespaceSettingError saying what is wrong."""
        known = sorted(set(tenants))
        unknown = sorted(set(self.named) - set(known))
        if unknown:
            raise NamespaceSettingError(
                f"INBOXCRM_TENANT_NAMESPACES names tenants without a policy: {unknown}")
        out: dict[str, str] = {}
        owner: dict[str, str] = {}
        for tenant in known:
            namespace = self.of(tenant)
            if not NAMESPACE_NAME.fullmatch(namespace):
                raise NamespaceSettingError(
                    f"INBOXCRM_TENANT_NAMESPACES: {namespace!r} (tenant {tenant}) is not a "
                    "namespace name (letters, digits, '.', '-', '_'; at most 255)")
            if namespace != self.shared and namespace in owner:
                raise NamespaceSettingError(
                    f"INBOXCRM_TENANT_NAMESPACES: tenants {owner[namespace]} and {tenant} "
                    f"share namespace {namespace!r}; only the shared namespace "
                    f"{self.shared!r} may hold several tenants")
            owner[namespace] = tenant
            out[tenant] = namespace
        return out

    def served(self, tenants: Iterable[str]) -> list[str]:
        """The shared namespace first, then every tenant's own (each once, sorted)."""
        return [self.shared, *sorted({self.of(t) for t in tenants} - {self.shared})]


def parse_tenant_namespaces(value: str, shared: str) -> TenantNamespaces:
    """`acme=inboxcrm-acme,beta=inboxcrm-beta`, `inboxcrm-{tenant}`, or both (the entries
    win over the template); empty: everyone in `shared`."""
    named: dict[str, str] = {}
    template: str | None = None
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        tenant, eq, namespace = (part.strip() for part in entry.partition("="))
        if not eq:
            if TENANT_PLACEHOLDER not in entry:
                raise NamespaceSettingError(
                    f"INBOXCRM_TENANT_NAMESPACES: {entry!r} is neither tenant=namespace nor "
                    "a template with {tenant}")
            if template is not None:
                raise NamespaceSettingError("INBOXCRM_TENANT_NAMESPACES: one template at most")
            template = entry
            continue
        if not tenant or not namespace:
            raise NamespaceSettingError(
                f"INBOXCRM_TENANT_NAMESPACES: {entry!r} needs a tenant and a namespace")
        if tenant in named:
            raise NamespaceSettingError(
                f"INBOXCRM_TENANT_NAMESPACES: tenant {tenant} is named twice")
        if not NAMESPACE_NAME.fullmatch(namespace):
            raise NamespaceSettingError(
                f"INBOXCRM_TENANT_NAMESPACES: {namespace!r} is not a namespace name")
        named[tenant] = namespace
    return TenantNamespaces(shared=shared, named=named, template=template)


def tenant_namespaces(settings: Settings) -> TenantNamespaces:
    """The operator's INBOXCRM_TENANT_NAMESPACES over the shared namespace."""
    return parse_tenant_namespaces(settings.tenant_namespaces, effective_namespace(settings))


def namespace_for(settings: Settings, tenant: str | None) -> str:
    """The namespace of `tenant`'s workflows (None: the shared namespace, where the
    product's own Schedules run)."""
    return tenant_namespaces(settings).of(tenant)


def namespace_for_workflow(settings: Settings, workflow_id: str) -> str:
    """The namespace of a workflow, from the tenant in its ID (`inbound/{tenant}/…`,
    `mailbox/{tenant}/…`); a workflow of no tenant runs in the shared namespace."""
    from inboxcrm.platform.codec import tenant_of_workflow

    return namespace_for(settings, tenant_of_workflow(workflow_id))


def worker_namespaces(settings: Settings, tenants: Iterable[str]) -> list[str]:
    """The namespaces a worker polls: INBOXCRM_WORKER_NAMESPACES, or all of them."""
    mapping = tenant_namespaces(settings)
    every = mapping.served(tenants)
    asked = [part.strip() for part in settings.worker_namespaces.split(",") if part.strip()]
    if not asked:
        return every
    stray = sorted(set(asked) - set(every))
    if stray:
        raise NamespaceSettingError(
            f"INBOXCRM_WORKER_NAMESPACES names namespaces no tenant uses: {stray}")
    return list(dict.fromkeys(asked))


def in_namespace(client: Client, namespace: str) -> Client:
    """The same connection, data converter and interceptors in another namespace (the SDK
    builds a Client on an existing service client: no second connection)."""
    if client.namespace == namespace:
        return client
    config = client.config()
    config["namespace"] = namespace
    return Client(**config)


async def connect(settings: Settings, *, lazy: bool = False,
                  runtime: Runtime | None = None, tenant: str | None = None,
                  namespace: str | None = None) -> Client:
    """The one way every process connects (docs/architecture.md §8): profile and overrides
    from connect_config, payload encryption, and the Temporal SDK's tracing interceptor when
    tracing is on (inboxcrm/platform/tracing.py; workers inherit it from the client). With
    `tenant`, in that tenant's namespace (`namespace_for`); `namespace` names one outright."""
    from inboxcrm.platform.codec import (
        data_converter,  # payload encryption (docs/architecture.md §7)
    )

    config = connect_config(settings)
    if namespace is None:
        namespace = namespace_for(settings, tenant) if tenant is not None else config.namespace
    return await Client.connect(
        config.target_host, namespace=namespace, lazy=lazy,
        data_converter=data_converter(
            settings, meter=runtime.metric_meter if runtime is not None else None),
        runtime=runtime,
        tls=config.tls, api_key=config.api_key, rpc_metadata=config.rpc_metadata,
        interceptors=tracing.client_interceptors(),
    )


def tls_config(settings: Settings) -> TLSConfig | bool | None:
    """TLS for a remote cluster: mTLS with a client certificate and key (PEM files; Temporal
    Cloud or self-hosted), optionally a private CA; plain TLS with an API key (Temporal
    Cloud). None (the SDK default, no TLS) when nothing is configured: the local dev server."""
    cert, key = settings.temporal_tls_cert, settings.temporal_tls_key
    if bool(cert) != bool(key):
        raise ValueError("INBOXCRM_TEMPORAL_TLS_CERT and INBOXCRM_TEMPORAL_TLS_KEY go together")
    ca = settings.temporal_tls_ca
    if not (cert or ca or settings.temporal_tls_server_name):
        return True if settings.temporal_api_key else None
    return TLSConfig(
        client_cert=Path(cert).read_bytes() if cert else None,
        client_private_key=Path(key).read_bytes() if key else None,
        server_root_ca_cert=Path(ca).read_bytes() if ca else None,
        domain=settings.temporal_tls_server_name or None,
    )


def metrics_runtime(bind_address: str | None) -> Runtime | None:
    """A runtime exporting the SDK's metrics (and the worker's own, via the activity
    metric meter) in Prometheus format at `bind_address` (e.g. 127.0.0.1:9464)."""
    if not bind_address:
        return None
    try:
        return Runtime(telemetry=TelemetryConfig(
            metrics=PrometheusConfig(bind_address=bind_address)))
    except ValueError:
        # Another worker on this host holds the port: run (and process work) without the
        # exporter rather than not at all.
        log.warning("metrics exporter not started: %s is in use", bind_address)
        return None


async def ensure_search_attributes(client: Client, namespace: str) -> list[str]:
    """Register any missing custom search attribute (idempotent). Returns the added names."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    missing = {
        name: kind for name, kind in SEARCH_ATTRIBUTES.items()
        if name not in existing.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(search_attributes=missing, namespace=namespace)
        )
    return sorted(missing)


NAMESPACE_RETENTION = timedelta(days=3)  # when the shared namespace says none
NAMESPACE_READY_SECONDS = 30.0


async def ensure_namespaces(client: Client, namespaces: Iterable[str],
                            retention: timedelta | None = None) -> list[str]:
    """Register each namespace that does not exist yet (the operator service's
    RegisterNamespace; idempotent) with `retention` (default: the retention of the client's
    own namespace, the shared one; else NAMESPACE_RETENTION), then wait until the server
    serves it (its namespace cache learns a new one within seconds) and register the search
    attributes in it. Returns the namespaces registered now. Temporal Cloud creates
    namespaces with `tcld` or its UI instead (deploy/bootstrap.py --skip-namespaces)."""
    import asyncio

    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import (
        DescribeNamespaceRequest,
        RegisterNamespaceRequest,
    )
    from temporalio.service import RPCError, RPCStatusCode

    if retention is None:
        shared = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=client.namespace))
        kept = shared.config.workflow_execution_retention_ttl
        retention = kept.ToTimedelta() if kept.seconds else NAMESPACE_RETENTION
    added: list[str] = []
    for namespace in namespaces:
        try:
            await client.workflow_service.register_namespace(RegisterNamespaceRequest(
                namespace=namespace, workflow_execution_retention_period=Duration(
                    seconds=int(retention.total_seconds()))))
            added.append(namespace)
        except RPCError as exc:
            if exc.status != RPCStatusCode.ALREADY_EXISTS:
                raise
        loop = asyncio.get_running_loop()
        deadline = loop.time() + NAMESPACE_READY_SECONDS
        while True:
            try:
                await client.workflow_service.describe_namespace(
                    DescribeNamespaceRequest(namespace=namespace))
                await ensure_search_attributes(client, namespace)
                break
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND or loop.time() > deadline:
                    raise
                await asyncio.sleep(0.5)
    return added


def _every(workflow_type: str, argument: object, schedule_id: str, settings: Settings,
           interval: timedelta, timeout: timedelta) -> Schedule:
    """A Schedule that starts `workflow_type` every `interval`: one run at a time (a slow
    run makes the next one skip, not pile up), no catch-up burst after an outage."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            workflow_type, argument, id=schedule_id, task_queue=settings.task_queue,
            execution_timeout=timeout,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=interval),
    )


def drift_check_schedule(settings: Settings) -> Schedule:
    """The drift check's Schedule as the settings describe it."""
    interval = timedelta(seconds=settings.drift_check_interval_seconds)
    return _every(contract.DRIFT_CHECK_WORKFLOW_TYPE,
                  DriftCheckInput(window_seconds=settings.drift_check_window_seconds,
                                  sample_size=settings.drift_check_sample_size),
                  contract.drift_check_schedule_id(settings.task_queue), settings,
                  interval, interval)


def review_notices_schedule(settings: Settings) -> Schedule:
    """The review notices' Schedule (docs/architecture.md §6); a run that finds nothing to
    tell posts nothing."""
    interval = timedelta(seconds=settings.review_notice_interval_seconds)
    return _every(contract.REVIEW_NOTICES_WORKFLOW_TYPE, ReviewNoticesInput(),
                  contract.review_notices_schedule_id(settings.task_queue), settings,
                  interval, max(interval, timedelta(minutes=5)))


def consent_sync_schedule(settings: Settings) -> Schedule:
    """The consent sync's Schedule (docs/consent.md); the rows it works off are durable, so
    a skipped run loses nothing."""
    interval = timedelta(seconds=settings.consent_sync_interval_seconds)
    return _every(contract.CONSENT_SYNC_WORKFLOW_TYPE, ConsentSyncInput(),
                  contract.consent_sync_schedule_id(settings.task_queue), settings,
                  interval, max(interval, timedelta(minutes=5)))


def retention_schedule(settings: Settings) -> Schedule:
    """The retention run's Schedule (docs/architecture.md §7); what a skipped run would have
    removed is still due at the next one."""
    interval = timedelta(seconds=settings.retention_interval_seconds)
    return _every(contract.RETENTION_WORKFLOW_TYPE, RetentionInput(),
                  contract.retention_schedule_id(settings.task_queue), settings,
                  interval, max(interval, timedelta(hours=1)))


async def ensure_schedules(client: Client, settings: Settings) -> dict[str, str]:
    """Create the product's Schedules, or bring existing ones to the current settings
    (idempotent; an operator's pause is kept): each one's ID and "created" or "updated"."""
    outcomes: dict[str, str] = {}
    for build, schedule_id in (
        (drift_check_schedule, contract.drift_check_schedule_id),
        (review_notices_schedule, contract.review_notices_schedule_id),
        (consent_sync_schedule, contract.consent_sync_schedule_id),
        (retention_schedule, contract.retention_schedule_id),
    ):
        sid = schedule_id(settings.task_queue)
        outcomes[sid] = await _ensure_schedule(client, sid, build(settings))
    return outcomes


async def ensure_drift_check_schedule(client: Client, settings: Settings) -> str:
    """Create the drift check's Schedule, or bring an existing one to the current settings
    (idempotent; an operator's pause is kept). Returns "created" or "updated"."""
    return await _ensure_schedule(client, contract.drift_check_schedule_id(settings.task_queue),
                                  drift_check_schedule(settings))


async def _ensure_schedule(client: Client, schedule_id: str, schedule: Schedule) -> str:
    """Create the Schedule, or update an existing one to `schedule` keeping its state (an
    operator's pause)."""
    try:
        await client.create_schedule(schedule_id, schedule)
        return "created"
    except ScheduleAlreadyRunningError:
        pass

    def keep_state(current: ScheduleUpdateInput) -> ScheduleUpdate:
        schedule.state = current.description.schedule.state
        return ScheduleUpdate(schedule=schedule)

    await client.get_schedule_handle(schedule_id).update(keep_state)
    return "updated"
