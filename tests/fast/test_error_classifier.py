"""The one error classifier: every status code and exception type it handles, as a table."""

from __future__ import annotations

import smtplib
import socket
import ssl
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from inboxcrm.adapters.errors import (
    Category,
    ErrorType,
    classify_exception,
    classify_status,
    next_daily_reset,
    park_long_retry_after,
    parse_retry_after,
    to_application_error,
)

T, P, U = Category.TRANSIENT, Category.PERMANENT, Category.UNKNOWN

STATUS_TABLE = [
    # (status, reason label from the adapter, expected category)
    (400, None, P), (401, None, P), (403, None, P), (404, None, P), (405, None, P),
    (409, None, P), (410, None, P), (413, None, P), (415, None, P), (422, None, P),
    (418, None, P), (451, None, P),
    (408, None, T), (425, None, T), (429, None, T),
    (500, None, T), (502, None, T), (503, None, T), (507, None, T), (599, None, T),
    (504, None, U),                                   # a gateway timeout may hide a commit
    (302, None, U), (100, None, U),                   # not what a write expects: unknown
    (409, "http_409:concurrent_idempotent_requests", U),  # Resend: first request in flight
    (409, "http_409:invalid_idempotent_request", U),      # Resend: key used before: held
    (409, "http_409:CONFLICT", P),
    (403, "http_403:REQUEST_LIMIT_EXCEEDED", T),          # Salesforce: org API limit
    (403, "http_403:INSUFFICIENT_ACCESS", P),             # Salesforce: a real permission
    (401, "http_401:INVALID_SESSION_ID", P),              # Salesforce: expired credential
    (400, "http_400:UNABLE_TO_LOCK_ROW", T),              # Salesforce: row locked, retry
    (400, "http_400:INVALID_FIELD", P),
    (404, "http_404:NOT_FOUND", P),
    (300, "http_300:MULTIPLE_MATCHES", P),                # Salesforce: never pick one
    (300, None, U),
    (429, "http_429:SECONDLY", T), (429, "http_429:TEN_SECONDLY_ROLLING", T),  # HubSpot
    (207, "http_207:VALIDATION_ERROR", P),                # HubSpot multi-status
    (207, "http_207:RATE_LIMITS", T),
    (207, "http_207:SOMETHING_NEW", U),                   # unknown: reconcile first
]


@pytest.mark.parametrize(("status", "reason", "expected"), STATUS_TABLE)
def test_status_codes(status: int, reason: str | None, expected: Category) -> None:
    assert classify_status(status, None, reason).category is expected


def _request() -> httpx.Request:
    return httpx.Request("POST", "http://crm.test/x")


EXCEPTION_TABLE = [
    # Never sent: nothing can have happened.
    (httpx.ConnectError("refused", request=_request()), T),
    (httpx.ConnectTimeout("slow connect", request=_request()), T),
    (httpx.PoolTimeout("pool", request=_request()), T),
    (httpx.UnsupportedProtocol("ftp", request=_request()), T),
    (ConnectionRefusedError(), T),
    # Sent, answer lost: the side effect may exist.
    (httpx.ReadTimeout("read", request=_request()), U),
    (httpx.WriteTimeout("write", request=_request()), U),
    (httpx.ReadError("reset", request=_request()), U),
    (httpx.WriteError("broken pipe", request=_request()), U),
    (httpx.RemoteProtocolError("dropped", request=_request()), U),
    (httpx.CloseError("close", request=_request()), U),
    (TimeoutError(), U),
    (ConnectionResetError(), U),
    (RuntimeError("anything else"), U),
    # SMTP (smtplib): 4xx replies were not taken, 5xx never will be; a drop is unknown.
    (smtplib.SMTPConnectError(421, b"busy"), T),
    (smtplib.SMTPSenderRefused(451, b"try later", "a@x.test"), T),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (450, b"busy")}), T),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (550, b"no such user")}), P),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (450, b"b"), "b@x.test": (550, b"n")}), P),
    (smtplib.SMTPDataError(451, b"local error"), T),
    (smtplib.SMTPDataError(421, b"closing"), T),
    (smtplib.SMTPDataError(554, b"rejected"), P),
    (smtplib.SMTPAuthenticationError(535, b"bad credentials"), P),
    (smtplib.SMTPHeloError(501, b"bad helo"), P),
    (smtplib.SMTPResponseException(-1, b"garbled"), U),
    (smtplib.SMTPServerDisconnected("Connection unexpectedly closed"), U),
    (smtplib.SMTPNotSupportedError("STARTTLS extension not supported"), P),
    (smtplib.SMTPException("anything else"), U),
    (ssl.SSLCertVerificationError("self-signed"), P),
    (socket.gaierror(-2, "Name or service not known"), T),
]


