"""Provider request IDs at the one HTTP layer (inboxcrm/adapters/http.py): the provider's
header is read from every answer, success or error, kept only when it is a bounded, plain
value, carried on the `AdapterError`, and reset before each request so a request without an
answer never inherits an earlier one's. The ledger and audit side is
tests/test_request_ids.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from inboxcrm.adapters import http
from inboxcrm.adapters.base import AdapterError


def _response(**headers: str) -> httpx.Response:
    return httpx.Response(200, headers=headers)


@pytest.mark.parametrize(("headers", "expected"), [
    ({"X-HubSpot-Correlation-Id": "a2d3acb6-f78c-476e-9811-860509ae9e20"},
     "a2d3acb6-f78c-476e-9811-860509ae9e20"),
    ({"x-request-id": " req_01HZX9:abc.def/+= "}, "req_01HZX9:abc.def/+="),
    ({"Request-Id": "r-1"}, "r-1"),
    # HubSpot's header wins over a generic one the same answer carries.
    ({"X-Request-Id": "generic", "X-HubSpot-Correlation-Id": "hubspot"}, "hubspot"),
    ({}, None),
    ({"X-Request-Id": "x" * 128}, "x" * 128),
    ({"X-Request-Id": "x" * 129}, None),                      # over the bound: dropped
    ({"X-Request-Id": "<script>alert(1)</script>"}, None),     # markup
    ({"X-Request-Id": "two words"}, None),                     # whitespace
    ({"X-Request-Id": "-leading-dash"}, None),
    ({"X-Request-Id": "jane@example.com"}, None),              # not an ID's charset
])
def test_only_a_bounded_plain_request_id_is_kept(headers: dict[str, str],
                                                  expected: str | None) -> None:
    assert http.request_id_of(_response(**headers)) == expected


def _client(answers: list[httpx.Response | Exception]) -> httpx.AsyncClient:
    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer
    return httpx.AsyncClient(base_url="http://provider.test",
                             transport=httpx.MockTransport(handler))


def test_the_last_answer_and_an_error_carry_their_request_id() -> None:
    async def run() -> tuple[str | None, AdapterError, str | None, str | None]:
        client = _client([
            httpx.Response(200, headers={"X-Request-Id": "ok-1"}),
            httpx.Response(401, headers={"X-Request-Id": "denied-2"}),
            httpx.ReadTimeout("no answer"),
        ])
        http.clear_request_id()
        await http.send_request(client, "GET", "/a")
        after_success = http.last_request_id()
        with pytest.raises(AdapterError) as failed:
            await http.send_request(client, "POST", "/b")
        after_failure = http.last_request_id()
        with pytest.raises(AdapterError):
            await http.send_request(client, "POST", "/c")
        return after_success, failed.value, after_failure, http.last_request_id()

    success, error, failure, timeout = asyncio.run(run())
    assert success == "ok-1"
    assert (error.request_id, failure) == ("denied-2", "denied-2")
    assert timeout is None  # no answer: not the 401's ID
