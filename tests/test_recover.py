"""Bounded batch recovery (`inboxcrm recover`, docs/architecture.md §6) on the real stack: a
CRM token expires (the sandbox answers crm.upsert with 401), N items of acme block with
`http_401`, next to items blocked for another reason and another tenant's. `--dry-run` lists
exactly those N and changes nothing; with the token back, `recover --yes --limit N` retries
exactly those through the reviewer's own retry path, each completes, the destination holds
one contact per person and one email per intent, and every operation key is the one it had."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from typing import Any

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.cli import cli

N = 40  # the "40 http_401 items of acme"
OPS = """SELECT op_key, action, first_seen FROM operations WHERE workflow_id = ANY($1::text[])
         ORDER BY op_key"""


def recover(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it (a batch of retries takes longer than one command)."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", "recover", *args],
                          env=stack.env, capture_output=True, text=True, timeout=240,
                          check=False)


async def _deliver_all(env: StackClient, emails: list[str], **where: str) -> list[str]:
    raws = [message_from(email) for email in emails]
    if where:
        raws = [raw.replace("sales@acme.test", where["mailbox"]) for raw in raws]
    return list(await asyncio.gather(*(env.deliver(raw, **where) for raw in raws)))


async def _blocked(env: StackClient, workflow_ids: list[str]) -> set[str | None]:
    states = await asyncio.gather(*(env.wait_state(w, "blocked", timeout=120)
                                    for w in workflow_ids))
    return {reason for _, reason in states}


async def _keys(env: StackClient, workflow_ids: list[str]) -> list[tuple[str, str, Any]]:
    async with env.db.acquire() as conn:
        return [(r["op_key"], r["action"], r["first_seen"])
                for r in await conn.fetch(OPS, workflow_ids)]


async def test_recover_retries_exactly_the_selected_items_keeping_their_keys(
    env: StackClient, stack: Stack,
) -> None:
    async with env.db.acquire() as conn:
        since = (await conn.fetchval("SELECT now()")).isoformat()
    select = ("--tenant", "acme", "--reason", "http_401", "--since", since)

    # Another reason first (a field mapping: 400), for acme.
    await env.inject("crm.upsert", "invalid_field", count=2)
    other_reason = await _deliver_all(env, [unique_email("badfield") for _ in range(2)])
    assert await _blocked(env, other_reason) == {"http_400:VALIDATION_ERROR"}

    # The token expires: every CRM write is refused with 401, for acme and the other tenant.
    await env.inject("crm.upsert", "unauthorized", count=10_000)
    people = [unique_email("expired") for _ in range(N)]
    chosen = await _deliver_all(env, people)
    other_tenant = await _deliver_all(env, [unique_email("othertenant") for _ in range(2)],
                                      tenant="rehearsal", mailbox="inbox@rehearsal.test")
    reasons = await _blocked(env, chosen + other_tenant)
    assert len(reasons) == 1 and str(reasons.pop()).startswith("http_401")
    keys_before = await _keys(env, chosen)
    assert Counter(action for _, action, _ in keys_before)["crm-upsert"] == N
    crm_calls = len(await env.calls("crm.upsert"))

    try:
        # --dry-run: exactly those N, nothing changed.
        dry = recover(stack, *select, "--limit", str(N + 10), "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        listed = json.loads(dry.stdout)
        assert sorted(i["workflow_id"] for i in listed["items"]) == sorted(chosen)
        assert {i["outcome"] for i in listed["items"]} == {"would_retry"}
        assert {i["step"] for i in listed["items"]} == {"crm-upsert"}
        assert sorted(i["op_key"] for i in listed["items"]) == sorted(
            k for k, action, _ in keys_before if action == "crm-upsert")
        assert listed["refused"] == [] and listed["ran"] is False
        text = recover(stack, *select, "--limit", str(N), "--dry-run")
        assert text.returncode == 0, text.stderr
        lines = [line for line in text.stdout.splitlines() if "would retry" in line]
        assert sorted(line.split()[0] for line in lines) == sorted(chosen)
        assert all("step crm-upsert" in line and ":crm-upsert" in line for line in lines)
        assert f"{N} selected; 0 not retried; 0 over --limit {N}" in text.stdout
        assert len(await env.calls("crm.upsert")) == crm_calls
        assert await _blocked(env, chosen + other_tenant + other_reason)
        # Without a terminal and without --yes it asks no one and refuses.
        unasked = recover(stack, *select, "--limit", str(N))
        assert unasked.returncode == 1 and "pass --yes" in unasked.stderr
    finally:
        await env.http.delete(f"{env.endpoints.sandbox_url}/_sandbox/faults")  # token rotated

    ran = recover(stack, *select, "--limit", str(N), "--rate", "20", "--yes", "--json")
    assert ran.returncode == 0, ran.stderr
    report = json.loads(ran.stdout)
    assert sorted(i["workflow_id"] for i in report["items"]) == sorted(chosen)
    assert {i["outcome"] for i in report["items"]} == {"accepted"}, report["items"]

    await asyncio.gather(*(env.wait_state(w, "completed", timeout=120) for w in chosen))
    state = await env.sandbox_state()
    contacts = Counter(str(c["properties"].get("email", "")).lower() for c in state["contacts"])
    assert [contacts[p] for p in people] == [1] * N  # one contact per person
    emails = [m for m in state["emails"] if set(m["to"]) & set(people)]
    assert Counter(tuple(m["to"]) for m in emails) == Counter((p,) for p in people)
    assert len({m["idempotency_key"] for m in emails}) == N  # one email per intent

    keys_after = await _keys(env, chosen)
    assert keys_after == keys_before  # every key the same row: none new, none replaced
    async with env.db.acquire() as conn:
        done = await conn.fetch("SELECT action, status, attempts FROM operations "
                                "WHERE workflow_id = ANY($1::text[]) AND action = 'crm-upsert'",
                                chosen)
    assert {(r["status"], r["attempts"]) for r in done} == {("completed", 2)}  # one retry each
    # The others were not touched: still blocked, with their own reasons.
    assert await _blocked(env, other_reason) == {"http_400:VALIDATION_ERROR"}
    assert len(await _blocked(env, other_tenant)) == 1
    for workflow_id in other_reason + other_tenant:  # leave the session's stack without them
        rejected = cli(stack, "review", "reject", workflow_id, "--reviewer", "test",
                       "--note", "test_recover cleanup")
        assert rejected.returncode == 0, rejected.stderr
