"""`inboxcrm template preview --tenant T FILE.eml`: what the tenant would send in answer to
this message (docs/architecture.md §5, §10), without side effects.

The message is read offline with the rule-based extractor (no model is asked, nothing is
stored); its intent picks the tenant's follow-up rule, its `Content-Language` /
`Accept-Language` the template's language, and the follow-up is composed exactly as the send
step composes it: From, Reply-To, To, Subject, the headers, the text and HTML bodies. The
opt-out link names a placeholder contact (a real one names the contact). Exit 1 when the
file, the tenant or the template cannot be read, when no rule answers the message's intent,
or when the follow-up would be refused (e.g. no unsubscribe secret).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import typer

from inboxcrm.cli.common import JsonOpt, fail, settings_from_env
from inboxcrm.domain.extraction import extract_and_route
from inboxcrm.domain.extraction.rules import RulesExtractor
from inboxcrm.domain.followup import FollowupRefused, compose
from inboxcrm.domain.policy import PolicyError, UnknownTenant, get_policy
from inboxcrm.domain.templates import message_languages

template_app = typer.Typer(no_args_is_help=True, help="The tenant's follow-up templates.")


def _field(extraction: dict[str, Any], name: str) -> str | None:
    value = (extraction.get(name) or {}).get("value")
    return value.strip() if isinstance(value, str) and value.strip() else None


@template_app.command("preview")
def preview(
    file: Annotated[Path, typer.Argument(help="An inbound RFC 5322 message (.eml).")],
    tenant: Annotated[str, typer.Option(help="Tenant whose words and sender apply.")],
    template: Annotated[str | None, typer.Option(
        help="Preview this template instead of the one the message's intent selects.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Render what would be sent in answer to FILE.eml. Writes nothing, sends nothing."""
    if not tenant.strip():
        fail("--tenant must name a tenant")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        fail(f"cannot read {file}: {exc.strerror}")
        return
    try:
        policy = get_policy(tenant)
    except (UnknownTenant, PolicyError) as exc:
        fail(str(exc))
        return
    outcome = asyncio.run(extract_and_route(raw, policy, RulesExtractor(), "standard"))
    extraction: dict[str, Any] = outcome.extraction.model_dump(mode="json")
    intent = str(extraction.get("intent") or "other")
    rule = policy.rule_for_intent(intent)
    if template is None and rule is None:
        fail(f"tenant {tenant!r} has no follow-up rule for intent {intent!r}: nothing "
                "would be sent")
        return
    name = template or (rule.template_id if rule else "")
    chosen = policy.templates.get(name)
    if chosen is None:
        fail(f"tenant {tenant!r} has no template {name!r} (in its policy folder's "
                "templates/)")
        return
    to = (_field(extraction, "sender_email") or outcome.canonical_email
          or "(no trusted sender address)")
    try:
        followup = compose(policy, chosen, to=to, contact_id=None,
                           name=_field(extraction, "contact_name"),
                           company=_field(extraction, "company"),
                           languages=message_languages(raw[:64 * 1024]),
                           settings=settings_from_env())
    except FollowupRefused as refused:
        fail(f"this follow-up would not be sent ({refused.reason}): {refused}")
        return
    route = outcome.route
    if route != "auto":
        note = (f"route {route} ({', '.join(outcome.reasons) or 'no reason'}): nothing goes "
                "out before a person decides")
    elif rule is not None and rule.new_prospect_requires_approval:
        note = "route auto; a new prospect's follow-up waits for a reviewer's approval"
    else:
        note = "route auto: sent automatically"
    rule_text = (f"{rule.rule_id} v{policy.rule_version(rule)}"
                 if rule is not None and rule.template_id == name else "(template chosen)")
    if as_json:
        typer.echo(json.dumps({
            "tenant": tenant, "rule": rule_text, "template": followup.template_ref,
            "language": followup.language, "route": route, "note": note,
            "from": followup.sender, "reply_to": followup.reply_to, "to": followup.to,
            "subject": followup.subject, "headers": followup.headers, "text": followup.text,
            "html": followup.html}, ensure_ascii=False, indent=2))
        return
    lines = [f"tenant:    {tenant}", f"rule:      {rule_text}",
             f"template:  {followup.template_ref} ({followup.language})", f"note:      {note}",
             "", f"From: {followup.sender}"]
    if followup.reply_to:
        lines.append(f"Reply-To: {followup.reply_to}")
    lines += [f"To: {followup.to}", f"Subject: {followup.subject}"]
    lines += [f"{key}: {value}" for key, value in followup.headers.items()]
    lines += ["", followup.text.rstrip("\n")]
    if followup.html is not None:
        lines += ["", "--- text/html ---", followup.html.rstrip("\n")]
    typer.echo("\n".join(lines))
