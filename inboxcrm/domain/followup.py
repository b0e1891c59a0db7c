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
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from inboxcrm.domain.policy import TenantPolicy
from inboxcrm.domain.templates import Fields, Template, first_name, render
from inboxcrm.domain.unsubscribe_links import unsubscribe_url
from inboxcrm.platform.config import Settings

# Every follow-up is an automatic answer (RFC 3834): other robots must not answer it.
AUTO_SUBMITTED = "auto-replied"
# The contact a preview's opt-out link names before there is a real one (never sent).
PREVIEW_CONTACT = uuid.UUID(int=0)


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


def compose(
    policy: TenantPolicy, template: Template, *, to: str, contact_id: str | uuid.UUID | None,
    name: str | None, company: str | None, languages: Sequence[str], settings: Settings,
) -> Followup:
    """The follow-up to `to` from `policy`'s tenant in the best language the message asks
    for. Deterministic: the same inputs give the same bytes (a retried send repeats the
    identical request under its idempotency key). `contact_id` None (a preview before the
    contact exists): the link is shown for a placeholder contact."""
    opt_out = unsubscribe_url(settings, policy.tenant, contact_id or PREVIEW_CONTACT)
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
                 "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"})


def _display_name(address: str) -> str:
    return email.utils.parseaddr(address)[0]
