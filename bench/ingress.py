"""Phase 3: ingress latency and requests/s of POST /v1/inbound/standard.

Three cases, each a fixed number of pre-signed requests from `concurrency` keep-alive
clients (httpx), after a warm-up that is not counted:
  relay/new        fresh delivery IDs: signature, ledger insert + audit row, workflow
                   start (Temporal), started mark;
  bare             the same bodies to a FastAPI + uvicorn process that only verifies the
                   signature (bench/bare_endpoint.py);
  relay/duplicate  the relay/new deliveries again (same delivery IDs): signature, ledger
                   conflict, one lookup, no Temporal call.
The worker is stopped for this phase so that the workflows the new deliveries start do not
compete for the CPU with the endpoint being measured (they wait in Temporal's task queue).
"""

from __future__ import annotations

from typing import Any

from bench.common import (
    Handles,
    Options,
    PostStats,
    Stalled,
    cpu_delta,
    cpu_snapshot,
    inquiry,
    person_name,
    post_all,
    sign,
    summary_ms,
)

CASE_TIMEOUT = 600.0
SEED_CONCURRENCY = 8  # below the relay's pool size: used only to top up, never measured
# Processes that serve a request (CPU per request, independent of the load generator).
SERVER_SIDE = {"relay": ("relay", "postgres", "temporal"), "bare": ("bare-endpoint",)}
FALLBACK_CLIENTS = 16  # relay/new again at this many clients when it stalled at --concurrency

STORED = """
SELECT delivery_id FROM inbound_events
WHERE tenant = 'acme' AND delivery_id = ANY($1::text[]) AND workflow_started_at IS NOT NULL
"""


async def ensure_stored(h: Handles, items: list[tuple[str, str]], url: str, log: Any) -> None:
    """The duplicate case must measure duplicates only: deliveries that relay/new did not
    get stored and started (it failed or stalled) are posted first, slowly, unmeasured."""
    stored = {r["delivery_id"] for r in await h.db.fetch(STORED, [d for d, _ in items])}
    missing = [(d, raw) for d, raw in items if d not in stored]
    if not missing:
        return
    log(f"ingress: storing {len(missing)} deliveries relay/new did not (unmeasured, "
        f"{SEED_CONCURRENCY} at a time)")
    try:
        await post_all(h.http, url, [sign(h.secret, d, raw) for d, raw in missing],
                       SEED_CONCURRENCY, CASE_TIMEOUT)
    except (Stalled, TimeoutError) as exc:
        log(f"ingress: top-up: {exc}; restarting the relay")
        h.restart_relay()


def _case(name: str, stats: PostStats, expected: str) -> dict[str, Any]:
    return {
        "case": name,
        "requests": len(stats.latencies),
        "expected_answer": expected,
        "answers": dict(stats.answers),
        "seconds": round(stats.elapsed, 2),
        "requests_per_second": round(stats.rps, 1),
        "latency_ms": summary_ms(stats.latencies),
    }


async def run_phase(h: Handles, opts: Options, log: Any) -> dict[str, Any]:
    log("ingress: stopping the worker (new deliveries' workflows wait in Temporal)")
    h.stop_worker()
    relay = f"{h.relay_url}/v1/inbound/standard"
    bare = f"{h.bare_url}/v1/inbound/standard"

    def batch(tag: str, count: int) -> list[tuple[str, str]]:
        prefix = f"in-{h.run_id}-{tag}-"
        return [(f"{prefix}{i:05d}",
                 inquiry(f"{prefix}{i}@example.com", person_name(i), f"Question {i}"))
                for i in range(count)]

    warm = batch("warm", opts.warmup)
    main = batch("main", opts.requests)

    def signed(items: list[tuple[str, str]]) -> list[Any]:
        # Signed just before each case: webhook-timestamp stays well inside the tolerance.
        return [sign(h.secret, delivery_id, raw) for delivery_id, raw in items]

    warm_errors: list[str] = []

    async def case(name: str, url: str, items: list[tuple[str, str]], expected: str,
                   concurrency: int | None = None) -> dict[str, Any]:
        clients = concurrency or opts.concurrency
        requests = signed(items)
        before = cpu_snapshot(h.pids)
        try:
            stats = await post_all(h.http, url, requests, clients, CASE_TIMEOUT)
        except (Stalled, TimeoutError) as exc:
            log(f"ingress: {name}: {exc}; restarting the relay")
            h.restart_relay()
            if name.startswith("warm-up"):
                warm_errors.append(f"{name}: {exc}")
            return {"case": name, "clients": clients, "error": str(exc),
                    "expected_answer": expected, "latency_ms": {"count": 0},
                    "requests_per_second": None}
        result = _case(name, stats, expected)
        result["clients"] = clients
        cpu = cpu_delta(before, cpu_snapshot(h.pids))
        result["cpu_seconds"] = {k: v for k, v in cpu.items() if v >= 0.01}
        server = SERVER_SIDE["bare" if url == bare else "relay"]
        result["server_cpu_ms_per_request"] = round(
            sum(cpu.get(k, 0.0) for k in server) * 1000 / max(len(requests), 1), 2)
        result["client_cpu_ms_per_request"] = round(
            cpu.get("bench", 0.0) * 1000 / max(len(requests), 1), 2)
        return result

    log(f"ingress: warm-up ({opts.warmup} requests per endpoint and kind)")
    await case("warm-up relay/new", relay, warm, "accepted")
    await ensure_stored(h, warm, relay, log)
    await case("warm-up relay/duplicate", relay, warm, "duplicate")
    await case("warm-up bare", bare, warm, "duplicate")

    log(f"ingress: relay/new, {opts.requests} requests at {opts.concurrency} concurrent")
    new = await case("relay/new", relay, main, "accepted")
    cases = [new]
    if new.get("error") and opts.concurrency > FALLBACK_CLIENTS:
        log(f"ingress: relay/new again with {FALLBACK_CLIENTS} clients (fresh deliveries)")
        cases.append(await case(f"relay/new@{FALLBACK_CLIENTS}", relay,
                                batch("fallback", opts.requests), "accepted",
                                FALLBACK_CLIENTS))
    await ensure_stored(h, main, relay, log)
    log(f"ingress: bare, {opts.requests} requests")
    base = await case("bare", bare, main, "duplicate")
    log(f"ingress: relay/duplicate, {opts.requests} requests")
    dup = await case("relay/duplicate", relay, main, "duplicate")
    cases += [base, dup]

    bare_lat, dup_lat = base["latency_ms"], dup["latency_ms"]
    bare_rps, dup_rps = base["requests_per_second"], dup["requests_per_second"]

    def ratio(a: float | None, b: float | None) -> float | None:
        return round(a / b, 2) if a and b else None

    bare_cpu = base.get("server_cpu_ms_per_request")
    dup_cpu = dup.get("server_cpu_ms_per_request")
    return {
        "cases": cases,
        "duplicate_vs_bare_server_cpu": ratio(dup_cpu, bare_cpu),
        "concurrency": opts.concurrency,
        "duplicate_vs_bare_p50": ratio(dup_lat.get("p50"), bare_lat.get("p50")),
        "duplicate_vs_bare_p99": ratio(dup_lat.get("p99"), bare_lat.get("p99")),
        "duplicate_vs_bare_rps": ratio(bare_rps, dup_rps),
        "target_duplicate_vs_bare": 1.5,
        "worker_stopped": True,
        "warm_up_errors": warm_errors,
    }
