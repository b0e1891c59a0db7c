"""The attempt protocol every side-effecting activity follows, written once.

(paused? park) → claim the operation row → (completed? return it) → reconcile if a
previous attempt may have taken effect → call the destination → record the result before
reporting success. Starting an attempt and recording a success are one statement each.
Failures are classified once (`inboxcrm.adapters.errors`) and stored on the row without payload.

Where the destination's only tool is an idempotency key with a window (Resend: 24 h from the
key's first request), repeating the identical request inside the window is the
reconciliation; once the window has passed, a repeat could send again, so any later attempt
is held as `ambiguous` with the reference and the window's start for the person who decides.
The window is counted, less a margin, from the first attempt that may have taken effect
(`operations.key_window_from`): an attempt the destination certainly refused (a 429 or 503
answered, a connection never made) sent nothing and opens none, so a send refused before a
long pause is sent after it, not held. A limit with a
known reset (HubSpot's DAILY), or a Retry-After longer than a step waits in place, parks the
tenant's scope until then and gives the attempt back (up to a cap: past it, a person decides).

Retry delays are jittered here, since a RetryPolicy has no jitter of its own: the provider's
Retry-After is honoured and never shortened (a little is added, so items refused together
do not come back together); without one, the step's own backoff with "equal jitter".

Every write an attempt makes to its row is fenced by its claim token (`ledger`): an attempt
that a re-run overtook (a slow local activity outliving its step) cannot complete, fail or
release anything; it reports what the row says now instead.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.counters import count
from inboxcrm.activities.failures import refuse_if_worker_draining
from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.adapters import http
from inboxcrm.adapters.base import AdapterError
from inboxcrm.adapters.errors import (
    Category,
    Classified,
    ErrorType,
    park_long_retry_after,
    to_application_error,
)
from inboxcrm.schemas.models import OperationInput, OperationResult
from inboxcrm.store import audit, ledger

# The window is counted from our first attempt's start, which precedes the provider's first
# sight of the key; the margin covers clock skew between the two.
KEY_WINDOW_MARGIN = timedelta(hours=1)
# A step whose activity info carries no RetryPolicy backs off like CRM_RETRY / SEND_RETRY.
DEFAULT_BACKOFF = (1.0, 2.0, 60.0)  # initial seconds, coefficient, maximum seconds
# What is added to a provider's Retry-After: up to this share of it, at most RETRY_AFTER_SPREAD_MAX.
RETRY_AFTER_SPREAD = 0.1
RETRY_AFTER_SPREAD_MAX = 5.0
# The longest Retry-After parked for when the runner is built without a cap (24 h).
MAX_PARK_SECONDS = 86_400.0

_STATUS_FOR_CATEGORY = {
    Category.TRANSIENT: "waiting",
    Category.UNKNOWN: "waiting",
    Category.PERMANENT: "blocked",
}


@dataclass(frozen=True)
class Recorded:
    """The audit entry an action writes for its completed operation (with the ledger row,
    in the same statement; see `ledger.complete_attempt`)."""

    actor: str
    action: str
    detail: dict[str, Any]
    contact_id: str | None = None


@dataclass(frozen=True)
class Performed:
    """A destination's answer with what the action's success entry adds to its detail
    (`detail`), handed back by `perform` so the runner writes it with the success: nothing is
    kept between the call and its entry, so an attempt whose success is never recorded
    (fenced, failed, a lost worker) leaves nothing behind."""

    destination_id: str
    detail: dict[str, Any] = field(default_factory=dict)


class Fenced(Exception):  # noqa: N818 - a condition, not an error
    """This attempt's claim no longer owns its row (a later attempt claimed it, or it was
    settled): it must not write anything more."""


class Deferred(Exception):  # noqa: N818 - a condition, not an error
    """The attempt did nothing and should be tried again after `retry_after` seconds (e.g. an
    earlier attempt still holds the intent's lease)."""

    def __init__(self, reason: str, retry_after: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


@dataclass(frozen=True)
class Attempt:
    """What one attempt needs to know; handed to the action-specific callbacks."""

    op: OperationInput
    claim: ledger.Claim


class OutboxRunner:
    def __init__(self, pool: asyncpg.Pool, *, action: str, pause_scope: str,
                 max_retry_after: float, max_park: float = MAX_PARK_SECONDS,
                 also_record: ledger.AlsoRecord = ledger.AlsoRecord.NOTHING) -> None:
        """`also_record`: the action's own record of a success, written with the ledger row
        (`ledger.complete_attempt`). A Retry-After longer than `max_retry_after` parks the
        scope, up to `max_park` (longer: blocked for a person)."""
        self.pool = pool
        self.action = action
        self.pause_scope = pause_scope
        self.max_retry_after = max_retry_after
        self.max_park = max_park
        self._also_record = also_record

    async def run(
        self,
        op: OperationInput,
        *,
        reconcile: Callable[[Attempt], Awaitable[str | None]] | None,
        perform: Callable[[Attempt], Awaitable[str | Performed | OperationResult]],
        record_success: Callable[[Attempt, str, bool], Recorded],
        running_state: str,
        on_failure: Callable[[Any, Attempt, Classified], Awaitable[None]] | None = None,
        key_window_seconds: float | None = None,
    ) -> OperationResult:
        """Run one attempt. `reconcile` is None where the destination cannot be asked
        (then an uncertain previous attempt makes the operation ambiguous).
        `key_window_seconds`: how long the destination deduplicates by our key; a repeat
        attempt after it is held."""
        async with heartbeating():
            return await self._attempt(op, reconcile, perform, record_success, running_state,
                                       on_failure, key_window_seconds)

    async def _attempt(
        self,
        op: OperationInput,
        reconcile: Callable[[Attempt], Awaitable[str | None]] | None,
        perform: Callable[[Attempt], Awaitable[str | Performed | OperationResult]],
        record_success: Callable[[Attempt, str, bool], Recorded],
        running_state: str,
        on_failure: Callable[[Any, Attempt, Classified], Awaitable[None]] | None,
        key_window_seconds: float | None,
    ) -> OperationResult:
        item = op.item
        refuse_if_worker_draining(self.action)
        async with self.pool.acquire() as conn:
            claim = await ledger.begin_attempt(
                conn, op.op_key, tenant=item.tenant, pause_scope=self.pause_scope,
                event_id=item.event_id, running_state=running_state)
        if claim.paused:
            count("inboxcrm_operations_parked", action=self.action, outcome="paused")
            return OperationResult(
                status="parked", reason="paused",
                retry_at=claim.parked_until.isoformat() if claim.parked_until else None)
        if claim.already_completed:
            if claim.cancelled:
                # Cancelled stays cancelled (by a suppression or a rejection): never "sent".
                return OperationResult(status="cancelled", reason="already_cancelled")
            return OperationResult(status="completed", destination_id=claim.destination_id,
                                   reason="already_completed")
        if claim.exhausted:
            raise ApplicationError("attempt budget exhausted", type=ErrorType.TRANSIENT.value,
                                   non_retryable=True)
        attempt = Attempt(op, claim)
        activity.logger.info("operation attempt #%d", claim.attempts,
                             extra={"op_key": op.op_key})
        if key_window_seconds is not None and claim.since_key_window is not None and (
                claim.since_key_window
                >= key_window_seconds - KEY_WINDOW_MARGIN.total_seconds()):
            if not await self._hold(attempt, "idempotency_window_passed"):
                return await self._settled(op)
            raise ApplicationError("idempotency key window passed; outcome unconfirmed",
                                   type=ErrorType.AMBIGUOUS.value, non_retryable=True)
        http.clear_request_id()
        try:
            if claim.needs_reconcile:
                if reconcile is None:
                    await self._mark(attempt, "ambiguous", "unknown",
                                     "unreconcilable_previous_attempt")
                    raise ApplicationError("previous attempt unconfirmed",
                                           type=ErrorType.AMBIGUOUS.value, non_retryable=True)
                found = await reconcile(attempt)
                if found is not None:
                    await self._succeed(attempt, found, True, record_success)
                    return OperationResult(status="completed", destination_id=found,
                                           reconciled=True,
                                           end_recorded=op.ends_item is not None)
            outcome = await perform(attempt)
        except Fenced:
            return await self._settled(op)
        except Deferred as later:
            # Nothing happened in this attempt: the row goes back to waiting with what was
            # known before it (an uncertain earlier attempt stays uncertain).
            category = "unknown" if claim.needs_reconcile else claim.previous_category
            await self._mark(attempt, "waiting", category, later.reason, refused=True)
            raise ApplicationError(later.reason, type=ErrorType.TRANSIENT.value,
                                   next_retry_delay=timedelta(seconds=later.retry_after)
                                   ) from None
        except AdapterError as exc:
            classified = park_long_retry_after(exc.classified,
                                               max_retry_after=self.max_retry_after,
                                               max_park=self.max_park)
            count("inboxcrm_operation_failures", action=self.action,
                  outcome=classified.category.value)
            if classified.park_until is not None:
                if not await self._park(attempt, classified, on_failure):
                    return await self._settled(op)
                count("inboxcrm_operations_parked", action=self.action, outcome="provider_limit")
                return OperationResult(status="parked", reason=classified.reason,
                                       retry_at=classified.park_until.isoformat())
            error = with_jittered_delay(to_application_error(classified,
                                                    max_retry_after=self.max_retry_after,
                                                    reconcilable=reconcile is not None))
            status = _STATUS_FOR_CATEGORY[classified.category]
            if error.type == ErrorType.AMBIGUOUS.value:
                status = "ambiguous"
            # The failing answer's ID, else the step's last answer's (an adapter that
            # raised after reading a reply, e.g. a 409 it could not resolve).
            request_id = exc.request_id or http.last_request_id()
            async with self.pool.acquire() as conn, conn.transaction():
                # Transient and permanent mean the destination took nothing: no key window.
                owned = await ledger.record_failure(
                    conn, op.op_key, claim.attempts, status, classified.category.value,
                    classified.reason, refused=status != "ambiguous"
                    and classified.category is not Category.UNKNOWN,
                    window_before=claim.key_window_from, request_id=request_id)
                if owned and on_failure is not None:
                    await on_failure(conn, attempt, classified)
                await audit.append(
                    conn, tenant=item.tenant, event_id=item.event_id,
                    workflow_id=item.workflow_id, actor=self.action, action="attempt_failed",
                    detail={"op_key": op.op_key, "attempt": claim.attempts,
                            "category": classified.category.value, "reason": classified.reason,
                            "retry_after": classified.retry_after, "fenced": not owned,
                            "request_id": request_id},
                )
            if not owned:
                return await self._settled(op)
            raise error from None
        if isinstance(outcome, OperationResult):
            return outcome
        performed = outcome if isinstance(outcome, Performed) else Performed(outcome)
        try:
            await self._succeed(attempt, performed.destination_id, False, record_success,
                                performed.detail)
        except Fenced:
            return await self._settled(op)
        return OperationResult(status="completed", destination_id=performed.destination_id,
                               end_recorded=op.ends_item is not None)

    async def _succeed(
        self, attempt: Attempt, destination_id: str, reconciled: bool,
        record_success: Callable[[Attempt, str, bool], Recorded],
        performed: dict[str, Any] | None = None,
    ) -> None:
        """Record the success with its mirror and audit entry (and the item's end, when the
        workflow gave one), if this attempt still owns the row (raises Fenced otherwise:
        nothing is written). `performed`: what `perform` added to the entry's detail."""
        item = attempt.op.item
        entry = record_success(attempt, destination_id, reconciled)
        detail = {**entry.detail, **(performed or {})}
        request_id = http.last_request_id()
        if request_id is not None:  # the ledger row takes it from the entry's detail
            detail = {**detail, "request_id": request_id}
        owned = await ledger.complete_attempt(
            self.pool, attempt.op.op_key, token=attempt.claim.attempts,
            destination_id=destination_id, external_ref=attempt.claim.external_ref,
            also=self._also_record,
            entry=ledger.SuccessEntry(
                tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=entry.actor, action=entry.action, detail=detail,
                contact_id=entry.contact_id),
            ends_item=attempt.op.ends_item)
        if not owned:
            raise Fenced()
        count("inboxcrm_operations_completed", action=self.action,
              outcome="reconciled" if reconciled else "sent")

    async def _park(self, attempt: Attempt, classified: Classified,
                    on_failure: Callable[[Any, Attempt, Classified], Awaitable[None]] | None,
                    ) -> bool:
        """The destination's limit lasts until a reset: park the tenant's scope until then
        (read by the next attempt's start like a pause) and give this attempt back. False:
        this attempt no longer owns its row (fenced), nothing was written."""
        op, item = attempt.op, attempt.op.item
        assert classified.park_until is not None
        async with self.pool.acquire() as conn, conn.transaction():
            if not await ledger.park_scope(conn, op.op_key, attempt.claim.attempts, classified,
                                           tenant=item.tenant, scope=self.pause_scope,
                                           until=classified.park_until,
                                           window_before=attempt.claim.key_window_from):
                return False
            if on_failure is not None:
                await on_failure(conn, attempt, classified)
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=self.action, action="scope_parked",
                detail={"op_key": op.op_key, "scope": self.pause_scope,
                        "until": classified.park_until.isoformat(),
                        "reason": classified.reason, "retry_after": classified.retry_after},
            )
        return True

    async def _hold(self, attempt: Attempt, reason: str) -> bool:
        """Ambiguous: held for a person, with what they need to decide (the reference the
        destination knows, e.g. the intent ID = idempotency key, the first attempt's time,
        and the start of the key's window: the first attempt that may have taken effect).
        False: fenced off, nothing written."""
        op, item, claim = attempt.op, attempt.op.item, attempt.claim
        first = claim.first_attempt_at.isoformat() if claim.first_attempt_at else None
        window = claim.key_window_from.isoformat() if claim.key_window_from else None
        async with self.pool.acquire() as conn, conn.transaction():
            if not await ledger.record_failure(conn, op.op_key, claim.attempts, "ambiguous",
                                               "unknown", reason):
                return False
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                actor=self.action, action="operation_ambiguous",
                detail={"op_key": op.op_key, "reason": reason, "attempt": claim.attempts,
                        "external_ref": claim.external_ref, "first_attempt_at": first,
                        "key_window_from": window},
            )
        return True

    async def _mark(self, attempt: Attempt, status: str, category: str | None,
                    reason: str, refused: bool = False) -> None:
        async with self.pool.acquire() as conn:
            if not await ledger.record_failure(conn, attempt.op.op_key, attempt.claim.attempts,
                                               status, category, reason, refused=refused,
                                               window_before=attempt.claim.key_window_from):
                raise Fenced()

    async def _settled(self, op: OperationInput) -> OperationResult:
        """A fenced-off attempt reports the row as it is now: settled by another attempt, or
        still owned by one (then the next attempt of this step reconciles first)."""
        count("inboxcrm_operation_attempts_fenced", action=self.action, outcome="fenced")
        async with self.pool.acquire() as conn:
            status, destination_id = await ledger.current_status(conn, op.op_key)
        if status == "completed":
            return OperationResult(status="completed", destination_id=destination_id,
                                   reason="completed_by_another_attempt")
        if status == "cancelled":
            return OperationResult(status="cancelled", reason="cancelled")
        raise ApplicationError("another attempt owns the operation",
                               type=ErrorType.UNKNOWN_OUTCOME.value)


