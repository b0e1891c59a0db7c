"""The relay's request as the root of an item's trace (docs/architecture.md §8): one SERVER
span per HTTP request, named by the route's template (`POST /v1/inbound/standard`), never by
the raw path (a token or an ID in it) or the query string. The callers are the public (a mail
provider, anyone on the internet), so what they send is not trusted: a `traceparent` becomes
a *link* of a new root span, never its parent, and `baggage` is dropped, so nothing a caller
chooses reaches the spans or the Temporal headers the item's workflow carries. Mounted only
when tracing is on (inboxcrm/platform/tracing.py)."""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequestSpans:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.tracer = trace.get_tracer("inboxcrm.relay")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {key.decode("latin-1"): value.decode("latin-1")
                   for key, value in scope.get("headers", [])}
        method = str(scope["method"])
        status: dict[str, Any] = {}

        async def record_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        caller = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        links = [trace.Link(caller)] if caller.is_valid else []
        # A fresh context: no parent and no baggage from the caller.
        with self.tracer.start_as_current_span(
                method, context=otel_context.Context(), kind=trace.SpanKind.SERVER,
                links=links, attributes={"http.request.method": method},
                record_exception=False) as span:
            await self.app(scope, receive, record_status)
            route = getattr(scope.get("route"), "path", None)
            if route:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            if "code" in status:
                span.set_attribute("http.response.status_code", status["code"])
                if status["code"] >= 500:
                    span.set_status(trace.Status(trace.StatusCode.ERROR))
