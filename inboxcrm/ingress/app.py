"""The relay's HTTP app: one router per inbound source, plus health, metrics, the codec
endpoint, one-click unsubscribe and the review card, assembled here (no route module imports
another)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from inboxcrm.domain.extraction import work_pool
from inboxcrm.ingress.codec import codec_router
from inboxcrm.ingress.intake import Ingestor, TemporalHandle, sweep_forever
from inboxcrm.ingress.mailgun import mailgun_router
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.ingress.postmark import postmark_router
from inboxcrm.ingress.review import review_router
from inboxcrm.ingress.standard import standard_router
from inboxcrm.ingress.unsubscribe import unsubscribe_router
from inboxcrm.platform.config import Settings
from inboxcrm.store import db


def create_app(settings: Settings) -> FastAPI:
    metrics = RelayMetrics()
    handle = TemporalHandle(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # min_size=0: the relay starts (and answers 503) even while the database is down.
        pool = await db.create_pool(settings.database_url, min_size=0,
                                    max_size=settings.relay_pool_size)
        app.state.ingestor = Ingestor(pool, handle, settings.task_queue)
        app.state.metrics = metrics
        # The review card reads stored messages in a child process under the work budget,
        # never on this event loop (docs/architecture.md §7).
        work = work_pool(settings, settings.relay_work_processes)
        await work.start()
        app.state.work = work
        sweeper = asyncio.create_task(sweep_forever(app.state.ingestor, settings))
        try:
            yield
        finally:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
            await work.close()
            await pool.close()

    app = FastAPI(title="inboxcrm relay", lifespan=lifespan)
    app.include_router(standard_router(settings))  # POST /v1/inbound/standard
    app.include_router(postmark_router(settings))  # POST /v1/inbound/postmark
    app.include_router(mailgun_router(settings))  # POST /v1/inbound/mailgun[/mime]
    app.include_router(codec_router(settings))  # POST /codec/encode, /codec/decode
    app.include_router(unsubscribe_router(settings))  # POST /v1/unsubscribe/{token}
    app.include_router(review_router(settings))  # GET /review/{workflow_id}, /review/login

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Response:
        body = await metrics.render(request.app.state.ingestor.pool)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        ingestor: Ingestor = request.app.state.ingestor
        database = temporal_ok = False
        with contextlib.suppress(Exception):
            async with ingestor.pool.acquire() as conn:
                database = await asyncio.wait_for(conn.fetchval("SELECT true"), 3) is True
        with contextlib.suppress(Exception):
            client = await handle.get()
            temporal_ok = await asyncio.wait_for(client.service_client.check_health(), 3)
        ok = database and temporal_ok
        return JSONResponse({"ok": ok, "database": database, "temporal": temporal_ok},
                            status_code=200 if ok else 503)

    return app
