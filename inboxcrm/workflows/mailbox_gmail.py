"""GmailWatchWorkflow: the one watcher of one Gmail mailbox (docs/mailboxes.md).

Its ID is the mailbox's identity, `mailbox/{tenant}/gmail/{address}/INBOX`, as the IMAP
watcher's. It catches up (`catch_up_gmail_mailbox`: renew the watch when due, history from
the stored historyId) on start, on every Pub/Sub push the relay signals
(`gmail_push`), and at least every `idle_seconds` without one (a push Pub/Sub lost, a watch
to renew); the `sync` update (`inboxcrm mailbox sync`) runs one now and answers with what
it stored. The run continues as new before its history grows long. Cancelled (`inboxcrm
mailbox remove`), it stops the watch at Gmail's end (`stop_gmail_watch`, `users.stop`)
before it ends, so Gmail publishes no more pushes for the mailbox (the CLI deletes the
registration only then: the activity reads the token's variable from it). Runs cancelled
under the code before this (no `gmail-stop-on-remove` marker) ended without it.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.mailbox_gmail import MailboxGmailActivities
    from inboxcrm.schemas.mailboxes import (
        GMAIL_PUSH_SIGNAL,
        GMAIL_STOP_PATCH,
        GMAIL_WATCH_WORKFLOW_TYPE,
        SYNC_UPDATE,
        MailboxWatch,
        WatchSummary,
    )

# A catch-up that fails transiently (Gmail 5xx or 429, the store down, the worker died) is
# tried again after 1 s, doubling to a minute, until it gets through.
CATCH_UP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_interval=timedelta(minutes=1), maximum_attempts=0)
SYNC_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=10), maximum_attempts=3)
CATCH_UP_TIMEOUT = timedelta(minutes=10)
# users.stop on removal: a few tries, then the watch is left to lapse (within 7 days).
STOP_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=10), maximum_attempts=3)
STOP_TIMEOUT = timedelta(seconds=60)


@workflow.defn(name=GMAIL_WATCH_WORKFLOW_TYPE)
class GmailWatchWorkflow:
    def __init__(self) -> None:
        self._pushes = 0
        self._syncs_asked = 0
        self._syncs_done = 0
        self._last_sync = WatchSummary()
        self._sync_failure: str | None = None

    @workflow.run
    async def run(self, watch: MailboxWatch) -> WatchSummary:
        try:
            return await self._run(watch)
        except asyncio.CancelledError:
            await self._stop_watch(watch)
            raise
        except ActivityError as exc:
            if not isinstance(exc.cause, CancelledError):
                raise
            await self._stop_watch(watch)
            raise

    async def _stop_watch(self, watch: MailboxWatch) -> None:
        """`inboxcrm mailbox remove` cancelled the watcher: stop the watch at Gmail's end."""
        if not workflow.patched(GMAIL_STOP_PATCH):
            return
        # Best effort: a watch left behind lapses, its pushes find no watcher meanwhile.
        with contextlib.suppress(ActivityError):
            await workflow.execute_activity_method(
                MailboxGmailActivities.stop_gmail_watch, watch,
                start_to_close_timeout=STOP_TIMEOUT, retry_policy=STOP_RETRY)

    async def _run(self, watch: MailboxWatch) -> WatchSummary:
        total = WatchSummary()
        while True:
            if self._syncs_asked > self._syncs_done:
                asked = self._syncs_asked
                try:
                    self._last_sync = await self._catch_up(watch, SYNC_RETRY)
                    self._sync_failure = None
                except ActivityError as exc:
                    self._last_sync = WatchSummary()
                    self._sync_failure = str(exc.cause or exc)
                self._syncs_done = asked
                summary = self._last_sync
            else:
                self._pushes = 0
                summary = await self._catch_up(watch, CATCH_UP_RETRY)
            total.add(summary)
            if summary.removed:
                await workflow.wait_condition(workflow.all_handlers_finished)
                return total
            info = workflow.info()
            if (info.get_current_history_length() > watch.history_events_limit
                    or info.is_continue_as_new_suggested()):
                await workflow.wait_condition(
                    lambda: workflow.all_handlers_finished() and
                    self._syncs_asked == self._syncs_done)
                workflow.continue_as_new(watch)
            # A push, a sync, or the periodic catch-up (the timeout).
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(
                    lambda: self._pushes > 0 or self._syncs_asked > self._syncs_done,
                    timeout=timedelta(seconds=watch.idle_seconds))

    async def _catch_up(self, watch: MailboxWatch, retry: RetryPolicy) -> WatchSummary:
        return await workflow.execute_activity_method(
            MailboxGmailActivities.catch_up_gmail_mailbox, watch,
            start_to_close_timeout=CATCH_UP_TIMEOUT, retry_policy=retry)

    @workflow.signal(name=GMAIL_PUSH_SIGNAL)
    def pushed(self, history_id: str) -> None:
        """A Pub/Sub push for this mailbox (the relay verified it): catch up."""
        self._pushes += 1

    @workflow.update(name=SYNC_UPDATE)
    async def sync(self) -> WatchSummary:
        self._syncs_asked += 1
        mine = self._syncs_asked
        await workflow.wait_condition(lambda: self._syncs_done >= mine)
        if self._sync_failure is not None:
            raise ApplicationError(f"sync failed: {self._sync_failure}", non_retryable=True)
        return self._last_sync
