"""Temporal client construction and registration of the contract's search attributes."""

from __future__ import annotations

import logging
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
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import TLSConfig

from inboxcrm.platform.config import Settings
from schemas import contract
from schemas.drift import DriftCheckInput
from schemas.notices import ReviewNoticesInput

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


async def connect(settings: Settings, *, lazy: bool = False,
                  runtime: Runtime | None = None) -> Client:
    from inboxcrm.platform.codec import (
        data_converter,  # payload encryption (docs/architecture.md §7)
    )

    return await Client.connect(
        settings.temporal_address, namespace=settings.temporal_namespace, lazy=lazy,
        data_converter=data_converter(
            settings, meter=runtime.metric_meter if runtime is not None else None),
        runtime=runtime,
        tls=tls_config(settings),
        api_key=settings.temporal_api_key.get_secret_value() if settings.temporal_api_key
        else None,
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


def drift_check_schedule(settings: Settings) -> Schedule:
    """The drift check's Schedule as the settings describe it: one run at a time (a slow
    run makes the next one skip, not pile up), no catch-up burst after an outage."""
    interval = timedelta(seconds=settings.drift_check_interval_seconds)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            contract.DRIFT_CHECK_WORKFLOW_TYPE,
            DriftCheckInput(window_seconds=settings.drift_check_window_seconds,
                            sample_size=settings.drift_check_sample_size),
            id=contract.drift_check_schedule_id(settings.task_queue),
            task_queue=settings.task_queue,
            execution_timeout=interval,
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=interval),
    )


def review_notices_schedule(settings: Settings) -> Schedule:
    """The review notices' Schedule (docs/architecture.md §6): one run at a time, no
    catch-up burst; a run that finds nothing to tell posts nothing."""
    interval = timedelta(seconds=settings.review_notice_interval_seconds)
    return Schedule(
        action=ScheduleActionStartWorkflow(
            contract.REVIEW_NOTICES_WORKFLOW_TYPE, ReviewNoticesInput(),
            id=contract.review_notices_schedule_id(settings.task_queue),
            task_queue=settings.task_queue,
            execution_timeout=max(interval, timedelta(minutes=5)),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=interval),
    )


async def ensure_review_notices_schedule(client: Client, settings: Settings) -> str:
    """Create the review notices' Schedule or bring it to the current settings, as
    `ensure_drift_check_schedule` does. Returns "created" or "updated"."""
    return await _ensure_schedule(client, contract.review_notices_schedule_id(settings.task_queue),
                                  review_notices_schedule(settings))


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
