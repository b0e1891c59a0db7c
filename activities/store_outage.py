"""A PostgreSQL outage, as every activity reports it: `StoreUnavailable`, retryable.

An activity interceptor (registered by the worker) so no activity has to remember it. The
workflow waits out such a failure with capped backoff instead of asking a person
(docs/architecture.md §4): the store coming back is the only action an outage needs. A store
that hangs rather than refuses (a frozen server, a network partition) shows up as the step's
timeout instead, which the workflow treats the same way. Each conversion counts
`inboxcrm_store_unavailable` on the worker's metrics endpoint (alert
`InboxcrmStoreUnavailable`)."""

from __future__ import annotations

from typing import Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from schemas.outcomes import ErrorType

# Refused or dropped connections (OSError covers refused, reset and timed-out sockets),
# a server shutting down or starting up (class 57: operator intervention), a pool or
# connection that is closed.
STORE_DOWN: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.InterfaceError,
)


def store_unavailable() -> ApplicationError:
    return ApplicationError("store unavailable", type=ErrorType.STORE_UNAVAILABLE.value)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except STORE_DOWN:
            activity.metric_meter().create_counter("inboxcrm_store_unavailable").add(
                1, {"activity": activity.info().activity_type})
            raise store_unavailable() from None


class StoreOutageInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)
