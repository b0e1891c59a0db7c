"""Outcome records of an external call, shared by every room: the three categories of a
classified failure, the `ApplicationError` types the workflow branches on, and the classified
result itself. The classifier that produces them is `inboxcrm.adapters.errors`; the failure
table is in `docs/architecture.md` ("Failure classification").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Literal


class Category(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    UNKNOWN = "unknown"


class ErrorType(StrEnum):
    """`ApplicationError.type` values the workflow branches on."""

    TRANSIENT = "TransientError"        # retried by the activity's RetryPolicy
    UNKNOWN_OUTCOME = "UnknownOutcome"  # retried; the next attempt reconciles first
    PERMANENT = "PermanentError"        # non-retryable: item becomes `blocked`
    AMBIGUOUS = "AmbiguousOutcome"      # non-retryable: item becomes `ambiguous`, held
    # PostgreSQL unreachable: retried; past the step's budget the item waits for the store
    # (capped backoff), never for a person: an outage alone needs no operator action.
    STORE_UNAVAILABLE = "StoreUnavailable"
    # The worker is shutting down and did not start the step: the workflow hands it to the
    # next worker after a short timer (docs/architecture.md §4, graceful shutdown).
    WORKER_DRAINING = "WorkerDraining"
    # An unexpected error that is neither a destination's answer nor a store outage (a bug,
    # a missing file): never a store wait. Bookkeeping does not retry it: the run fails and
    # shows as `failed` in the queue (inboxcrm/activities/store_outage.py).
    STEP_BUG = "StepBug"


@dataclass(frozen=True)
class Classified:
    category: Category
    reason: str                        # short, payload-free, e.g. "http_429", "connect_error"
    retry_after: float | None = None   # seconds the provider asked us to wait
    status_code: int | None = None
    # A limit that lasts until a known reset (HubSpot's DAILY): park the tenant's scope until
    # then instead of retrying; the attempt is not counted.
    park_until: datetime | None = None


# The causes a tenant's policy names an owner for (`owners`, docs/architecture.md §6, "Who is
# called"): who can act on a blocked item depends on what blocked it, not only on the tenant.
# `inboxcrm.adapters.errors.failure_cause` sorts a reason label into one of them; `review` is
# every review reason (extraction, matching, a follow-up's approval).
FailureCause = Literal["access", "integration", "data", "rate", "ambiguous"]
FAILURE_CAUSES: tuple[FailureCause, ...] = ("access", "integration", "data", "rate", "ambiguous")
OWNER_CAUSES: tuple[str, ...] = (*FAILURE_CAUSES, "review")
