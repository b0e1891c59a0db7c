"""send_review_notices: tell each tenant's reviewers about their work (docs/architecture.md
§6, "Going live"). Run by the scheduled ReviewNoticesWorkflow, one run every
`INBOXCRM_REVIEW_NOTICE_INTERVAL_SECONDS`: per tenant with a channel, the review waits that
opened or became overdue since the last run go out together, one message per batch.

Each batch follows the outbox's order in small: claim (`inboxcrm.store.notices`), post,
record. A webhook that refused or was never reached releases the claim (the next run tries
again); an answer that never came keeps it until its lease ends, so a notice may be posted
twice but is never lost. A failing tenant never stops the others, and the run never fails
for it: the next run is the retry.
"""

from __future__ import annotations

import logging
import uuid
from typing import Literal

import asyncpg
import httpx
from temporalio import activity

from inboxcrm.activities.counters import count
from inboxcrm.domain.notices import slack_message, webhook_url
from inboxcrm.domain.policy import load_policies
from inboxcrm.schemas.contract import REVIEW_NOTICES_ACTIVITY
from inboxcrm.schemas.notices import ReviewNoticesInput, ReviewNoticesSummary
from inboxcrm.store import notices as store

log = logging.getLogger("inboxcrm.notices")

# A claim older than this whose batch never recorded its answer is taken over.
LEASE_SECONDS = 600.0
Posted = Literal["sent", "refused", "unknown"]


class NoticeActivities:
    def __init__(self, pool: asyncpg.Pool, review_base_url: str,
                 timeout_seconds: float = 10.0) -> None:
        self._pool = pool
        self._base_url = review_base_url
        self._timeout = timeout_seconds

    @activity.defn(name=REVIEW_NOTICES_ACTIVITY)
    async def send_review_notices(self, request: ReviewNoticesInput) -> ReviewNoticesSummary:
        summary = ReviewNoticesSummary()
        async with httpx.AsyncClient(timeout=self._timeout, follow_redirects=False) as http:
            for tenant, policy in sorted(load_policies().items()):
                channel = policy.notifications.webhook if policy.notifications else None
                if channel is None:
                    continue
                url = webhook_url(channel)
                if url is None:
                    summary.unconfigured_tenants.append(tenant)
                    continue
                await self._tenant(http, tenant, url, request, summary)
        return summary

    async def _tenant(self, http: httpx.AsyncClient, tenant: str, url: str,
                      request: ReviewNoticesInput, summary: ReviewNoticesSummary) -> None:
        for _ in range(request.max_messages_per_tenant):
            batch = uuid.uuid4()
            async with self._pool.acquire() as conn:
                rows = await store.claim(conn, tenant, batch, request.max_per_message,
                                         LEASE_SECONDS)
            if not rows:
                return
            activity.heartbeat()
            message = slack_message(tenant, [dict(row) for row in rows], self._base_url)
            outcome = await _post(http, url, message)
            _count(outcome)
            async with self._pool.acquire() as conn:
                if outcome == "sent":
                    await store.mark_sent(conn, batch)
                elif outcome == "refused":
                    await store.release(conn, batch)
            if outcome != "sent":
                log.warning("review notices for tenant %s not delivered (%s)", tenant, outcome)
                summary.failed_tenants.append(tenant)
                return
            summary.messages += 1
            summary.notices += len(rows)


async def _post(http: httpx.AsyncClient, url: str, payload: dict[str, object]) -> Posted:
    """`sent` on a 2xx; `refused` when nothing can have been delivered (connection refused,
    an error status); `unknown` when the request went out and no answer came."""
    try:
        response = await http.post(url, json=payload)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout):
        return "refused"
    except httpx.HTTPError:
        return "unknown"
    return "sent" if response.is_success else "refused"


def _count(outcome: Posted) -> None:
    count("inboxcrm_review_notice_messages",
          "Review notice messages posted to tenants' webhooks, by outcome", outcome=outcome)
