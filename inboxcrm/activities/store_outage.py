"""A PostgreSQL outage, as every activity reports it: `StoreUnavailable`, retryable; and
every other unexpected error, as what it is: `StepBug`.

An activity interceptor (registered by the worker) so no activity has to remember it. The
workflow waits out a store outage with capped backoff instead of asking a person
(docs/architecture.md §4): the store coming back is the only action an outage needs. A store
that hangs rather than refuses (a frozen server, a network partition) shows up as the step's
timeout instead, which the workflow treats the same way. Each conversion counts
`inboxcrm_store_unavailable` on the worker's metrics endpoint (alert
`InboxcrmStoreUnavailable`).

Only errors that say the store cannot be reached count (`is_store_unavailable`): waiting
cannot fix a missing policy file or a wrong query, and treating those as an outage would
make the item wait for a store that is fine, forever. They become `StepBug` (the exception's
type name only, never its message): bookkeeping does not retry it (`BOOKKEEPING_RETRY`), so a
bug there fails the run, which shows as `failed` in the queue; a step retries it within its
budget and then waits for a person (`blocked`). Conflicts a retry resolves (serialization
failures, deadlocks, a lock not available) pass through unchanged and are retried."""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from inboxcrm.activities.counters import count
from inboxcrm.schemas.outcomes import ErrorType

# The server refused, dropped or never answered the connection (class 08), is shutting
# down, starting or restarting (class 57: operator intervention, including a statement
# cancelled by its timeout), has no connection slot, disk or memory left (class 53), or is a
# standby that cannot write yet (25006, during a failover); a socket that was refused, reset
# or timed out (a pool acquire timing out is a TimeoutError too); the host not found.
_STORE_DOWN: tuple[type[BaseException], ...] = (
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.exceptions.ReadOnlySQLTransactionError,
    ConnectionError,
    TimeoutError,
    socket.gaierror,
)
# asyncpg reports a refused connection to several addresses as a plain OSError ("Multiple
# exceptions: Connect call failed"), without an errno, or with one of these.
_NETWORK_ERRNOS = frozenset({
    errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.EHOSTUNREACH,
    errno.ENETUNREACH, errno.ETIMEDOUT, errno.EPIPE, errno.ENOTCONN, errno.EHOSTDOWN,
    errno.ENETDOWN,
})
# Conflicts between transactions: retrying the same step resolves them.
_CONFLICTS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.TransactionRollbackError,   # serialization failure, deadlock (40)
    asyncpg.exceptions.LockNotAvailableError,      # 55P03
)
# What an activity raises on purpose (classified already), a cancellation, a conflict.
_PASS_THROUGH: tuple[type[BaseException], ...] = (
    ApplicationError, asyncio.CancelledError, *_CONFLICTS)


def is_store_unavailable(exc: BaseException) -> bool:
    """True only for errors that say PostgreSQL cannot be reached now."""
    if isinstance(exc, _STORE_DOWN):
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        # "connection is closed", "pool is closed", "pool is closing": the connection went
        # away. Every other interface error (wrong argument count, an operation already in
        # progress, a configuration error) is ours to fix.
        text = str(exc)
        return "closed" in text or "closing" in text
    if type(exc) is OSError:
        return exc.errno is None or exc.errno in _NETWORK_ERRNOS
    return False


def store_unavailable() -> ApplicationError:
    return ApplicationError("store unavailable", type=ErrorType.STORE_UNAVAILABLE.value)


def step_bug(exc: BaseException) -> ApplicationError:
    """An error no retry is meant to fix: named by its type only (no payload)."""
    return ApplicationError(f"bug: {type(exc).__name__}", type=ErrorType.STEP_BUG.value)


class _Inbound(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        try:
            return await super().execute_activity(input)
        except _PASS_THROUGH:
            raise
        except Exception as exc:
            name = activity.info().activity_type
            if is_store_unavailable(exc):
                count("inboxcrm_store_unavailable", activity=name)
                raise store_unavailable() from None
            count("inboxcrm_step_bugs", activity=name)
            activity.logger.error("unexpected error in %s: %s", name, type(exc).__name__)
            raise step_bug(exc) from exc


class StoreOutageInterceptor(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)
