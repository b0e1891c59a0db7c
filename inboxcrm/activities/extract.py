"""extract_message: reads the stored raw message (never passed through workflow history),
runs the configured extractor and the deterministic validation/routing, stores the
validated record on the event and returns only the route and its reasons.

The event's source goes to the extractor with the message: a provider's verdict on the
sender counts only when the message came through that provider (docs/architecture.md §5).
A hard bounce or an abuse report about one of our follow-ups is ignored like any report,
and suppresses the reported address in the same transaction as the stored record.

The extraction is stored once per event: a re-run (a crash, a replay) answers from the
stored record and never asks the model again, which might answer differently and leave an
orphan contact behind.

With the LLM extractor the model call is not a local step (docs/architecture.md §5): the
local `extract_message` answers a stored extraction, or names the model's task queue, and
the workflow runs `extract_with_model` there as a regular activity, under that queue's rate
limit. The rule-based extractor takes milliseconds and stays local."""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import asyncpg
from temporalio import activity
from temporalio.exceptions import ApplicationError

from inboxcrm.activities.counters import count
from inboxcrm.activities.failures import missing_row
from inboxcrm.activities.heartbeat import heartbeating
from inboxcrm.activities.step_attempts import (
    StepAttempt,
    counted_attempt,
)
from inboxcrm.adapters.errors import ErrorType
from inboxcrm.domain.extraction import (
    Extractor,
    ExtractorMisconfigured,
    ExtractorUnavailable,
    extract_and_route,
)
from inboxcrm.domain.extraction.route import TOO_COMPLEX
from inboxcrm.domain.policy import InvalidAddress, TenantPolicy, canonical_email, get_policy
from inboxcrm.platform import atrest
from inboxcrm.platform.workpool import IN_PROCESS, Runner, WorkPoolUnavailable
from inboxcrm.schemas.models import ExtractResult, ItemRef, ItemState
from inboxcrm.store import audit, events
from inboxcrm.store.suppression import SendInFlight, suppress_reported

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

STEP = "extract"


