"""The relay's HTTP app: the inbound sources (`inboxcrm.ingress.sources`), plus health, the
codec endpoint, one-click unsubscribe and the review card, assembled here (no route module
imports another; shared dependencies come from `inboxcrm.ingress.deps`).
Metrics are not on this (public) port: the lifespan starts their internal listener
(`inboxcrm.ingress.metrics`)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from inboxcrm.domain.extraction import work_pool
from inboxcrm.domain.policy import current_policies
from inboxcrm.ingress.admission import Admission
from inboxcrm.ingress.codec import codec_router
from inboxcrm.ingress.decisions_api import decisions_router
from inboxcrm.ingress.failed_runs import FailedRuns, check_forever
from inboxcrm.ingress.gmail_push import gmail_push_router
from inboxcrm.ingress.graph import graph_router
from inboxcrm.ingress.intake import Ingestor, TemporalHandle, sweep_forever
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.ingress.review import review_router
from inboxcrm.ingress.sources import sources_router
from inboxcrm.ingress.unsubscribe import unsubscribe_router
from inboxcrm.platform import tracing
from inboxcrm.platform.config import Settings
from inboxcrm.store import db
from inboxcrm.store.roles import role_of

# How long /healthz's answer is reused (it costs a database and a Temporal round trip, and
# the route is public: a caller in a loop must not cost one of each per request).
HEALTH_SECONDS = 1.0


class Health:
    """/healthz's answer, checked at most once per HEALTH_SECONDS whoever asks; callers
    that arrive while a check runs wait for that one."""

    def __init__(self, check: Callable[[], Awaitable[tuple[bool, bool]]]) -> None:
        self._check = check
        self._answer: tuple[bool, bool] | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    def _fresh(self) -> tuple[bool, bool] | None:
        if self._answer is not None and time.monotonic() - self._at < HEALTH_SECONDS:
            return self._answer
        return None

    async def answer(self) -> tuple[bool, bool]:
        """(database, temporal)."""
        if (fresh := self._fresh()) is not None:
            return fresh
        async with self._lock:
            if (fresh := self._fresh()) is not None:
                return fresh
            self._answer = await self._check()
            self._at = time.monotonic()
            return self._answer


def create_app(settings: Settings) -> FastAPI:
    metrics = RelayMetrics()
    handle = TemporalHandle(settings)
    if handle.namespaces.per_tenant:  # a bad INBOXCRM_TENANT_NAMESPACES stops the start
        handle.namespaces.check(current_policies())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # min_size=0: the relay starts (and answers 503) even while the database is down.
        pool = await db.create_pool(settings.database_url, min_size=0,
                                    max_size=settings.relay_pool_size,
                                    role=role_of("relay", settings.db_role))
        # The card and one-click unsubscribe read contacts: a pool of their own under the
        # desk's role, so that intake's role has no privilege on them (store.roles).
        desk_pool = await db.create_pool(settings.database_url, min_size=0,
                                         max_size=max(2, settings.relay_pool_size // 4),
                                         role=role_of("desk", settings.db_role))
        app.state.desk_pool = desk_pool
        app.state.ingestor = Ingestor(pool, handle, settings.task_queue)
        app.state.metrics = metrics
        app.state.admission = Admission()
        listener = metrics.serve(settings.relay_metrics_address) \
            if settings.relay_metrics_address else None
        # The review card reads stored messages in a child process under the work budget,
        # never on this event loop (docs/architecture.md §7).
        work = work_pool(settings, settings.relay_work_processes)
        await work.start()
        app.state.work = work
        failed = FailedRuns(pool, handle, settings.task_queue,
                            timedelta(hours=settings.failed_run_lookback_hours))
        tasks = [asyncio.create_task(sweep_forever(app.state.ingestor, settings)),
                 asyncio.create_task(check_forever(failed, settings.failed_run_check_seconds)),
                 asyncio.create_task(metrics.refresh_forever(
                     pool, settings.relay_metrics_interval_seconds))]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if listener is not None:
                listener.shutdown()
                listener.server_close()
            await work.close()
            await desk_pool.close()
            await pool.close()

    # The interactive docs and the schema describe every route to whoever asks: the local
    # stack only (docs/architecture.md §10 documents the interfaces).
    local = settings.env == "local"
    app = FastAPI(title="inboxcrm relay", lifespan=lifespan,
                  docs_url="/docs" if local else None, redoc_url="/redoc" if local else None,
                  openapi_url="/openapi.json" if local else None)
    if tracing.enabled():
        from inboxcrm.ingress.request_spans import RequestSpans

        app.add_middleware(RequestSpans)  # each request the root of its item's trace
    app.include_router(sources_router(settings))  # POST /v1/inbound/<source> (schemas.sources)
    app.include_router(gmail_push_router(settings, handle))  # POST /v1/inbound/gmail
    app.include_router(graph_router(settings))  # POST /v1/inbound/graph (Graph notifications)
    app.include_router(codec_router(settings))  # POST /codec/encode, /codec/decode
    app.include_router(unsubscribe_router(settings))  # POST /v1/unsubscribe/{token}
    app.include_router(review_router(settings))  # GET /review/ (queue), GET|POST /review/{id}
    app.include_router(decisions_router(settings))  # POST /v1/decisions (the CLI's)

    async def check() -> tuple[bool, bool]:
        ingestor: Ingestor = app.state.ingestor
        database = temporal_ok = False
        with contextlib.suppress(Exception):
            async with ingestor.pool.acquire() as conn:
                database = await asyncio.wait_for(db.ping(conn), 3)
        with contextlib.suppress(Exception):
            client = await handle.get()
            temporal_ok = await asyncio.wait_for(client.service_client.check_health(), 3)
        return database, temporal_ok

    health = Health(check)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        database, temporal_ok = await health.answer()
        ok = database and temporal_ok
        return JSONResponse({"ok": ok, "database": database, "temporal": temporal_ok},
                            status_code=200 if ok else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        """Readiness of the probes: PostgreSQL only, which storing a delivery needs. A relay
        keeps storing deliveries while Temporal is down (the sweeper starts them later), so
        a Temporal outage must neither restart relays nor take them out of the Service."""
        pool = request.app.state.ingestor.pool

        async def ping() -> bool:
            async with pool.acquire() as conn:
                return bool(await db.ping(conn))

        database = False
        with contextlib.suppress(Exception):
            database = await asyncio.wait_for(ping(), 3)
        return JSONResponse({"ok": database, "database": database},
                            status_code=200 if database else 503)

    return app
