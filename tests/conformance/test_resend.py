"""Resend through the resend SDK: sending with an Idempotency-Key (and its 24 h window on
the sandbox clock), reading, listing, and the errors the Resend adapter relies on, as the
SDK raises them."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest
import resend
from resend.emails._email import Email
from resend.exceptions import (
    ApplicationError,
    InvalidApiKeyError,
    MissingApiKeyError,
    RateLimitError,
    ResendError,
)

from tests.helpers.conformance import assert_fits, check_idempotency_key_expires, use_resend
from tests.helpers.sandbox_process import API_KEY, SandboxProcess


def email(subject: str = "Thanks") -> Any:
    return {"from": "Sales <sales@acme.test>", "to": ["ada@example.com"], "subject": subject,
            "text": "We got your message.", "headers": {"X-Entity-Ref-ID": "abc"}}


@pytest.fixture(autouse=True)
def configured(sandbox: SandboxProcess) -> None:
    use_resend(sandbox.url, API_KEY)


async def emails_at(sandbox: SandboxProcess) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        return list((await control.get("/_sandbox/state")).json()["emails"])


def move_clock(sandbox: SandboxProcess) -> Any:
    def advance(seconds: float) -> None:
        httpx.post(f"{sandbox.url}/_sandbox/clock",
                   json={"advance_seconds": seconds}).raise_for_status()
    return advance


async def test_same_key_answers_the_first_email_and_sends_nothing(sandbox: SandboxProcess
                                                                  ) -> None:
    key = str(uuid.uuid4())
    first = resend.Emails.send(email(), {"idempotency_key": key})
    again = resend.Emails.send(email(), {"idempotency_key": key})
    assert_fits(resend.Emails.SendResponse, first)
    assert first["id"] == again["id"]
    assert len(await emails_at(sandbox)) == 1
    with pytest.raises(ResendError) as reused:
        resend.Emails.send(email("Other"), {"idempotency_key": key})
    assert (str(reused.value.code), reused.value.error_type) == (
        "409", "invalid_idempotent_request")
    got = resend.Emails.get(first["id"])
    assert_fits(Email, got)
    assert got["id"] == first["id"] and got["subject"] == "Thanks"


async def test_key_expires_after_24_hours(sandbox: SandboxProcess) -> None:
    check_idempotency_key_expires(sandbox.url, API_KEY, move_clock(sandbox))
    assert len(await emails_at(sandbox)) == 2


async def test_list_is_newest_first_paged_and_has_no_key_filter(sandbox: SandboxProcess
                                                                ) -> None:
    ids = [resend.Emails.send(email(f"S{n}"), {"idempotency_key": str(uuid.uuid4())})["id"]
           for n in range(3)]
    page = resend.Emails.list({"limit": 2})
    assert_fits(resend.Emails.ListResponse, page)
    for item in page["data"]:
        assert_fits(Email, item)
    assert ([e["id"] for e in page["data"]], page["has_more"]) == (ids[::-1][:2], True)
    rest = resend.Emails.list({"limit": 2, "after": ids[1]})
    assert ([e["id"] for e in rest["data"]], rest["has_more"]) == ([ids[0]], False)
    # An unknown filter is ignored, as on Resend: the whole list, not a lookup by key.
    async with httpx.AsyncClient(base_url=sandbox.url,
                                 headers={"Authorization": f"Bearer {API_KEY}"}) as raw:
        unfiltered = (await raw.get("/emails", params={"idempotency_key": "nothing"})).json()
    assert_fits(resend.Emails.ListResponse, unfiltered)
    assert [e["id"] for e in unfiltered["data"]] == ids[::-1]


async def test_credentials_are_refused_as_resend_refuses_them(sandbox: SandboxProcess) -> None:
    use_resend(sandbox.url, "re_wrong")
    with pytest.raises(InvalidApiKeyError) as wrong:
        resend.Emails.send(email(), {"idempotency_key": str(uuid.uuid4())})
    assert str(wrong.value.code) == "403"
    use_resend(sandbox.url, "")
    with pytest.raises(MissingApiKeyError):
        resend.Emails.list()
    assert await emails_at(sandbox) == []


@pytest.mark.parametrize(("mode", "error"), [("rate_limit", RateLimitError),
                                             ("server_error", ApplicationError)])
async def test_faults_raise_the_sdk_errors(sandbox: SandboxProcess, mode: str,
                                          error: type[Exception]) -> None:
    async with httpx.AsyncClient(base_url=sandbox.url) as control:
        (await control.post("/_sandbox/faults",
                            json={"target": "mail.send", "mode": mode})).raise_for_status()
    with pytest.raises(error):
        resend.Emails.send(email(), {"idempotency_key": str(uuid.uuid4())})
