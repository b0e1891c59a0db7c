"""The Microsoft Graph watcher's activities (docs/mailboxes.md): keep the mailbox's
subscription alive (create, renew before expiry, renew on `reauthorizationRequired`,
recreate after `subscriptionRemoved`), fetch the messages a notification named by their
immutable IDs, and run the delta query, the catch-up after any gap (start, `missed`, a new
subscription, a quiet period, `inboxcrm mailbox sync`).

A message is stored under its immutable ID in one transaction with its ledger row
(`inboxcrm.store.graph_messages`), and only then is its item's workflow started. The delta
link is advanced after the page it ends was stored: a worker killed in between reads the
page again, and the delivery keys make every re-read a duplicate that starts nothing.
The access token is read from the workers' environment at each call, never stored;
`clientState` is a fresh random secret per subscription of which only the SHA-256 is kept.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio import activity
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError

from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.adapters.graph import MESSAGE_ID, GraphClient, GraphFailure, parse_graph_time
from inboxcrm.adapters.imap import message_id_of
from inboxcrm.domain.policy import tenant_priority
from inboxcrm.platform.conflicts import ConflictKind, count_conflict
from inboxcrm.schemas.contract import WORKFLOW_TYPE, start_search_attributes
from inboxcrm.schemas.graph_mailbox import (
    GRAPH_KIND,
    GraphFetch,
    GraphSubscriptionAsk,
    GraphSubscriptionState,
    GraphUnsubscribe,
    GraphWatch,
)
from inboxcrm.schemas.mailboxes import WatchSummary
from inboxcrm.schemas.models import InboundEmailInput, inbound_workflow_id
from inboxcrm.schemas.outcomes import Category, Classified
from inboxcrm.store import graph_messages, mailboxes, subscriptions
from inboxcrm.store.mailboxes import StoredMessage

log = logging.getLogger("inboxcrm.mailbox.graph")

START_RPC_TIMEOUT = timedelta(seconds=5)


class GraphSettings(BaseSettings):
    """Where the workers reach Graph and where Graph reaches the relay (`INBOXCRM_GRAPH_*`)."""

    model_config = SettingsConfigDict(env_prefix="INBOXCRM_GRAPH_", extra="ignore")
    # Graph's root; the local stack points it at the sandbox's subset.
    url: str = "https://graph.microsoft.com"
    # The relay's public `POST /v1/inbound/graph` (HTTPS for the real service); also the
    # lifecycle notification URL.
    notification_url: str | None = None


def graph_delivery_workflow_id(tenant: str, address: str, immutable_id: str) -> str:
    """`inbound/{tenant}/graph/{address}/{immutable id}` (docs/architecture.md §10)."""
    return inbound_workflow_id(tenant, graph_messages.SOURCE, address, immutable_id)


def client_state_digest(client_state: str) -> str:
    """What is stored of a subscription's `clientState`, and what the relay compares."""
    return hashlib.sha256(client_state.encode()).hexdigest()


