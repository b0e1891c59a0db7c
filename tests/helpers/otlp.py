"""A tiny OTLP/HTTP trace receiver for the stack tier: processes started with
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT pointing at it send their spans here as the protobuf
ExportTraceServiceRequest a real collector receives, decoded with opentelemetry-proto."""

from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    raw: dict[str, Any] = field(repr=False)  # everything the span carried (events, status)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def add(self, request: ExportTraceServiceRequest) -> None:
        with self._lock:
            self.requests += 1
            for resource_spans in request.resource_spans:
                service = next((a.value.string_value for a in resource_spans.resource.attributes
                                if a.key == "service.name"), "")
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        attributes = {a.key: MessageToDict(a.value) for a in span.attributes}
                        self.spans.append(ReceivedSpan(
                            service=service, name=span.name, trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(), parent_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={k: next(iter(v.values()), None) for k, v in
                                        attributes.items()},
                            raw=MessageToDict(span)))

    def snapshot(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
