"""The IMAP watcher's activities: a long-lived, heartbeating watch of one folder (catch-up,
then IDLE, reconnecting with backoff) and a one-off catch-up (`inboxcrm mailbox sync`).

Each message is stored under `(tenant, address, folder, UIDVALIDITY, UID)` with the folder's
cursor and its inbound event in one transaction (`inboxcrm.store.mailboxes`), and only then
is its item's workflow started: the same ledger row and the same start every source makes
(`start_item`). A worker killed at any point leaves either the message with its cursor, or
neither; the next attempt reads from the cursor and the unique keys make a second read of a
stored message a duplicate that starts nothing new. A message found in this folder again
after a UIDVALIDITY change is matched (Message-ID and content hash) against what was stored,
never run again.

Connections per account are capped across every worker: each IMAP connection holds one of
the registration's `max_connections` PostgreSQL advisory-lock slots, on a database session
of its own that dies with the worker process.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.adapters.imap import (
    Credential,
    FolderState,
    ImapFailure,
    ImapFolderReader,
    classify_imap,
    message_id_of,
)
from inboxcrm.domain.policy import tenant_priority
from inboxcrm.platform.conflicts import ConflictKind, count_conflict
from inboxcrm.schemas.contract import WORKFLOW_TYPE, start_search_attributes
from inboxcrm.schemas.mailboxes import MailboxWatch, WatchSummary
from inboxcrm.schemas.models import InboundEmailInput, inbound_workflow_id
from inboxcrm.schemas.outcomes import Category, Classified
from inboxcrm.store import db
from inboxcrm.store import mailboxes as store

log = logging.getLogger("inboxcrm.mailbox")

T = TypeVar("T")

START_RPC_TIMEOUT = timedelta(seconds=5)
# Bodies are fetched a few at a time, and never more than this many bytes in one answer.
FETCH_BATCH = 10
FETCH_BATCH_BYTES = 8 * 1024 * 1024
# Reconnect backoff: 1 s doubling to 60 s; a refused login waits the longest.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0
# How often a watcher that finds every connection slot taken asks again.
SLOT_POLL_SECONDS = 0.5
# One IDLE wait is cut into slices this long, so a cancel is heard promptly.
IDLE_SLICE_SECONDS = 1.0


def imap_delivery_workflow_id(tenant: str, address: str, folder: str, uidvalidity: int,
                              uid: int) -> str:
    """`inbound/{tenant}/imap/{address}/{folder}:{uidvalidity}:{uid}`."""
    return inbound_workflow_id(tenant, store.SOURCE, address,
                               store.delivery_id(folder, uidvalidity, uid))


async def start_item(event_id: str, tenant: str, workflow_id: str) -> bool:
    """Start a stored event's item workflow, as the relay's intake and sweeper do (the same
    type, input, ID policies and search attributes), on this worker's task queue. False when
    Temporal did not answer: the relay's sweeper starts the stored event later."""
    try:
        await activity.client().start_workflow(
            WORKFLOW_TYPE, InboundEmailInput(event_id=event_id, tenant=tenant),
            id=workflow_id, task_queue=activity.info().task_queue,
            static_summary=f"inbound email · tenant {tenant} · source imap",
            search_attributes=start_search_attributes(tenant),
            priority=tenant_priority(tenant),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            rpc_timeout=START_RPC_TIMEOUT)
    except WorkflowAlreadyStartedError:
        pass  # it ran and closed under this ID: never start it twice
    except (TimeoutError, RPCError, OSError, RuntimeError) as exc:
        log.warning("item start deferred: %s", type(exc).__name__)
        return False
    return True


class _Session:
    """One IMAP connection on its own thread, holding one connection slot of the account."""

    def __init__(self, reader: ImapFolderReader) -> None:
        self.reader = reader
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="imap")

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    async def close(self) -> None:
        # After the call in flight (one thread): never two calls on one connection.
        fut = asyncio.get_running_loop().run_in_executor(self._thread, self.reader.close)
        await asyncio.shield(fut)
        self._thread.shutdown(wait=False)


