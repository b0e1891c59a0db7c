"""MailboxWatchWorkflow: the one watcher of one mailbox folder (docs/mailboxes.md).

Its ID is the folder's identity, `mailbox/{tenant}/{kind}/{address}/{folder}`, so however
many workers run there is one watcher. The long-lived connection lives in a heartbeating
activity (`watch_imap_folder`) that runs for a session and is started again, retried with
backoff when its worker dies; the run continues as new before its history grows long. An
update `sync` (`inboxcrm mailbox sync`) stops the watch, runs one catch-up on the freed
connection and answers with what it stored, then the watch resumes: the account's
connection cap holds whatever it is.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.workflow import ActivityCancellationType

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.mailbox_imap import MailboxImapActivities
    from inboxcrm.schemas.mailboxes import (
        MAILBOX_WATCH_WORKFLOW_TYPE,
        SYNC_UPDATE,
        MailboxWatch,
        WatchSummary,
    )

# A watch that fails (its worker died, the store was down) is started again after 1 s,
# doubling to a minute, for as long as the registration exists.
WATCH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                          maximum_interval=timedelta(minutes=1), maximum_attempts=0)
SYNC_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=10), maximum_attempts=3)

@workflow.defn(name=MAILBOX_WATCH_WORKFLOW_TYPE)
class MailboxWatchWorkflow:
    def __init__(self) -> None:
        self._syncs_asked = 0
        self._syncs_done = 0
        self._last_sync = WatchSummary()
        self._sync_failure: str | None = None

    @workflow.run
    async def run(self, watch: MailboxWatch) -> WatchSummary:
        total = WatchSummary()
        while True:
            if self._syncs_asked > self._syncs_done:
                asked = self._syncs_asked
                try:
                    self._last_sync = await workflow.execute_activity_method(
                        MailboxImapActivities.sync_imap_folder, watch,
                        start_to_close_timeout=timedelta(
                            seconds=max(watch.session_seconds, 60)),
                        heartbeat_timeout=timedelta(seconds=watch.heartbeat_seconds),
                        retry_policy=SYNC_RETRY)
                    self._sync_failure = None
                except ActivityError as exc:
                    # The caller hears why; the watcher goes on watching (and retrying).
                    self._last_sync = WatchSummary()
                    self._sync_failure = str(exc.cause or exc)
                self._syncs_done = asked
                total.add(self._last_sync)
                if self._last_sync.removed:
                    return total
                continue
            summary = await self._watch(watch)
            if summary is not None:
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

    async def _watch(self, watch: MailboxWatch) -> WatchSummary | None:
        """One watch session; None when a sync request stopped it early."""
        handle = workflow.start_activity_method(
            MailboxImapActivities.watch_imap_folder, watch,
            start_to_close_timeout=timedelta(seconds=watch.session_seconds + 120),
            heartbeat_timeout=timedelta(seconds=watch.heartbeat_seconds),
            retry_policy=WATCH_RETRY,
            # A sync waits until the watch has let go of its connection.
            cancellation_type=ActivityCancellationType.WAIT_CANCELLATION_COMPLETED)
        await workflow.wait_condition(
            lambda: handle.done() or self._syncs_asked > self._syncs_done)
        if handle.done():
            return handle.result()
        handle.cancel()
        try:
            return await handle
        except ActivityError as exc:
            if not isinstance(exc.cause, CancelledError):
                raise
        return None

    @workflow.update(name=SYNC_UPDATE)
    async def sync(self) -> WatchSummary:
        self._syncs_asked += 1
        mine = self._syncs_asked
        await workflow.wait_condition(lambda: self._syncs_done >= mine)
        if self._sync_failure is not None:
            raise ApplicationError(f"sync failed: {self._sync_failure}", non_retryable=True)
        return self._last_sync