class MailboxGraphActivities:
    def __init__(self, pool: asyncpg.Pool, max_message_bytes: int,
                 environ: Mapping[str, str] | None = None,
                 settings: GraphSettings | None = None) -> None:
        self.pool = pool
        self.max_message_bytes = max_message_bytes
        self.environ = environ if environ is not None else os.environ
        self.settings = settings or GraphSettings()

    # --- the subscription ----------------------------------------------------------------
    @activity.defn(name="ensure_graph_subscription")
    async def ensure_graph_subscription(self, ask: GraphSubscriptionAsk
                                        ) -> GraphSubscriptionState:
        """Create the subscription when there is none (or `recreate`), renew it when less
        than `renew_ahead_seconds` is left (or `renew`); say when to look again."""
        watch = ask.watch
        box, client = await self._open(watch)
        if box is None or client is None:
            return GraphSubscriptionState(removed=True)
        try:
            async with self.pool.acquire() as conn:
                row = await subscriptions.get_subscription(
                    conn, tenant=watch.tenant, kind=GRAPH_KIND, address=watch.address,
                    folder=watch.folder)
            now = datetime.now(UTC)
            expires = now + timedelta(seconds=watch.subscription_seconds)
            current = None if row is None or ask.recreate else row["subscription_id"]
            created = False
            if current is not None and row is not None and (
                    ask.renew or row["expires_at"] is None
                                        or (row["expires_at"] - now).total_seconds()
                                        < watch.renew_ahead_seconds):
                try:
                    answer = await client.renew_subscription(current, expires)
                    await self._record(watch, current, row["client_state_sha256"], answer,
                                       expires)
                except GraphFailure as exc:
                    if exc.classified.status_code != 404:
                        raise
                    current = None  # gone at Graph's end: a new one, and a catch-up
            if current is None:
                if row is not None and row["subscription_id"] and ask.recreate:
                    await client.delete_subscription(row["subscription_id"])
                await self._create(watch, client, expires)
                created = True
            async with self.pool.acquire() as conn:
                row = await subscriptions.get_subscription(
                    conn, tenant=watch.tenant, kind=GRAPH_KIND, address=watch.address,
                    folder=watch.folder)
            assert row is not None and row["expires_at"] is not None
            left = (row["expires_at"] - datetime.now(UTC)).total_seconds()
            await self._set_state(watch, "watching", None)
            return GraphSubscriptionState(
                created=created,
                next_check_seconds=max(60.0, left - watch.renew_ahead_seconds),
                subscription_id=row["subscription_id"], token_env=box["oauth_token_env"])
        except GraphFailure as exc:
            raise await self._failed(watch, exc) from None
        finally:
            await client.aclose()

    @activity.defn(name="delete_graph_subscription")
    async def delete_graph_subscription(self, ask: GraphUnsubscribe) -> None:
        """The mailbox was removed: delete its subscription at Graph's end (best effort; one
        left behind lapses on its own, and its notifications are refused meanwhile)."""
        token = self.environ.get(ask.token_env)
        if not token:
            return
        client = GraphClient(self.settings.url, token)
        try:
            await client.delete_subscription(ask.subscription_id)
        except GraphFailure as exc:
            log.warning("graph subscription not deleted: %s", exc.classified.reason)
        finally:
            await client.aclose()

    async def _create(self, watch: GraphWatch, client: GraphClient, expires: datetime) -> None:
        url = self.settings.notification_url
        if not url:
            raise GraphFailure(Classified(Category.PERMANENT, "graph_notification_url_unset"))
        client_state = secrets.token_urlsafe(48)  # 64 characters; Graph allows 128
        answer = await client.create_subscription(
            user=watch.address, folder=watch.folder, notification_url=url,
            client_state=client_state, expires=expires)
        subscription_id = answer.get("id")
        if not isinstance(subscription_id, str) or not subscription_id:
            raise GraphFailure(Classified(Category.TRANSIENT, "graph_subscription_without_id"))
        await self._record(watch, subscription_id, client_state_digest(client_state), answer,
                           expires)
        log.info("graph subscription created for tenant %s", watch.tenant)

    async def _record(self, watch: GraphWatch, subscription_id: str, digest: str | None,
                      answer: dict[str, Any], asked: datetime) -> None:
        granted = answer.get("expirationDateTime")
        try:
            expires = parse_graph_time(granted) if isinstance(granted, str) else asked
        except ValueError:
            expires = asked
        async with self.pool.acquire() as conn:
            await subscriptions.record_subscription(
                conn, tenant=watch.tenant, kind=GRAPH_KIND, address=watch.address,
                folder=watch.folder, subscription_id=subscription_id,
                client_state_sha256=digest, expires_at=expires)

    # --- messages ------------------------------------------------------------------------
    @activity.defn(name="fetch_graph_messages")
    async def fetch_graph_messages(self, fetch: GraphFetch) -> WatchSummary:
        """Store the messages a notification named (by immutable ID)."""
        watch = fetch.watch
        summary = WatchSummary()
        box, client = await self._open(watch)
        if box is None or client is None:
            summary.removed = True
            return summary
        try:
            async with heartbeating(min(2.0, watch.heartbeat_seconds / 4)):
                for immutable_id in fetch.ids:
                    if MESSAGE_ID.match(immutable_id):
                        await self._store(watch, client, immutable_id, summary)
            await self._set_state(watch, "watching", None)
        except GraphFailure as exc:
            raise await self._failed(watch, exc) from None
        finally:
            await client.aclose()
        return summary

    @activity.defn(name="graph_delta_catch_up")
    async def graph_delta_catch_up(self, watch: GraphWatch) -> WatchSummary:
        """Read the delta query from the stored link to its new delta link, storing every
        message it names; the link advances page by page, after the page is stored."""
        summary = WatchSummary()
        box, client = await self._open(watch)
        if box is None or client is None:
            summary.removed = True
            return summary
        try:
            async with heartbeating(min(2.0, watch.heartbeat_seconds / 4)):
                async with self.pool.acquire() as conn:
                    row = await subscriptions.get_subscription(
                        conn, tenant=watch.tenant, kind=GRAPH_KIND, address=watch.address,
                        folder=watch.folder)
                link = None if row is None else row["cursor"]
                while True:
                    try:
                        page = await client.delta_page(user=watch.address, folder=watch.folder,
                                                       link=link)
                    except GraphFailure as exc:
                        if link is None or exc.classified.status_code not in (400, 410):
                            raise
                        # The delta token expired (Graph: 410 Gone / syncStateNotFound): a
                        # new round from the start, matched by immutable ID.
                        log.warning("graph delta link refused (%s): full round",
                                    exc.classified.reason)
                        link = None
                        continue
                    for immutable_id in page.ids:
                        await self._store(watch, client, immutable_id, summary)
                    link = page.next_link or page.delta_link
                    assert link is not None
                    async with self.pool.acquire() as conn:
                        await subscriptions.advance_cursor(
                            conn, tenant=watch.tenant, kind=GRAPH_KIND, address=watch.address,
                            folder=watch.folder, cursor=link)
                    if page.next_link is None:
                        break
            async with self.pool.acquire() as conn:
                await mailboxes.mark_checked(conn, tenant=watch.tenant, kind=GRAPH_KIND,
                                             address=watch.address, folder=watch.folder)
            await self._set_state(watch, "watching", None)
        except GraphFailure as exc:
            raise await self._failed(watch, exc) from None
        finally:
            await client.aclose()
        return summary

    async def _store(self, watch: GraphWatch, client: GraphClient, immutable_id: str,
                     summary: WatchSummary) -> None:
        workflow_id = graph_delivery_workflow_id(watch.tenant, watch.address, immutable_id)
        async with self.pool.acquire() as conn:
            seen = await graph_messages.seen(conn, tenant=watch.tenant, address=watch.address,
                                             immutable_id=immutable_id)
        if seen is not None:
            summary.duplicates += 1  # stored before (or recorded as a copy): not read again
            await self._start_if_needed(watch, seen)
            return
        raw = await client.mime(user=watch.address, message_id=immutable_id,
                                max_bytes=self.max_message_bytes)
        if raw is None:
            summary.too_large += 1
            log.warning("graph message not read: over the size limit or gone")
            return
        async with self.pool.acquire() as conn:
            stored = await graph_messages.store_graph_message(
                conn, tenant=watch.tenant, address=watch.address, folder=watch.folder,
                immutable_id=immutable_id, raw=raw, message_id=message_id_of(raw),
                content_sha256=hashlib.sha256(raw).hexdigest(), workflow_id=workflow_id)
        if stored.raced:
            count_conflict(ConflictKind.MAILBOX_MESSAGE)
        if not stored.new:
            summary.duplicates += 1
        elif stored.role == "copy":
            summary.copies += 1
        else:
            summary.stored += 1
        await self._start_if_needed(watch, stored)

    async def _start_if_needed(self, watch: GraphWatch, stored: StoredMessage) -> None:
        if stored.role == "item" and stored.event_id and stored.workflow_id and not stored.started:
            started = await _start_item(stored.event_id, watch.tenant, stored.workflow_id)
            async with self.pool.acquire() as conn:
                if started:
                    await mailboxes.mark_started(conn, event_id=stored.event_id)
                else:
                    await mailboxes.count_start_failure(conn, event_id=stored.event_id)

    # --- registration and state --------------------------------------------------------------
    async def _open(self, watch: GraphWatch) -> tuple[asyncpg.Record | None, GraphClient | None]:
        """The registration and a client with its token (None, None: it was removed)."""
        async with self.pool.acquire() as conn:
            box = await mailboxes.get_mailbox(conn, tenant=watch.tenant, kind=GRAPH_KIND,
                                              address=watch.address, folder=watch.folder)
        if box is None:
            return None, None
        token = self.environ.get(box["oauth_token_env"] or "")
        if not token:
            raise await self._failed(watch, GraphFailure(
                Classified(Category.PERMANENT, "graph_credential_unset")))
        return box, GraphClient(self.settings.url, token)

    async def _failed(self, watch: GraphWatch, exc: GraphFailure) -> ApplicationError:
        """Record the failure on the registration (a category and a code, no payload) and
        give the workflow an error to retry on (every Graph failure waits and retries: an
        expired token recovers once the secret is renewed)."""
        classified = exc.classified
        log.warning("graph mailbox of tenant %s: %s (%s)", watch.tenant, classified.reason,
                    classified.category.value)
        await self._set_state(watch, "error", f"{classified.category.value}:{classified.reason}")
        return ApplicationError(classified.reason, type=classified.category.value,
                                next_retry_delay=timedelta(seconds=classified.retry_after)
                                if classified.retry_after else None)

    async def _set_state(self, watch: GraphWatch, state: str, error: str | None) -> None:
        async with self.pool.acquire() as conn:
            await mailboxes.set_state(conn, tenant=watch.tenant, kind=GRAPH_KIND,
                                      address=watch.address, folder=watch.folder, state=state,
                                      last_error=error)


