"""Tracing is off unless the OTEL_* variables ask for it, and then nothing of it is loaded or
wired in; what does leave a process is scrubbed of personal data (inboxcrm/platform/tracing.py,
inboxcrm/platform/span_scrub.py). The stack tier's tests/test_tracing.py reads real spans."""

from __future__ import annotations

import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode

from inboxcrm.platform import tracing
from inboxcrm.platform.span_scrub import ScrubbingExporter, scrub_span


@pytest.mark.parametrize(("env", "expected"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_tracing_is_on_only_when_asked(env: dict[str, str], expected: bool) -> None:
    assert tracing.requested(env) is expected


OFF_PROBE = """
import sys, asyncpg
from inboxcrm.platform import tracing
from inboxcrm.platform.config import Settings
from inboxcrm.ingress.app import create_app
import inboxcrm.worker
assert tracing.configure("probe") is False and not tracing.enabled()
assert tracing.client_interceptors() == []
app = create_app(Settings())
assert not any(m.cls.__name__ == "RequestSpans" for m in app.user_middleware)
assert not hasattr(asyncpg.Connection.execute, "__wrapped__"), "asyncpg is instrumented"
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry.sdk",
                "opentelemetry.instrumentation", "opentelemetry.exporter",
                "inboxcrm.platform.span_scrub", "temporalio.contrib.opentelemetry")))
assert not loaded, loaded
print("off")
"""


def test_off_by_default_nothing_is_loaded_or_wired() -> None:
    """The worker and the relay without OTEL_* variables: no SDK, no exporter, no asyncpg
    patch, no interceptor, no middleware (a process of its own: a clean interpreter)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
           "INBOXCRM_MAIL_FROM": "Sales <sales@example.com>"}
    result = subprocess.run([sys.executable, "-c", OFF_PROBE], env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "off", result.stderr


def test_path_template_hides_identifiers_and_addresses() -> None:
    assert tracing.path_template("/crm/v3/objects/contacts/batch/upsert") == \
        "/crm/v3/objects/contacts/batch/upsert"
    assert tracing.path_template("/crm/v3/objects/contacts/123456") == \
        "/crm/v3/objects/contacts/{id}"
    assert tracing.path_template(
        "/crm/v4/objects/notes/9f1c2d3e-aaaa/associations/default/contacts/77") == \
        "/crm/v4/objects/notes/{id}/associations/default/contacts/{id}"
    assert tracing.path_template("/lookup/jane@example.com?x=jane@example.com") == \
        "/lookup/{id}"


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: object) -> SpanExportResult:
        self.spans.extend(spans)  # type: ignore[call-overload]
        return SpanExportResult.SUCCESS


def test_what_leaves_the_process_carries_no_personal_data() -> None:
    context = SpanContext(trace_id=1, span_id=2, is_remote=False)
    span = ReadableSpan(
        name="lookup jane@example.com", context=context, kind=SpanKind.CLIENT,
        attributes={"temporalWorkflowID": "inbound/acme/standard/sales@acme.test/E-1",
                    "url.full": "https://api.example.com/x?email=jane@example.com",
                    "db.statement": "SELECT 1 FROM contacts WHERE email = $1",
                    "count": 3, "tags": ("a", "bob@example.org")},
        events=[Event("exception", {"exception.type": "UniqueViolationError",
                                    "exception.message": "Key (email)=(jane@example.com)",
                                    "exception.stacktrace": "... jane@example.com ..."})],
        status=Status(StatusCode.ERROR, "UniqueViolationError: Key (email)=(jane@example.com)"),
    )
    kept = Keep()
    ScrubbingExporter(kept).export([span])
    [out] = kept.spans
    assert out.name == "lookup {email}"
    assert out.attributes == {
        "temporalWorkflowID": "inbound/acme/standard/{email}/E-1",
        "url.full": "https://api.example.com/x",
        "db.statement": "SELECT 1 FROM contacts WHERE email = $1",
        "count": 3, "tags": ("a", "{email}")}
    assert [dict(e.attributes or {}) for e in out.events] == [
        {"exception.type": "UniqueViolationError"}]
    assert (out.status.status_code, out.status.description) == (
        StatusCode.ERROR, "UniqueViolationError")
    assert out.context == span.context and out.kind == span.kind
    assert scrub_span(out).attributes == out.attributes  # idempotent


async def test_a_callers_trace_context_is_a_link_and_its_baggage_is_dropped() -> None:
    """The relay's callers are the public: a `traceparent` they send must not make our item
    a child of their trace, and their `baggage` must not reach what we propagate onward
    (the Temporal headers of the item's workflow)."""
    from opentelemetry import baggage, propagate
    from opentelemetry import trace as otel_trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inboxcrm.ingress import request_spans

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    seen: dict[str, object] = {}

    async def app(scope: dict[str, object], receive: object, send: object) -> None:
        carrier: dict[str, str] = {}
        propagate.inject(carrier)  # what a workflow start would carry in its headers
        seen.update(carrier=carrier, baggage=dict(baggage.get_all()))

    middleware = request_spans.RequestSpans(app)  # type: ignore[arg-type]
    middleware.tracer = provider.get_tracer("test")
    caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    scope = {"type": "http", "method": "POST", "headers": [
        (b"traceparent", f"00-{caller_trace}-00f067aa0ba902b7-01".encode()),
        (b"baggage", b"tenant=globex,role=operator")]}
    await middleware(scope, None, None)  # type: ignore[arg-type]

    [span] = exporter.get_finished_spans()
    assert span.parent is None
    assert format(span.context.trace_id, "032x") != caller_trace
    assert [format(link.context.trace_id, "032x") for link in span.links] == [caller_trace]
    assert seen["baggage"] == {}
    carrier = seen["carrier"]
    assert isinstance(carrier, dict) and "baggage" not in carrier
    assert caller_trace not in carrier.get("traceparent", "")
    assert otel_trace.get_current_span().get_span_context().is_valid is False
