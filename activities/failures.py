"""Failures of a step that are not a destination's answer: a row the step needs is not in
the store. Retrying cannot make it appear, so it is permanent and says which row; the
workflow blocks the item with that reason (docs/architecture.md §4) instead of spending the
retry budget."""

from __future__ import annotations

from temporalio.exceptions import ApplicationError

from schemas.outcomes import ErrorType


def missing_row(what: str) -> ApplicationError:
    """`what` is a short code (`event`, `intent`, `crm_record` …), never a value."""
    return ApplicationError(f"permanent: missing_row:{what}", type=ErrorType.PERMANENT.value,
                            non_retryable=True)