def with_jittered_delay(error: ApplicationError) -> ApplicationError:
    """The same error with a jittered `next_retry_delay` (a RetryPolicy has no jitter).

    A provider's delay is honoured and never shortened: up to RETRY_AFTER_SPREAD of it (at
    most RETRY_AFTER_SPREAD_MAX seconds) is added. Without one, the step's RetryPolicy
    backoff for this attempt, as "equal jitter": half of it, plus a random part of the other
    half, so a burst of failures (a CRM outage) does not come back in lockstep. Errors that
    are not retried are returned as they are."""
    if error.non_retryable:
        return error
    if error.next_retry_delay is not None:
        asked = error.next_retry_delay.total_seconds()
        delay = asked + random.uniform(0, min(asked * RETRY_AFTER_SPREAD,
                                              RETRY_AFTER_SPREAD_MAX))
    else:
        backoff = _backoff_seconds()
        delay = backoff / 2 + random.uniform(0, backoff / 2)
    return ApplicationError(error.message, *error.details, type=error.type,
                            non_retryable=False, next_retry_delay=timedelta(seconds=delay))


def _backoff_seconds() -> float:
    """The step's RetryPolicy backoff before the next attempt (Temporal's formula)."""
    initial, coefficient, maximum = DEFAULT_BACKOFF
    attempt = 1
    with contextlib.suppress(RuntimeError):  # outside an activity: the defaults
        info = activity.info()
        attempt = max(info.attempt, 1)
        policy = info.retry_policy
        if policy is not None:
            initial = policy.initial_interval.total_seconds()
            coefficient = policy.backoff_coefficient
            if policy.maximum_interval is not None:
                maximum = policy.maximum_interval.total_seconds()
            else:
                maximum = initial * 100
    return float(min(initial * coefficient ** (attempt - 1), maximum))
