"""The relay's shared route dependencies, named once (`Annotated[..., Depends(...)]`): a route
declares what it needs (`ingestor: IngestorDep`) instead of reaching into `app.state`, and a
test hands it a stand-in with `app.dependency_overrides`. What the lifespan opens (the
ledger pool behind the `Ingestor`, the desk's pool, the work pool) is read from the app here
and nowhere else.
"""

from __future__ import annotations

from typing import Annotated, cast

import asyncpg
from fastapi import Depends, Request

from inboxcrm.ingress.admission import Admission
from inboxcrm.ingress.intake import Ingestor, Intake
from inboxcrm.ingress.metrics import RelayMetrics
from inboxcrm.platform.workpool import Runner


def get_ingestor(request: Request) -> Ingestor:
    """The ledger insert + workflow start (opened by the lifespan)."""
    return cast(Ingestor, request.app.state.ingestor)


def get_metrics(request: Request) -> RelayMetrics:
    """The relay's counters (made with the app, served on the internal listener)."""
    return cast(RelayMetrics, request.app.state.metrics)


def get_work(request: Request) -> Runner:
    """The pool that reads stored messages off the event loop, under the work budget."""
    return cast(Runner, request.app.state.work)


IngestorDep = Annotated[Ingestor, Depends(get_ingestor)]
MetricsDep = Annotated[RelayMetrics, Depends(get_metrics)]
WorkDep = Annotated[Runner, Depends(get_work)]


def get_pool(ingestor: IngestorDep) -> asyncpg.Pool:
    """The ledger's connection pool."""
    return ingestor.pool


def get_desk_pool(request: Request, ingestor: IngestorDep) -> asyncpg.Pool:
    """The pool of the routes that read a contact (the review card, one-click unsubscribe),
    under the desk's database role; the ledger's pool has no privilege on `contacts`
    (`inboxcrm.store.roles`). An app assembled without the lifespan (a test's) has one
    pool."""
    return cast(asyncpg.Pool, getattr(request.app.state, "desk_pool", None) or ingestor.pool)


def get_intake(request: Request, ingestor: IngestorDep, metrics: MetricsDep) -> Intake:
    """The one ingest path (`Intake.ingest`) over this relay's ledger, counters and
    per-tenant intake rates."""
    admission = getattr(request.app.state, "admission", None)
    if admission is None:  # an app assembled without the relay's lifespan (a test's)
        admission = request.app.state.admission = Admission()
    return Intake(ingestor, metrics, cast(Admission, admission))


PoolDep = Annotated[asyncpg.Pool, Depends(get_pool)]
DeskPoolDep = Annotated[asyncpg.Pool, Depends(get_desk_pool)]
IntakeDep = Annotated[Intake, Depends(get_intake)]
