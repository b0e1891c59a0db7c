"""The audit trail as a readable timeline: one sentence per step, so an operator can answer
"why did this person get two replies?" or "why none?" without reading JSON."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inboxcrm.domain.shadow import describe as describe_shadow_plan

Detail = dict[str, Any]


def _short(value: Any, n: int = 8) -> str:
    text = str(value or "")
    return text[:n] + "…" if len(text) > n + 1 else text


def _received(d: Detail) -> str:
    return (f"received via {d.get('source')} (delivery {d.get('delivery_id')}, "
            f"{d.get('size_bytes')} bytes, sha256 {_short(d.get('content_sha256'), 12)})")


def _extracted(d: Detail) -> str:
    conf = d.get("confidence") or {}
    reasons = ", ".join(d.get("reasons") or []) or "none"
    return (f"extracted by {d.get('extractor_version')}: route {d.get('route')} "
            f"(reasons: {reasons}), intent {d.get('intent')}, confidence sender "
            f"{conf.get('sender_email')} / name {conf.get('contact_name')} / company "
            f"{conf.get('company')}")


def _state(d: Detail) -> str:
    text = f"state → {d.get('state')}"
    if d.get("reason"):
        text += f" ({d['reason']})"
    if d.get("review_reason"):
        text += f"; waits for {d.get('owner')}"
    return text


def _attempt_failed(d: Detail) -> str:
    retry = f", provider asked to wait {d['retry_after']}s" if d.get("retry_after") else ""
    return (f"{_action_of(d)} attempt {d.get('attempt')} failed: {d.get('category')} "
            f"{d.get('reason')}{retry}")


def _action_of(d: Detail) -> str:
    return str(d.get("op_key", "")).rsplit(":", 1)[-1] or "operation"


def _suppressed(d: Detail) -> str:
    text = (f"opt-out recorded ({d.get('reason') or 'opt-out'}, scope {d.get('scope') or 'all'}"
            f"); cancelled {len(d.get('cancelled_intents') or [])} queued follow-up(s)")
    if d.get("crm_write"):
        text += f"; write-back to the CRM queued as {d['crm_write']}"
    return text


def _eligibility(d: Detail) -> str:
    text = (f"send eligibility for {_short(d.get('intent_id'))}: "
            + ("eligible" if d.get("eligible") else f"NOT eligible ({d.get('reason')})"))
    consent = d.get("consent") or {}
    if d.get("crm_field"):
        text += f": the CRM's {d['crm_field']} says opted out"
    if consent.get("lawful_basis"):
        text += (f"; consent record: lawful basis {consent['lawful_basis']} "
                 f"({consent.get('purpose')})")
    if consent.get("checked") == "inboxcrm_only":
        text += "; checked against inboxcrm's suppressions only (no CRM opt-out field)"
    elif consent.get("crm_field"):
        state = "opted out" if consent.get("crm_opted_out") else "not opted out"
        text += (f"; CRM {consent.get('crm')} {consent['crm_field']} {state}"
                 + (" (cached)" if consent.get("cached") else ""))
    return text


def _crm_opt_out(outcome: str) -> Callable[[Detail], str]:
    def describe(d: Detail) -> str:
        where = f"CRM ({d.get('crm')}) {d.get('crm_field') or 'opt-out field'}"
        if outcome == "written":
            if d.get("supported") is False:
                return (f"CRM ({d.get('crm')}) has no opt-out field inboxcrm writes: the "
                        "opt-out is honoured by inboxcrm's suppression list alone")
            records = ", ".join(d.get("crm_record_ids") or []) or "no record held yet"
            return f"opt-out written to {where} ({records}), attempt {d.get('attempt')}"
        verb = "blocked" if outcome == "blocked" else "failed, retried later"
        return (f"opt-out write to {where} attempt {d.get('attempt')} {verb}: "
                f"{d.get('category')} {d.get('error')}")
    return describe


def _signal(action: str) -> Callable[[Detail], str]:
    def describe(d: Detail) -> str:
        verb = action.split("_", 1)[1]
        # Decisions attributed from authentication say how they came (desk, cli, the
        # Temporal UI's signal or update) and whether the decider was proven.
        via = ""
        if d.get("path"):
            proven = "authenticated" if d.get("authenticated") else "not authenticated"
            via = f" via {d['path']} ({proven}"
            if d.get("typed_reviewer"):
                via += f", typed name {d['typed_reviewer']!r}"
            via += ")"
        if d.get("accepted"):
            note = f": {d['note']}" if d.get("note") else ""
            return f"reviewer decision {verb} accepted{via}{note}"
        return f"reviewer decision {verb} refused{via} ({d.get('ignored_reason')})"
    return describe


SENTENCES: dict[str, Callable[[Detail], str]] = {
    "received": _received,
    "redelivery_content_differs": lambda d: (
        f"redelivery of {d.get('delivery_id')} with DIFFERENT content (not processed)"),
    "copy_recorded": lambda d: (
        f"the same message again by {d.get('source')} to {d.get('mailbox')} "
        f"({d.get('delivery_id')}): recorded as a copy of this item, nothing run"),
    "extracted": _extracted,
    "match_needs_review": lambda d: (
        f"matching needs review: {d.get('reason')} ({len(d.get('candidates') or [])} "
        "candidate(s))"),
    "contact_matched": lambda d: (
        f"matched: {str(d.get('decision')).replace('_', ' ')} by {d.get('rule')}"
        + (f", approved by {d['approved_by']}" if d.get("approved_by") else "")),
    "contact_updated": lambda d: f"contact fields updated: {', '.join(d.get('fields') or [])}",
    "suppression_recorded": _suppressed,
    "crm_opt_out_written": _crm_opt_out("written"),
    "crm_opt_out_failed": _crm_opt_out("failed"),
    "crm_opt_out_blocked": _crm_opt_out("blocked"),
    "intent_created": lambda d: (
        f"follow-up intent {_short(d.get('intent_id'))} created (rule {d.get('rule_id')} "
        f"v{d.get('rule_version')}" + (", needs approval)" if d.get("needs_approval") else ")")),
    "followup_not_planned": lambda d: (
        f"no follow-up planned: {d.get('reason')}"
        + (f" (answers {'our follow-up' if d.get('answers') == 'followup' else 'a message'}"
           f" of event {_short(d.get('thread_event_id'))})"
           if d.get("reason") == "thread_reply" else "")),
    "crm_email_logged": lambda d: (
        f"CRM ({d.get('crm')}) email activity {d.get('email_activity_id')} logged "
        f"({str(d.get('op_key', '')).rsplit(':', 1)[-1]}), attempt {d.get('attempt')}"
        + (" (found by reconciliation, not logged again)" if d.get("reconciled") else "")),
    "followup_approved": lambda d: (
        f"follow-up {_short(d.get('intent_id'))} approved"
        + (f" in a reviewer's edited words (sha256 {str(d['draft_sha256'])[:12]}…)"
           if d.get("draft_sha256") else "")),
    "eligibility_checked": _eligibility,
    "crm_upserted": lambda d: (
        f"CRM ({d.get('crm')}) record {d.get('crm_record_id')} written, attempt "
        f"{d.get('attempt')}" + (" (found by reconciliation, not re-sent)"
                                 if d.get("reconciled") else "")),
    "crm_record_adopted": lambda d: (
        f"CRM ({d.get('crm')}) record {d.get('crm_record_id')} existed (created outside "
        "inboxcrm) and was adopted" + (": our external ID written onto it"
                                       if d.get("external_id_written") else "")),
    "crm_record_merged": lambda d: (
        f"CRM ({d.get('crm')}) record {d.get('old')} was merged into {d.get('survivor')}: "
        "followed, the survivor is the contact's record" + (
            " (our external ID written onto it)" if d.get("external_id_written") else "")),
    "contact_linked": lambda d: (
        f"a second address was linked to contact {_short(d.get('contact_id'))}"
        + (f" (contact {_short(d.get('joined_contact_id'))} joined to it)"
           if d.get("joined_contact_id") else "")
        + (f"; {len(d.get('items_moved') or [])} open item(s) moved to it, "
           f"{len(d.get('items_kept') or [])} left where they were"
           if d.get("items_moved") or d.get("items_kept") else "")
        + (f": {d.get('note')}" if d.get("note") else "")),
    "crm_match_needs_review": lambda d: (
        f"CRM ({d.get('crm')}) merged record {d.get('old')} into "
        f"{', '.join(str(c) for c in d.get('candidates') or [])}, which carries another "
        f"contact's ID of ours ({_short(d.get('other_contact_id'))}): not followed, nothing "
        "written; a person decides (split the records in the CRM and retry, or reject)"
        if d.get("reason") == "crm_merged_into_other_contact" else
        f"CRM ({d.get('crm')}) holds several records with this email "
        f"({', '.join(str(c) for c in d.get('candidates') or [])}): none adopted, none "
        "created; a person decides"),
    "followup_sent": lambda d: (
        f"follow-up sent via {d.get('provider')}: message {d.get('provider_message_id')}, "
        f"idempotency key {_short(d.get('idempotency_key'))}, attempt {d.get('attempt')}"
        + (" (found by reconciliation, not re-sent)" if d.get("reconciled") else "")),
    "followup_send_again_approved": lambda d: (
        f"a person approved sending the follow-up again: new intent "
        f"{_short(d.get('intent_id'))} (its own idempotency key) repeats intent "
        f"{_short(d.get('repeats_intent_id'))}: {d.get('reason')}"),
    "followup_sent_again": lambda d: (
        f"follow-up sent again, deliberately, via {d.get('provider')}: message "
        f"{d.get('provider_message_id')}, idempotency key {_short(d.get('idempotency_key'))}"),
    "attempt_failed": _attempt_failed,
    "state_changed": _state,
    "operation_resolved": lambda d: (
        f"{_action_of(d)} resolved by a person with evidence {d.get('evidence')}"),
    "operation_retry_granted": lambda d: (
        f"{_action_of(d)} retry granted ({d.get('budget')} more attempts)"),
    "review_corrections_applied": lambda d: (
        f"reviewer corrected: {', '.join(d.get('fields') or []) or 'nothing'}"
        + (f" (rejected: {', '.join(d['rejected'])})" if d.get("rejected") else "")),
    "review_escalated": lambda d: f"review overdue: escalated ({d.get('reason')})",
    "replayed": lambda d: f"run replayed: {d.get('reason')}",
    "paused": lambda d: f"{d.get('scope')} paused for {d.get('tenant')}",
    "resumed": lambda d: f"{d.get('scope')} resumed for {d.get('tenant')}",
    "forgotten": lambda d: "personal data forgotten on request",
    "purged": lambda d: f"raw content purged ({d.get('events')} events)",
    "exported": lambda d: (f"access request answered: {d.get('contacts')} contact(s), "
                           f"{d.get('messages')} message(s) exported"),
    "reencrypted": lambda d: (f"{d.get('values')} stored value(s) of {d.get('column')} "
                              f"re-encrypted under key {d.get('key')}"),
    "retention_applied": lambda d: (
        f"retention: the stored message removed, older than {d.get('older_than_days')} days"),
    "retention_run": lambda d: (
        f"retention run: {d.get('raw')} message(s) emptied, {d.get('evidence')} evidence "
        f"record(s) and {d.get('audit')} audit entries removed"),
    "shadow_planned": lambda d: (
        f"shadow mode, {d.get('outcome')}: nothing written or sent; it would have been: "
        f"{describe_shadow_plan(d)}"),
    "mode_changed": lambda d: f"mode of {d.get('tenant')}: {d.get('from')} → {d.get('to')}",
}


def sentence(action: str, detail: Detail) -> str:
    if action.startswith(("signal_", "update_")):  # a decision, by how it arrived
        return _signal(action)(detail)
    describe = SENTENCES.get(action)
    if describe is None:
        return f"{action}: {detail}"
    try:
        return describe(detail)
    except (KeyError, TypeError, ValueError):
        return f"{action}: {detail}"


def summary(entries: list[dict[str, Any]]) -> list[str]:
    """Counts that answer the usual questions first."""
    workflows = sorted({e["workflow_id"] for e in entries if e.get("workflow_id")})
    sent = [e for e in entries if e["action"] in ("followup_sent", "followup_sent_again")]
    not_planned = [e["detail"].get("reason") for e in entries
                   if e["action"] == "followup_not_planned"]
    refused = [e["detail"].get("reason") for e in entries
               if e["action"] == "eligibility_checked" and not e["detail"].get("eligible")]
    lines = [f"{len(workflows)} inbound item(s); {len(sent)} follow-up(s) sent"]
    if len(sent) > 1:
        keys = {e["detail"].get("idempotency_key") for e in sent}
        lines.append(f"follow-ups came from {len(keys)} distinct intent(s): each intent is at "
                     "most one email; several intents mean several items outside each "
                     "other's quiet period, or a person's deliberate send-again")
    if not_planned or refused:
        lines.append("follow-ups not sent because: "
                     + ", ".join(str(r) for r in not_planned + refused))
    return lines
