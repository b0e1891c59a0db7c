"""The review card: what a reviewer needs in front of them to decide on one waiting item
(docs/architecture.md §6): the minimised message with the lines that triggered the review
reason marked, the headers that matter, the extracted fields with confidence and evidence,
candidate contacts and why they match, consent and suppression, the proposed follow-up
(rule, recipient, rendered subject and body), the operations with their attempts and the
destination's error, and the decisions allowed now with the exact body each needs.

Candidates and the proposed follow-up come from the planner itself (`planning.plan`) on the
store's current rows (read-only queries; nothing is written), so they exist before anyone
approves, and the card cannot promise what the planner would hold. The relay
(`GET /review/{workflow_id}`) and the CLI (`inboxcrm review show`) render the same card.
It never reads workflow history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from inboxcrm.domain import drafts, planning
from inboxcrm.domain.extraction import view_message
from inboxcrm.domain.extraction.authentication import Authentication
from inboxcrm.domain.extraction.minimise import MinimisedMessage
from inboxcrm.domain.extraction.signals import (
    addresses_in_text,
    legal_threat,
    looks_like_instruction,
    opt_out_language,
    soft_opt_out,
)
from inboxcrm.domain.followup import PART_NAMES, UNCONFIRMED_THEN, FollowupRefused, compose
from inboxcrm.domain.policy import (
    PolicyError,
    TenantPolicy,
    UnknownTenant,
    get_policy,
)
from inboxcrm.domain.templates import Template, TemplateRefused, from_sources, reply_languages
from inboxcrm.platform import atrest
from inboxcrm.platform.config import get_settings
from inboxcrm.platform.workpool import IN_PROCESS, BudgetExceeded, Runner, WorkFailed
from inboxcrm.schemas.contract import decision_body
from inboxcrm.store import consent as consent_store
from inboxcrm.store import intents, review
from inboxcrm.store import templates as template_store

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn

MAX_LINES = 80
MAX_LINE_CHARS = 400
MAX_HEADER_CHARS = 300
FIELDS = ("sender_email", "contact_name", "company")


@dataclass
class Line:
    """One line of the minimised message and the review reasons it triggered (if any)."""

    text: str
    marks: list[str] = field(default_factory=list)


@dataclass
class FieldView:
    name: str
    value: str | None
    confidence: float
    evidence: str | None


@dataclass
class Candidate:
    contact: str              # short reference of the integration contact
    email: str
    name: str | None
    company: str | None
    why: str


@dataclass
class Followup:
    rule: str                 # rule_id vN
    template_id: str
    recipient: str | None
    subject: str
    body: str
    status: str               # what happens to it now, in words
    # Held for approval under a rule that declares draft limits (docs/architecture.md §6,
    # "Edited drafts"): the reviewer may edit `body` within them. `draft`: the stored edited
    # text (None: none proposed), which the approval then binds by its hash.
    editable: bool = False
    max_chars: int | None = None
    keep: list[str] = field(default_factory=list)
    draft: str | None = None
    draft_sha256: str | None = None
    intent_id: str | None = None


@dataclass
class OperationLine:
    action: str
    status: str
    attempts: str             # n/max
    error: str | None


@dataclass
class AmbiguousView:
    """What a person checks before deciding on an ambiguous side effect (docs/architecture.md
    §6, "Authority"): the operation key, the intent ID (the provider's idempotency key), the
    first attempt, where to look at the destination, and who may retry."""

    op_key: str
    intent_id: str | None
    first_attempt_at: str | None
    key_window_from: str | None
    lookup: str
    warning: str
    retry_role: str | None = None


# A retry of a send is a repeat with the same key: inside the provider's window it sends
# nothing new; past it (the reason the item is held) the provider may send a second email.
SEND_TWICE_WARNING = ("a retry repeats the send with the same idempotency key; the provider "
                      "keeps a key for {window} from the first attempt that may have taken "
                      "effect, so past that window a retry can send the customer a second "
                      "email: check the lookup path first, and `resolve` with the provider's "
                      "message ID if it was sent")


@dataclass
class DecisionOption:
    action: str
    body: dict[str, object]


@dataclass
class ReviewCard:
    workflow_id: str
    tenant: str
    source: str
    mailbox: str
    state: str
    reason: str | None
    reasons: list[str]
    waiting: bool
    wait_id: str | None = None
    wait_reason: str | None = None
    owner: str | None = None
    escalate_at: str | None = None
    overdue: bool = False
    headers: list[tuple[str, str]] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    truncated: bool = False
    intent: str | None = None
    fields: list[FieldView] = field(default_factory=list)
    candidates: list[Candidate] = field(default_factory=list)
    consent: list[str] = field(default_factory=list)
    followup: Followup | None = None
    operations: list[OperationLine] = field(default_factory=list)
    decisions: list[DecisionOption] = field(default_factory=list)
    ambiguous: AmbiguousView | None = None


def _marks(line: str, reasons: set[str], evidence: dict[str, str]) -> list[str]:
    """Which review reasons (or field evidence) this line of the message triggers."""
    marks = []
    if "prompt_injection" in reasons and looks_like_instruction(line):
        marks.append("prompt_injection")
    if "legal_threat" in reasons and legal_threat(line):
        marks.append("legal_threat")
    if reasons & {"possible_opt_out", "opt_out_phrase"} and (
            opt_out_language(line, "") or soft_opt_out(line, "")):
        marks.append("opt_out")
    if reasons & {"different_contact_address", "several_identities"} and addresses_in_text(line):
        marks.append("address")
    marks += [f"evidence:{name}" for name, text in evidence.items() if text and text in line]
    return marks


def _verdict(auth: Authentication | None, policy: TenantPolicy | None) -> str:
    """The same verdict the extractor reached, under the tenant's trust settings: which
    boundary vouched for the sender, or why none did."""
    if auth is None or policy is None:
        return "unknown (tenant policy missing)"
    by = f" by {auth.authority}" if auth.authority else ""
    how = f" ({auth.method})" if auth.method else ""
    why = f": {auth.reason}" if auth.reason else ""
    setting = f"; tenant setting sender_authentication={policy.sender_authentication}"
    return f"{auth.verdict}{how}{by}{why}{setting}"


def _auth_results(message: MinimisedMessage) -> list[str]:
    """`Authentication-Results` as received (bounded); evaluating them is the tenant
    policy's job, the card only shows them."""
    return [value[:MAX_HEADER_CHARS] for name, value in message.auth_headers
            if name == "Authentication-Results"]


def _short(contact_id: Any) -> str:
    return str(contact_id)[:8]


async def build_card(conn: Conn, workflow_id: str,
                     runner: Runner = IN_PROCESS) -> ReviewCard | None:
    """The card of one item (None if the store has no such item), read on one connection:
    for the CLI, which has nothing else waiting for it."""
    facts = await card_facts(conn, workflow_id)
    if facts is None:
        return None
    await read_message(facts, runner)
    return facts.card


@dataclass
class CardFacts:
    """A card with everything the store says, before the stored message is read: the relay
    checks `card.tenant` against who asks, and gives back its connection, before it spends a
    work child's time on the message (`read_message`)."""

    card: ReviewCard
    raw: bytes | None
    # its evidence quotes opened (inboxcrm/platform/atrest.py)
    extraction: dict[str, Any]


async def card_facts(conn: Conn, workflow_id: str) -> CardFacts | None:
    """Every store read of the card (the item, the planner's dry run, the operations, the
    allowed decisions), with no work on the message."""
    row = await review.review_item(conn, workflow_id)
    if row is None:
        return None
    reasons = [str(r) for r in (row["route_reasons"] or [])]
    waiting = row["wait_id"] is not None or row["task_status"] == "open"
    now = datetime.now(UTC)
    card = ReviewCard(
        workflow_id=workflow_id, tenant=row["tenant"], source=row["source"],
        mailbox=row["mailbox"], state=row["state"], reason=row["reason"], reasons=reasons,
        waiting=waiting, wait_id=row["wait_id"], wait_reason=row["wait_reason"],
        owner=row["owner"],
        escalate_at=row["escalate_at"].astimezone(UTC).isoformat() if row["escalate_at"]
        else None,
        overdue=bool(row["escalate_at"] and row["escalate_at"] <= now))
    # the evidence quotes opened once (sealed at rest, bound to the item's event)
    event_id = str(row["event_id"])
    extraction: dict[str, Any] = atrest.open_evidence(row["extraction"] or {},
                                                      tenant=card.tenant, event_id=event_id)
    _fields(card, extraction)
    await _dry_run(conn, card, row, extraction)
    crm, existing = await review.crm_candidates(conn, workflow_id=workflow_id)
    cause, old = await review.crm_candidates_cause(conn, workflow_id=workflow_id)
    for record_id in existing:
        card.candidates.append(Candidate(
            f"{crm}:{record_id}", row["canonical_email"] or "", None, None,
            f"the {crm} record {old} this contact had was merged into this one, which carries "
            "another contact's ID of ours: not followed, nothing written; split the records "
            "in the CRM, then retry (approve), or reject"
            if cause == "crm_merged_into_other_contact" else
            f"an existing {crm} record with this email (created outside inboxcrm): several "
            "match, so none is adopted and none created; merge them in the CRM, then retry "
            "(approve), or reject"))
    for op in await review.item_operations(conn, workflow_id):
        card.operations.append(OperationLine(
            op["action"], op["status"], f"{op['attempts']}/{op['max_attempts']}",
            f"{op['last_error_category']}: {op['last_error']}" if op["last_error"] else None))
        if op["status"] == "ambiguous" and card.ambiguous is None:
            card.ambiguous = await _ambiguous(conn, workflow_id, op, card.tenant)
    if waiting and row["wait_id"]:
        card.decisions = [DecisionOption(a, decision_body(a, row["wait_id"], row["needs_sender"]))
                          for a in sorted(row["allowed"] or [])]
    raw = atrest.open_optional(row["raw"], tenant=str(row["tenant"]), column=atrest.RAW,
                               row=event_id)
    return CardFacts(card, raw, extraction)


async def _ambiguous(conn: Conn, workflow_id: str, op: Any, tenant: str) -> AmbiguousView:
    """The ambiguous operation's facts, the adapter's lookup path and the retry warning."""
    found = await review.operation_lookup(conn, workflow_id=workflow_id, op_key=op["op_key"])
    lookup = found["lookup"] if found is not None else None
    try:
        role = get_policy(tenant).authority.repeat_customer_facing
    except (PolicyError, UnknownTenant):
        role = None
    send = op["action"] == "send"
    return AmbiguousView(
        op_key=op["op_key"], intent_id=op["external_ref"],
        first_attempt_at=_iso(op["first_attempt_at"]),
        key_window_from=_iso(op["key_window_from"]),
        lookup=lookup or ("not recorded: look the intent ID up at the destination by hand"
                          if send else f"the destination's record with our ID "
                          f"{op['external_ref'] or '(none)'}"),
        warning=_warning(send, found["window"] if found is not None else None,
                         str(op["last_error"] or "")),
        retry_role=role if send else None)


REFUSED_REPEAT_WARNING = ("since the unconfirmed attempt the contact may no longer be written "
                          "to ({refusal}): a retry is held again and sends nothing while that "
                          "stands. Check the lookup path: if the provider has the email, "
                          "`resolve` with its message ID; if not, `reject` (nothing more is "
                          "sent)")


def _warning(send: bool, window: float | None, last_error: str = "") -> str:
    if send and last_error.startswith(UNCONFIRMED_THEN):
        return REFUSED_REPEAT_WARNING.format(refusal=last_error.removeprefix(UNCONFIRMED_THEN))
    if not send:
        return "a retry repeats the write with the same key; check the destination first"
    if window is None:
        return ("the provider keeps no idempotency key (SMTP): a retry sends again unless the "
                "email was not sent; check the lookup path first")
    return SEND_TWICE_WARNING.format(window=f"{window / 3600:g} h")


def _iso(moment: Any) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment is not None else None


async def read_message(facts: CardFacts, runner: Runner = IN_PROCESS) -> None:
    """The stored message onto the card, read through `runner`: the relay's `WorkPool`, so a
    message that is expensive to read costs a child process its time limit, never the
    relay's event loop. Holds no database connection."""
    await _message(facts.card, facts.raw, facts.card.reasons, facts.extraction, runner)


async def _message(card: ReviewCard, raw: bytes | None, reasons: list[str],
                   extraction: dict[str, Any], runner: Runner) -> None:
    if raw is None:
        card.headers.append(("Message", "purged (past retention)"))
        return
    try:
        policy: TenantPolicy | None = get_policy(card.tenant)
    except UnknownTenant:
        policy = None
    try:
        message, auth = await runner.for_tenant(card.tenant).run(view_message, bytes(raw),
                                                                  policy, card.source)
    except (BudgetExceeded, WorkFailed):
        card.headers.append(("Message", "not shown: reading it exceeded the work budget "
                                        "(too_complex)"))
        card.truncated = True
        return
    for name in ("From", "Reply-To", "Sender", "Subject"):
        if name in message.headers:
            card.headers.append((name, message.headers[name][:MAX_HEADER_CHARS]))
    card.headers.append(("Sender authentication", _verdict(auth, policy)))
    for verdict in _auth_results(message):
        card.headers.append(("Authentication-Results", verdict))
    if message.too_complex:
        card.headers.append(("Message", f"only the header fields were read: over the "
                                        f"{message.too_complex} limit (too_complex)"))
    if message.limits_hit:
        card.headers.append(("Limits applied", ", ".join(message.limits_hit)))
    evidence = {name: (extraction.get(name) or {}).get("evidence") or "" for name in FIELDS}
    lines = message.body.split("\n")
    card.truncated = message.truncated or len(lines) > MAX_LINES
    for text in lines[:MAX_LINES]:
        clipped = text[:MAX_LINE_CHARS]
        card.lines.append(Line(clipped, _marks(clipped, set(reasons), evidence)))


def _fields(card: ReviewCard, extraction: dict[str, Any]) -> None:
    card.intent = extraction.get("intent")
    for name in FIELDS:
        value = extraction.get(name) or {}
        card.fields.append(FieldView(name, value.get("value"), float(value.get("confidence") or 0),
                                     value.get("evidence")))


async def _dry_run(conn: Conn, card: ReviewCard, row: Any, extraction: dict[str, Any]) -> None:
    """What the planner would decide once the item is approved: `planning.plan` on facts read
    with read-only queries (docs/architecture.md §5)."""
    tenant, identity = row["tenant"], row["canonical_email"]
    try:
        policy = get_policy(tenant)
    except UnknownTenant:
        card.consent.append("tenant policy missing: nothing can be planned")
        return
    contact = await review.contact_by_identity(conn, tenant, identity) if identity else None
    name = planning.value(extraction, "contact_name")
    others = list(await review.contacts_by_name(conn, tenant, name, identity)) if name else []
    facts = await _facts(conn, row, extraction, policy, contact, others)
    decided = planning.plan(facts)
    if contact is not None:
        card.candidates.append(Candidate(
            _short(contact["contact_id"]), contact["email"], contact["name"], contact["company"],
            "same address (exact canonical email): this contact is updated, not duplicated"
            + contact_update(decided)))
    for other in others:
        card.candidates.append(Candidate(
            _short(other["contact_id"]), other["email"], other["name"], other["company"],
            "same name, different address: a candidate only, never merged automatically"))
    if identity is None:
        card.consent.append("no trusted sender address: approve with corrections.sender_email "
                            "to give one")
    else:
        suppressed = await review.suppression(conn, tenant, identity)
        card.consent.append(suppression_line(suppressed) if suppressed else "not suppressed")
        if contact is not None and contact["status"] != "active":
            card.consent.append(f"contact status {contact['status']}: no follow-up is sent")
        for write in await consent_store.writes_of_identity(conn, tenant=tenant,
                                                            canonical_email=identity):
            card.consent.append(crm_write_line(write))
    if row["route"] == "opt_out":
        scope = policy.suppression_scope("opt_out_request")
        card.consent.append(f"opt-out request: approving records the suppression (scope "
                            f"{scope})")
    rule = decided.followup.rule if decided.followup is not None else None
    if rule is not None:
        card.consent.append(consent_record_line(rule.rule_id, rule.purpose, rule.lawful_basis))
    await _followup(conn, card, row, extraction, policy, contact, decided)


async def _facts(conn: Conn, row: Any, extraction: dict[str, Any], policy: TenantPolicy,
                 contact: Any, others: list[Any]) -> planning.Facts:
    """The planner's facts as the store has them now, the item approved (the card is what a
    reviewer decides on). Asked with the planner's statements where the planner asks them:
    `intents.followup_blockers`, and the ramp's hour (read, not locked)."""
    identity = row["canonical_email"]
    existing = _existing(contact) if contact is not None else None
    # A reply in a thread we know is not acknowledged (`intents.thread_of_event`).
    thread = await intents.thread_of_event(conn, event_id=row["event_id"])
    facts = planning.Facts(policy=policy, route=str(row["route"]), identity=identity,
                           extraction=extraction, approved=True,
                           name_candidates=tuple(str(o["contact_id"]) for o in others),
                           contact=existing,
                           thread=str(thread["event_id"]) if thread is not None else None)
    asked = planning.questions(policy, extraction, None)
    if identity is None or asked.rule is None:
        return facts
    blockers = None
    if existing is None or existing.status == "active":
        blockers = planning.FollowupFacts(*await intents.followup_blockers(
            conn, tenant=row["tenant"], canonical_email=identity,
            contact_id=contact["contact_id"] if contact is not None else None,
            event_id=row["event_id"], quiet_period_hours=asked.rule.quiet_period_hours))
    ramp = None
    if policy.ramp is not None:
        live_for, granted = await review.ramp_now(conn, tenant=row["tenant"])
        cap = planning.ramp_cap(policy, live_for)
        ramp = planning.RampFacts(cap, granted) if cap is not None else None
    return replace(facts, followup=blockers, ramp=ramp)


async def _followup(conn: Conn, card: ReviewCard, row: Any, extraction: dict[str, Any],
                    policy: TenantPolicy, contact: Any, decided: planning.Plan) -> None:
    planned = await review.event_intent(conn, row["event_id"])
    languages = reply_languages(row["languages"],
                                atrest.open_head(row["raw"], tenant=str(row["tenant"]),
                                                 event_id=str(row["event_id"])))
    if planned is not None:
        ref = str(planned["template_id"])
        words, refused = await _words(
            conn, policy, ref, planned["rule_id"], to=planned["email"],
            contact_id=planned["contact_id"], name=planned["name"],
            company=planned["company"], languages=languages)
        status = {"awaiting_approval": "planned; waits for a reviewer's approval of this intent",
                  "queued": "planned; sent when the item continues",
                  "sent": "sent", "cancelled": "cancelled"}.get(planned["status"],
                                                                planned["status"])
        if refused and planned["status"] not in ("sent", "cancelled"):
            status = f"blocked when sent: {refused}"
        card.followup = Followup(f"{planned['rule_id']} v{planned['rule_version']}", ref,
                                 planned["email"], words[0], words[1], status)
        terms = drafts.terms_of(policy.tenant, planned["rule_id"], planned["contact_id"],
                                get_settings())
        if planned["status"] == "awaiting_approval" and terms is not None and not refused:
            card.followup.editable, card.followup.max_chars = True, terms.max_chars
            card.followup.intent_id = str(planned["intent_id"])
            card.followup.keep = [PART_NAMES[part] for part, _ in terms.fixed]
        if planned["draft_text"] is not None:  # sealed at rest
            card.followup.draft = intents.opened_draft(planned, tenant=policy.tenant)
            card.followup.draft_sha256 = planned["draft_sha256"]
        return
    rule = planning.questions(policy, extraction, None).rule
    if rule is None:
        return
    recipient = planning.value(extraction, "sender_email") or row["canonical_email"]
    (subject, body), refused = await _words(
        conn, policy, rule.template_id, rule.rule_id, to=recipient or "",
        contact_id=contact["contact_id"] if contact is not None else None,
        name=planning.value(extraction, "contact_name"),
        company=planning.value(extraction, "company"), languages=languages)
    if refused:
        status = f"not sent: {refused}"
    elif row["canonical_email"] is None:
        status = "no recipient yet (needs corrections.sender_email)"
    else:
        status = proposed_status(decided, contact)
    template_ref = (policy.template_for(rule).ref if rule.template_id in policy.templates
                    else rule.template_id)
    card.followup = Followup(f"{rule.rule_id} v{policy.rule_version(rule)}"
                             if rule.template_id in policy.templates else rule.rule_id,
                             template_ref, recipient, subject, body, status)


async def _words(conn: Conn, policy: TenantPolicy, ref: str, rule_id: str, *, to: str,
                 contact_id: Any, name: str | None, company: str | None,
                 languages: list[str]) -> tuple[tuple[str, str], str | None]:
    """(subject, body) as the send would render them, or ("", "") and why it would not."""
    try:
        template: Template
        if "@" in ref:
            sources = await template_store.stored_version(conn, policy.tenant, ref)
            if sources is None:
                raise TemplateRefused(f"template version {ref} is not stored")
            template = from_sources(sources)
        else:
            rule = policy.rule_by_id(rule_id)
            if rule is None:
                raise TemplateRefused(f"rule {rule_id!r} is no longer in the policy")
            template = policy.template_for(rule)
        followup = compose(policy, template, to=to, contact_id=contact_id, name=name,
                           company=company, languages=languages, settings=get_settings())
    except FollowupRefused as refused:
        return ("", ""), refused.reason
    except (TemplateRefused, PolicyError):
        return ("", ""), "template_unusable"
    return (followup.subject, followup.text), None


def suppression_line(suppressed: Any) -> str:
    """A suppression and what its scope stops (docs/consent.md)."""
    if suppressed["scope"] == "marketing":
        return (f"suppressed ({suppressed['reason']}, scope marketing): no marketing "
                "follow-up is sent; service replies still go")
    return f"suppressed ({suppressed['reason']}, scope all): no follow-up is sent"


def crm_write_line(write: Any) -> str:
    """The write-back of inboxcrm's own opt-out to the CRM's field, and where it stands."""
    where = write["crm_field"] or "the CRM's opt-out field"
    text = f"opt-out written back to {where}: {write['status']} (attempt {write['attempts']})"
    if write["last_error"] and write["status"] != "completed":
        text += f", last error {write['last_error']}"
    return text


def consent_record_line(rule_id: str, purpose: str, lawful_basis: str) -> str:
    """The consent record the proposed send would carry; the CRM's own opt-out is read right
    before the send, never here."""
    return (f"consent record: lawful basis {lawful_basis} ({purpose} reply, rule {rule_id}); "
            "the CRM record's opt-out field is checked right before sending")


def proposed_status(decided: planning.Plan, contact: Any) -> str:
    """What the card promises about a follow-up not planned yet: the planner's own decision
    (`planning.plan`), in words. `contact`: the stored contact with this address (None:
    planning creates it)."""
    decision = decided.followup
    if decision is None:
        # Not reached: an opt-out (approving records the suppression instead).
        return "not sent: an opt-out request"
    if decision.outcome == "suppressed":
        if contact is not None and contact["status"] != "active":
            return f"not sent: contact {contact['status']}"
        return "not sent: suppressed"
    if decision.outcome == "thread_reply":
        return "not sent: a reply in a conversation we know (thread_reply)"
    if decision.outcome == "quiet_period":
        assert decision.rule is not None
        return f"not sent: quiet period ({decision.rule.quiet_period_hours:g} h)"
    if decision.approval_reason == planning.RAMP_LIMIT:
        return ("proposed; the ramp's automatic follow-ups for this hour are used up "
                "(ramp_limit): its send needs a second approval of this intent")
    if decision.outcome == "awaiting_approval":
        return "proposed; a new prospect: its send needs a second approval of this intent"
    return "proposed; sent after approval"


def contact_update(decided: planning.Plan) -> str:
    """What planning does to the existing contact, in words (empty: nothing): a conflicting
    field holds the item for a reviewer; approving writes the fields the policy updates."""
    words = ""
    if decided.conflict:
        words += (f"; {decided.conflict} differs from the stored one "
                  f"(field_conflict:{decided.conflict})")
    if decided.fill:
        words += (f"; {'approving ' if decided.conflict else ''}updates its "
                  f"{' and '.join(decided.fill)}")
    return words


def _existing(contact: Any) -> planning.ExistingContact:
    return planning.ExistingContact(contact["name"], contact["company"], contact["status"],
                                    contact["crm_record_id"] is not None)


def age_text(seconds: int) -> str:
    """How long an item has waited, as the queue shows it (CLI and desk alike)."""
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def render_text(card: ReviewCard) -> list[str]:
    """The card as plain lines (the CLI adds colour). Marked message lines start with `>>`."""
    out = [f"review card: {card.workflow_id}",
           f"tenant {card.tenant} · source {card.source} · mailbox {card.mailbox}",
           f"state {card.state}" + (f" ({card.reason})" if card.reason else "")]
    if card.waiting:
        out.append(f"open wait {card.wait_id or '?'}: {card.wait_reason} · owner {card.owner} "
                   f"· escalates at {card.escalate_at}" + (" (OVERDUE)" if card.overdue else ""))
    else:
        out.append("no open wait: nothing to decide")
    out += ["", f"reasons: {', '.join(card.reasons) or 'none'}", "", "== message (minimised) =="]
    out += [f"{name}: {value}" for name, value in card.headers]
    out.append("")
    for line in card.lines:
        out.append(f">> {line.text}    [{', '.join(line.marks)}]" if line.marks
                   else f"   {line.text}")
    if card.truncated:
        out.append("   … (truncated)")
    out += ["", f"== extracted fields (intent {card.intent}) =="]
    out += [f"{f.name}: {f.value!r} confidence {f.confidence:.2f} evidence {f.evidence!r}"
            for f in card.fields]
    out += ["", "== candidate contacts =="]
    out += [f"{c.contact} {c.email} {c.name or ''} {c.company or ''} — {c.why}"
            for c in card.candidates] or ["none (a new contact would be created)"]
    out += ["", "== consent and suppression =="] + card.consent
    out += ["", "== proposed follow-up =="]
    if card.followup is None:
        out.append("none (no rule for this intent)")
    else:
        f = card.followup
        out += [f"rule {f.rule} · template {f.template_id} · to {f.recipient or '(unknown)'}",
                f"status: {f.status}", f"subject: {f.subject}", *f.body.rstrip().split("\n")]
        if f.editable:
            out.append(f"editable before approval: at most {f.max_chars} characters, keeping "
                       f"{', '.join(f.keep)} (`inboxcrm review approve WF --draft-file FILE`)")
        if f.draft is not None:
            out += [f"-- edited draft (sha256 {f.draft_sha256}) --",
                    *f.draft.rstrip().split("\n")]
    if card.operations:
        out += ["", "== operations =="]
        out += [f"{o.action}: {o.status}, attempts {o.attempts}"
                + (f", error {o.error}" if o.error else "") for o in card.operations]
    if card.ambiguous is not None:
        a = card.ambiguous
        out += ["", "== ambiguous: check the destination before deciding ==",
                f"operation key: {a.op_key}", f"intent ID (idempotency key): {a.intent_id}",
                f"first attempt: {a.first_attempt_at}",
                f"key window from: {a.key_window_from}", f"lookup: {a.lookup}",
                f"WARNING: {a.warning}"]
        if a.retry_role:
            out.append(f"retry and send-again need the reviewer role {a.retry_role!r} "
                       "(tenant policy)")
    out += ["", "== decisions allowed now =="]
    out += [f"{d.action}: {json.dumps(d.body)}" for d in card.decisions] or ["none"]
    return out
