"""What one follow-up says and who it comes from, decided in one place for the send step, the
review card and `inboxcrm template preview` (docs/architecture.md §5).

The words come from the tenant's template at the version the plan stored; the sender from
the tenant's policy (`sender.from`, `sender.reply_to`; the global INBOXCRM_MAIL_FROM when it
sets none). A commercial follow-up always carries the one-click opt-out link (in the body
and as RFC 8058 headers) and the sender's postal address: without the unsubscribe secret no
link can be made, and the follow-up is refused (`FollowupRefused`), never sent without it.
"""

from __future__ import annotations

import email.utils
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from inboxcrm.domain.policy import DraftLimits, DraftPart, TenantPolicy
from inboxcrm.domain.templates import Fields, Template, first_name, render
from inboxcrm.domain.unsubscribe_links import unsubscribe_url
from inboxcrm.platform.config import Settings

# The hold of a send that was unconfirmed when the person became someone who may not be
# written to: `unconfirmed_then_<refusal>` (inboxcrm/activities/send.py). Only a person can
# settle it: the provider's message ID (`resolve`) or no follow-up (`reject`); a retry holds
# again while the refusal stands.
UNCONFIRMED_THEN = "unconfirmed_then_"

# Every follow-up is an automatic answer (RFC 3834): other robots must not answer it.
AUTO_SUBMITTED = "auto-replied"
# The contact a preview's opt-out link names before there is a real one (never sent).
PREVIEW_CONTACT = uuid.UUID(int=0)
# At most this many IDs in the References we write (RFC 5322 §3.6.4 allows trimming; the
# first and the newest are what clients thread on).
MAX_REFERENCES = 10


@dataclass(frozen=True)
class Thread:
    """What our follow-up answers (RFC 5322 §3.6.4): its Message-ID, the inbound message's
    Message-ID (In-Reply-To) and the IDs that message named (References: those, then it)."""

    message_id: str
    answers: str | None = None
    references: tuple[str, ...] = ()

    def headers(self) -> dict[str, str]:
        out = {"Message-ID": self.message_id}
        if self.answers:
            chain = [ref for ref in self.references if ref != self.answers] + [self.answers]
            if len(chain) > MAX_REFERENCES:
                chain = chain[:1] + chain[-(MAX_REFERENCES - 1):]
            out["In-Reply-To"] = self.answers
            out["References"] = " ".join(chain)
        return out


def followup_message_id(intent_id: str, sender: str) -> str:
    """Our follow-up's Message-ID: `<intent_id@sender domain>`, the one the SMTP adapter
    writes, so a retry, a resolve and a reply all name the same message."""
    domain = email.utils.parseaddr(sender)[1].rpartition("@")[2] or "inboxcrm.invalid"
    return f"<{intent_id}@{domain}>"


# The intent statuses a deliberate second send may repeat: a send whose outcome is unknown
# (`sending`: the lease of an unconfirmed attempt) or one that is known to have gone out.
REPEATABLE = frozenset({"sending", "sent"})


@dataclass(frozen=True)
class RepeatFacts:
    """What decides whether a follow-up may be sent again now (`intents.send_again_facts`
    and the planner's blockers)."""

    status: str
    contact_status: str
    suppressed: bool
    marketing_suppressed: bool
    recent: bool
    purpose: str = "service"


def send_again_refusal(facts: RepeatFacts | None) -> str | None:
    """Why a person may not send this follow-up again (a code of
    `contract.send_again_refusal`), or None. The same checks as any follow-up: the send step
    checks suppression and consent once more right before it submits."""
    if facts is None:
        return "no_followup_to_repeat"
    if facts.suppressed or (facts.marketing_suppressed and facts.purpose == "marketing"):
        return "suppressed"
    if facts.contact_status != "active":
        return "contact_inactive"
    if facts.status not in REPEATABLE:
        return "followup_not_sent"
    if facts.recent:
        return "quiet_period"
    return None


# --- edited drafts (docs/architecture.md §6, "Edited drafts") -------------------------------
# How each fixed part is named to a person (a refusal names the limit, never the text).
PART_NAMES: dict[str, str] = {
    "signature": "the signature", "sender_name": "the sender's name",
    "opt_out_url": "the opt-out link", "postal_address": "the postal address",
}


@dataclass(frozen=True)
class DraftTerms:
    """The limits of one intent's edited draft: the length, and the rendered value of each
    part that must stay in it verbatim."""

    max_chars: int
    fixed: tuple[tuple[DraftPart, str], ...]