async def _start_item(event_id: str, tenant: str, workflow_id: str) -> bool:
    """Start a stored event's item workflow as every source does; False when Temporal did
    not answer (the relay's sweeper starts the stored event later)."""
    try:
        await activity.client().start_workflow(
            WORKFLOW_TYPE, InboundEmailInput(event_id=event_id, tenant=tenant),
            id=workflow_id, task_queue=activity.info().task_queue,
            static_summary=f"inbound email · tenant {tenant} · source graph",
            search_attributes=start_search_attributes(tenant),
            priority=tenant_priority(tenant),
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            rpc_timeout=START_RPC_TIMEOUT)
    except WorkflowAlreadyStartedError:
        pass
    except (TimeoutError, RPCError, OSError, RuntimeError) as exc:
        log.warning("item start deferred: %s", type(exc).__name__)
        return False
    return True


def graph_activities(pool: asyncpg.Pool, max_message_bytes: int, relay_notification_url: str
                     ) -> list[Callable[..., Awaitable[Any]]]:
    """The Graph watcher's activities, for the worker to register; notifications go to
    `INBOXCRM_GRAPH_NOTIFICATION_URL`, else to the relay's public URL."""
    settings = GraphSettings()
    if not settings.notification_url:
        settings.notification_url = relay_notification_url
    acts = MailboxGraphActivities(pool, max_message_bytes, settings=settings)
    return [acts.ensure_graph_subscription, acts.fetch_graph_messages,
            acts.graph_delta_catch_up, acts.delete_graph_subscription]