class MailboxImapActivities:
    def __init__(self, pool: asyncpg.Pool, database_url: str, max_message_bytes: int,
                 environ: Mapping[str, str] | None = None, role: str | None = None) -> None:
        self.pool = pool
        self.database_url = database_url
        self.role = role  # the worker's database role, as its pool's (store.roles)
        self.max_message_bytes = max_message_bytes
        self.environ = environ if environ is not None else os.environ

    @activity.defn(name="watch_imap_folder")
    async def watch_imap_folder(self, watch: MailboxWatch) -> WatchSummary:
        """Watch one folder for `session_seconds`: catch up from the cursor, then IDLE and
        catch up on every notice; reconnect with backoff when the connection drops."""
        summary = WatchSummary()
        deadline = time.monotonic() + watch.session_seconds
        backoff = BACKOFF_FIRST
        async with heartbeating(min(2.0, watch.heartbeat_seconds / 4)):
            while time.monotonic() < deadline:
                connected = summary.connections
                try:
                    done = await self._one_connection(watch, summary, deadline)
                    if done:
                        return summary
                    backoff = BACKOFF_FIRST
                except ImapFailure as exc:
                    if summary.connections > connected:
                        backoff = BACKOFF_FIRST  # it was up: a drop, not a refusal
                    await self._record_error(watch, exc)
                    await asyncio.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
                    backoff = min(BACKOFF_MAX, backoff * 2)
        return summary

    @activity.defn(name="sync_imap_folder")
    async def sync_imap_folder(self, watch: MailboxWatch) -> WatchSummary:
        """One catch-up now (`inboxcrm mailbox sync`), on one connection of the account's."""
        summary = WatchSummary()
        async with heartbeating(min(2.0, watch.heartbeat_seconds / 4)):
            deadline = time.monotonic() + max(watch.session_seconds, 60.0)
            try:
                await self._one_connection(watch, summary, deadline, idle=False)
            except ImapFailure as exc:
                await self._record_error(watch, exc)
                classified = classify_imap(exc)
                raise ApplicationError(
                    classified.reason, type=classified.category.value,
                    non_retryable=classified.category is Category.PERMANENT) from None
        return summary

    # --- one connection ----------------------------------------------------------------------
    async def _one_connection(self, watch: MailboxWatch, summary: WatchSummary,
                              deadline: float, idle: bool = True) -> bool:
        """Connect, catch up, then (with `idle`) IDLE until the deadline. True: stop (done,
        or the registration is gone)."""
        async with self.pool.acquire() as conn:
            box = await store.get_mailbox(conn, tenant=watch.tenant, kind="imap",
                                          address=watch.address, folder=watch.folder)
        if box is None:
            summary.removed = True
            return True
        credential = self._credential(box)
        account = f"imap:{box['host']}:{box['port']}:{box['username']}"
        # Session-level advisory lock slots live on a database session of their own.
        slots = await db.connect(self.database_url, role=self.role)
        session: _Session | None = None
        slot: int | None = None
        try:
            slot = await self._claim_slot(slots, account, int(box["max_connections"]), deadline)
            if slot is None:
                return False
            session = _Session(ImapFolderReader(host=box["host"], port=int(box["port"]),
                                                tls=box["tls"], credential=credential))
            await session.call(session.reader.connect)
            summary.connections += 1
            after_store = str(box["after_store"])
            writable = after_store != "none"
            state = await session.call(session.reader.examine, watch.folder, writable)
            await self._set_state(watch, "watching", None)
            await self._catch_up(session, watch, state, summary, after_store)
            while idle and time.monotonic() < deadline:
                # Mail announced during the catch-up is read at once: IDLE would not
                # announce it again, and it would wait a whole IDLE period.
                if not await session.call(session.reader.announced_new_mail):
                    await self._idle(session, watch, deadline)
                state = await session.call(session.reader.examine, watch.folder, writable)
                await self._catch_up(session, watch, state, summary, after_store)
            return not idle
        finally:
            if session is not None:
                await session.close()
            if slot is not None:
                await store.release_slot(slots, account=account, slot=slot)
            await slots.close()

    async def _claim_slot(self, slots: asyncpg.Connection[Any], account: str,
                          max_connections: int, deadline: float) -> int | None:
        """One of the account's connection slots, in turn with the other watchers; None at
        the deadline."""
        try:
            await asyncio.wait_for(store.enter_turnstile(slots, account=account),
                                   max(0.1, deadline - time.monotonic()))
        except TimeoutError:
            return None
        try:
            while (slot := await store.try_claim_slot(
                    slots, account=account, max_connections=max_connections)) is None:
                if time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(SLOT_POLL_SECONDS)
            return slot
        finally:
            await store.leave_turnstile(slots, account=account)

    async def _idle(self, session: _Session, watch: MailboxWatch, deadline: float) -> None:
        """IDLE until the server says something, `idle_seconds` pass, or the deadline."""
        reader = session.reader
        until = min(deadline, time.monotonic() + watch.idle_seconds)
        if "IDLE" not in reader.capabilities:
            await asyncio.sleep(max(0.0, min(until - time.monotonic(), 30.0)))
            return
        await session.call(reader.idle_start)
        while time.monotonic() < until:
            if await session.call(reader.idle_wait, IDLE_SLICE_SECONDS):
                break
        await session.call(reader.idle_done)

    async def _catch_up(self, session: _Session, watch: MailboxWatch, state: FolderState,
                        summary: WatchSummary, after_store: str = "none") -> None:
        """Store every message above the cursor, in UID order, each with its cursor; then
        run the after-store action on what is stored and still waits for it."""
        await self._read_new(session, watch, state, summary)
        if after_store != "none":
            await self._after_store(session, watch, state, after_store)
        async with self.pool.acquire() as conn:
            await store.mark_checked(conn, tenant=watch.tenant, kind="imap",
                                     address=watch.address, folder=watch.folder)

    async def _after_store(self, session: _Session, watch: MailboxWatch, state: FolderState,
                           after_store: str) -> None:
        """Flag or move stored messages: only ever after their transaction committed, and
        recorded after the server confirmed (a repeat after a crash is harmless: the flag is
        set again, a moved UID is gone)."""
        while True:
            async with self.pool.acquire() as conn:
                uids = await store.after_store_pending(
                    conn, tenant=watch.tenant, address=watch.address, folder=watch.folder,
                    uidvalidity=state.uidvalidity, limit=100)
            if not uids:
                return
            if after_store == "seen":
                await session.call(session.reader.mark_seen, uids)
            else:
                await session.call(session.reader.move, uids, after_store.removeprefix("move:"))
            async with self.pool.acquire() as conn:
                await store.after_store_done(
                    conn, tenant=watch.tenant, address=watch.address, folder=watch.folder,
                    uidvalidity=state.uidvalidity, uids=uids)

    async def _read_new(self, session: _Session, watch: MailboxWatch, state: FolderState,
                        summary: WatchSummary) -> None:
        async with self.pool.acquire() as conn:
            cursor = await store.cursor(conn, tenant=watch.tenant, address=watch.address,
                                        folder=watch.folder, uidvalidity=state.uidvalidity)
        if state.uidnext is not None and state.uidnext - 1 <= cursor:
            return
        uids = await session.call(session.reader.uids_after, cursor)
        sizes = await session.call(session.reader.sizes, uids)
        batch: list[int] = []
        batch_bytes = 0
        for uid in uids:
            size = sizes.get(uid, 0)
            if size > self.max_message_bytes:
                await self._flush(session, watch, state, batch, summary)
                batch, batch_bytes = [], 0
                await self._store(watch, state, uid, None, size, summary)
                continue
            if batch and (len(batch) >= FETCH_BATCH or batch_bytes + size > FETCH_BATCH_BYTES):
                await self._flush(session, watch, state, batch, summary)
                batch, batch_bytes = [], 0
            batch.append(uid)
            batch_bytes += size
        await self._flush(session, watch, state, batch, summary)

    async def _flush(self, session: _Session, watch: MailboxWatch, state: FolderState,
                     uids: list[int], summary: WatchSummary) -> None:
        if not uids:
            return
        bodies = await session.call(session.reader.fetch, uids)
        for uid in uids:
            raw = bodies.get(uid)
            if raw is None:
                continue  # expunged between the search and the fetch
            await self._store(watch, state, uid, raw, len(raw), summary)

    async def _store(self, watch: MailboxWatch, state: FolderState, uid: int,
                     raw: bytes | None, size: int, summary: WatchSummary) -> None:
        workflow_id = imap_delivery_workflow_id(watch.tenant, watch.address, watch.folder,
                                                state.uidvalidity, uid)
        digest = hashlib.sha256(raw).hexdigest() if raw is not None else None
        async with self.pool.acquire() as conn:
            stored = await store.store_imap_message(
                conn, tenant=watch.tenant, address=watch.address, folder=watch.folder,
                uidvalidity=state.uidvalidity, uid=uid, raw=raw, size=size,
                message_id=message_id_of(raw) if raw is not None else None,
                content_sha256=digest, workflow_id=workflow_id,
                modseq=state.highest_modseq)
        if stored.raced:
            count_conflict(ConflictKind.MAILBOX_MESSAGE)
        if not stored.new:
            summary.duplicates += 1
        elif stored.role == "item":
            summary.stored += 1
        elif stored.role == "copy":
            summary.copies += 1
        elif stored.role == "reseen":
            summary.reseen += 1
        else:
            summary.too_large += 1
            log.warning("message over the size limit not read: uid %d (%d bytes)", uid, size)
        if stored.role == "item" and stored.event_id and stored.workflow_id and not stored.started:
            await self._start(stored.event_id, watch.tenant, stored.workflow_id)

    async def _start(self, event_id: str, tenant: str, workflow_id: str) -> None:
        started = await start_item(event_id, tenant, workflow_id)
        async with self.pool.acquire() as conn:
            if started:
                await store.mark_started(conn, event_id=event_id)
            else:
                await store.count_start_failure(conn, event_id=event_id)

    # --- registration and state ---------------------------------------------------------------
    def _credential(self, box: asyncpg.Record) -> Credential:
        """Read the secret from this worker's environment now (never stored)."""
        name = box["oauth_token_env"] or box["password_env"]
        secret = self.environ.get(name or "")
        if not secret:
            raise ImapFailure(Classified(Category.PERMANENT, "imap_credential_unset"))
        return Credential(box["username"], secret, oauth=box["oauth_token_env"] is not None)

    async def _record_error(self, watch: MailboxWatch, exc: ImapFailure) -> None:
        classified = classify_imap(exc)
        log.warning("mailbox %s/%s folder %s: %s (%s)", watch.tenant, watch.address,
                    watch.folder, classified.reason, classified.category.value)
        await self._set_state(watch, "error", f"{classified.category.value}:{classified.reason}")

    async def _set_state(self, watch: MailboxWatch, state: str, error: str | None) -> None:
        async with self.pool.acquire() as conn:
            await store.set_state(conn, tenant=watch.tenant, kind="imap", address=watch.address,
                                  folder=watch.folder, state=state, last_error=error)


def mailbox_activities(pool: asyncpg.Pool, database_url: str, max_message_bytes: int,
                       role: str | None = None
                       ) -> list[Callable[..., Awaitable[WatchSummary]]]:
    """The watcher's activities, for the worker to register."""
    acts = MailboxImapActivities(pool, database_url, max_message_bytes, role=role)
    return [acts.watch_imap_folder, acts.sync_imap_folder]
