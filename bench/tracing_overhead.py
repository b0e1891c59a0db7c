"""What tracing costs on the per-item CPU path (docs/architecture.md §8): the CPU time of one
destination call through `inboxcrm.adapters.http.send_request` — the path every CRM and mail
call of an item takes — with tracing off (the default), against the same call without the
tracing branch at all, and with tracing on (spans built and scrubbed, exported to nowhere).
In-process (httpx's MockTransport), so only our code and httpx are measured. Figures, not
pass/fail:

    .venv/bin/python -m bench.tracing_overhead [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import httpx

from inboxcrm.adapters import http
from inboxcrm.platform import tracing


def _client() -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url="http://crm.invalid", transport=httpx.MockTransport(
        lambda request: httpx.Response(200, json={"results": []})))


async def _cpu_per_call(call: Callable[[httpx.AsyncClient], Awaitable[object]], calls: int
                        ) -> float:
    async with _client() as client:
        for _ in range(200):  # warm-up
            await call(client)
        start = time.process_time()
        for _ in range(calls):
            await call(client)
        return (time.process_time() - start) / calls * 1e6


async def run(calls: int, rounds: int) -> dict[str, float]:
    def without_branch(client: httpx.AsyncClient) -> Awaitable[object]:
        return http._send(client, "POST", "/crm/v3/objects/contacts/batch/upsert", json={},
                          params=None, headers=None, passthrough=(), reason=None)

    def send(client: httpx.AsyncClient) -> Awaitable[object]:
        return http.send_request(client, "POST", "/crm/v3/objects/contacts/batch/upsert",
                                 json={})

    assert not tracing.enabled()
    results: dict[str, list[float]] = {"no tracing code": [], "tracing off": []}
    for index in range(rounds):  # alternating which goes first, so drift cancels out
        pair = [("no tracing code", without_branch), ("tracing off", send)]
        for name, call in pair[::-1] if index % 2 else pair:
            results[name].append(await _cpu_per_call(call, calls))
    _tracing_on_exporting_nowhere()
    results["tracing on"] = [await _cpu_per_call(send, calls) for _ in range(rounds)]
    return {name: statistics.median(values) for name, values in results.items()}


def _tracing_on_exporting_nowhere() -> None:
    """Tracing as `tracing.configure` sets it up, with the scrubbing step kept and the
    network export replaced by nothing."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from inboxcrm.platform.span_scrub import ScrubbingExporter

    class Nowhere(SpanExporter):
        def export(self, spans: object) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ScrubbingExporter(Nowhere())))
    trace.set_tracer_provider(provider)
    tracing._enabled = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    figures = asyncio.run(run(args.calls, args.rounds))
    base = figures["no tracing code"]
    for name, value in figures.items():
        print(f"{name:16} {value:8.1f} µs CPU per destination call "
              f"({(value - base) / base:+.1%})")


if __name__ == "__main__":
    main()
