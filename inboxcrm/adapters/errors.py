"""The one error classifier every adapter uses (docs/architecture.md §4).

Every outcome of an external call is one of three categories:
- transient: the request did not take effect; retrying with the same key is safe;
- permanent: retrying cannot help (invalid field, bad credential, not found): stop, block;
- unknown:   the request was sent and we do not know whether it took effect: reconcile first.

Two refinements: a limit with a known reset (HubSpot's `DAILY` 429) is transient with a
`park_until` (the scope waits for the reset like a pause, spending no attempts); an answer
that says a side effect may exist but can never be confirmed (Resend's
`invalid_idempotent_request`: the key was already used) is unknown and ambiguous: held.

Activities turn a classified failure into an `ApplicationError` whose `type` the workflow
understands (see ErrorType). Messages never carry payloads or personal data.
"""

from __future__ import annotations

import email.utils
import smtplib
import socket
import ssl
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
from temporalio.exceptions import ApplicationError

from inboxcrm.schemas.outcomes import Category, Classified, ErrorType, FailureCause

__all__ = [
    "Category",
    "Classified",
    "ErrorType",
    "FailureCause",
    "classify_exception",
    "classify_response",
    "classify_smtp_code",
    "classify_status",
    "failure_cause",
    "next_daily_reset",
    "park_long_retry_after",
    "parse_retry_after",
    "to_application_error",
]


PERMANENT_STATUSES = frozenset({400, 401, 403, 404, 405, 409, 410, 413, 415, 422})
TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
# Provider-specific answers whose status alone would mislead.
TRANSIENT_REASONS = frozenset({
    "http_403:REQUEST_LIMIT_EXCEEDED",          # Salesforce: org API limit, not a permission
    "http_400:UNABLE_TO_LOCK_ROW",              # Salesforce: record locked by a concurrent save
    "http_207:RATE_LIMITS",                     # HubSpot batch: the one input was rate limited
})
# The request reached the provider and its outcome is not known yet: reconcile (repeat).
UNKNOWN_REASONS = frozenset({
    "http_409:concurrent_idempotent_requests",  # Resend: the first request is still running
})
# The side effect may exist and no later attempt can confirm it: held for a person.
AMBIGUOUS_REASONS = frozenset({
    "http_409:invalid_idempotent_request",  # Resend: the key was used with another payload
})
# Limits that last until a daily reset: park the scope until then (`park_until`).
DAILY_LIMIT_REASONS = frozenset({
    "http_429:DAILY",  # HubSpot: the account's daily limit
})
# HubSpot resets the daily limit at midnight in the account's time zone, which the API does
# not tell: we park until the next midnight UTC plus this margin. Where the account's midnight
# comes earlier, the scope waits a few hours longer; where later, the first call after the
# park meets the limit again and parks again, spending no attempt.
DAILY_RESET_MARGIN = timedelta(minutes=5)
PERMANENT_REASONS = frozenset({
    "http_300:MULTIPLE_MATCHES",   # Salesforce upsert: several records match; never pick one
    "http_207:VALIDATION_ERROR",   # HubSpot batch (multi-status): the one input was invalid
})
# Where a provider documents its limit window but sends no Retry-After, wait that long.
DEFAULT_RETRY_AFTER: dict[str, float] = {
    "http_429:SECONDLY": 1.0,                 # HubSpot burst limit (policyName)
    "http_429:TEN_SECONDLY_ROLLING": 10.0,    # HubSpot 10-second rolling limit (policyName)
    "http_429:TEN_SECONDLY": 10.0,            # the same limit under its short name
    "http_207:RATE_LIMITS": 1.0,
    "http_403:REQUEST_LIMIT_EXCEEDED": 60.0,  # Salesforce 24 h org limit: back off long
}

# Errors raised before any byte of the request reached the peer: nothing can have happened.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)
# Errors after the request may have been received: the side effect may exist.
_MAYBE_SENT = (
    httpx.ReadTimeout,
    httpx.WriteTimeout,
    httpx.ReadError,
    httpx.WriteError,
    httpx.RemoteProtocolError,
    httpx.CloseError,
)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: either delta-seconds or an HTTP date."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - (time.time() if now is None else now))


def next_daily_reset(now: datetime | None = None) -> datetime:
    """When a daily limit met `now` is reset (see DAILY_RESET_MARGIN)."""
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)
    return midnight + DAILY_RESET_MARGIN