@pytest.mark.parametrize(("exc", "expected"), EXCEPTION_TABLE,
                         ids=[type(e).__name__ for e, _ in EXCEPTION_TABLE])
def test_exceptions(exc: BaseException, expected: Category) -> None:
    assert classify_exception(exc).category is expected


def test_http_status_error_uses_the_status_table() -> None:
    response = httpx.Response(429, headers={"Retry-After": "7"}, request=_request())
    classified = classify_exception(httpx.HTTPStatusError("x", request=_request(),
                                                          response=response))
    assert (classified.category, classified.retry_after) == (T, 7.0)


@pytest.mark.parametrize(("header", "seconds"), [
    ("3", 3.0), ("0", 0.0), ("1.5", 1.5), (" 10 ", 10.0), ("-4", 0.0), ("", None), (None, None),
    ("soon", None),
    ("Sun, 29 Nov 2026 10:00:30 GMT", 30.0),
])
def test_retry_after_forms(header: str | None, seconds: float | None) -> None:
    now = 1795946400.0  # Sun, 29 Nov 2026 10:00:00 GMT
    assert parse_retry_after(header, now=now) == seconds


def test_retry_after_is_honoured_and_capped() -> None:
    polite = to_application_error(classify_status(429, "20"), max_retry_after=300)
    assert polite.type == ErrorType.TRANSIENT.value and not polite.non_retryable
    assert polite.next_retry_delay == timedelta(seconds=20)
    greedy = to_application_error(classify_status(503, "86400"), max_retry_after=300)
    assert greedy.next_retry_delay == timedelta(seconds=300)
    assert to_application_error(classify_status(500), max_retry_after=300).next_retry_delay is None


NOW = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(("status", "header", "expected"), [
    (429, "3600", ("park", timedelta(hours=1))),         # parks for an hour, no attempt spent
    (503, "86400", ("park", timedelta(days=1))),         # up to the cap
    (429, "86401", ("block", None)),                     # past it: a person decides
    (429, "300", ("retry", None)),                       # waited in place (an attempt)
    (429, None, ("retry", None)),
    (401, "3600", ("block", None)),                      # permanent anyway
    (504, "3600", ("retry", None)),                      # unknown: reconciled, not parked
])
def test_a_long_retry_after_parks_up_to_the_cap(
        status: int, header: str | None, expected: tuple[str, timedelta | None]) -> None:
    classified = classify_status(status, header)
    parked = park_long_retry_after(classified, max_retry_after=300, max_park=86_400, now=NOW)
    kind, delay = expected
    if kind == "park":
        assert parked.category is T and parked.park_until == NOW + delay
    elif kind == "block":
        assert parked.category is P and parked.park_until is None
        error = to_application_error(parked, max_retry_after=300)
        assert (error.type, error.non_retryable) == (ErrorType.PERMANENT.value, True)
        if status == 429:
            assert error.message == "permanent: http_429:retry_after_over_cap"
    else:
        assert parked == classified


def test_a_daily_park_is_left_as_it_is() -> None:
    daily = classify_status(429, None, "http_429:DAILY")
    assert park_long_retry_after(daily, max_retry_after=300, max_park=60) == daily


