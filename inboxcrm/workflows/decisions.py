"""Reviewer decisions for InboundEmailWorkflow: which wait a decision answers, how its body is
validated, and what the Temporal UI shows while an item waits for a person.

Every wait has an ID (`w3-review`: a counter in the workflow, so replay gives the same IDs).
A decision names the wait it answers: an update must carry `wait_id`; a signal is bound to
the wait that was open when it arrived (or to the `wait_id` in its body). A decision for any
other wait is stale and dropped, so a double click or a second reviewer can never answer a
later wait (a follow-up approval, a second blocked step) that nobody looked at.

Pure, deterministic helpers, imported as passthrough (not re-executed per workflow run).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from temporalio.exceptions import ApplicationError

from inboxcrm.adapters.errors import failure_cause
from inboxcrm.schemas.contract import authority_refusal, decision_body, send_again_refusal
from inboxcrm.schemas.models import (
    DECISION_ACTIONS,
    REVIEWER_LABEL_CHARS,
    DecisionAction,
    DecisionBody,
    ItemState,
    ReviewDecision,
)

# What a wait waits for: a review of the item, a follow-up's approval, or a person's
# recovery of a blocked or ambiguous step.
WaitKind = Literal["review", "followup", "recovery"]

REVIEW_ACTIONS = {"approve", "hold", "reject"}
RECOVERY_ACTIONS = {"retry", "resolve", "hold", "reject"}
# Offered besides them where a customer-facing send is unconfirmed (behind the patch
# `send-again`): a deliberate second send, a new intent with its own key and approval.
SEND_AGAIN = "send_again"
DECISION_FIELDS = {"reviewer", "note", "evidence", "corrections", "wait_id", "send_followup",
                   "decider", "path", "proof", "draft_sha256"}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Request:
    """A decision as it arrived (signal or update), bound to the wait open at that moment."""

    action: str
    body: Any
    wait_seq: int | None = None     # None: no wait was open when it arrived
    via: str = "signal"             # signal | update
    outcome: str | None = None      # once taken: "accepted" or the refusal code
    message: str = ""               # the refusal a person reads
    signal_seq: int | None = None   # the n-th decision signal of this run (finds its identity)
    update_id: str | None = None


@dataclass
class Waiting:
    kind: WaitKind
    reason: str
    allowed: set[str]
    op_key: str | None = None
    since: str = ""
    seq: int = 0
    escalate_at: str = ""
    needs_sender: bool = False     # approve needs corrections.sender_email
    intent_id: str | None = None   # the follow-up an approval of this wait approves
    error: str | None = None       # the destination's error label (blocked step)
    attempts: str | None = None    # "n/max" from the ledger
    card_url: str = ""
    owner: str = ""                # who this wait's review task goes to (`owner_of`)
    # The reviewer role a retry needs (an ambiguous customer-facing send, the policy's
    # `authority.repeat_customer_facing`); None: any reviewer of the tenant.
    required_role: str | None = None
    # A follow-up's approval wait opened under the patch `edited-draft`: an approval may bind
    # an edited draft (`draft_sha256`).
    drafts: bool = False

    @property
    def wait_id(self) -> str:
        return f"w{self.seq}-{self.kind}"


@dataclass(frozen=True)
class Refusal:
    code: str                      # recorded in the audit log
    message: str                   # what the person reads, with what to do instead


class Rejected(Exception):
    """A reviewer rejected the item: the run ends in `rejected`."""


CHOICES = {
    "approve": "approve: continue processing (optionally with corrected fields)",
    "hold": "hold: keep it parked in the queue (the escalation time does not move)",
    "reject": "reject: end it; nothing more is written or sent",
    "retry": "retry: run the step again with the same operation key",
    "resolve": "resolve: the side effect exists; record the evidence and continue",
    "send_again": ("send_again: send the follow-up again, deliberately, as a new intent with "
                   "its own idempotency key (the customer may get two); the note says why"),
}
FOLLOWUP_CHOICE = ("approve: send this follow-up (this intent only); "
                   "`\"send_followup\": false` completes the item without it")


def body_for(action: str, waiting: Waiting) -> dict[str, Any]:
    """The exact body a decision needs at this wait (placeholders in angle brackets)."""
    return decision_body(action, waiting.wait_id, waiting.needs_sender)


def details(waiting: Waiting, state: ItemState) -> str:
    """What the UI shows on the workflow page (User Metadata → current details): why it
    waits, by when, and a ready-to-paste body per decision. References and reasons only,
    never personal data."""
    lines = [f"**Waiting for a person** ({state.value}): `{waiting.reason}`", "",
             f"- wait ID: `{waiting.wait_id}`",
             f"- escalates at: {waiting.escalate_at or 'n/a'} (holds do not move it)"]
    if waiting.op_key:
        lines.append(f"- operation: `{waiting.op_key.rsplit(':', 1)[-1]}`")
    if waiting.attempts:
        lines.append(f"- attempts: {waiting.attempts}")
    if waiting.error:
        lines.append(f"- destination error: `{waiting.error}`")
    if waiting.required_role and waiting.kind == "followup":
        lines.append(f"- approve only by a reviewer with the role `{waiting.required_role}` "
                     "(authority.approve_followup), through the review desk or "
                     "`inboxcrm review`")
    elif waiting.required_role:
        lines.append(f"- retry (and send_again) only by a reviewer with the role "
                     f"`{waiting.required_role}`, "
                     "through the review desk or `inboxcrm review` (a retry may send twice: "
                     "check the destination first, see the review card)")
    if waiting.card_url:
        lines.append(f"- review card: [{waiting.card_url}]({waiting.card_url})")
    lines += ["", "More Actions → \"Send an Update\" (you get an answer) or \"Send a Signal\", "
              "with one of these bodies:", ""]
    for action in sorted(waiting.allowed):
        choice = FOLLOWUP_CHOICE if action == "approve" and waiting.kind == "followup" else (
            CHOICES[action])
        lines += [f"- {choice}", "", f"  `{action}`: `{json.dumps(body_for(action, waiting))}`",
                  ""]
    return "\n".join(lines)


def owner_of(waiting: Waiting, owners: dict[str, str], default: str) -> str:
    """Who this wait's review task goes to (docs/architecture.md §6, "Who is called"): the
    policy's owner of its exact reason (`http_401:INVALID_AUTHENTICATION`), of the reason's
    status (`http_401`), or of its cause (`access`, `integration`, `data`, `rate`,
    `ambiguous`, or `review` for every review and follow-up wait); else `review_owner`.
    Blocked after retries ran out, the last error of the step tells the cause."""
    if not owners:
        return default
    label = waiting.reason
    if waiting.kind != "recovery":
        cause = "review"
    else:
        if waiting.reason == "retries_exhausted" and waiting.error:
            label = waiting.error
        cause = ("ambiguous" if waiting.reason == "outcome_unconfirmed"
                 else failure_cause(label))
    for key in (waiting.reason, label, label.split(":", 1)[0], cause):
        if key in owners:
            return owners[key]
    return default


def customer_facing(op_key: str | None) -> bool:
    """A step whose repeat reaches the customer: the follow-up's send (`{workflow_id}:send`)."""
    return op_key is not None and op_key.rsplit(":", 1)[-1] == "send"


