"""Step options of InboundEmailWorkflow: timeouts and retry policies.

A module of its own, imported as passthrough, so the workflow sandbox does not re-execute it
for every workflow run (see the Temporal Python SDK sandbox docs on passthrough modules).
Everything here is a constant: changing a value changes only future schedules, but changing
which *commands* a workflow issues needs `workflow.patched` (see
tests/fast/test_replay_stored.py).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as StepTimeout

from inboxcrm.schemas.models import DEFAULT_CRM_RETRY, DEFAULT_SEND_RETRY, StepRetry
from inboxcrm.schemas.outcomes import ErrorType

# --- Retry policies: bounded everywhere, each with the reason beside it -----------------
NON_RETRYABLE = [ErrorType.PERMANENT.value, ErrorType.AMBIGUOUS.value]

# Extraction reads Postgres and maybe an LLM: a few quick retries for blips and 429s.
EXTRACT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(
    seconds=30), maximum_attempts=5, non_retryable_error_types=NON_RETRYABLE)
# Planning is one DB transaction: retry conflicts/outages briefly (an opt-out also waits here,
# ≤5 s at a time, for a send already on the wire: up to one send lease), then a person looks.
PLAN_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(
    seconds=20), maximum_attempts=8, non_retryable_error_types=NON_RETRYABLE)
# CRM calls and the send: rate limits and outages clear within minutes; the idempotency key
# makes every retry safe, and the ledger enforces the same cap. These are the defaults; a
# tenant's policy `retries` may set others within the bounds of inboxcrm/schemas/models.py,
# and the plan carries them (`destination_retry`).
CRM_MAX_ATTEMPTS = DEFAULT_CRM_RETRY.max_attempts
SEND_MAX_ATTEMPTS = DEFAULT_SEND_RETRY.max_attempts


def destination_retry(settings: StepRetry) -> RetryPolicy:
    """The retry policy of a destination call (a CRM call or the send) under settings."""
    return RetryPolicy(initial_interval=timedelta(seconds=settings.initial_seconds),
                       backoff_coefficient=settings.backoff,
                       maximum_interval=timedelta(seconds=settings.maximum_seconds),
                       maximum_attempts=settings.max_attempts,
                       non_retryable_error_types=NON_RETRYABLE)


CRM_RETRY = destination_retry(DEFAULT_CRM_RETRY)
SEND_RETRY = destination_retry(DEFAULT_SEND_RETRY)
# Bookkeeping writes (state, audit, review tasks) are idempotent single statements: a few
# quick attempts (about a minute against a frozen store), then the workflow waits for the
# store (STORE_WAIT_*) and tries again, for as long as the outage lasts. Only a store outage
# waits: any other error (a bug, a missing row) is not retried and fails the run, which the
# relay's sweeper then shows as `failed` in the queue (docs/architecture.md §3).
BOOKKEEPING_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1),
                                maximum_interval=timedelta(seconds=10), maximum_attempts=5,
                                non_retryable_error_types=[*NON_RETRYABLE,
                                                           ErrorType.STEP_BUG.value])

# The timeout chain, innermost first (docs/architecture.md §4):
#   HTTP call ≤ INBOXCRM_HTTP_TIMEOUT_SECONDS (10 s); SMTP ≤ one command timeout per step,
#   and DATA starts only if it can end inside the send lease (inboxcrm/activities/send.py);
#   an operation attempt = claim + reconcile (one call) + call + record ≤ OPERATION_TIMEOUT,
#   which is also the send lease, so no delivery outlives the lease;
#   a step's attempts run inside workflow tasks that the SDK keeps alive while a local
#   activity runs (workflow task timeout 10 s: a dead worker is noticed after it);
#   the worker's graceful shutdown (INBOXCRM_SHUTDOWN_GRACE_SECONDS) ≥ OPERATION_TIMEOUT, and
#   the pod's terminationGracePeriodSeconds exceeds that (deploy/k8s/base/worker.yaml).
# Worst case of the LLM extractor: its own bounded retries of a 30 s call.
EXTRACT_TIMEOUT = timedelta(seconds=120)
PLAN_TIMEOUT = timedelta(seconds=30)
# Shadow planning may ask the second extractor (an LLM) first: the extraction's bound.
SHADOW_PLAN_TIMEOUT = EXTRACT_TIMEOUT
# Claim + reconcile (10 s) + call (10 s) + record, with room for slow statements.
OPERATION_TIMEOUT = timedelta(seconds=45)
BOOKKEEPING_TIMEOUT = timedelta(seconds=10)
# Regular activities (only workflows started before `local-steps` schedule them) heartbeat
# every 2 s: a killed worker's attempt is retried after this, not after the start-to-close
# timeout. Local activities cannot heartbeat; the workflow task timeout covers them.
HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# While a tenant's CRM or send switch is paused, the step is re-checked: first after
# PAUSE_POLL, then backing off. Since `inboxcrm resume` wakes parked items with a signal, the
# re-check is only the fallback for a missed signal: it backs off to an hour (~24 checks a
# day), so a long pause cannot bloat the history.
PAUSE_POLL = timedelta(seconds=5)
PAUSE_FALLBACK_MAX = timedelta(hours=1)
# The workflow's own backoff waits (pause re-checks, store waits) are shortened by up to this
# share at random (`workflow.random()`, deterministic on replay): items that began waiting
# together do not all return together. A parked operation whose destination said when its
# limit ends (`OperationResult.retry_at`) checks again then, plus up to PARK_END_SPREAD (and
# at least PARK_END_MIN, so a clock difference between the store and the server never makes
# it check a moment too early and park again).
WAIT_JITTER = 0.2
PARK_END_SPREAD = timedelta(seconds=60)
PARK_END_MIN = timedelta(seconds=1)
# Past this many history events a run waiting on a pause continues as new, carrying the
# plan (Temporal's hard limit is 51,200; a 30-day pause stays far below either).
HISTORY_LIMIT = 1_000
# A step that failed because the store was unreachable (or hung: a timeout) waits for the
# store, doubling up to STORE_WAIT_MAX: no person is asked, the item resumes at most one
# step after the store is back (a wake signal cuts the wait short), and an outage costs
# about 2,000 history events a day at most (a waiting operation continues as new).
STORE_WAIT_FIRST = timedelta(seconds=10)
STORE_WAIT_MAX = timedelta(minutes=5)
# A step refused by a draining worker waits this long (a timer ends the workflow task, so the
# draining worker can exit) and is then run by the next worker.
DRAIN_HANDOVER = timedelta(seconds=1)

# How a step that could not finish reaches the workflow: a regular activity's failure is an
# ActivityError around the cause; a local activity's non-retryable failure or timeout can
# arrive as the cause itself.
STEP_FAILURES = (ActivityError, ApplicationError, StepTimeout)


def is_worker_draining(err: BaseException) -> bool:
    """The step was not started because its worker is shutting down (a rollout)."""
    cause = err.cause if isinstance(err, ActivityError) else err
    return (isinstance(cause, ApplicationError)
            and cause.type == ErrorType.WORKER_DRAINING.value)


def is_store_outage(err: BaseException) -> bool:
    """The store was unreachable (`StoreUnavailable`) or the step hung past its timeout.
    Adapters time out well inside a step, so a step timeout means our side hung: the store
    frozen or partitioned, or the worker overloaded; waiting, not a person, fixes it."""
    cause = err.cause if isinstance(err, ActivityError) else err
    if isinstance(cause, StepTimeout):
        return True
    return (isinstance(cause, ApplicationError)
            and cause.type == ErrorType.STORE_UNAVAILABLE.value)


def retry_caps_markdown() -> str:
    """The runbook's table of attempt caps, rendered from the constants above, so the docs
    cannot drift from the code (docs/architecture.md §4 holds it; tests/fast/
    test_retry_caps_doc.py compares them)."""
    from inboxcrm.schemas.models import (
        DEFAULT_URGENT_SEND_RETRY,
        RETRY_BACKOFF,
        RETRY_INITIAL_SECONDS,
        RETRY_MAX_ATTEMPTS,
        RETRY_MAXIMUM_SECONDS,
    )

    def row(step: str, policy: RetryPolicy, then: str) -> str:
        maximum = policy.maximum_interval.total_seconds() if policy.maximum_interval else 0
        return (f"| {step} | {policy.maximum_attempts} | "
                f"{policy.initial_interval.total_seconds():g} s | {maximum:g} s | "
                f"{policy.backoff_coefficient:g} | {then} |")

    lines = [
        "| step | attempts | first wait | longest wait | backoff | after the last |",
        "|---|---|---|---|---|---|",
        row("extraction", EXTRACT_RETRY, "`blocked`, a person looks"),
        row("planning", PLAN_RETRY, "`blocked`, a person looks"),
        row("CRM calls (policy `retries.crm`)", CRM_RETRY,
            "`blocked / retries_exhausted`; a reviewer's retry grants as many again"),
        row("the send (policy `retries.send`)", SEND_RETRY,
            "`blocked / retries_exhausted`; a reviewer's retry grants as many again"),
        row("an urgent rule's send (policy `retries.urgent_send`)",
            destination_retry(DEFAULT_URGENT_SEND_RETRY), "as the send"),
        row("bookkeeping", BOOKKEEPING_RETRY,
            "the workflow waits for the store, then tries again"),
    ]
    bounds = (f"A tenant's `retries` stay within: attempts 1 to {RETRY_MAX_ATTEMPTS}, first wait "
              f"{RETRY_INITIAL_SECONDS[0]:g} to {RETRY_INITIAL_SECONDS[1]:g} s, longest wait "
              f"at most {RETRY_MAXIMUM_SECONDS:g} s, backoff {RETRY_BACKOFF[0]:g} to "
              f"{RETRY_BACKOFF[1]:g}.")
    return "\n".join([*lines, "", bounds])