def test_application_errors_by_category() -> None:
    permanent = to_application_error(classify_status(401), max_retry_after=60)
    assert (permanent.type, permanent.non_retryable) == (ErrorType.PERMANENT.value, True)
    unknown = to_application_error(classify_status(504), max_retry_after=60)
    assert (unknown.type, unknown.non_retryable) == (ErrorType.UNKNOWN_OUTCOME.value, False)
    # Where the destination cannot be reconciled (SMTP), unknown means held for a person.
    ambiguous = to_application_error(classify_status(504), max_retry_after=60,
                                     reconcilable=False)
    assert (ambiguous.type, ambiguous.non_retryable) == (ErrorType.AMBIGUOUS.value, True)


def test_messages_carry_no_payload() -> None:
    error = to_application_error(classify_status(422, None, "http_422:validation_error"),
                                 max_retry_after=60)
    assert error.message == "permanent: http_422:validation_error"


@pytest.mark.parametrize(("reason", "seconds"), [
    ("http_429:SECONDLY", 1.0), ("http_429:TEN_SECONDLY_ROLLING", 10.0),
    ("http_429:TEN_SECONDLY", 10.0),
    ("http_403:REQUEST_LIMIT_EXCEEDED", 60.0), ("http_429", None),
])
def test_documented_windows_without_retry_after(reason: str, seconds: float | None) -> None:
    status = int(reason.split(":")[0].removeprefix("http_"))
    assert classify_status(status, None, reason).retry_after == seconds
    assert classify_status(status, "3", reason).retry_after in (3.0, None)  # the header wins


@pytest.mark.parametrize(("exc", "expected"), [
    (smtplib.SMTPServerDisconnected("dropped"), T),   # before the data: nothing delivered
    (TimeoutError(), T),
    (httpx.ReadTimeout("read", request=_request()), T),
    (smtplib.SMTPRecipientsRefused({"a@x.test": (550, b"no")}), P),  # an answer stays one
])
def test_not_sent_is_never_unknown(exc: BaseException, expected: Category) -> None:
    assert classify_exception(exc, sent=False).category is expected


def test_smtp_read_timeout_is_named() -> None:
    """smtplib raises SMTPServerDisconnected while handling the socket timeout."""
    assert classify_exception(smtplib.SMTPServerDisconnected("x")).reason == "smtp_disconnected"
    try:
        try:
            raise TimeoutError("timed out")
        except OSError:
            raise smtplib.SMTPServerDisconnected("Connection unexpectedly closed")  # noqa: B904
    except smtplib.SMTPServerDisconnected as caught:
        classified = classify_exception(caught)
    assert (classified.category, classified.reason) == (U, "smtp_timeout")


def test_hubspot_daily_limit_parks_until_the_reset_and_the_short_ones_wait() -> None:
    """DAILY: no retry on a backoff (it would fail until midnight and spend the budget) but a
    park until the next reset; SECONDLY/TEN_SECONDLY: a short wait, no park."""
    daily = classify_status(429, None, "http_429:DAILY")
    assert (daily.category, daily.retry_after) == (T, None)
    assert daily.park_until is not None
    assert daily.park_until - datetime.now(UTC) <= timedelta(days=1, minutes=5)
    assert daily.park_until.hour == 0 and daily.park_until.minute == 5
    for policy in ("SECONDLY", "TEN_SECONDLY_ROLLING"):
        assert classify_status(429, "2", f"http_429:{policy}").park_until is None
    evening = datetime(2026, 3, 1, 23, 59, tzinfo=UTC)
    assert next_daily_reset(evening) == datetime(2026, 3, 2, 0, 5, tzinfo=UTC)


def test_resend_key_used_with_another_payload_is_held() -> None:
    """`invalid_idempotent_request`: something was already sent under this key and nothing
    can confirm what: ambiguous, never blocked-and-retried, never resent under a new key."""
    error = to_application_error(
        classify_status(409, None, "http_409:invalid_idempotent_request"), max_retry_after=60)
    assert (error.type, error.non_retryable) == (ErrorType.AMBIGUOUS.value, True)
    # The first request with the key is still running: it may yet send. Not a failure that
    # frees the intent (an opt-out must wait), but an outcome to reconcile by repeating later.
    busy = to_application_error(
        classify_status(409, None, "http_409:concurrent_idempotent_requests"), max_retry_after=60)
    assert (busy.type, busy.non_retryable) == (ErrorType.UNKNOWN_OUTCOME.value, False)