def first(reasons: list[str], default: str) -> str:
    return reasons[0] if reasons else default


def reason_of(cause: ApplicationError) -> str:
    """'permanent: http_400:VALIDATION_ERROR' → 'http_400:VALIDATION_ERROR'."""
    return cause.message.split(": ", 1)[-1] or "permanent_error"


def decision_action(action: str) -> DecisionAction | None:
    """The decision an update or signal name stands for (None: not a decision)."""
    for known in DECISION_ACTIONS:
        if action == known:
            return known
    return None


def parse_decision(name: str, body: Any) -> tuple[ReviewDecision | None, str | None]:
    """A decision from an update's typed body or a signal's JSON object."""
    action = decision_action(name)
    if action is None:
        return None, "unknown_decision"
    if isinstance(body, DecisionBody):
        return ReviewDecision(action=action, reviewer=body.reviewer.strip()[:REVIEWER_LABEL_CHARS],
                              note=body.note, evidence=body.evidence,
                              corrections=dict(body.corrections), wait_id=body.wait_id or None,
                              send_followup=body.send_followup, decider=body.decider,
                              path=body.path, proof=body.proof,
                              draft_sha256=body.draft_sha256 or None), None
    if not isinstance(body, dict):
        return None, "body_not_an_object"
    unknown = set(body) - DECISION_FIELDS
    if unknown:
        return None, "unknown_fields"
    reviewer = body.get("reviewer")
    if not isinstance(reviewer, str) or not reviewer.strip():
        return None, "reviewer_required"
    corrections = body.get("corrections") or {}
    if not isinstance(corrections, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in corrections.items()
    ):
        return None, "corrections_not_string_map"
    for name in ("note", "evidence", "wait_id", "decider", "path", "proof", "draft_sha256"):
        if body.get(name) is not None and not isinstance(body[name], str):
            return None, f"{name}_not_a_string"
    send_followup = body.get("send_followup", True)
    if not isinstance(send_followup, bool):
        return None, "send_followup_not_a_bool"
    return ReviewDecision(action=action, reviewer=reviewer.strip()[:REVIEWER_LABEL_CHARS],
                          note=body.get("note"), evidence=body.get("evidence"),
                          corrections=corrections, wait_id=body.get("wait_id") or None,
                          send_followup=send_followup, decider=body.get("decider") or "",
                          path=body.get("path") or "", proof=body.get("proof") or "",
                          draft_sha256=body.get("draft_sha256") or None), None


