"""Sender authentication: is the `From` domain vouched for by the receiving boundary?

Only a verdict written by the boundary the tenant trusts counts, never a header the
sender could have written (docs/architecture.md §5):

- `Authentication-Results` (RFC 8601, parsed with `authres`) whose authserv-id is one of
  the tenant's `trusted_authserv_ids`; the topmost such header (the boundary adds its own
  on top and removes look-alikes, RFC 8601 §5);
- on the Mailgun source: the topmost `X-Mailgun-Spf` / `X-Mailgun-Dkim-Check-Result`;
- on the Postmark source: the topmost `Received-SPF`.

A provider header arriving through another source (a raw message posted to the standard
webhook, say) is text the sender may have written and is ignored.

DMARC `pass`, or an SPF or DKIM `pass` for a domain aligned with the `From` domain
(relaxed alignment: the same domain, or one a subdomain of the other; without a public
suffix list a one-label parent such as `com` never aligns) authenticates the sender.
A pass for another domain does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import authres

from inboxcrm.domain.policy import TenantPolicy
from inboxcrm.schemas.sources import SourceName

from .minimise import MinimisedMessage

Verdict = Literal["pass", "fail", "none"]
# The inbound sources (schemas.sources) and a message read straight from an MX.
Source = SourceName | Literal["smtp"]

AUTH_REASONS = frozenset({
    "sender_auth_failed", "sender_auth_misaligned", "sender_auth_untrusted",
    "sender_auth_missing",
})
_PASS = "pass"
_FAILURES = frozenset({"fail", "softfail", "permerror", "policy"})
_DKIM_D = re.compile(r"(?:^|;)\s*d\s*=\s*([A-Za-z0-9.-]+)")
_SPF_WORD = re.compile(r"^\s*([A-Za-z]+)")
_ENVELOPE_FROM = re.compile(r"envelope-from\s*=\s*\"?<?([^\s;>\"]+)", re.IGNORECASE)
_AUTHSERV_ID = re.compile(r"\s*+([^\s;]{1,255})")
# authres parses ~7 µs per character: only headers that name a trusted authserv-id are
# parsed, at most this many, each up to its last complete result within this many chars.
MAX_RESULTS_PARSED = 8
MAX_RESULTS_CHARS = 2000


@dataclass(frozen=True)
class Check:
    """One result of one method, for one domain, as the boundary reported it."""

    method: str  # dmarc | dkim | spf
    result: str  # pass | fail | softfail | neutral | none | temperror | permerror ...
    domain: str | None


@dataclass(frozen=True)
class Authentication:
    """The verdict on the sender and where it came from."""

    verdict: Verdict
    reason: str | None = None  # one of AUTH_REASONS unless the verdict is pass
    method: str | None = None  # the check that decided it
    authority: str | None = None  # authserv-id, "mailgun" or "postmark"
    from_domain: str | None = None
    checks: tuple[Check, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "method": self.method,
            "authority": self.authority,
            "from_domain": self.from_domain,
            "checks": [{"method": c.method, "result": c.result, "domain": c.domain}
                       for c in self.checks],
        }


def aligned(domain: str | None, from_domain: str) -> bool:
    """Relaxed alignment without a public suffix list (see the module docstring)."""
    if not domain:
        return False
    domain = domain.strip().strip(".").lower()
    if domain == from_domain:
        return True
    shorter, longer = sorted((domain, from_domain), key=len)
    return shorter.count(".") >= 1 and longer.endswith("." + shorter)


def _domain_of(value: str | None) -> str | None:
    if not value:
        return None
    return value.strip().strip("<>").rpartition("@")[2].strip().strip(".").lower() or None


def _property(result: Any, kind: str, name: str) -> str | None:
    for prop in getattr(result, "properties", []) or []:
        if prop.type == kind and prop.name == name and prop.value:
            return str(prop.value)
    return None


def _names_trusted(value: str, trusted: set[str]) -> bool:
    """Whether a header may be the trusted boundary's (its first token is a trusted
    authserv-id; a leading comment is left to the parser)."""
    found = _AUTHSERV_ID.match(value)
    return found is None or found.group(1).startswith("(") or found.group(1).lower() in trusted


def _authres_checks(value: str) -> tuple[str, list[Check]] | None:
    if len(value) > MAX_RESULTS_CHARS:
        cut = value.rfind(";", 0, MAX_RESULTS_CHARS)
        value = value[:cut] if cut > 0 else value[:MAX_RESULTS_CHARS]
    try:
        header = authres.AuthenticationResultsHeader.parse_value(value)
    except Exception:  # authres raises its own errors (and others) on malformed values
        return None
    checks: list[Check] = []
    for result in header.results:
        method = str(result.method).lower()
        outcome = str(result.result).lower()
        if method == "dmarc":
            domain = _property(result, "header", "from")
        elif method == "dkim":
            domain = _property(result, "header", "d") or _domain_of(
                _property(result, "header", "i"))
        elif method == "spf":
            domain = _domain_of(_property(result, "smtp", "mailfrom")) or _domain_of(
                _property(result, "smtp", "helo"))
        else:
            continue
        checks.append(Check(method, outcome, domain.lower() if domain else None))
    return str(header.authserv_id).lower(), checks


def _first(msg: MinimisedMessage, name: str) -> str | None:
    return next((value for key, value in msg.auth_headers if key == name), None)


def _dkim_domains(msg: MinimisedMessage) -> list[str]:
    domains = []
    for key, value in msg.auth_headers:
        if key == "DKIM-Signature":
            found = _DKIM_D.search(value.replace(" ", ""))
            if found:
                domains.append(found.group(1).lower())
    return domains


def _mailgun_checks(msg: MinimisedMessage, from_domain: str) -> list[Check]:
    checks: list[Check] = []
    spf = _first(msg, "X-Mailgun-Spf")
    if spf is not None:
        envelope = _first(msg, "X-Envelope-From") or _first(msg, "Return-Path")
        checks.append(Check("spf", spf.strip().lower(), _domain_of(envelope)))
    dkim = _first(msg, "X-Mailgun-Dkim-Check-Result")
    if dkim is not None:
        # Mailgun does not say which signature passed: every signature must align
        signed = _dkim_domains(msg)
        unaligned = [d for d in signed if not aligned(d, from_domain)]
        domain = unaligned[0] if unaligned else (signed[0] if signed else None)
        checks.append(Check("dkim", dkim.strip().lower(), domain))
    return checks


def _postmark_checks(msg: MinimisedMessage) -> list[Check]:
    received = _first(msg, "Received-SPF")
    if received is None:
        return []
    word = _SPF_WORD.match(received)
    envelope = _ENVELOPE_FROM.search(received)
    return [Check("spf", word.group(1).lower() if word else "none",
                  _domain_of(envelope.group(1)) if envelope else None)]


def _decide(checks: list[Check], from_domain: str, authority: str) -> Authentication:
    def verdict(v: Verdict, reason: str | None, method: str | None) -> Authentication:
        return Authentication(v, reason, method, authority, from_domain, tuple(checks))

    for check in checks:
        if check.method == "dmarc" and check.result == _PASS and (
                check.domain is None or aligned(check.domain, from_domain)):
            return verdict("pass", None, "dmarc")
    if any(c.method == "dmarc" and c.result in _FAILURES for c in checks):
        return verdict("fail", "sender_auth_failed", "dmarc")
    for method in ("dkim", "spf"):
        if any(c.method == method and c.result == _PASS and aligned(c.domain, from_domain)
               for c in checks):
            return verdict("pass", None, method)
    passed = [c for c in checks if c.result == _PASS]
    if passed:
        return verdict("fail", "sender_auth_misaligned", passed[0].method)
    failed = [c for c in checks if c.result in _FAILURES]
    if failed:
        return verdict("fail", "sender_auth_failed", failed[0].method)
    return verdict("none", "sender_auth_missing", None)


def authenticate(msg: MinimisedMessage, policy: TenantPolicy,
                 source: str = "standard") -> Authentication:
    """The sender's authentication verdict under the tenant's trust settings."""
    from_domain = _domain_of(msg.from_addrs[0].address) if msg.from_addrs else None
    if from_domain is None:
        return Authentication("none", "sender_auth_missing")
    trusted = set(policy.trusted_authserv_ids)
    seen_results = False
    parsed_count = 0
    for key, value in msg.auth_headers:
        if key != "Authentication-Results":
            continue
        seen_results = True
        if not _names_trusted(value, trusted) or parsed_count >= MAX_RESULTS_PARSED:
            continue
        parsed_count += 1
        parsed = _authres_checks(value)
        if parsed is not None and parsed[0] in trusted:
            return _decide(parsed[1], from_domain, parsed[0])
    provider: list[Check] = []
    if source == "mailgun":
        provider = _mailgun_checks(msg, from_domain)
    elif source == "postmark":
        provider = _postmark_checks(msg)
    if provider:
        return _decide(provider, from_domain, source)
    if seen_results:
        return Authentication("none", "sender_auth_untrusted", from_domain=from_domain)
    return Authentication("none", "sender_auth_missing", from_domain=from_domain)


def blocking_reason(auth: Authentication, policy: TenantPolicy) -> str | None:
    """The review reason the tenant's `sender_authentication` setting makes of a verdict:
    `required` - anything but a pass; `prefer` - an explicit failure (a fail, or a pass
    only for another domain); `off` - none."""
    if auth.verdict == "pass" or policy.sender_authentication == "off":
        return None
    if policy.sender_authentication == "prefer" and auth.verdict != "fail":
        return None
    return auth.reason or "sender_auth_missing"