def classify_status(
    status_code: int, retry_after: str | None = None, reason: str | None = None
) -> Classified:
    """Classify an HTTP answer that was received (so the request reached the peer)."""
    label = reason or f"http_{status_code}"
    delay = parse_retry_after(retry_after)
    if delay is None:
        delay = DEFAULT_RETRY_AFTER.get(label)
    if label in DAILY_LIMIT_REASONS:
        return Classified(Category.TRANSIENT, label, None, status_code,
                          park_until=next_daily_reset())
    if label in AMBIGUOUS_REASONS or label in UNKNOWN_REASONS:
        return Classified(Category.UNKNOWN, label, None, status_code)
    if label in PERMANENT_REASONS:
        return Classified(Category.PERMANENT, label, None, status_code)
    if label in TRANSIENT_REASONS:
        return Classified(Category.TRANSIENT, label, delay, status_code)
    if status_code in TRANSIENT_STATUSES:
        # A 5xx *answer* means the peer processed the request and reports failure; providers
        # document these as "not applied". A gateway timeout (504) may hide a commit.
        category = Category.UNKNOWN if status_code == 504 else Category.TRANSIENT
        return Classified(category, label, delay, status_code)
    if status_code in PERMANENT_STATUSES:
        return Classified(Category.PERMANENT, label, None, status_code)
    if 500 <= status_code < 600:
        return Classified(Category.TRANSIENT, label, delay, status_code)
    if 400 <= status_code < 500:
        return Classified(Category.PERMANENT, label, None, status_code)
    # 1xx/3xx where a 2xx was expected: we cannot tell what the peer did.
    return Classified(Category.UNKNOWN, label, None, status_code)


_ACCESS_STATUSES = frozenset({401, 403})
_DATA_STATUSES = frozenset({400, 404, 409, 413, 415, 422})
_RATE_STATUSES = frozenset({429})
_RATE_LABELS = frozenset({"http_403:REQUEST_LIMIT_EXCEEDED", "http_207:RATE_LIMITS"})
_DATA_LABELS = frozenset({"http_300:MULTIPLE_MATCHES", "http_207:VALIDATION_ERROR"})
_INTEGRATION_LABELS = frozenset({"http_400:UNABLE_TO_LOCK_ROW"})  # contention, not the data


def failure_cause(reason: str | None) -> FailureCause:
    """Which kind of failure a classified reason label is (`http_401:INVALID_AUTHENTICATION`,
    `smtp_550`, `retries_exhausted`'s last error, …), for routing it to its owner:
    - access: the credential or its permissions (401, 403): the integration's keys;
    - rate: a provider's limit (429, a limit reported as 403/207, a Retry-After over cap);
    - data: the record or the message itself (400/404/409/422, several matches, SMTP 5xx);
    - ambiguous: a side effect that may exist and cannot be confirmed;
    - integration: anything else (5xx, timeouts, TLS, connection, an address refused).
    Pure (no I/O): the workflow calls it to pick the owner of a wait."""
    label = (reason or "").removesuffix(":retry_after_over_cap")
    if reason and reason.endswith(":retry_after_over_cap"):
        return "rate"
    if label in AMBIGUOUS_REASONS or label in ("outcome_unconfirmed", "idempotency_window_passed"):
        return "ambiguous"
    if label in _RATE_LABELS or label in DAILY_LIMIT_REASONS:
        return "rate"
    if label in _DATA_LABELS:
        return "data"
    if label in _INTEGRATION_LABELS:
        return "integration"
    head = label.split(":", 1)[0]
    kind, _, number = head.partition("_")
    if not number.isdigit():
        return "integration"
    code = int(number)
    if kind == "smtp":
        if code in (530, 535):  # authentication required / credentials refused
            return "access"
        return "data" if 500 <= code < 600 else "integration"
    if kind != "http":
        return "integration"
    if code in _ACCESS_STATUSES:
        return "access"
    if code in _RATE_STATUSES:
        return "rate"
    if code in _DATA_STATUSES:
        return "data"
    return "integration"


def classify_response(response: httpx.Response, reason: str | None = None) -> Classified:
    return classify_status(response.status_code, response.headers.get("retry-after"), reason)


def classify_exception(exc: BaseException, *, sent: bool = True) -> Classified:
    """Classify an exception raised by an HTTP call, an SMTP session (smtplib) or a
    socket-level library.

    `sent=False` says the request (for SMTP: the message data) was never handed to the peer,
    so nothing can have happened: an outcome that would be unknown is transient instead.
    """
    classified = _classify_exception(exc)
    if not sent and classified.category is Category.UNKNOWN:
        return Classified(Category.TRANSIENT, classified.reason, classified.retry_after,
                          classified.status_code)
    return classified