def refusal(waiting: Waiting | None, action: str, body: Any, state: str, *,
            require_wait_id: bool) -> Refusal | None:
    """Why this decision cannot answer the open wait, or None. The update validators and the
    workflow's own check of every queued signal use this one function."""
    if waiting is None:
        return Refusal("no_open_wait", f"refused: nothing is waiting for a decision (the item "
                       f"is {state}); decisions answer an open wait only")
    decision, problem = parse_decision(action, body)
    if decision is None or not decision.reviewer:
        problem = problem or "reviewer_required"
        return Refusal(problem, f"refused ({problem}): send a body like "
                       f"{json.dumps(body_for(action, waiting))}")
    if decision.wait_id is None and require_wait_id:
        return Refusal("wait_id_required", f"refused: say which wait you answer: the open "
                       f"wait is \"wait_id\": \"{waiting.wait_id}\" ({waiting.reason})")
    if decision.wait_id is not None and decision.wait_id != waiting.wait_id:
        return Refusal("stale_wait", f"refused: wait {decision.wait_id} is not the open one; "
                       f"the open wait is {waiting.wait_id} ({waiting.reason}): read the "
                       "review card and decide on that one")
    return check_action(waiting, decision)


def check_action(waiting: Waiting, decision: ReviewDecision) -> Refusal | None:
    """The checks that depend on what the wait is for."""
    action = decision.action
    if action == SEND_AGAIN and action not in waiting.allowed:
        return Refusal("no_followup_to_repeat", send_again_refusal("no_followup_to_repeat")
                       + f" (wait {waiting.wait_id}: {waiting.reason}; allowed: "
                       f"{', '.join(sorted(waiting.allowed))})")
    if action not in waiting.allowed:
        return Refusal(f"not_allowed_while_{waiting.kind}",
                       f"refused: {action} is not allowed at wait {waiting.wait_id} "
                       f"({waiting.reason}); allowed: {', '.join(sorted(waiting.allowed))}")
    if decision.draft_sha256 is not None:
        if action != "approve" or not waiting.drafts:
            return Refusal("draft_not_editable", "refused (draft_not_editable): an edited draft "
                           "answers only the approval of a follow-up held for approval")
        if not _SHA256.match(decision.draft_sha256):
            return Refusal("draft_sha256_invalid", "refused (draft_sha256_invalid): "
                           "draft_sha256 is the lower-case hex SHA-256 of the edited text")
        if not decision.send_followup:
            return Refusal("draft_not_sent", "refused (draft_not_sent): an edited draft with "
                           "\"send_followup\": false would never be sent; decline without it")
    if (waiting.required_role and not decision.proof
            and (action in ("retry", SEND_AGAIN)
                 or (action == "approve" and waiting.kind == "followup"))):
        return Refusal("authority_required", authority_refusal(waiting.required_role, action))
    if action == SEND_AGAIN and not (decision.note or "").strip():
        return Refusal("reason_required", send_again_refusal("reason_required") + ", e.g. "
                       f"{json.dumps(body_for(action, waiting))}")
    if action == "resolve" and not decision.evidence:
        return Refusal("evidence_required", "refused: resolve needs evidence (the CRM record "
                       "ID or the provider's message ID you found), e.g. "
                       f"{json.dumps(body_for(action, waiting))}")
    if action == "approve" and waiting.needs_sender and not decision.corrections.get(
            "sender_email"):
        return Refusal("sender_email_required", f"refused: {waiting.reason}: the message "
                       "gives no usable sender address, so approve needs "
                       "corrections.sender_email, e.g. "
                       f"{json.dumps(body_for(action, waiting))}")
    return None


