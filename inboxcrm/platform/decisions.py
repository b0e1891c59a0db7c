"""The one decision client (docs/architecture.md §6): how the review desk and the CLI send a
reviewer's decision to an item's workflow, and how its answer is worded for a person.

A decision is the workflow's own Temporal Update, named by its `Decision` (the contract), with
a `DecisionBody` carrying the typed label, the wait it answers, the note, evidence and
corrections, and the authenticated decider with its path and proof
(`reviewer_identity.sign_decision`). This module is the only place that builds that body and
that proof, and the only place that sends the update: the desk (`inboxcrm/ingress/review.py`)
and the CLI (`inboxcrm/cli/review.py`) each turn their input into a `DecisionRequest` and show
the `DecisionResult`'s `message`. A fast test (`tests/fast/test_decisions.py`) keeps it so.

The body stays wire-identical to what the desk and the CLI sent before: the same update name,
the same dataclass, the same fields (the workflow code and its stored histories do not change).
Nothing personal is logged: the log lines name the path and an exception type only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from inboxcrm.platform.reviewer_identity import DecisionClaim, Principal, sign_decision
from inboxcrm.schemas.contract import QUERY_STATUS, Decision, authority_refusal
from inboxcrm.schemas.models import REVIEWER_LABEL_CHARS, DecisionBody, ItemStatus, OpenReview

log = logging.getLogger("inboxcrm.platform.decisions")

# How long a decision may take end to end (the wait's query, the update and its answer).
SEND_SECONDS = 60.0

Outcome = Literal["accepted", "refused", "unsigned", "not_found", "not_running",
                  "unavailable"]


@dataclass(frozen=True)
class DecisionRequest:
    """One reviewer decision on one item. `reviewer` is the typed display label, sent as
    given (the audit records the authenticated `decider`); `wait_id` None means the wait open
    now (the workflow's validator still refuses a stale one); `path` is where it came from
    (`desk` or `cli`)."""

    workflow_id: str
    action: Decision
    decider: Principal
    path: str
    reviewer: str = ""
    note: str | None = None
    evidence: str | None = None
    corrections: Mapping[str, str] = field(default_factory=dict)
    send_followup: bool = True
    wait_id: str | None = None
    # An approval of an edited draft the caller stored with the intent: its SHA-256.
    draft_sha256: str | None = None


@dataclass(frozen=True)
class DecisionResult:
    """The workflow's answer. `accepted` False: refused or not delivered, `outcome` says
    which; `message` is the wording shown to people (the page, stdout or stderr);
    `wait_id` the wait the decision answered; `status` the state the workflow reported as it
    took the decision (None unless accepted)."""

    accepted: bool
    outcome: Outcome
    message: str
    wait_id: str = ""
    status: ItemStatus | None = None


def decision_body(request: DecisionRequest, secret: str, wait_id: str) -> DecisionBody:
    """The update's argument: what the reviewer sent, the authenticated decider, the path and
    the proof over all of it (`DecisionClaim`: the body with the workflow and the wait). The
    label is sent as the workflow reads it (stripped, cut to REVIEWER_LABEL_CHARS), so the
    proof covers what the workflow checks."""
    decider = request.decider.decider
    label = request.reviewer.strip()[:REVIEWER_LABEL_CHARS]
    claim = DecisionClaim(decider=decider, path=request.path, workflow_id=request.workflow_id,
                          wait_id=wait_id, action=request.action.value, reviewer=label,
                          note=request.note, evidence=request.evidence,
                          corrections=dict(request.corrections),
                          send_followup=request.send_followup,
                          draft_sha256=request.draft_sha256)
    return DecisionBody(
        reviewer=label, wait_id=wait_id, note=request.note, evidence=request.evidence,
        corrections=dict(request.corrections), send_followup=request.send_followup,
        decider=decider, path=request.path, proof=sign_decision(secret, claim),
        draft_sha256=request.draft_sha256)


def accepted_text(action: str, wait_id: str, workflow_id: str, status: ItemStatus) -> str:
    """An accepted decision in words. The update answers as the workflow takes the decision,
    before the item moves on: the state is the one at that moment (`held` for a hold)."""
    text = (f"accepted: {action} at wait {wait_id}: {workflow_id} is now {status.state}"
            + (f" ({status.reason})" if status.reason else ""))
    review = status.review
    if review is not None:
        where = "the wait stays open" if review.wait_id == wait_id else (
            f"open wait {review.wait_id}: {review.reason}")
        text += f"; {where}; allowed: {', '.join(review.allowed) or 'nothing'}"
    return text


def lacks_authority(request: DecisionRequest, review: OpenReview | None,
                    wait_id: str) -> DecisionResult | None:
    """A retry (or a send-again) of an ambiguous customer-facing send, or an approval of a
    follow-up, by someone without the role the tenant's policy asks for
    (`OpenReview.repeat_role`, `OpenReview.approve_role`) is refused here, before
    anything is sent; the
    workflow refuses it too (its decision record checks the proven reviewer's role), so a
    Temporal client that skips this check gets the same answer."""
    if review is None or review.wait_id != wait_id:
        return None
    role = (review.repeat_role if request.action in (Decision.RETRY, Decision.SEND_AGAIN)
            else review.approve_role if request.action == Decision.APPROVE else None)
    if not role or request.decider.role == role:
        return None
    log.info("%s decision refused: authority_required", request.path)
    return DecisionResult(False, "refused", authority_refusal(role, request.action.value),
                          wait_id)


UNSIGNED = ("refused: INBOXCRM_DECISION_SECRET is not set here, so the worker could not tell "
            "who decided (the local stack writes it to .data/stack.env)")
UNAVAILABLE = "not delivered: Temporal is unavailable; try again"


async def send_decision(connect: Callable[[], Awaitable[Client]], secret: str | None,
                        request: DecisionRequest, *,
                        timeout: float = SEND_SECONDS) -> DecisionResult:
    """Send the decision as the workflow's Update and wait for its answer: accepted with the
    state it reports, or refused with the workflow's own reason, or not delivered (no secret
    to prove the decider, no such workflow, a finished one, Temporal unreachable)."""
    if not secret:
        return DecisionResult(False, "unsigned", UNSIGNED, request.wait_id or "")
    try:
        client = await asyncio.wait_for(connect(), timeout)
    except (TimeoutError, OSError, RuntimeError, RPCError) as exc:
        log.warning("%s decision: Temporal unavailable (%s)", request.path, type(exc).__name__)
        return DecisionResult(False, "unavailable", UNAVAILABLE, request.wait_id or "")
    handle = client.get_workflow_handle(request.workflow_id)
    wait_id = request.wait_id
    try:
        async with asyncio.timeout(timeout):
            if wait_id is None or request.action in (Decision.RETRY, Decision.SEND_AGAIN,
                                                     Decision.APPROVE):
                current = await handle.query(QUERY_STATUS, result_type=ItemStatus)
                open_wait = current.review
                if wait_id is None:
                    wait_id = open_wait.wait_id if open_wait else ""
                refused = lacks_authority(request, open_wait, wait_id)
                if refused is not None:
                    return refused
            status = await handle.execute_update(
                request.action.value, decision_body(request, secret, wait_id),
                result_type=ItemStatus)
    except WorkflowUpdateFailedError as exc:
        cause = exc.cause
        return DecisionResult(False, "refused",
                              str(getattr(cause, "message", None) or cause or "refused"),
                              wait_id or "")
    except RPCError as exc:
        log.info("%s decision not delivered: %s", request.path, type(exc).__name__)
        return await _undelivered(client, request, wait_id or "", exc)
    except (TimeoutError, OSError) as exc:
        log.warning("%s decision: Temporal unavailable (%s)", request.path, type(exc).__name__)
        return DecisionResult(False, "unavailable", UNAVAILABLE, wait_id or "")
    return DecisionResult(True, "accepted",
                          accepted_text(request.action.value, wait_id, request.workflow_id,
                                        status), wait_id, status)


async def _undelivered(client: Client, request: DecisionRequest, wait_id: str,
                       error: RPCError) -> DecisionResult:
    """Why Temporal would not take the update: no such workflow, or one that is not running
    (it finished, or was terminated), or Temporal itself."""
    if error.status not in (RPCStatusCode.NOT_FOUND, RPCStatusCode.FAILED_PRECONDITION,
                            RPCStatusCode.INVALID_ARGUMENT):
        return DecisionResult(False, "unavailable", UNAVAILABLE, wait_id)
    try:
        description = await asyncio.wait_for(
            client.get_workflow_handle(request.workflow_id).describe(), 10)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return DecisionResult(False, "not_found", "refused: no workflow with ID "
                                  f"{request.workflow_id!r}", wait_id)
        return DecisionResult(False, "unavailable", UNAVAILABLE, wait_id)
    except (TimeoutError, OSError):
        return DecisionResult(False, "unavailable", UNAVAILABLE, wait_id)
    state = description.status
    if state == WorkflowExecutionStatus.RUNNING:
        # Running, yet it refused the request itself (e.g. a wait ID it cannot parse).
        return DecisionResult(False, "refused", f"refused: {error.message}", wait_id)
    return DecisionResult(False, "not_running",
                          f"refused: workflow {request.workflow_id!r} is not running "
                          f"({state.name.lower() if state else 'unknown'}); it finished, or "
                          "never started", wait_id)
