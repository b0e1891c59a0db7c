"""Validation and routing: ordinary, deterministic code. The extractor's record is data to
be checked, never a decision.

Route precedence: ignore > opt_out > review > auto. `canonical_email` is only ever derived
from an address that is present in the From or Reply-To header (never from the body, a
quoted reply or an instruction) and only when nothing casts doubt on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import jsonschema

from inboxcrm.domain.policy import InvalidAddress, TenantPolicy, canonical_email
from inboxcrm.schemas.extraction import ExtractedField, Extraction, load_schema
from inboxcrm.schemas.models import Route

from . import signals
from .authentication import AUTH_REASONS
from .minimise import Mailbox, MinimisedMessage
from .spam import SpamVerdict, spam_verdict

FIELDS = ("sender_email", "contact_name", "company")

# Every reason the router can give (field-specific ones as "<reason>:<field>").
# The message exceeded its work budget (a structural limit while parsing, or the process
# pool's time or memory limit): nothing was decided from its content, a person looks.
TOO_COMPLEX = "too_complex"

IGNORE_REASONS = frozenset({
    "auto_submitted", "auto_reply", "null_return_path", "multipart_report", "mailer_daemon",
    "bounce", "bulk_list", "bulk_precedence", "own_mailbox", "own_domain", "abuse_report",
    "delivery_delay", "upstream_spam", "bulk_signals",
})
REVIEW_REASONS = frozenset({
    "unparseable", "schema_invalid", "extractor_failed", "routing_failed", "missing_sender",
    "invalid_sender", "sender_not_corroborated", "several_identities", "noreply_sender",
    "shared_mailbox", "forwarded_sender_unknown", "forwarded_sender_mismatch",
    "different_contact_address", "prompt_injection", "complaint", "legal_threat",
    "extractor_flagged", "empty_message", "auto_reply_suspected", "possible_opt_out",
    "bulk_precedence", "bulk_suspected", "bounce_suspected", "internal_forward",
    "upstream_spam", TOO_COMPLEX,
    *AUTH_REASONS,
    *(f"{kind}:{name}" for kind in ("evidence_not_found", "low_confidence")
      for name in ("sender_email", "contact_name", "company")),
})
OPT_OUT_REASONS = frozenset({"opt_out_phrase"})
ALL_REASONS = IGNORE_REASONS | REVIEW_REASONS | OPT_OUT_REASONS

# Reasons that mean the sender identity itself is in doubt: no canonical email then.
IDENTITY_DOUBT = frozenset({
    "missing_sender", "invalid_sender", "evidence_not_found:sender_email",
    "low_confidence:sender_email", "sender_not_corroborated", "several_identities",
    "forwarded_sender_mismatch", "forwarded_sender_unknown", "noreply_sender",
    "schema_invalid", "unparseable",
})

_validator: Any = None


def schema_validator() -> Any:
    global _validator
    if _validator is None:
        schema = load_schema()
        cls = jsonschema.validators.validator_for(schema)
        cls.check_schema(schema)
        _validator = cls(schema)
    return _validator


def schema_errors(instance: object) -> list[str]:
    """JSON Schema problems as paths + validator keywords (no instance values)."""
    errors = []
    for error in schema_validator().iter_errors(instance):
        path = "/".join(str(p) for p in error.absolute_path) or "<root>"
        errors.append(f"{path}: {error.validator}")
    return errors


# --------------------------------------------------------------------------- header identity


@dataclass(frozen=True)
class HeaderIdentity:
    """Who the headers say wrote the message."""

    primary: Mailbox | None  # the address a follow-up would go to
    source: Literal["from", "reply-to", "none"]
    form_notification: bool = False  # From is a form service / no-reply, Reply-To the visitor
    candidates: tuple[Mailbox, ...] = ()  # every address the headers offer as the writer


def _canon(address: str, policy: TenantPolicy) -> str | None:
    try:
        return canonical_email(address, policy)
    except InvalidAddress:
        return None


def header_identity(msg: MinimisedMessage) -> HeaderIdentity:
    from_addr = msg.from_addrs[0] if msg.from_addrs else None
    reply = msg.reply_to[0] if msg.reply_to else None
    candidates = tuple(msg.from_addrs) + tuple(msg.reply_to)
    if from_addr is None:
        if reply is not None:
            return HeaderIdentity(reply, "reply-to", False, candidates)
        return HeaderIdentity(None, "none", False, candidates)
    if (
        reply is not None
        and len(msg.reply_to) == 1
        and signals.FORM_LOCAL.match(signals.local_part(from_addr.address))
        and signals.domain_part(reply.address) != signals.domain_part(from_addr.address)
    ):
        return HeaderIdentity(reply, "reply-to", True, candidates)
    return HeaderIdentity(from_addr, "from", False, candidates)


# --------------------------------------------------------------------------- ignore


_LIST_COMPANIONS = ("List-Post", "List-Help", "List-Subscribe", "List-Owner", "List-Archive")
# Headers bulk senders and their ESPs add (RFC 8058 / feedback loops / campaign IDs).
_ESP_HEADERS = ("Feedback-ID", "X-CSA-Complaints", "X-Campaign", "X-Campaign-ID", "X-MC-User",
                "X-Mailchimp-Campaign", "X-SG-EID", "X-Report-Abuse")
_BULK_MAILER = re.compile(
    r"mailchimp|mailjet|sendgrid|sendinblue|brevo|campaign ?monitor|activecampaign|phplist|"
    r"constant ?contact|mailerlite|getresponse|klaviyo|emarsys|acoustic|exacttarget|"
    r"salesforce marketing|marketo|pardot|mass ?mail|bulk ?mail|newsletter",
    re.IGNORECASE,
)
_UNDISCLOSED = re.compile(r"undisclosed|recipients? (?:list )?suppressed|:\s*;", re.IGNORECASE)
MANY_RECIPIENTS = 10


def bulk_signals(msg: MinimisedMessage) -> list[str]:
    """The bulk-mail signals present (each alone is weak; together they are clear)."""
    headers, routing = msg.headers, msg.routing_headers
    found: list[str] = []
    if "List-Unsubscribe" in routing:
        found.append("list_unsubscribe")
    if any(h in routing for h in _LIST_COMPANIONS):
        found.append("list_headers")
    if headers.get("Precedence", "").strip().lower() in ("bulk", "list", "junk"):
        found.append("precedence")
    if any(h in routing for h in _ESP_HEADERS) or _BULK_MAILER.search(
            routing.get("X-Mailer", "")):
        found.append("esp")
    recipients = msg.to + msg.cc
    if len(recipients) > MANY_RECIPIENTS:
        found.append("many_recipients")
    elif not msg.to and (_UNDISCLOSED.search(headers.get("To", "")) or "To" not in headers):
        found.append("undisclosed_recipients")
    if any(signals.NOREPLY_LOCAL.match(signals.local_part(m.address)) for m in msg.from_addrs):
        found.append("noreply_sender")
    return found


def upstream_spam(msg: MinimisedMessage, policy: TenantPolicy) -> SpamVerdict:
    """An upstream filter's verdict in any dialect it writes (`spam.py`): only ever a reason
    to trust the message less, from any source."""
    return spam_verdict(msg.spam_headers, policy.spam_score_threshold)


def internal_forward(msg: MinimisedMessage, policy: TenantPolicy) -> Mailbox | None:
    """A colleague (tenant's own domain, not its mailbox) forwarding one outside sender:
    that sender, proposed for review. Otherwise None."""
    if not msg.forwarded or not msg.from_addrs:
        return None
    if not all(policy.is_own_domain(m.address) for m in msg.from_addrs):
        return None
    outside = [m for m in msg.forwarded_from if not policy.is_own_domain(m.address)]
    if len({m.address.lower() for m in outside}) != 1:
        return None
    return outside[0]


def ignore_reasons(msg: MinimisedMessage, policy: TenantPolicy,
                   source: str = "standard") -> list[str]:
    """Header-only reasons to ignore a message (no model is consulted for these)."""
    reasons: list[str] = []
    headers, routing = msg.headers, msg.routing_headers

    auto_submitted = headers.get("Auto-Submitted")
    if auto_submitted is not None:
        value = auto_submitted.split(";", 1)[0].strip().lower()
        if value and value != "no":
            reasons.append("auto_submitted")
    precedence = headers.get("Precedence", "").strip().lower()
    if (
        any(h in routing and routing[h].strip().lower() not in ("no", "false", "0")
            for h in ("X-Autoreply", "X-Autorespond"))
        or precedence == "auto_reply"
        or signals.auto_reply_subject(msg.subject)
    ):
        reasons.append("auto_reply")

    return_path = routing.get("Return-Path")
    if return_path is not None and re.fullmatch(r"\s*<\s*>\s*", return_path):
        reasons.append("null_return_path")
    if msg.has_report_part or msg.content_type == "multipart/report":
        reasons.append("multipart_report")
    if any(signals.DAEMON_LOCAL.match(signals.local_part(m.address)) for m in msg.from_addrs) or (
        not msg.from_addrs and "mailer-daemon" in headers.get("From", "").lower()
    ):
        reasons.append("mailer_daemon")
    report = msg.report
    if report is not None and not report.suspected:
        if report.kind == "arf":
            reasons.append("abuse_report")
        elif report.kind == "delay":
            reasons.append("delivery_delay")
        elif "mailer_daemon" not in reasons:
            reasons.append("bounce")
    if "X-Failed-Recipients" in routing and not {"mailer_daemon", "bounce"} & set(reasons):
        reasons.append("bounce")
    if policy.spam_action == "ignore" and upstream_spam(msg, policy).spam:
        reasons.append("upstream_spam")

    bulk = bulk_signals(msg)
    if "List-Id" in headers or {"list_unsubscribe", "list_headers"} <= set(bulk) or (
        "list_unsubscribe" in bulk and ({"precedence", "noreply_sender"} & set(bulk))
    ):
        reasons.append("bulk_list")
    elif len(bulk) >= 2:
        reasons.append("bulk_signals")
    if precedence in ("bulk", "list", "junk") and reasons:
        reasons.append("bulk_precedence")

    if any(policy.is_own_mailbox(m.address) for m in msg.from_addrs + msg.sender):
        reasons.append("own_mailbox")
    elif any(policy.is_own_domain(m.address) for m in msg.from_addrs) and not (
        _outside_visitor(msg, policy) or internal_forward(msg, policy) is not None
    ):
        reasons.append("own_domain")
    return reasons


def _outside_visitor(msg: MinimisedMessage, policy: TenantPolicy) -> bool:
    """A web-form notification from the tenant's own site about an outside visitor."""
    identity = header_identity(msg)
    return (identity.form_notification and identity.primary is not None
            and not policy.is_own_domain(identity.primary.address))


# --------------------------------------------------------------------------- validation


def _internal_forward(msg: MinimisedMessage, extraction: Extraction, policy: TenantPolicy,
                      original: Mailbox, auth_reason: str | None) -> Decision:
    """A colleague forwarded an outside sender ("can someone follow up?"): a lead, not a
    loop. A person decides; the forwarded sender is the proposed identity."""
    reasons = ["internal_forward"]
    canonical = _canon(original.address, policy)
    if canonical is None:
        reasons.append("invalid_sender")
    if auth_reason is not None:
        reasons.append(auth_reason)
    names = " | ".join(m.name for m in msg.from_addrs + msg.forwarded_from)
    if signals.looks_like_instruction(msg.header_text(), names, msg.own_text,
                                      msg.forwarded_text, msg.hidden_text):
        reasons.append("prompt_injection")
        canonical = None
    sender = ExtractedField.empty()
    if canonical is not None and evidence_found(original.address, _squash(msg.as_text())):
        sender = ExtractedField(value=original.address, confidence=0.9,
                                evidence=original.address)
    record = extraction.model_copy(update={
        "sender_email": sender,
        "contact_name": ExtractedField(value=original.name, confidence=0.6,
                                       evidence=original.name)
        if original.name and evidence_found(original.name, _squash(msg.as_text()))
        else ExtractedField.empty(),
        "company": ExtractedField.empty(),
        "needs_human_review": True,
    })
    return Decision("review", reasons, canonical, record)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", signals.fold(text))


def evidence_found(evidence: str, squashed_message: str) -> bool:
    needle = _squash(evidence.strip().strip("\"'\u201c\u201d").strip())
    needle = needle.strip(".\u2026")
    return len(needle) >= 2 and needle in squashed_message


@dataclass
class Decision:
    route: Route
    reasons: list[str]
    canonical_email: str | None
    extraction: Extraction


def _add(reasons: list[str], reason: str) -> None:
    if reason not in reasons:
        reasons.append(reason)


def validate_and_route(
    msg: MinimisedMessage, extraction: Extraction, policy: TenantPolicy,
    *, precomputed_ignore: list[str] | None = None, source: str = "standard",
    auth_reason: str | None = None,
) -> Decision:
    """Check an extraction against the message and the tenant policy; choose a route.
    `auth_reason` is the tenant's verdict on the sender's authentication (see
    authentication.blocking_reason): present, it keeps the message from `auto`."""
    ignore = precomputed_ignore if precomputed_ignore is not None else ignore_reasons(
        msg, policy, source)
    if ignore:
        record = extraction.model_copy(update={"needs_human_review": False})
        return Decision("ignore", list(ignore), None, record)

    reasons: list[str] = []
    if msg.too_complex:
        _add(reasons, TOO_COMPLEX)
    if msg.parse_failed:
        _add(reasons, "unparseable")
    forwarded_by_colleague = internal_forward(msg, policy)
    if forwarded_by_colleague is not None:
        return _internal_forward(msg, extraction, policy, forwarded_by_colleague, auth_reason)

    # 1. JSON Schema, in ordinary code, on the plain JSON form.
    if schema_errors(extraction.model_dump(mode="json")):
        extraction = Extraction.empty()
        _add(reasons, "schema_invalid")

    # 2. Evidence and confidence per field; a distrusted field is dropped.
    squashed = _squash(msg.as_text())
    thresholds = policy.thresholds
    fields: dict[str, ExtractedField] = {}
    for name in FIELDS:
        value: ExtractedField = getattr(extraction, name)
        if value.value is not None and not value.value.strip():
            value = ExtractedField.empty()
        if value.value is not None:
            if value.evidence is None or not evidence_found(value.evidence, squashed):
                _add(reasons, f"evidence_not_found:{name}")
                value = ExtractedField.empty()
            elif value.confidence < getattr(thresholds, name):
                _add(reasons, f"low_confidence:{name}")
                value = ExtractedField.empty()
        fields[name] = value

    # 3. The sender: valid, and corroborated by the From / Reply-To headers.
    identity = header_identity(msg)
    sender = fields["sender_email"]
    canonical: str | None = None
    if identity.primary is None:
        _add(reasons, "missing_sender")
    if sender.value is None:
        if not any(r.endswith(":sender_email") for r in reasons):
            _add(reasons, "missing_sender")
    else:
        canonical = _canon(sender.value, policy)
        if canonical is None:
            _add(reasons, "invalid_sender")
            fields["sender_email"] = ExtractedField.empty()
        else:
            header_canon = {_canon(m.address, policy) for m in identity.candidates}
            if canonical not in header_canon:
                _add(reasons, "sender_not_corroborated")
                fields["sender_email"] = ExtractedField.empty()
                canonical = None
    if identity.primary is not None and _canon(identity.primary.address, policy) is None:
        _add(reasons, "invalid_sender")

    # 4. One writer, one identity.
    from_canon = {_canon(m.address, policy) or m.address.lower() for m in msg.from_addrs}
    reply_canon = {_canon(m.address, policy) or m.address.lower() for m in msg.reply_to}
    if len(from_canon) > 1 or msg.from_header_count > 1 or len(reply_canon) > 1:
        _add(reasons, "several_identities")
    if reply_canon and from_canon and reply_canon != from_canon and not identity.form_notification:
        _add(reasons, "several_identities")
    for box in msg.from_addrs + msg.reply_to:
        box_canon = _canon(box.address, policy) or box.address.lower()
        for named in signals.addresses_in_text(box.name):
            if (_canon(named, policy) or named.lower()) != box_canon:
                _add(reasons, "several_identities")
    if canonical is not None and identity.primary is not None:
        primary_canon = _canon(identity.primary.address, policy)
        if canonical != primary_canon and identity.form_notification:
            # the extractor picked the form service's own address, not the visitor
            _add(reasons, "noreply_sender")
    if identity.primary is not None and not identity.form_notification and (
        signals.NOREPLY_LOCAL.match(signals.local_part(identity.primary.address))
    ):
        _add(reasons, "noreply_sender")
    if canonical is not None and signals.local_part(canonical) in signals.ROLE_LOCAL_PARTS:
        _add(reasons, "shared_mailbox")

    # 5. Forwarded mail: the envelope sender is not the original writer.
    if msg.forwarded:
        originals = {_canon(m.address, policy) or m.address.lower() for m in msg.forwarded_from}
        if not originals:
            _add(reasons, "forwarded_sender_unknown")
        elif canonical is None or originals != {canonical}:
            _add(reasons, "forwarded_sender_mismatch")

    # 6. A different contact address in the writer's own text or subject.
    sender_canon = canonical or (
        _canon(identity.primary.address, policy) if identity.primary else None
    )
    for address in signals.addresses_in_text(msg.own_text + "\n" + msg.subject):
        other = _canon(address, policy) or address.lower()
        if other != sender_canon and not policy.is_own_domain(address):
            _add(reasons, "different_contact_address")
            break

    # 7. Text that tries to instruct the system, anywhere a model could read it.
    names = " | ".join(m.name for m in msg.from_addrs + msg.reply_to + msg.sender)
    if signals.looks_like_instruction(
        msg.header_text(), names, msg.own_text, msg.forwarded_text, msg.hidden_text,
        fields["contact_name"].value or "", fields["company"].value or "",
    ):
        _add(reasons, "prompt_injection")

    # 8. Complaints and legal threats go to a person.
    if extraction.intent == "complaint":
        _add(reasons, "complaint")
    if signals.legal_threat(msg.subject + "\n" + msg.own_text):
        _add(reasons, "legal_threat")
    if extraction.needs_human_review:
        _add(reasons, "extractor_flagged")
    # A special category of personal data: the extractor's flag, or the same deterministic
    # phrases whatever the extractor said.
    sensitive = extraction.sensitive_attribute or signals.sensitive_attribute(
        msg.own_text, "" if msg.forwarded else msg.subject)
    if sensitive:
        _add(reasons, "sensitive_attribute")
    if not msg.body.strip():
        _add(reasons, "empty_message")
    if signals.out_of_office_text(msg.own_text):
        _add(reasons, "auto_reply_suspected")

    # 9. Opt-out is decided by deterministic phrases, never by the model alone.
    subject_for_opt_out = "" if msg.forwarded else msg.subject
    opt_out = signals.opt_out_language(msg.own_text, subject_for_opt_out) is not None
    if not opt_out and (
        extraction.possible_opt_out or extraction.intent == "opt_out"
        or signals.soft_opt_out(msg.own_text, subject_for_opt_out)
    ):
        _add(reasons, "possible_opt_out")

    # 10. Weak bulk or bounce signals alone: never dropped silently, never answered.
    bulk = bulk_signals(msg)
    if "precedence" in bulk:
        _add(reasons, "bulk_precedence")
    elif bulk and bulk != ["noreply_sender"]:
        _add(reasons, "bulk_suspected")
    if msg.report is not None and msg.report.suspected:
        _add(reasons, "bounce_suspected")
    # 11. The sender must be vouched for by the trusted boundary (tenant policy).
    if auth_reason is not None:
        _add(reasons, auth_reason)
    # 12. An upstream spam verdict the tenant wants a person to see (`spam_action: review`).
    if policy.spam_action == "review" and upstream_spam(msg, policy).spam:
        _add(reasons, "upstream_spam")

    doubt = any(r in IDENTITY_DOUBT or r.startswith("evidence_not_found:sender")
                for r in reasons)
    if doubt:
        canonical = None

    if opt_out:
        if canonical is not None:
            route: Route = "opt_out"
            reasons.insert(0, "opt_out_phrase")
        else:
            route = "review"
            reasons.insert(0, "opt_out_phrase")
    elif reasons:
        route = "review"
    else:
        route = "auto"
    if TOO_COMPLEX in reasons:  # never acted on; the reason the queue shows
        route = "review"
        reasons.remove(TOO_COMPLEX)
        reasons.insert(0, TOO_COMPLEX)

    record = Extraction(
        sender_email=fields["sender_email"],
        contact_name=fields["contact_name"],
        company=fields["company"],
        intent=extraction.intent,
        possible_opt_out=extraction.possible_opt_out or opt_out,
        needs_human_review=route == "review",
        sensitive_attribute=sensitive,
    )
    return Decision(route, reasons, canonical, record)
