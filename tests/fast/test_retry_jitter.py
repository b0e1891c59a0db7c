"""Retry delays of the attempt protocol are jittered (inboxcrm/activities/outbox.py): a
RetryPolicy has
none, so the outbox sets `next_retry_delay` itself. A provider's Retry-After is never
shortened; without one, the step's backoff with equal jitter."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities.outbox import with_jittered_delay
from inboxcrm.schemas.outcomes import ErrorType


def transient(delay: float | None = None) -> ApplicationError:
    return ApplicationError("transient: http_429", type=ErrorType.TRANSIENT.value,
                            next_retry_delay=None if delay is None else timedelta(seconds=delay))


def seconds(error: ApplicationError) -> float:
    assert error.next_retry_delay is not None
    return error.next_retry_delay.total_seconds()


def test_a_retry_after_is_honoured_never_shortened_and_spread() -> None:
    delays = {seconds(with_jittered_delay(transient(20))) for _ in range(200)}
    assert all(20 <= d <= 22 for d in delays) and len(delays) > 100
    assert all(120 <= seconds(with_jittered_delay(transient(120))) <= 125 for _ in range(50))
    assert seconds(with_jittered_delay(transient(0))) == 0


def test_without_a_retry_after_the_step_backoff_is_jittered() -> None:
    env = ActivityEnvironment()
    policy = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=60))
    for attempt, backoff in ((1, 1.0), (3, 4.0), (10, 60.0)):
        env.info = dataclasses.replace(env.info, attempt=attempt, retry_policy=policy)
        delays = [env.run(lambda: seconds(with_jittered_delay(transient()))) for _ in range(100)]
        assert all(backoff / 2 <= d <= backoff for d in delays), (attempt, delays)
        assert max(delays) - min(delays) > backoff / 10  # really spread


def test_errors_that_are_not_retried_are_left_alone() -> None:
    final = ApplicationError("permanent: http_400", type=ErrorType.PERMANENT.value,
                             non_retryable=True)
    assert with_jittered_delay(final) is final
    jittered = with_jittered_delay(transient(3))
    assert (jittered.type, jittered.message, jittered.non_retryable) == (
        ErrorType.TRANSIENT.value, "transient: http_429", False)
