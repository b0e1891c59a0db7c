"""Traces (docs/architecture.md §8): OpenTelemetry from the relay's request through the
workflow (the Temporal SDK's TracingInterceptor) to each destination call and each database
statement, exported over OTLP/HTTP as the standard OTEL_* variables configure it.

Off by default, and then free: nothing is imported, patched or wrapped unless
OTEL_TRACES_EXPORTER (otlp, console) or an OTLP endpoint is set, and the hot paths check
one module flag (`enabled()`). OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keep it off.

No personal data leaves the process in a span: every exporter is wrapped in
`inboxcrm.platform.span_scrub.ScrubbingExporter`. Span names and attributes are set by our
code from routes, methods, statement text (parameterised: no values) and IDs, never from
message content.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span
    from temporalio.client import Interceptor

log = logging.getLogger("inboxcrm.platform.tracing")

_enabled = False


def requested(env: Mapping[str, str] | None = None) -> bool:
    """Whether the OTEL_* variables ask for traces (the OTel default exporter, otlp, counts
    only once something names it or its endpoint: off by default, unlike the SDK's own)."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = _exporters(env)
    if exporters:
        return exporters != ["none"]
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def _exporters(env: Mapping[str, str]) -> list[str]:
    return [e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")
            if e.strip()]


def configure(service_name: str, env: Mapping[str, str] | None = None) -> bool:
    """Install the tracer provider, its exporters and the asyncpg instrumentation, once per
    process, if the environment asks for traces. Returns whether tracing is on."""
    global _enabled
    env = os.environ if env is None else env
    if _enabled or not requested(env):
        return _enabled
    from opentelemetry import trace
    from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    from inboxcrm.platform.span_scrub import ScrubbingExporter

    # OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win over the component's own name.
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))  # OTEL_TRACES_SAMPLER
    for name in _exporters(env) or ["otlp"]:
        exporter: SpanExporter
        if name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
                "OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            if protocol != "http/protobuf":
                log.warning("OTLP protocol %s is not shipped; exporting http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()  # endpoint, headers, timeout: OTEL_EXPORTER_OTLP_*
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            log.warning("unknown OTEL_TRACES_EXPORTER %r ignored", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(ScrubbingExporter(exporter)))
    trace.set_tracer_provider(provider)
    # Statement text only (parameterised), never the parameters.
    AsyncPGInstrumentor().instrument(  # type: ignore[no-untyped-call]
        tracer_provider=provider, capture_parameters=False)
    _enabled = True
    log.info("tracing on: %s", ",".join(_exporters(env) or ["otlp"]))
    return True


def enabled() -> bool:
    return _enabled


def client_interceptors() -> list[Interceptor]:
    """The Temporal SDK's tracing interceptor (client and worker) when tracing is on. It puts
    the trace context into workflow and activity headers, so the relay's request, the
    workflow and every step share one trace."""
    if not _enabled:
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


# A path segment that is an identifier (record IDs, UUIDs, numbers) or holds an address: a
# span name keeps the route's shape, not the values in it.
_ID_SEGMENT = re.compile(r"^(?:\d+|[0-9a-fA-F-]{8,}|.*@.*|.{25,})$")


def path_template(path: str) -> str:
    """`/crm/v3/objects/contacts/12345` -> `/crm/v3/objects/contacts/{id}`."""
    return "/".join("{id}" if segment and _ID_SEGMENT.match(segment) else segment
                    for segment in path.split("?", 1)[0].split("/"))


@contextlib.contextmanager
def destination_span(name: str, attributes: Mapping[str, str | int]) -> Iterator[Span]:
    """A CLIENT span around one call to a destination (call only when `enabled()`): the
    classified outcome, never the answer's content, is recorded by the caller."""
    from opentelemetry import trace

    tracer = trace.get_tracer("inboxcrm.adapters")
    with tracer.start_as_current_span(name, kind=trace.SpanKind.CLIENT,
                                      attributes=dict(attributes),
                                      record_exception=False) as span:
        yield span