def classify_smtp_code(code: int) -> Classified:
    """An SMTP reply code where success was expected. A 4xx reply (also to the end of DATA)
    means the server did not take the message: retry. 5xx: it never will."""
    if 400 <= code < 500:
        return Classified(Category.TRANSIENT, f"smtp_{code}", None, code)
    if 500 <= code < 600:
        return Classified(Category.PERMANENT, f"smtp_{code}", None, code)
    return Classified(Category.UNKNOWN, f"smtp_{code}", None, code)


class AddressRefused(httpx.ConnectError):
    """A tenant destination's host resolved to an internal address the operator does not
    allow (inboxcrm/adapters/transport.py): nothing was sent, and retrying cannot help."""


def _classify_exception(exc: BaseException) -> Classified:
    if isinstance(exc, AddressRefused):
        return Classified(Category.PERMANENT, "destination_address_refused")
    if isinstance(exc, httpx.HTTPStatusError):
        return classify_response(exc.response)
    if isinstance(exc, _NOT_SENT):
        return Classified(Category.TRANSIENT, _name(exc))
    if isinstance(exc, _MAYBE_SENT):
        return Classified(Category.UNKNOWN, _name(exc))
    if isinstance(exc, smtplib.SMTPRecipientsRefused):
        codes = [reply[0] for reply in exc.recipients.values()]
        return classify_smtp_code(max(codes) if codes else -1)  # any 5xx: permanent
    if isinstance(exc, smtplib.SMTPResponseException):
        return classify_smtp_code(exc.smtp_code)
    if isinstance(exc, smtplib.SMTPServerDisconnected):
        # smtplib reports a read timeout as a disconnect raised while handling the timeout.
        timed_out = isinstance(exc.__cause__ or exc.__context__, TimeoutError)
        return Classified(Category.UNKNOWN, "smtp_timeout" if timed_out else "smtp_disconnected")
    if isinstance(exc, smtplib.SMTPNotSupportedError):
        return Classified(Category.PERMANENT, "smtp_not_supported")  # e.g. no STARTTLS
    if isinstance(exc, ssl.SSLCertVerificationError):
        return Classified(Category.PERMANENT, "tls_certificate")
    if isinstance(exc, socket.gaierror):
        return Classified(Category.TRANSIENT, "dns_error")
    if isinstance(exc, ConnectionRefusedError):
        return Classified(Category.TRANSIENT, "connection_refused")
    if isinstance(exc, TimeoutError):
        return Classified(Category.UNKNOWN, "timeout")
    return Classified(Category.UNKNOWN, _name(exc))


def _name(exc: BaseException) -> str:
    return type(exc).__name__


def park_long_retry_after(classified: Classified, *, max_retry_after: float,
                          max_park: float, now: datetime | None = None) -> Classified:
    """A refusal whose Retry-After is longer than a step waits in place (`max_retry_after`)
    parks the operation's scope until then, like a daily limit: the attempt is given back,
    so waiting spends none of the budget. A delay longer than `max_park` is beyond what we
    wait for unattended: the item is blocked for a person, with the reason
    `<label>:retry_after_over_cap`. Anything else is returned unchanged."""
    delay = classified.retry_after
    if (classified.category is not Category.TRANSIENT or classified.park_until is not None
            or delay is None or delay <= max_retry_after):
        return classified
    if delay > max_park:
        return Classified(Category.PERMANENT, f"{classified.reason}:retry_after_over_cap",
                          delay, classified.status_code)
    moment = (now or datetime.now(UTC)).astimezone(UTC)
    return replace(classified, park_until=moment + timedelta(seconds=delay))


def to_application_error(
    classified: Classified, *, max_retry_after: float, reconcilable: bool = True
) -> ApplicationError:
    """Turn a classification into the error the workflow and RetryPolicy act on.

    `reconcilable` is False where the destination can neither be searched nor deduplicate
    by key (SMTP): an unknown outcome there is ambiguous and must wait for a person.
    """
    message = f"{classified.category.value}: {classified.reason}"
    if classified.reason in AMBIGUOUS_REASONS:
        return ApplicationError(message, type=ErrorType.AMBIGUOUS.value, non_retryable=True)
    if classified.category is Category.PERMANENT:
        return ApplicationError(message, type=ErrorType.PERMANENT.value, non_retryable=True)
    if classified.category is Category.UNKNOWN:
        if not reconcilable:
            return ApplicationError(message, type=ErrorType.AMBIGUOUS.value, non_retryable=True)
        return ApplicationError(message, type=ErrorType.UNKNOWN_OUTCOME.value)
    delay = None
    if classified.retry_after is not None:
        delay = timedelta(seconds=min(classified.retry_after, max_retry_after))
    return ApplicationError(message, type=ErrorType.TRANSIENT.value, next_retry_delay=delay)