def normalised_draft(text: str) -> str:
    """The draft as it is hashed, stored and sent: line ends as LF (a browser's textarea
    posts CRLF), nothing else changed."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def draft_sha256(text: str) -> str:
    """The hash the approval binds (over the normalised text, UTF-8)."""
    return hashlib.sha256(normalised_draft(text).encode()).hexdigest()


def draft_terms(policy: TenantPolicy, limits: DraftLimits, *, settings: Settings,
                contact_id: str | uuid.UUID | None) -> DraftTerms:
    """The limits of a draft to this contact: the values its fixed parts render to."""
    sender = policy.sender.from_address or settings.mail_from
    opt_out = unsubscribe_url(settings, policy.tenant, contact_id or PREVIEW_CONTACT) or ""
    values: dict[DraftPart, str] = {
        "signature": policy.sender.signature or "", "sender_name": _display_name(sender),
        "opt_out_url": opt_out, "postal_address": policy.sender.postal_address or ""}
    return DraftTerms(limits.max_chars,
                      tuple((part, values[part]) for part in limits.fixed() if values[part]))


def draft_refusal(text: str, terms: DraftTerms | None) -> str | None:
    """Why this edited draft may not be approved (a code of `DRAFT_REFUSALS`, with the part
    it misses), or None. The same check on every path: the desk and the CLI before the
    draft is stored, the worker as the approval is recorded, the send before it submits."""
    if terms is None:
        return "draft_not_editable"
    draft = normalised_draft(text)
    if not draft.strip():
        return "draft_empty"
    if len(draft) > terms.max_chars:
        return "draft_too_long"
    for part, rendered in terms.fixed:
        if rendered not in draft:
            return f"draft_missing:{part}"
    return None


def draft_refusal_text(code: str, terms: DraftTerms | None) -> str:
    """A refusal in words, naming the limit (never the text)."""
    if code == "draft_too_long" and terms is not None:
        return (f"refused (draft_too_long): the edited follow-up may be at most "
                f"{terms.max_chars} characters (draft.max_chars, from the template's "
                "draft.json or the rule)")
    if code.startswith("draft_missing:"):
        part = code.partition(":")[2]
        return (f"refused ({code}): the edited follow-up must keep "
                f"{PART_NAMES.get(part, part)} exactly as rendered (draft.keep, from the "
                "template's draft.json or the rule)")
    return {
        "draft_not_editable": "refused (draft_not_editable): this follow-up's template "
                              "declares no draft limits, so its words cannot be edited",
        "draft_empty": "refused (draft_empty): the edited follow-up is empty",
        "draft_not_found": "refused (draft_not_found): the approval names a draft that is "
                           "not the one stored for this follow-up (edited again since?); "
                           "read the card and approve the text shown",
        "draft_changed": "refused (draft_changed): the stored draft is not the approved one",
    }.get(code, f"refused ({code})")


class FollowupRefused(Exception):  # noqa: N818 - a decision, not a crash
    """The follow-up must not be sent as things are configured. `reason` is a short code
    for the ledger; the message says what to change (never personal data)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Followup:
    sender: str
    reply_to: str | None
    to: str
    subject: str
    text: str
    html: str | None
    language: str
    template_ref: str
    headers: dict[str, str] = field(default_factory=dict)


# The opt-out link in the CRM's log of a sent follow-up, written by a worker that cannot
# sign one (the link the customer got is in the sent email itself).
LOGGED_LINK_PLACEHOLDER = "https://unsubscribe.invalid/(link as sent)"


def compose(
    policy: TenantPolicy, template: Template, *, to: str, contact_id: str | uuid.UUID | None,
    name: str | None, company: str | None, languages: Sequence[str], settings: Settings,
    thread: Thread | None = None, for_log: bool = False,
) -> Followup:
    """The follow-up to `to` from `policy`'s tenant in the best language the message asks
    for. Deterministic: the same inputs give the same bytes (a retried send repeats the
    identical request under its idempotency key). `contact_id` None (a preview before the
    contact exists): the link is shown for a placeholder contact. `thread`: the threading
    headers of a follow-up that is sent (None: a preview). `for_log`: the words of a
    follow-up already sent, for the CRM's log of it; a worker without the unsubscribe secret
    shows a placeholder for the link instead of refusing (nothing is sent from them)."""
    opt_out = unsubscribe_url(settings, policy.tenant, contact_id or PREVIEW_CONTACT)
    if opt_out is None and for_log:
        opt_out = LOGGED_LINK_PLACEHOLDER
    if opt_out is None:
        raise FollowupRefused(
            "unsubscribe_secret_missing",
            "INBOXCRM_UNSUBSCRIBE_SECRET is not set: a commercial follow-up must carry an "
            "opt-out link, so none is sent (`inboxcrm up` generates one for the local stack)")
    postal = policy.sender.postal_address
    if not postal:
        raise FollowupRefused("postal_address_missing",
                              f"tenant {policy.tenant!r} has no sender.postal_address")
    sender = policy.sender.from_address or settings.mail_from
    language = template.language_for(languages, policy.default_language)
    words = render(template, language, Fields(
        first_name=first_name(name), company=company or "", signature=policy.sender.signature,
        sender_name=_display_name(sender), opt_out_url=opt_out, postal_address=postal))
    return Followup(
        sender=sender, reply_to=policy.sender.reply_to, to=to, subject=words.subject,
        text=words.text, html=words.html, language=language, template_ref=template.ref,
        headers={"Auto-Submitted": AUTO_SUBMITTED, "List-Unsubscribe": f"<{opt_out}>",
                 "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
                 **(thread.headers() if thread is not None else {})})


def _display_name(address: str) -> str:
    return email.utils.parseaddr(address)[0]
