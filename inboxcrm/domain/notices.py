"""What a tenant's reviewers are told (docs/architecture.md §6, "Going live"): one message
per batch in the Slack incoming-webhook format, with each review task's reason, owner, state,
age and the link to its review card. Never a message's content or personal data: no
address, name or subject ever reaches a notice (the card behind the link asks for a
reviewer's credentials).

The webhook URL is a secret: the policy names where it is (an environment variable, or a
file), and it is read here at each run, so a rotated secret needs no restart. It is never
logged and never part of an error.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from inboxcrm.domain.policy import ROOT, WebhookChannel

KIND_TITLES = {"new": "new review task", "overdue": "overdue review task"}


def webhook_url(channel: WebhookChannel, root: Path = ROOT) -> str | None:
    """The channel's URL, or None when its reference is not set (the tenant is told
    nothing, and the run says so). Only http(s) URLs count."""
    value: str | None
    if channel.url_env is not None:
        value = os.environ.get(channel.url_env)
    else:
        assert channel.url_file is not None  # exactly one of them (policy validation)
        path = Path(channel.url_file)
        path = path if path.is_absolute() else root / path
        try:
            value = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            value = None
    value = (value or "").strip()
    if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
        return None
    return value


def card_link(base_url: str, workflow_id: str) -> str:
    """The review card (`GET /review/{workflow_id}`, the ID URL-encoded)."""
    return f"{base_url.rstrip('/')}/review/{quote(workflow_id, safe='')}"


def _escape(text: str) -> str:
    """Slack mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC")


def slack_message(tenant: str, notices: Iterable[Mapping[str, Any]], base_url: str
                  ) -> dict[str, Any]:
    """One message for one batch of one tenant. Each notice: `kind` (new | overdue),
    `workflow_id`, `reason`, `owner`, `state`, `first_seen`, `escalate_at`."""
    rows = list(notices)
    counts = {kind: sum(1 for n in rows if n["kind"] == kind) for kind in KIND_TITLES}
    title = f"inboxcrm · {tenant}: " + ", ".join(
        f"{count} {KIND_TITLES[kind]}{'s' if count != 1 else ''}"
        for kind, count in counts.items() if count)
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": title[:150]}}]
    for notice in rows:
        kind = str(notice["kind"])
        text = (f"*{kind}* · `{_escape(str(notice['reason']))}` · {_escape(str(notice['state']))}"
                f" · owner {_escape(str(notice['owner']))} · waiting since "
                f"{_when(notice['first_seen'])}")
        if kind == "overdue":
            text += f" · due {_when(notice['escalate_at'])}"
        text += f" · <{card_link(base_url, str(notice['workflow_id']))}|review card>"
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    return {"text": title, "blocks": blocks}
