"""GraphMailboxWorkflow: the one watcher of a mailbox's Inbox over Microsoft Graph
(docs/mailboxes.md). Its ID is the folder's identity, `mailbox/{tenant}/graph/{address}/inbox`.

It keeps the subscription alive (renewed before it lapses; renewed at once on
`reauthorizationRequired`; recreated after `subscriptionRemoved`), fetches each message a
verified notification names (the relay signals `graph_notice`), and runs the delta query
as the catch-up after any gap: on start, after `missed`, after a new subscription, after
`poll_seconds` without news, and on the `sync` update (`inboxcrm mailbox sync`). The run
continues as new before its history grows long; IDs still pending then are covered by the
delta query the next run starts with.

No `from __future__ import annotations`: the sandbox evaluates this file for every run.
"""

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from inboxcrm.activities.mailbox_graph import MailboxGraphActivities
    from inboxcrm.schemas.graph_mailbox import (
        GRAPH_NOTICE_SIGNAL,
        GRAPH_WATCH_WORKFLOW_TYPE,
        GraphFetch,
        GraphNotice,
        GraphSubscriptionAsk,
        GraphUnsubscribe,
        GraphWatch,
    )
    from inboxcrm.schemas.mailboxes import SYNC_UPDATE, WatchSummary

# A failing call (token expired, Graph or the store down) is tried again after 1 s, doubling
# to a minute, for as long as the registration exists; the mailbox shows `error` meanwhile.
GRAPH_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                          maximum_interval=timedelta(minutes=1), maximum_attempts=0)
SYNC_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                         maximum_interval=timedelta(seconds=10), maximum_attempts=3)
CALL_TIMEOUT = timedelta(minutes=10)
# Notified IDs fetched per activity; past this many waiting, the delta query covers them.
FETCH_BATCH = 50
MAX_PENDING = 5000