class ExtractActivities:
    """`runner`: where the work on the message runs. The worker passes its `WorkPool`
    (off the event loop, killed at the time limit: docs/architecture.md §7); a message over
    budget is stored and routed like any other, to review with reason `too_complex`, so it
    is never a crash and never reaches the crash-loop counter."""

    def __init__(self, pool: asyncpg.Pool, extractor: Extractor, max_retry_after: float,
                 review_base_url: str = "", model_queue: str = "",
                 runner: Runner = IN_PROCESS) -> None:
        """`model_queue`: where `extract_with_model` runs (the LLM extractor); empty: the
        whole extraction runs in `extract_message`."""
        self._pool = pool
        self._extractor = extractor
        self._max_retry_after = max_retry_after
        self._review_base_url = review_base_url
        self._model_queue = model_queue
        self._runner = runner

    @activity.defn(name="extract_message")
    async def extract_message(self, item: ItemRef) -> ExtractResult:
        if self._model_queue:
            stored = await self._stored(item)
            if stored is not None:
                return stored
            policy = get_policy(item.tenant)
            return ExtractResult(route="review", extractor="pending",
                                 review_owner=policy.review_owner, **_authority(policy),
                                 escalation_hours=policy.escalation_hours,
                                 review_base_url=self._review_base_url,
                                 model_queue=self._model_queue)
        async with heartbeating(), counted_attempt(self._pool, item, STEP,
                                                   counts_itself=True) as attempt:
            return await self._extract(item, attempt)

    @activity.defn(name="extract_with_model")
    async def extract_with_model(self, item: ItemRef) -> ExtractResult:
        """The extraction with the model, as a regular activity on the model's task queue:
        heartbeats, a crash loop counted like the local step's."""
        async with heartbeating(), counted_attempt(self._pool, item, STEP,
                                                   counts_itself=True) as attempt:
            return await self._extract(item, attempt)

    async def _stored(self, item: ItemRef) -> ExtractResult | None:
        """Mark the item `extracting`; the stored extraction's result, if there is one."""
        policy = get_policy(item.tenant)
        event = await events.mark_extracting(self._pool, event_id=item.event_id,
                                             state=ItemState.EXTRACTING,
                                             shadow=policy.mode == "shadow")
        if event is None:
            raise missing_row("event")
        return self._stored_result(item, event) if event["extracted"] else None

    def _stored_result(self, item: ItemRef, event: asyncpg.Record) -> ExtractResult:
        policy = get_policy(item.tenant)
        return ExtractResult(route=event["route"], reasons=list(event["route_reasons"] or []),
                             extractor="stored", review_owner=policy.review_owner,
                             **_authority(policy),
                             escalation_hours=policy.escalation_hours,
                             identity_known=bool(event["identity_known"]),
                             review_base_url=self._review_base_url,
                             shadow=bool(event["shadow"]))

    async def _extract(self, item: ItemRef, attempt: StepAttempt) -> ExtractResult:
        policy = get_policy(item.tenant)
        event = await events.start_extraction(self._pool, event_id=item.event_id,
                                              state=ItemState.EXTRACTING,
                                              workflow_id=item.workflow_id, step=STEP,
                                              shadow=policy.mode == "shadow")
        if event is None:
            raise missing_row("event")  # counted: cleared on the way out
        attempt.begun(event["started"])
        shadow = bool(event["shadow"])
        if event["extracted"]:
            return self._stored_result(item, event)
        raw = event["raw"]
        if raw is None:
            raise ApplicationError(
                "raw message missing (purged?)", type=ErrorType.PERMANENT.value,
                non_retryable=True,
            )
        try:
            outcome = await extract_and_route(
                atrest.open_value(raw, tenant=item.tenant, column=atrest.RAW,
                                  row=item.event_id), policy,
                self._extractor, source=str(event["source"]), runner=self._runner)
        except WorkPoolUnavailable:
            # this worker cannot run the work now (its pool is closing or cannot start
            # children): not the message's doing, so a plain retry
            raise ApplicationError("work pool unavailable", type=ErrorType.TRANSIENT.value,
                                   next_retry_delay=timedelta(seconds=2)) from None
        except ExtractorUnavailable as exc:
            delay = None
            if exc.retry_after is not None:
                delay = timedelta(seconds=min(exc.retry_after, self._max_retry_after))
            raise ApplicationError(
                "extractor unavailable", type=ErrorType.TRANSIENT.value, next_retry_delay=delay
            ) from None
        except ExtractorMisconfigured as exc:
            # A wrong key, model or URL: retrying cannot help; an operator must fix settings.
            raise ApplicationError(
                f"extractor misconfigured: http_{exc.status_code}",
                type=ErrorType.PERMANENT.value, non_retryable=True,
            ) from None
        if outcome.reasons[:1] == [TOO_COMPLEX]:
            count("inboxcrm_messages_over_budget", "messages routed to review as too_complex")
        record: dict[str, Any] = outcome.extraction.model_dump(mode="json")
        detail = {
            "extractor": outcome.extractor,
            "extractor_version": outcome.extractor_version,
            "route": outcome.route,
            "reasons": outcome.reasons,
            "authentication": {k: outcome.authentication.get(k)
                               for k in ("verdict", "reason", "method", "authority")},
            "intent": record.get("intent"),
            "confidence": {
                name: (record.get(name) or {}).get("confidence")
                for name in ("sender_email", "contact_name", "company")
            },
            # Quoted from the message: personal data, sealed at rest (one AES-GCM per quote,
            # inboxcrm/platform/atrest.py), removed by `inboxcrm forget`.
            "evidence": {
                name: atrest.seal_text((record.get(name) or {}).get("evidence"),
                                       tenant=item.tenant, column=atrest.AUDIT_EVIDENCE,
                                       row=item.event_id)  # the entry's event_id
                for name in atrest.EVIDENCE_FIELDS
            },
        }
        stored = functools.partial(
            events.store_extraction, event_id=item.event_id,
            extraction=atrest.seal_evidence(record, tenant=item.tenant,
                                            event_id=item.event_id),
            route=outcome.route, route_reasons=outcome.reasons,
            canonical_email=outcome.canonical_email, tenant=item.tenant,
            workflow_id=item.workflow_id, audit_detail=audit.json_safe(detail), step=STEP,
            written_at=outcome.written_at, languages=outcome.languages,
            thread_refs=outcome.thread_refs)
        if outcome.suppression_candidates:
            async with self._pool.acquire() as conn, conn.transaction():
                await stored(conn)
                await self._suppress_reported(conn, item, policy, outcome.suppression_candidates)
        else:
            await stored(self._pool)  # one statement: atomic without a transaction
        attempt.cleared()
        return ExtractResult(route=outcome.route, reasons=list(outcome.reasons),
                             extractor=outcome.extractor, review_owner=policy.review_owner,
                             **_authority(policy),
                             escalation_hours=policy.escalation_hours,
                             identity_known=outcome.canonical_email is not None,
                             review_base_url=self._review_base_url, shadow=shadow)

    async def _suppress_reported(self, conn: Conn, item: ItemRef, policy: TenantPolicy,
                                 report: dict[str, Any]) -> None:
        identities = []
        for address in report.get("recipients", []):
            try:
                identities.append(canonical_email(str(address), policy))
            except InvalidAddress:
                continue
        reason = str(report["reason"])
        try:
            suppressed = await suppress_reported(conn, item.tenant, identities, reason=reason,
                                                 source=f"event:{item.event_id}")
        except SendInFlight as busy:
            raise ApplicationError(
                "send in flight for a reported identity", type=ErrorType.TRANSIENT.value,
                next_retry_delay=timedelta(seconds=min(busy.retry_after, 5.0))) from None
        if suppressed:
            await audit.append(
                conn, tenant=item.tenant, event_id=item.event_id, workflow_id=item.workflow_id,
                contact_id=None, actor="extractor", action="suppression_recorded",
                detail={"reason": reason, "identities": len(suppressed)})


def _authority(policy: TenantPolicy) -> dict[str, Any]:
    """Who owns which wait, and who may repeat a customer-facing action, for the workflow."""
    return {"owners": dict(policy.owners),
            "repeat_role": policy.authority.repeat_customer_facing,
            "approve_role": policy.authority.approve_followup}
