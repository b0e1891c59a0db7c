"""Failures of a step that are not a destination's answer.

- A row the step needs is not in the store: retrying cannot make it appear, so it is
  permanent and says which row; the workflow blocks the item with that reason
  (docs/architecture.md §4) instead of spending the retry budget.
- The worker is shutting down: the step does not start, and the workflow hands it to the
  next worker (docs/architecture.md §4, graceful shutdown)."""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.counters import count
from inboxcrm.schemas.outcomes import ErrorType


def missing_row(what: str) -> ApplicationError:
    """`what` is a short code (`event`, `intent`, `crm_record` …), never a value."""
    return ApplicationError(f"permanent: missing_row:{what}", type=ErrorType.PERMANENT.value,
                            non_retryable=True)


def refuse_if_worker_draining(step: str) -> None:
    """A draining worker finishes the steps already running but starts none: an LLM call or
    a destination call begun now could outlast the pod's grace period and be cut off. Called
    before anything is claimed or counted; counted as `inboxcrm_steps_handed_over`."""
    if not activity.is_worker_shutdown():
        return
    count("inboxcrm_steps_handed_over", step=step)
    raise ApplicationError("worker draining", type=ErrorType.WORKER_DRAINING.value,
                           non_retryable=True)