_DESCRIPTIONS = {
    "approve": "Approve what the open wait asks (a follow-up wait: that intent only); the item "
               "continues. Body: {\"reviewer\": \"name\", \"wait_id\": \"w1-review\", \"note\": "
               "\"...\", \"corrections\": {\"sender_email\": \"...\", \"name\": \"...\", "
               "\"company\": \"...\"}, \"send_followup\": false (optional)}; at a follow-up "
               "wait also \"draft_sha256\": the hash of the edited draft the desk or "
               "`inboxcrm review approve --draft-file` stored with the intent (optional)",
    "hold": "Park the item (state held) until another decision; it stays in the review queue "
            "and its escalation time does not move. Body: {\"reviewer\": \"name\", "
            "\"wait_id\": \"...\", \"note\": \"...\"}",
    "reject": "Reject the item: it ends as rejected and nothing more is written or sent. "
              "Body: {\"reviewer\": \"name\", \"wait_id\": \"...\", \"note\": \"...\"}",
    "retry": "Blocked or ambiguous step: run it again with the same operation key and a fresh, "
             "bounded attempt budget. Body: {\"reviewer\": \"name\", \"wait_id\": \"...\", "
             "\"note\": \"...\"}",
    "resolve": "Blocked or ambiguous side effect already exists: mark it complete with "
               "evidence (e.g. the CRM record ID) and continue. Body: {\"reviewer\": \"name\", "
               "\"wait_id\": \"...\", \"evidence\": \"...\", \"note\": \"...\"}",
    "send_again": "Ambiguous follow-up send: send it again deliberately, as a new intent with "
                  "its own idempotency key and this approval (the customer may get two; the "
                  "first intent stays as evidence). Needs the role the tenant's policy names "
                  "(authority.repeat_customer_facing) and a note saying why. Body: "
                  "{\"reviewer\": \"name\", \"wait_id\": \"...\", \"note\": \"why\"}",
}


def signal_description(action: str) -> str:
    return (f"{_DESCRIPTIONS[action]}. As a signal it answers the wait open when it arrives "
            "(wait_id optional); a stale one is recorded in the audit log and dropped.")


def update_description(action: str) -> str:
    return (f"{_DESCRIPTIONS[action]}. wait_id required (see the current details or the "
            "review card). Refused at once with the reason if it does not fit the open wait; "
            "an accepted decision answers with the item's new state.")


# Reasons after which an approval must name the sender (the planner has no identity).
NEEDS_SENDER = frozenset({"missing_sender", "no_identity", "candidates"})
# The timer that ends the workflow task before a wait opens (see `_wait_for_person`).
WAIT_BARRIER = timedelta(milliseconds=1)
