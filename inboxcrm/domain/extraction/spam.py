"""Upstream spam verdicts, in the dialects of the filters in front of a mailbox
(docs/architecture.md §5): SpamAssassin, Exim's spamd ACL headers, rspamd, Microsoft 365,
and the providers' own (Mailgun, Postmark's SpamAssassin headers in its payload).

A spam header is text a sender could have written, so it may only ever make a message
*less* trusted: every occurrence of every dialect is read, any one that says spam counts,
and nothing that says "not spam" rescues a message another header condemns. Forging a spam
verdict only harms the forger's own message, so the provider dialects count on every
source too (a provider's own headers on another source are a sender's text, and a spam
verdict is the one thing such text may decide).

What a verdict does is the tenant's policy (`spam_score_threshold`, `spam_action`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Lower-case header names read, every occurrence (minimise.SPAM_HEADERS keeps them in order).
SPAM_HEADERS = (
    # SpamAssassin (spamd / spamass-milter / amavis / Postmark's payload)
    "X-Spam-Flag", "X-Spam-Status", "X-Spam-Score", "X-Spam-Level",
    # Exim with spamd (`X-Spam_score: $spam_score` ...; cPanel writes X-Spam-Bar)
    "X-Spam_score", "X-Spam_score_int", "X-Spam_bar", "X-Spam-Bar",
    # rspamd (milter_headers: spamd-result, x-rspamd-score, x-spam, spamd-bar, x-rspamd-action)
    "X-Spamd-Result", "X-Rspamd-Score", "X-Spam", "X-Spamd-Bar", "X-Rspamd-Action",
    # providers and suites
    "X-Mailgun-Sflag", "X-Mailgun-Sscore", "X-PM-Spam-Score",
    "X-MS-Exchange-Organization-SCL", "X-Forefront-Antispam-Report",
)
MAX_SPAM_HEADERS = 60

_LEADING_NUMBER = re.compile(r"\s*([+-]?\d{1,6}(?:\.\d{1,6})?)")
_SCORE = re.compile(r"(?:^|[\s,;(])(?:score|hits)\s*=\s*([+-]?\d{1,6}(?:\.\d{1,6})?)",
                    re.IGNORECASE)
_RSPAMD_RESULT = re.compile(
    r"^\s*[\w-]{0,40}\s*:\s*(true|false)\s*\[\s*([+-]?\d{1,6}(?:\.\d{1,6})?)\s*/",
    re.IGNORECASE)
_SFV = re.compile(r"(?:^|;)\s*SFV:(SPM|BLK)\s*(?:;|$)", re.IGNORECASE)
_RSPAMD_SPAM_ACTIONS = frozenset({"reject", "add header", "rewrite subject"})
MS_SPAM_SCL = 5  # Microsoft: SCL 5 and 6 are spam, 9 high-confidence spam; -1 a safe sender


@dataclass(frozen=True)
class SpamVerdict:
    """Whether an upstream filter called the message spam, and which header said it."""

    spam: bool
    header: str | None = None  # the first header (name as spelt in SPAM_HEADERS) that did
    score: float | None = None  # its score, when it gave one


def _yes(value: str) -> bool:
    return value.strip().lower().startswith("yes")


def _leading(value: str) -> float | None:
    found = _LEADING_NUMBER.match(value)
    return float(found.group(1)) if found else None


def _bar(value: str) -> float:
    """Exim / rspamd bars and SpamAssassin's level: one symbol per point."""
    value = value.strip()
    return float(max(value.count("+"), value.count("*")))


def _score_of(name: str, value: str) -> tuple[bool, float | None]:
    """(flagged as spam outright, score on SpamAssassin's scale or None) for one header."""
    key = name.lower()
    if key in ("x-spam-flag", "x-mailgun-sflag", "x-spam"):
        return _yes(value), None
    if key == "x-spam-status":
        found = _SCORE.search(value)
        return _yes(value), float(found.group(1)) if found else None
    if key in ("x-spam-score", "x-spam_score", "x-rspamd-score", "x-mailgun-sscore",
               "x-pm-spam-score"):
        return False, _leading(value)
    if key == "x-spam_score_int":
        number = _leading(value)
        return False, number / 10 if number is not None else None
    if key in ("x-spam-level", "x-spam_bar", "x-spam-bar", "x-spamd-bar"):
        return False, _bar(value) or None
    if key == "x-spamd-result":
        found = _RSPAMD_RESULT.match(value)
        if not found:
            return False, None
        return found.group(1).lower() == "true", float(found.group(2))
    if key == "x-rspamd-action":
        return value.strip().lower() in _RSPAMD_SPAM_ACTIONS, None
    if key == "x-ms-exchange-organization-scl":
        number = _leading(value)
        return number is not None and number >= MS_SPAM_SCL, None
    if key == "x-forefront-antispam-report":
        return bool(_SFV.search(value)), None
    return False, None


def spam_verdict(headers: list[tuple[str, str]], threshold: float) -> SpamVerdict:
    """Spam if any header flags it, or gives a score at or above `threshold`. `headers` are
    (name, decoded value) pairs, topmost first, names as spelt in SPAM_HEADERS."""
    for name, value in headers[:MAX_SPAM_HEADERS]:
        flagged, score = _score_of(name, value[:500])
        if flagged or (score is not None and score >= threshold):
            return SpamVerdict(True, name, score)
    return SpamVerdict(False)
