"""What a span may carry out of the process (docs/architecture.md §7): exception types but
not their messages or stack traces (a database error can quote a value), URLs without their
query strings, and nothing shaped like an email address — the tenant's mailbox inside a
workflow ID included — which becomes `{email}`. Imported only when tracing is on
(inboxcrm/platform/tracing.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Status

EMAIL = re.compile(r"[^\s/@<>\"',;:]+@[^\s/@<>\"',;:]+\.[A-Za-z0-9-]+")
URL_ATTRIBUTES = ("url.full", "http.url", "http.target", "url.query")
# Exception event attributes that may quote data; the type stays.
DROPPED_EXCEPTION_ATTRIBUTES = ("exception.message", "exception.stacktrace")


def scrub_text(value: str) -> str:
    return EMAIL.sub("{email}", value)


def scrub_value(key: str, value: Any) -> Any:
    if isinstance(value, str):
        if key in URL_ATTRIBUTES:
            value = value.split("?", 1)[0] if key != "url.query" else ""
        return scrub_text(value)
    if isinstance(value, Sequence) and not isinstance(value, bytes | str):
        return tuple(scrub_text(v) if isinstance(v, str) else v for v in value)
    return value


def scrub_attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    return {key: scrub_value(key, value) for key, value in (attributes or {}).items()}


def scrub_span(span: ReadableSpan) -> ReadableSpan:
    """A copy of `span` fit to leave the process (see the module docstring)."""
    events = [Event(event.name, scrub_attributes(
        {k: v for k, v in (event.attributes or {}).items()
         if k not in DROPPED_EXCEPTION_ATTRIBUTES}), event.timestamp) for event in span.events]
    status = span.status
    if status.description:
        status = Status(status.status_code, status.description.split(":", 1)[0])
    return ReadableSpan(
        name=scrub_text(span.name), context=span.context, parent=span.parent,
        resource=span.resource, attributes=scrub_attributes(span.attributes), events=events,
        links=span.links, kind=span.kind, status=status, start_time=span.start_time,
        end_time=span.end_time, instrumentation_scope=span.instrumentation_scope)


class ScrubbingExporter(SpanExporter):
    """Hands the wrapped exporter scrubbed copies of the spans."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return self.inner.export([scrub_span(span) for span in spans])

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
