"""The sandbox over real HTTP: duplicate-safety contracts, search lag, faults, control API."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from collections import Counter
from typing import Any

import asyncpg
import httpx
import pytest

from inboxcrm.sandbox import crm
from inboxcrm.sandbox.app import init_connection
from inboxcrm.sandbox.crm import UpsertInput
from tests.helpers.sandbox_process import HANG, SEARCH_LAG, SandboxProcess, free_port

UPSERT = "/crm/v3/objects/contacts/batch/upsert"
SEARCH = "/crm/v3/objects/contacts/search"
CONTACTS = "/crm/v3/objects/contacts"
ID_PROP = "inboxcrm_contact_id"
SHORT = httpx.Timeout(0.5)


def contact(cid: str, **properties: str) -> dict[str, Any]:
    return {"idProperty": ID_PROP, "id": cid, "properties": properties}


async def upsert(
    client: httpx.AsyncClient, cid: str, timeout: Any = httpx.USE_CLIENT_DEFAULT, **props: str
) -> httpx.Response:
    return await client.post(UPSERT, json={"inputs": [contact(cid, **props)]}, timeout=timeout)


async def search_eq(client: httpx.AsyncClient, prop: str, value: str, **kw: Any) -> httpx.Response:
    body = {
        "filterGroups": [{"filters": [{"propertyName": prop, "operator": "EQ", "value": value}]}]
    }
    return await client.post(SEARCH, json=body, **kw)


def email_body(to: str = "ada@example.com", subject: str = "Thanks") -> dict[str, Any]:
    return {
        "from": "Sales <sales@acme.test>",
        "to": [to],
        "subject": subject,
        "text": "We got your message.",
        "headers": {"X-Entity-Ref-ID": "abc"},
    }


async def send(
    client: httpx.AsyncClient,
    key: str | None,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
    **kw: Any,
) -> httpx.Response:
    headers = dict(headers or {})
    if key is not None:
        headers["Idempotency-Key"] = key
    return await client.post("/emails", json=body or email_body(), headers=headers, **kw)


async def state(anon: httpx.AsyncClient) -> dict[str, Any]:
    response = await anon.get("/_sandbox/state")
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result


async def add_fault(anon: httpx.AsyncClient, target: str, mode: str, **extra: Any) -> None:
    response = await anon.post("/_sandbox/faults", json={"target": target, "mode": mode, **extra})
    assert response.status_code == 200, response.text


async def calls(anon: httpx.AsyncClient, target: str | None = None) -> list[dict[str, Any]]:
    params = {"target": target} if target else {}
    result: list[dict[str, Any]] = (await anon.get("/_sandbox/calls", params=params)).json()[
        "calls"
    ]
    return result


# --- CRM ------------------------------------------------------------------------------


async def test_upsert_same_id_twice_updates_one_record(client, anon) -> None:
    first = await upsert(client, "c-1", email="ada@example.com", firstname="Ada")
    second = await upsert(client, "c-1", lastname="Lovelace")
    assert first.status_code == second.status_code == 200
    one, two = first.json()["results"][0], second.json()["results"][0]
    assert first.json()["status"] == "COMPLETE"
    assert one["id"] == two["id"] and one["id"].isdigit()
    assert (one["new"], two["new"]) == (True, False)
    assert two["properties"] == {
        "email": "ada@example.com",
        "firstname": "Ada",
        "lastname": "Lovelace",
        ID_PROP: "c-1",
    }
    contacts = (await state(anon))["contacts"]
    assert [c["id"] for c in contacts] == [one["id"]]


async def test_twenty_concurrent_identical_upserts_make_one_record(client, anon) -> None:
    """Several rounds, because the race inside Postgres only shows up now and then."""
    for rnd in range(5):
        responses = await asyncio.gather(
            *(upsert(client, f"c-race-{rnd}", email=f"race{rnd}@example.com") for _ in range(20))
        )
        assert [r.status_code for r in responses] == [200] * 20, [r.text for r in responses]
        ids = {r.json()["results"][0]["id"] for r in responses}
        assert len(ids) == 1
        assert sum(r.json()["results"][0]["new"] for r in responses) == 1
    assert len((await state(anon))["contacts"]) == 5


async def test_upsert_survives_races_inside_postgres(anon, database_url: str) -> None:
    """Direct calls, many at once: the loser of a speculative-insertion race gets a unique
    violation on email or a deadlock from Postgres, and must retry into the update path."""
    pool = await asyncpg.create_pool(database_url, min_size=30, max_size=30, init=init_connection)
    try:
        for rnd in range(10):
            item = UpsertInput(ID_PROP, f"c-pg-{rnd}", {"email": f"pg{rnd}@example.com"})
            outcomes = await asyncio.gather(*(crm.upsert(pool, [item]) for _ in range(30)))
            assert {o.response.status_code for o in outcomes} == {200}
    finally:
        await pool.close()
    assert len((await state(anon))["contacts"]) == 10


async def test_email_owned_by_another_record_is_409_and_writes_nothing(client, anon) -> None:
    owner = (await upsert(client, "c-a", email="Ada@Example.com")).json()["results"][0]["id"]
    batch = {
        "inputs": [
            contact("c-new", email="new@example.com"),
            contact("c-b", email="ada@example.COM"),
        ]
    }
    response = await client.post(UPSERT, json=batch)
    assert response.status_code == 409
    body = response.json()
    assert body["status"] == "error" and body["category"] == "CONFLICT"
    assert body["message"] == f"Contact already exists. Existing ID: {owner}"
    assert body["context"] == {"id": [owner]}
    contacts = (await state(anon))["contacts"]
    assert [c["properties"][ID_PROP] for c in contacts] == ["c-a"]  # batch was all-or-nothing


async def test_concurrent_upserts_racing_for_one_email_make_one_record(client, anon) -> None:
    responses = await asyncio.gather(
        *(upsert(client, f"c-{n}", email="same@example.com") for n in range(10))
    )
    assert Counter(r.status_code for r in responses) == {200: 1, 409: 9}
    winner = next(r for r in responses if r.status_code == 200).json()["results"][0]["id"]
    assert {r.json()["context"]["id"][0] for r in responses if r.status_code == 409} == {winner}
    assert len((await state(anon))["contacts"]) == 1


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"inputs": []},
        {"inputs": [{"id": "x", "properties": {}}]},
        {"inputs": [contact("c-1", email="not-an-email")]},
        {"inputs": [contact("c-1"), contact("c-1")]},
    ],
)
async def test_invalid_upsert_is_400(client, anon, body) -> None:
    response = await client.post(UPSERT, json=body)
    assert response.status_code == 400
    assert response.json()["category"] == "VALIDATION_ERROR"
    assert response.json()["message"]
    assert (await state(anon))["contacts"] == []


async def test_search_lags_but_get_is_read_after_write(client) -> None:
    created = (await upsert(client, "c-lag", email="lag@example.com")).json()["results"][0]
    written = time.monotonic()
    assert (await search_eq(client, ID_PROP, "c-lag")).json() == {"total": 0, "results": []}
    by_prop = await client.get(f"{CONTACTS}/c-lag", params={"idProperty": ID_PROP})
    by_id = await client.get(f"{CONTACTS}/{created['id']}")
    assert by_prop.status_code == by_id.status_code == 200
    assert by_prop.json()["id"] == by_id.json()["id"] == created["id"]
    assert by_prop.json()["properties"]["email"] == "lag@example.com"

    await asyncio.sleep(max(0.0, SEARCH_LAG + 0.2 - (time.monotonic() - written)))
    found = (await search_eq(client, ID_PROP, "c-lag")).json()
    assert found["total"] == 1 and found["results"][0]["id"] == created["id"]
    by_email = (await search_eq(client, "email", "LAG@example.com")).json()
    assert [r["id"] for r in by_email["results"]] == [created["id"]]

    await upsert(client, "c-lag", firstname="Later")  # a new write hides it again
    assert (await search_eq(client, ID_PROP, "c-lag")).json()["total"] == 0


async def test_search_or_groups_and_validation(client, anon) -> None:
    await anon.post("/_sandbox/config", json={"search_lag_seconds": 0})
    for n in range(3):
        await upsert(client, f"c-{n}", email=f"p{n}@example.com", company="Acme")
    groups = [
        {"filters": [{"propertyName": ID_PROP, "operator": "EQ", "value": "c-0"}]},
        {"filters": [{"propertyName": "email", "operator": "EQ", "value": "P2@example.com"}]},
    ]
    found = (await client.post(SEARCH, json={"filterGroups": groups})).json()
    assert sorted(r["properties"][ID_PROP] for r in found["results"]) == ["c-0", "c-2"]
    paged = (await client.post(SEARCH, json={"filterGroups": [], "limit": 2})).json()
    assert paged["total"] == 3 and len(paged["results"]) == 2
    assert paged["paging"]["next"]["after"] == "2"
    bad = {"filterGroups": [{"filters": [{"propertyName": "x", "operator": "LIKE", "value": 1}]}]}
    response = await client.post(SEARCH, json=bad)
    assert response.status_code == 400 and response.json()["category"] == "VALIDATION_ERROR"


async def test_get_unknown_contact_is_404(client) -> None:
    for path, params in [
        (f"{CONTACTS}/999999", {}),
        (f"{CONTACTS}/nope", {"idProperty": ID_PROP}),
        (f"{CONTACTS}/abc", {}),
    ]:
        response = await client.get(path, params=params)
        assert response.status_code == 404
        assert response.json()["category"] == "OBJECT_NOT_FOUND"


# --- mail -----------------------------------------------------------------------------


async def test_same_key_same_payload_sends_once(client, anon) -> None:
    first, second = await send(client, "k-1"), await send(client, "k-1")
    assert first.status_code == second.status_code == 200
    assert first.json()["id"] == second.json()["id"]
    emails = (await state(anon))["emails"]
    assert [(e["id"], e["idempotency_key"], e["to"]) for e in emails] == [
        (first.json()["id"], "k-1", ["ada@example.com"])
    ]
    got = (await client.get(f"/emails/{first.json()['id']}")).json()
    assert got["subject"] == "Thanks" and got["idempotency_key"] == "k-1"
    assert got["headers"] == {"X-Entity-Ref-ID": "abc"} and got["from"] == "Sales <sales@acme.test>"
    assert (await client.get("/emails/00000000-0000-0000-0000-000000000000")).status_code == 404


async def test_key_expires_after_24_hours_on_the_sandbox_clock(client, anon) -> None:
    """Resend keeps a key for 24 h after its first request: the sandbox clock moves past
    that, and the same request sends a second email."""
    first = (await send(client, "k-exp")).json()["id"]
    (await anon.post("/_sandbox/clock", json={"advance_seconds": 23 * 3600})).raise_for_status()
    assert (await send(client, "k-exp")).json()["id"] == first
    (await anon.post("/_sandbox/clock", json={"advance_seconds": 2 * 3600})).raise_for_status()
    second = (await send(client, "k-exp")).json()["id"]
    assert second != first
    assert (await send(client, "k-exp", email_body(subject="Other"))).status_code == 409
    assert [e["idempotency_key"] for e in (await state(anon))["emails"]] == ["k-exp"] * 2
    clock = (await anon.get("/_sandbox/clock")).json()
    assert clock["offset_seconds"] == 25 * 3600
    (await anon.post("/_sandbox/reset")).raise_for_status()
    assert (await anon.get("/_sandbox/clock")).json()["offset_seconds"] == 0
    assert (await anon.post("/_sandbox/clock", json={})).status_code == 422


async def test_list_pages_newest_first_and_ignores_unknown_filters(client, anon) -> None:
    """Only limit/after/before, as on Resend: `?idempotency_key=` filters nothing."""
    ids = [(await send(client, f"k-list-{n}", email_body(subject=f"S{n}"))).json()["id"]
           for n in range(5)]
    newest_first = ids[::-1]
    whole = (await client.get("/emails", params={"idempotency_key": "k-list-0"})).json()
    assert ([e["id"] for e in whole["data"]], whole["has_more"]) == (newest_first, False)
    page = (await client.get("/emails", params={"limit": 2})).json()
    assert ([e["id"] for e in page["data"]], page["has_more"]) == (newest_first[:2], True)
    page = (await client.get("/emails", params={"limit": 2, "after": newest_first[1]})).json()
    assert ([e["id"] for e in page["data"]], page["has_more"]) == (newest_first[2:4], True)
    page = (await client.get("/emails", params={"limit": 2, "before": newest_first[3]})).json()
    assert [e["id"] for e in page["data"]] == newest_first[1:3]
    for bad in ({"limit": 0}, {"limit": 101}, {"after": "nope"}):
        assert (await client.get("/emails", params=bad)).status_code == 422


async def test_key_reuse_with_other_payload_is_409(client, anon) -> None:
    assert (await send(client, "k-2")).status_code == 200
    response = await send(client, "k-2", email_body(subject="Something else"))
    assert response.status_code == 409
    assert response.json()["name"] == "invalid_idempotent_request"
    assert response.json()["statusCode"] == 409
    assert len((await state(anon))["emails"]) == 1


async def test_no_key_means_no_dedupe(client, anon) -> None:
    assert (await send(client, None)).status_code == 200
    assert (await send(client, None)).status_code == 200
    assert len((await state(anon))["emails"]) == 2


@pytest.mark.parametrize("drop", ["to", "from", "subject"])
async def test_mail_validation_is_422(client, anon, drop) -> None:
    body = email_body()
    del body[drop]
    response = await send(client, "k-val", body)
    assert response.status_code == 422
    assert response.json()["name"] == "validation_error" and response.json()["message"]
    assert (await state(anon))["emails"] == []


async def test_twenty_concurrent_sends_with_one_key_send_once(client, anon) -> None:
    responses = await asyncio.gather(*(send(client, "k-race") for _ in range(20)))
    ok = {r.json()["id"] for r in responses if r.status_code == 200}
    others = {r.json()["name"] for r in responses if r.status_code != 200}
    assert len(ok) == 1 and others <= {"concurrent_idempotent_requests"}
    assert len((await state(anon))["emails"]) == 1
    assert (await send(client, "k-race")).json()["id"] in ok


async def test_in_flight_key_is_409_concurrent_then_released(client, anon) -> None:
    """timeout_before_commit holds the key: retries are refused until it ends, then send."""
    await add_fault(anon, "mail.send", "timeout_before_commit")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await send(client, "k-hang", timeout=SHORT)
    retry = await send(client, "k-hang")
    assert retry.status_code == 409 and retry.json()["name"] == "concurrent_idempotent_requests"
    other = await send(client, "k-hang", email_body(subject="Other"))
    assert other.json()["name"] == "invalid_idempotent_request"
    assert (await state(anon))["emails"] == []

    await asyncio.sleep(max(0.0, HANG + 0.3 - (time.monotonic() - started)))
    assert (await state(anon))["emails"] == []  # the hung request wrote nothing at the end
    final = await send(client, "k-hang")
    assert final.status_code == 200
    assert [e["id"] for e in (await state(anon))["emails"]] == [final.json()["id"]]
    outcomes = [c["outcome"] for c in await calls(anon, "mail.send")]
    assert outcomes == ["timeout_before_commit", "in_flight", "idempotency_mismatch", "ok"]


async def test_after_commit_timeout_sent_once_and_replays_same_id(client, anon) -> None:
    await add_fault(anon, "mail.send", "timeout_after_commit")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await send(client, "k-late", timeout=SHORT)
    emails = (await state(anon))["emails"]
    assert len(emails) == 1  # committed before the hang
    retry = await send(client, "k-late")  # committed: the same email, before the answer came
    assert retry.status_code == 200 and retry.json()["id"] == emails[0]["id"]
    await asyncio.sleep(max(0.0, HANG + 0.3 - (time.monotonic() - started)))
    replay = await send(client, "k-late")
    assert replay.status_code == 200 and replay.json()["id"] == emails[0]["id"]
    assert len((await state(anon))["emails"]) == 1


# --- faults ---------------------------------------------------------------------------


async def call(client: httpx.AsyncClient, target: str, **kw: Any) -> httpx.Response:
    """One representative call per fault target."""
    if target == "crm.upsert":
        return await upsert(client, "c-f", email="f@example.com", **kw)
    if target == "crm.search":
        return await search_eq(client, ID_PROP, "c-f", **kw)
    return await send(client, "k-f", **kw)


async def records(anon: httpx.AsyncClient) -> int:
    current = await state(anon)
    return len(current["contacts"]) + len(current["emails"])


EXPECTED_FAULTS = {
    ("rate_limit", "crm"): (429, "category", "RATE_LIMITS"),
    ("rate_limit", "mail"): (429, "name", "rate_limit_exceeded"),
    ("server_error", "crm"): (500, "status", "error"),
    ("server_error", "mail"): (500, "statusCode", 500),
    ("invalid_field", "crm"): (400, "category", "VALIDATION_ERROR"),
    ("invalid_field", "mail"): (422, "name", "validation_error"),
    ("unauthorized", "crm"): (401, "category", "INVALID_AUTHENTICATION"),
    ("unauthorized", "mail"): (403, "name", "invalid_api_key"),
}


@pytest.mark.parametrize("target", ["crm.upsert", "crm.search", "mail.send"])
@pytest.mark.parametrize("mode", ["rate_limit", "server_error", "invalid_field", "unauthorized"])
async def test_immediate_fault_answers_once_and_writes_nothing(client, anon, target, mode) -> None:
    await add_fault(anon, target, mode)
    faulted = await call(client, target)
    status, field, value = EXPECTED_FAULTS[(mode, target.split(".")[0])]
    assert faulted.status_code == status
    assert faulted.json()[field] == value
    if mode == "rate_limit":
        assert faulted.headers["retry-after"] == "1"
        if target.startswith("crm"):
            assert faulted.json()["policyName"] == "SECONDLY"
            assert faulted.json()["errorType"] == "RATE_LIMIT"
    assert await records(anon) == 0
    assert (await call(client, target)).status_code == 200  # fault consumed
    log = await calls(anon, target)
    assert [(c["outcome"], c["status_code"]) for c in log] == [(mode, status), ("ok", 200)]


@pytest.mark.parametrize("target", ["crm.upsert", "crm.search", "mail.send"])
async def test_timeout_before_commit_writes_nothing(client, anon, target) -> None:
    await add_fault(anon, target, "timeout_before_commit")
    started = time.monotonic()
    with pytest.raises(httpx.ReadTimeout):
        await call(client, target, timeout=SHORT)
    assert await records(anon) == 0
    await asyncio.sleep(max(0.0, HANG + 0.3 - (time.monotonic() - started)))
    assert await records(anon) == 0
    assert (await call(client, target)).status_code == 200
    assert await records(anon) == (0 if target == "crm.search" else 1)
    log = await calls(anon, target)
    assert [(c["outcome"], c["status_code"]) for c in log] == [
        ("timeout_before_commit", 504),
        ("ok", 200),
    ]


async def test_timeout_before_commit_answers_504_after_the_hang(client, anon) -> None:
    await anon.post("/_sandbox/config", json={"hang_seconds": 0.2})
    await add_fault(anon, "crm.upsert", "timeout_before_commit")
    response = await call(client, "crm.upsert")
    assert response.status_code == 504
    assert await records(anon) == 0


@pytest.mark.parametrize("target", ["crm.upsert", "crm.search", "mail.send"])
async def test_timeout_after_commit_commits_then_hangs(client, anon, target) -> None:
    await add_fault(anon, target, "timeout_after_commit")
    with pytest.raises(httpx.ReadTimeout):
        await call(client, target, timeout=SHORT)
    if target == "crm.upsert":
        assert len((await state(anon))["contacts"]) == 1  # committed despite the timeout
        retry = await call(client, target)
        assert retry.status_code == 200 and retry.json()["results"][0]["new"] is False
        assert len((await state(anon))["contacts"]) == 1
    elif target == "mail.send":
        assert len((await state(anon))["emails"]) == 1
    else:
        assert (await call(client, target)).status_code == 200
    assert (await calls(anon, target))[0]["outcome"] == "timeout_after_commit"


async def test_timeout_after_commit_returns_success_after_the_hang(client, anon) -> None:
    await anon.post("/_sandbox/config", json={"hang_seconds": 0.2})
    await add_fault(anon, "crm.upsert", "timeout_after_commit")
    response = await call(client, "crm.upsert")
    assert response.status_code == 200 and response.json()["results"][0]["new"] is True


async def test_search_faults_cover_get_by_id(client, anon) -> None:
    await add_fault(anon, "crm.search", "rate_limit", retry_after=7)
    response = await client.get(f"{CONTACTS}/c-1", params={"idProperty": ID_PROP})
    assert response.status_code == 429 and response.headers["retry-after"] == "7"
    assert (await client.get(f"{CONTACTS}/c-1", params={"idProperty": ID_PROP})).status_code == 404


async def test_fault_count_is_consumed_exactly_under_concurrency(client, anon) -> None:
    await add_fault(anon, "crm.upsert", "server_error", count=3)
    await add_fault(anon, "mail.send", "rate_limit", count=4, retry_after=2)
    crm, mails = await asyncio.gather(
        asyncio.gather(*(upsert(client, "c-n", email="n@example.com") for _ in range(10))),
        asyncio.gather(*(send(client, f"k-{n}") for n in range(12))),
    )
    assert Counter(r.status_code for r in crm) == {500: 3, 200: 7}
    assert Counter(r.status_code for r in mails) == {429: 4, 200: 8}
    assert {r.headers["retry-after"] for r in mails if r.status_code == 429} == {"2"}
    current = await state(anon)
    assert len(current["contacts"]) == 1 and len(current["emails"]) == 8
    assert (await anon.get("/_sandbox/faults")).json()["faults"] == []


async def test_faults_are_fifo_and_listed_until_used(client, anon) -> None:
    await add_fault(anon, "crm.upsert", "rate_limit", count=2)
    await add_fault(anon, "crm.upsert", "server_error")
    listed = (await anon.get("/_sandbox/faults")).json()["faults"]
    assert [(f["mode"], f["remaining"]) for f in listed] == [("rate_limit", 2), ("server_error", 1)]
    statuses = [(await call(client, "crm.upsert")).status_code for _ in range(4)]
    assert statuses == [429, 429, 500, 200]

    await add_fault(anon, "mail.send", "server_error", count=5)
    assert (await anon.delete("/_sandbox/faults")).status_code == 200
    assert (await anon.get("/_sandbox/faults")).json()["faults"] == []
    assert (await call(client, "mail.send")).status_code == 200


@pytest.mark.parametrize(
    "body",
    [
        {"target": "crm.delete", "mode": "server_error"},
        {"target": "crm.upsert", "mode": "explode"},
        {"target": "crm.upsert"},
        {"target": "crm.upsert", "mode": "rate_limit", "count": 0},
        {"target": "crm.upsert", "mode": "rate_limit", "retry_after": -1},
    ],
)
async def test_bad_fault_is_422(anon, body) -> None:
    assert (await anon.post("/_sandbox/faults", json=body)).status_code == 422
    assert (await anon.get("/_sandbox/faults")).json()["faults"] == []


# --- auth, inspection, control ----------------------------------------------------------


async def test_api_key_is_required(client, anon) -> None:
    crm = await anon.post(UPSERT, json={"inputs": [contact("c-1")]})
    assert crm.status_code == 401
    assert crm.json()["status"] == "error"
    assert crm.json()["category"] == "INVALID_AUTHENTICATION"
    assert (await search_eq(anon, ID_PROP, "c-1")).status_code == 401
    missing = await send(anon, "k-auth")
    assert (missing.status_code, missing.json()["name"]) == (401, "missing_api_key")
    wrong = await send(anon, "k-auth", headers={"Authorization": "Bearer nope"})
    assert (wrong.status_code, wrong.json()["name"]) == (403, "invalid_api_key")
    assert (await anon.get("/emails")).status_code == 401
    assert await records(anon) == 0
    assert [c["outcome"] for c in await calls(anon, "mail.send")] == ["unauthenticated"] * 2
    assert (await anon.get("/healthz")).json() == {"ok": True}


async def test_calls_log_has_outcomes_and_no_bodies(client, anon) -> None:
    await upsert(client, "c-log", email="log@example.com")
    await search_eq(client, ID_PROP, "c-log")
    await send(client, "k-log")
    await upsert(client, "c-other", email="LOG@example.com")  # conflict
    everything = await calls(anon)
    assert [(c["target"], c["outcome"], c["status_code"]) for c in everything] == [
        ("crm.upsert", "ok", 200),
        ("crm.search", "ok", 200),
        ("mail.send", "ok", 200),
        ("crm.upsert", "conflict", 409),
    ]
    assert all(set(c) == {"target", "outcome", "status_code", "at", "request_id"}
               for c in everything)
    # The request ID the sandbox answered with: opaque, never derived from the request.
    assert all(str(c["request_id"]).startswith("sbx-") for c in everything)
    assert "example.com" not in str(everything)
    assert len(await calls(anon, "crm.upsert")) == 2


async def test_config_is_runtime_and_validated(anon) -> None:
    assert (await anon.get("/_sandbox/config")).json() == {
        "search_lag_seconds": SEARCH_LAG,
        "hang_seconds": HANG,
        "session_seconds": 7200.0,
        "salesforce_duplicate_rule": "alert",
        "crm_fields": {},
    }
    changed = await anon.post("/_sandbox/config", json={"hang_seconds": 3})
    assert changed.json() == {"search_lag_seconds": SEARCH_LAG, "hang_seconds": 3.0,
                              "session_seconds": 7200.0, "salesforce_duplicate_rule": "alert",
                              "crm_fields": {}}
    rule = {"salesforce_duplicate_rule": "sometimes"}
    assert (await anon.post("/_sandbox/config", json=rule)).status_code == 422
    assert (await anon.post("/_sandbox/config", json={"session_seconds": 0})).status_code == 422
    assert (await anon.post("/_sandbox/config", json={"hang_seconds": -1})).status_code == 422
    assert (await anon.post("/_sandbox/config", json={"lag": 1})).status_code == 422


async def test_reset_forgets_everything_but_config(client, anon) -> None:
    await anon.post("/_sandbox/config", json={"search_lag_seconds": 0.5})
    await upsert(client, "c-r", email="r@example.com")
    await send(client, "k-r")
    await add_fault(anon, "crm.search", "server_error")
    assert (await anon.post("/_sandbox/reset")).json() == {"ok": True}
    assert await state(anon) == {"contacts": [], "leads": [], "notes": [], "activities": [],
                                 "emails": []}
    assert await calls(anon) == []
    assert (await anon.get("/_sandbox/faults")).json()["faults"] == []
    assert (await anon.get("/_sandbox/config")).json()["search_lag_seconds"] == 0.5
    # The key is free again after a reset.
    assert (await send(client, "k-r", email_body(subject="New"))).status_code == 200


async def test_state_survives_restart(client, anon, sandbox_process: SandboxProcess) -> None:
    created = (await upsert(client, "c-keep", email="keep@example.com")).json()["results"][0]
    sent = (await send(client, "k-keep")).json()["id"]
    before = await state(anon)
    await sandbox_process.stop()
    await sandbox_process.start()
    assert await state(anon) == before
    again = (await upsert(client, "c-keep", firstname="Kept")).json()["results"][0]
    assert again["id"] == created["id"] and again["new"] is False
    assert (await send(client, "k-keep")).json()["id"] == sent
    assert len(await calls(anon)) == 4


async def test_two_processes_share_state_and_config(client, anon, database_url: str) -> None:
    other = SandboxProcess(database_url, free_port())
    await other.start()
    try:
        headers = {"Authorization": client.headers["Authorization"]}
        async with httpx.AsyncClient(base_url=other.url, headers=headers) as second:
            await anon.post("/_sandbox/config", json={"hang_seconds": 0.25})
            assert (await second.get("/_sandbox/config")).json()["hang_seconds"] == 0.25
            both = await asyncio.gather(
                *(send(http, "k-both") for http in (client, second, client, second))
            )
            ids = {r.json()["id"] for r in both if r.status_code == 200}
            assert len(ids) == 1
            assert (await send(second, "k-both")).json()["id"] in ids
            assert len((await state(anon))["emails"]) == 1
    finally:
        await other.stop()
        other.log.unlink(missing_ok=True)


async def test_port_in_use_is_a_one_line_error(database_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sandbox",
            "--port",
            str(port),
            env={**os.environ, "DATABASE_URL": database_url},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0], err.decode()
