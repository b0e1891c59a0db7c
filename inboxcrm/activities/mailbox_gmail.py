"""The Gmail API watcher's activities: one catch-up of a Gmail mailbox, and the watch
stopped when the mailbox is removed (docs/mailboxes.md).

Renew the `users.watch` when less than `renew_before_seconds` is left of its 7 days; then
`users.history.list` (`messageAdded`, the INBOX label) from the stored historyId, each
added message read with `messages.get?format=raw` and stored under `(tenant, address,
Gmail message ID)` with its inbound event and the historyId in one transaction
(`inboxcrm.store.gmail`); only then is its item's workflow started,
`inbound/{tenant}/gmail/{address}/{message id}`. A 404 on the history (the historyId is
older than Gmail keeps) falls back to a bounded full sync (`messages.list`) matched by
message ID, so nothing stored runs again and nothing newer is lost. The relay's Pub/Sub
route only wakes the watcher: the mail is read here, with the tenant's own token.
`stop_gmail_watch` (`users.stop`) ends the pushes of a removed mailbox.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from inboxcrm.adapters.gmail import GmailClient, GmailFailure, HistoryExpired
from inboxcrm.adapters.imap import message_id_of
from inboxcrm.domain.policy import tenant_priority
from inboxcrm.platform.conflicts import ConflictKind, count_conflict
from inboxcrm.platform.gmail_config import GmailSettings
from inboxcrm.schemas.contract import WORKFLOW_TYPE, start_search_attributes
from inboxcrm.schemas.mailboxes import MailboxWatch, WatchSummary
from inboxcrm.schemas.models import InboundEmailInput, inbound_workflow_id
from inboxcrm.schemas.outcomes import Category
from inboxcrm.store import gmail as store
from inboxcrm.store import mailboxes, subscriptions

log = logging.getLogger("inboxcrm.mailbox")

START_RPC_TIMEOUT = timedelta(seconds=5)


def gmail_delivery_workflow_id(tenant: str, address: str, gmail_id: str) -> str:
    """`inbound/{tenant}/gmail/{address}/{message id}`."""
    return inbound_workflow_id(tenant, store.SOURCE, address, gmail_id)


class MailboxGmailActivities:
    def __init__(self, pool: asyncpg.Pool, gmail: GmailSettings, max_message_bytes: int,
                 environ: Mapping[str, str] | None = None) -> None:
        self.pool = pool
        self.gmail = gmail
        self.max_message_bytes = max_message_bytes
        self.environ = environ if environ is not None else os.environ

    @activity.defn(name="catch_up_gmail_mailbox")
    async def catch_up_gmail_mailbox(self, watch: MailboxWatch) -> WatchSummary:
        """Renew the watch when due, then store every message added since the cursor. A
        refused token is recorded (`state: error`) and returned; a transient failure is
        raised, for the workflow's retry with backoff."""
        summary = WatchSummary()
        async with self.pool.acquire() as conn:
            box = await mailboxes.get_mailbox(conn, tenant=watch.tenant, kind=store.KIND,
                                              address=watch.address, folder=watch.folder)
        if box is None:
            summary.removed = True
            return summary
        token = self.environ.get(box["oauth_token_env"] or "")
        if not token:
            await self._set_state(watch, "error", "permanent:gmail_credential_unset")
            return summary
        try:
            async with httpx.AsyncClient() as http:
                client = GmailClient(self.gmail.api_url or "", watch.address, token, http)
                await self._catch_up(client, watch, str(box["push_topic"] or ""), summary)
        except GmailFailure as exc:
            reason = f"{exc.classified.category.value}:{exc.classified.reason}"
            log.warning("gmail mailbox of tenant %s: %s", watch.tenant, reason)
            await self._set_state(watch, "error", reason)
            if exc.classified.category is Category.PERMANENT:
                return summary
            raise ApplicationError(exc.classified.reason, type="TransientError") from None
        await self._set_state(watch, "watching", None)
        async with self.pool.acquire() as conn:
            await mailboxes.mark_checked(conn, tenant=watch.tenant, kind=store.KIND,
                                         address=watch.address, folder=watch.folder)
        return summary

    @activity.defn(name="stop_gmail_watch")
    async def stop_gmail_watch(self, watch: MailboxWatch) -> None:
        """`inboxcrm mailbox remove` cancelled the watcher, the registration not yet
        deleted: `users.stop` with its token, so Gmail publishes no more of its pushes. A
        transient failure is raised for the workflow's few retries; after them, or with the
        registration already gone or its token refused or unset, the watch is left to lapse
        (within its 7 days), its pushes finding no watcher meanwhile."""
        async with self.pool.acquire() as conn:
            box = await mailboxes.get_mailbox(conn, tenant=watch.tenant, kind=store.KIND,
                                              address=watch.address, folder=watch.folder)
        token = self.environ.get(box["oauth_token_env"] or "") if box is not None else None
        if not token:
            log.warning("gmail watch of tenant %s not stopped: %s", watch.tenant,
                        "no registration" if box is None else "token unset")
            return
        try:
            async with httpx.AsyncClient() as http:
                await GmailClient(self.gmail.api_url or "", watch.address, token, http).stop()
        except GmailFailure as exc:
            log.warning("gmail watch of tenant %s not stopped: %s", watch.tenant,
                        exc.classified.reason)
            if exc.classified.category is Category.TRANSIENT:
                raise ApplicationError(exc.classified.reason, type="TransientError") from None
            return
        log.info("gmail watch of tenant %s stopped", watch.tenant)

    async def _catch_up(self, client: GmailClient, watch: MailboxWatch, topic: str,
                        summary: WatchSummary) -> None:
        async with self.pool.acquire() as conn:
            sub = await subscriptions.get_subscription(
                conn, tenant=watch.tenant, kind=store.KIND, address=watch.address,
                folder=watch.folder)
        cursor = int(sub["cursor"]) if sub is not None and sub["cursor"] else None
        expires = sub["expires_at"] if sub is not None else None
        due = expires is None or expires - datetime.now(UTC) < timedelta(
            seconds=self.gmail.renew_before_seconds)
        if due or cursor is None:
            history_id = await self._renew(client, watch, topic)
            if cursor is None:
                # First catch-up: the INBOX as it is (bounded), then history from here.
                await self._full_sync(client, watch, history_id, summary)
                return
        try:
            await self._read_history(client, watch, cursor, summary)
        except HistoryExpired:
            log.warning("gmail history of tenant %s expired: full sync", watch.tenant)
            await self._full_sync(client, watch, await self._renew(client, watch, topic),
                                  summary)

    async def _renew(self, client: GmailClient, watch: MailboxWatch, topic: str) -> int:
        """`users.watch` (a new one or a renewal: Gmail keeps one per user); its historyId."""
        renewed = await client.watch(topic, [watch.folder])
        async with self.pool.acquire() as conn:
            await subscriptions.record_subscription(
                conn, tenant=watch.tenant, kind=store.KIND, address=watch.address,
                folder=watch.folder, subscription_id=None, client_state_sha256=None,
                expires_at=renewed.expires_at)
        return renewed.history_id

    async def _read_history(self, client: GmailClient, watch: MailboxWatch, cursor: int,
                            summary: WatchSummary) -> None:
        page_token: str | None = None
        while True:
            page = await client.history(cursor, watch.folder, page_token)
            for gmail_id, record_id in page.added:
                # One below the record: a crash inside a record reads all of it again
                # ("after startHistoryId"), the stored part as duplicates.
                await self._store(client, watch, gmail_id, record_id - 1, summary)
            page_token = page.next_page_token
            if not page_token:
                async with self.pool.acquire() as conn:
                    await store.advance_cursor(conn, tenant=watch.tenant,
                                               address=watch.address, folder=watch.folder,
                                               history_id=page.history_id)
                return

    async def _full_sync(self, client: GmailClient, watch: MailboxWatch, history_id: int,
                         summary: WatchSummary) -> None:
        """The newest `full_sync_max_messages` of the label, each not stored before read
        and stored (oldest first); the cursor moves to `history_id` (taken before the list)
        only when all of them are, so a crash here repeats the sync, never skips it."""
        ids = await client.list_ids(watch.folder, self.gmail.full_sync_max_messages)
        async with self.pool.acquire() as conn:
            known = await store.known_ids(conn, tenant=watch.tenant, address=watch.address,
                                          gmail_ids=ids)
        summary.duplicates += len(known)
        for gmail_id in reversed(ids):
            if gmail_id not in known:
                await self._store(client, watch, gmail_id, None, summary)
        async with self.pool.acquire() as conn:
            await store.advance_cursor(conn, tenant=watch.tenant, address=watch.address,
                                       folder=watch.folder, history_id=history_id)

    async def _store(self, client: GmailClient, watch: MailboxWatch, gmail_id: str,
                     history_id: int | None, summary: WatchSummary) -> None:
        async with self.pool.acquire() as conn:
            if await store.known_ids(conn, tenant=watch.tenant, address=watch.address,
                                     gmail_ids=[gmail_id]):
                summary.duplicates += 1
                return
        raw = await client.raw(gmail_id)
        if raw is None:
            return  # deleted since it was listed
        size = len(raw)
        if size > self.max_message_bytes:
            raw = None
        workflow_id = gmail_delivery_workflow_id(watch.tenant, watch.address, gmail_id)
        async with self.pool.acquire() as conn:
            stored = await store.store_gmail_message(
                conn, tenant=watch.tenant, address=watch.address, folder=watch.folder,
                gmail_id=gmail_id, raw=raw, size=size,
                message_id=message_id_of(raw) if raw is not None else None,
                content_sha256=hashlib.sha256(raw).hexdigest() if raw is not None else None,
                workflow_id=workflow_id, history_id=history_id)
        if stored.raced:
            count_conflict(ConflictKind.MAILBOX_MESSAGE)
        if not stored.new:
            summary.duplicates += 1
        elif stored.role == "item":
            summary.stored += 1
        elif stored.role == "copy":
            summary.copies += 1
        else:
            summary.too_large += 1
            log.warning("gmail message over the size limit not stored (%d bytes)", size)
        if stored.role == "item" and stored.event_id and stored.workflow_id and not stored.started:
            await self._start(stored.event_id, watch.tenant, stored.workflow_id)

    async def _start(self, event_id: str, tenant: str, workflow_id: str) -> None:
        """Start the item as the relay's intake does; a Temporal that does not answer
        leaves it to the relay's sweeper."""
        started = True
        try:
            await activity.client().start_workflow(
                WORKFLOW_TYPE, InboundEmailInput(event_id=event_id, tenant=tenant),
                id=workflow_id, task_queue=activity.info().task_queue,
                static_summary=f"inbound email · tenant {tenant} · source gmail",
                search_attributes=start_search_attributes(tenant),
                priority=tenant_priority(tenant),
                id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                rpc_timeout=START_RPC_TIMEOUT)
        except WorkflowAlreadyStartedError:
            pass
        except (TimeoutError, RPCError, OSError, RuntimeError) as exc:
            log.warning("item start deferred: %s", type(exc).__name__)
            started = False
        async with self.pool.acquire() as conn:
            if started:
                await mailboxes.mark_started(conn, event_id=event_id)
            else:
                await mailboxes.count_start_failure(conn, event_id=event_id)

    async def _set_state(self, watch: MailboxWatch, state: str, error: str | None) -> None:
        async with self.pool.acquire() as conn:
            await mailboxes.set_state(conn, tenant=watch.tenant, kind=store.KIND,
                                      address=watch.address, folder=watch.folder,
                                      state=state, last_error=error)


def gmail_activities(pool: asyncpg.Pool, gmail: GmailSettings, max_message_bytes: int
                     ) -> list[Callable[..., Awaitable[WatchSummary | None]]]:
    """The Gmail watcher's activities, for the worker to register."""
    acts = MailboxGmailActivities(pool, gmail, max_message_bytes)
    return [acts.catch_up_gmail_mailbox, acts.stop_gmail_watch]

