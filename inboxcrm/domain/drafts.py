"""Edited drafts (docs/architecture.md §6, "Edited drafts"): a reviewer's text for a follow-up
held for approval, checked against the limits its template (and rule) declare, the same way
on every path (the desk and the CLI before the draft is stored, the worker as the approval is
recorded, the send before it submits). Never logged: a refusal names the limit, not the
text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from inboxcrm.domain.followup import (
    DraftTerms,
    draft_refusal,
    draft_refusal_text,
    draft_sha256,
    draft_terms,
    normalised_draft,
)
from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy
from inboxcrm.platform.config import Settings
from inboxcrm.store import intents

if TYPE_CHECKING:
    from inboxcrm.store.db import Conn


@dataclass(frozen=True)
class DraftCheck:
    """A draft's check: `refused` a code (None: within the limits), `message` the words a
    person reads, `sha256` the hash an approval of it binds."""

    refused: str | None
    message: str
    sha256: str = ""
    terms: DraftTerms | None = None


def terms_of(tenant: str, rule_id: str, contact_id: object, settings: Settings
             ) -> DraftTerms | None:
    """The draft limits of a follow-up under `rule_id` (None: neither its template nor its
    rule declares any, or the rule is no longer in the policy)."""
    try:
        policy = get_policy(tenant)
    except (UnknownTenant, PolicyError):
        return None
    rule = policy.rule_by_id(rule_id)
    limits = None if rule is None else policy.draft_limits(rule)
    if limits is None:
        return None
    return draft_terms(policy, limits, settings=settings,
                       contact_id=str(contact_id) if contact_id is not None else None)


def check(text: str, terms: DraftTerms | None) -> DraftCheck:
    code = draft_refusal(text, terms)
    return DraftCheck(code, draft_refusal_text(code, terms) if code else "ok",
                      draft_sha256(text), terms)


async def propose(conn: Conn, *, intent_id: str, text: str, proposed_by: str,
                  settings: Settings) -> DraftCheck:
    """Check a reviewer's text for intent `intent_id` and store it with its hash (replacing
    an earlier proposal). Refused: nothing is stored."""
    row = await intents.draft_facts(conn, intent_id=intent_id)
    if row is None or row["status"] != "awaiting_approval":
        return DraftCheck("draft_not_awaiting",
                          "refused (draft_not_awaiting): this follow-up is not waiting for "
                          "approval, so there is no draft to edit")
    checked = check(text, terms_of(row["tenant"], row["rule_id"], row["contact_id"], settings))
    if checked.refused is not None:
        return checked
    if not await intents.save_draft(conn, intent_id=intent_id, tenant=str(row["tenant"]),
                                    draft_text=normalised_draft(text),
                                    draft_sha256=checked.sha256, proposed_by=proposed_by):
        return DraftCheck("draft_not_awaiting", "refused (draft_not_awaiting): this follow-up "
                          "is no longer waiting for approval")
    return checked


async def approval_refusal(conn: Conn, *, intent_id: str, sha256: str,
                           settings: Settings) -> DraftCheck | None:
    """Why an approval binding draft `sha256` of intent `intent_id` is refused, or None: the
    stored draft must be that text and still within the limits."""
    row = await intents.draft_facts(conn, intent_id=intent_id)
    if row is None or row["draft_sha256"] != sha256 or row["draft_text"] is None:
        return DraftCheck("draft_not_found", draft_refusal_text("draft_not_found", None))
    text = intents.opened_draft(row, tenant=str(row["tenant"]))
    if text is None or draft_sha256(text) != sha256:
        return DraftCheck("draft_not_found", draft_refusal_text("draft_not_found", None))
    checked = check(text, terms_of(row["tenant"], row["rule_id"], row["contact_id"], settings))
    return checked if checked.refused is not None else None