@workflow.defn(name=GRAPH_WATCH_WORKFLOW_TYPE)
class GraphMailboxWorkflow:
    def __init__(self) -> None:
        self._pending: list[str] = []
        self._catch_up = True  # every run starts with one: mail that came while none ran
        self._renew = False
        self._recreate = False
        self._syncs_asked = 0
        self._syncs_done = 0
        self._last_sync = WatchSummary()
        self._sync_failure: str | None = None
        self._subscription: tuple[str, str] | None = None  # (ID, token variable)

    @workflow.signal(name=GRAPH_NOTICE_SIGNAL)
    def notice(self, notice: GraphNotice) -> None:
        """Verified by the relay (clientState): created messages and lifecycle events."""
        for message_id in notice.ids:
            if message_id in self._pending:
                continue
            if len(self._pending) >= MAX_PENDING:
                self._catch_up = True
                break
            self._pending.append(message_id)
        for event in notice.lifecycle:
            if event == "missed":
                self._catch_up = True
            elif event == "reauthorizationRequired":
                self._renew = True
            elif event == "subscriptionRemoved":
                self._recreate = True
                self._catch_up = True

    @workflow.update(name=SYNC_UPDATE)
    async def sync(self) -> WatchSummary:
        self._syncs_asked += 1
        mine = self._syncs_asked
        await workflow.wait_condition(lambda: self._syncs_done >= mine)
        if self._sync_failure is not None:
            raise ApplicationError(f"sync failed: {self._sync_failure}", non_retryable=True)
        return self._last_sync

    @workflow.run
    async def run(self, watch: GraphWatch) -> WatchSummary:
        try:
            return await self._run(watch)
        except asyncio.CancelledError:
            # `inboxcrm mailbox remove`: the subscription goes too (the registration that
            # named it is already deleted).
            await self._unsubscribe(watch)
            raise
        except ActivityError as exc:
            if not isinstance(exc.cause, CancelledError):
                raise
            await self._unsubscribe(watch)
            raise

    async def _unsubscribe(self, watch: GraphWatch) -> None:
        if self._subscription is None:
            return
        subscription_id, token_env = self._subscription
        self._subscription = None
        # One left behind lapses on its own; its notifications are refused meanwhile.
        with contextlib.suppress(ActivityError):
            await workflow.execute_activity_method(
                MailboxGraphActivities.delete_graph_subscription,
                GraphUnsubscribe(watch, subscription_id, token_env),
                start_to_close_timeout=timedelta(seconds=60),
                retry_policy=RetryPolicy(maximum_attempts=3))

    async def _run(self, watch: GraphWatch) -> WatchSummary:
        total = WatchSummary()
        check_at = workflow.time()  # when the subscription is looked at next
        while True:
            if workflow.time() >= check_at or self._renew or self._recreate:
                ask = GraphSubscriptionAsk(watch, renew=self._renew, recreate=self._recreate)
                self._renew = self._recreate = False
                state = await workflow.execute_activity_method(
                    MailboxGraphActivities.ensure_graph_subscription, ask,
                    start_to_close_timeout=CALL_TIMEOUT, retry_policy=GRAPH_RETRY)
                if state.removed:
                    return await self._end(total)
                if state.created:
                    self._catch_up = True
                if state.subscription_id and state.token_env:
                    self._subscription = (state.subscription_id, state.token_env)
                check_at = workflow.time() + state.next_check_seconds
                continue
            if self._syncs_asked > self._syncs_done:
                summary = await self._sync(watch)
            elif self._pending:
                batch, self._pending = self._pending[:FETCH_BATCH], self._pending[FETCH_BATCH:]
                summary = await workflow.execute_activity_method(
                    MailboxGraphActivities.fetch_graph_messages, GraphFetch(watch, batch),
                    start_to_close_timeout=CALL_TIMEOUT,
                    heartbeat_timeout=timedelta(seconds=watch.heartbeat_seconds),
                    retry_policy=GRAPH_RETRY)
            elif self._catch_up:
                self._catch_up = False
                summary = await self._delta(watch, GRAPH_RETRY)
            else:
                wait = max(1.0, min(check_at - workflow.time(), watch.poll_seconds))
                try:
                    await workflow.wait_condition(
                        lambda: bool(self._pending) or self._catch_up or self._renew
                        or self._recreate or self._syncs_asked > self._syncs_done,
                        timeout=timedelta(seconds=wait))
                except TimeoutError:
                    self._catch_up = self._catch_up or wait >= watch.poll_seconds
                summary = WatchSummary()
            total.add(summary)
            if summary.removed:
                return await self._end(total)
            info = workflow.info()
            if (info.get_current_history_length() > watch.history_events_limit
                    or info.is_continue_as_new_suggested()):
                await workflow.wait_condition(
                    lambda: workflow.all_handlers_finished()
                    and self._syncs_asked == self._syncs_done)
                workflow.continue_as_new(watch)

    async def _delta(self, watch: GraphWatch, retry: RetryPolicy) -> WatchSummary:
        summary: WatchSummary = await workflow.execute_activity_method(
            MailboxGraphActivities.graph_delta_catch_up, watch,
            start_to_close_timeout=CALL_TIMEOUT,
            heartbeat_timeout=timedelta(seconds=watch.heartbeat_seconds), retry_policy=retry)
        return summary

    async def _sync(self, watch: GraphWatch) -> WatchSummary:
        """One delta round now, answered to every sync asked before it began."""
        asked = self._syncs_asked
        try:
            self._last_sync = await self._delta(watch, SYNC_RETRY)
            self._sync_failure = None
        except ActivityError as exc:
            self._last_sync = WatchSummary()
            self._sync_failure = str(exc.cause or exc)
        self._syncs_done = asked
        return self._last_sync

    async def _end(self, total: WatchSummary) -> WatchSummary:
        self._syncs_done = self._syncs_asked
        await workflow.wait_condition(workflow.all_handlers_finished)
        return total
