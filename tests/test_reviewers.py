"""Reviewers as people (docs/architecture.md §6, §7), over HTTP against the real relay, worker
and Temporal: two reviewers on two tenants each see and decide only their own tenant's items
(the other's card, queue entry and decisions answer 404); a decision on the desk reaches the
workflow bound to its wait, the page shows the workflow's answer, and the audit names the
authenticated reviewer whatever name was typed; forged cross-site POSTs are refused; the CLI
acts as INBOXCRM_REVIEWER_TOKEN's reviewer; a revoked reviewer is out at once."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient, unique_email
from tests.helpers.cli import cli
from tests.helpers.messages import GLOBEX, no_sender_message, to_globex

FORM = {"Content-Type": "application/x-www-form-urlencoded"}
CSRF = re.compile(r"name='csrf' value='([0-9a-f]+)'")


def add_reviewer(stack: Stack, name: str, *tenants: str) -> str:
    args = [a for t in tenants for a in ("--tenant", t)]
    added = cli(stack, "reviewer", "add", name, *args, "--json")
    assert added.returncode == 0, added.stderr
    token = json.loads(added.stdout)["token"]
    plain = cli(stack, "reviewer", "add", f"{name}-2", *args)
    assert plain.returncode == 0 and plain.stdout.strip().splitlines()[-1].startswith("icr_")
    return str(token)


class Desk:
    """One reviewer at the desk with their personal token (bearer)."""

    def __init__(self, env: StackClient, stack: Stack, token: str) -> None:
        self.http, self.base, self.token = env.http, stack.relay_url, token

    def url(self, workflow_id: str = "") -> str:
        return f"{self.base}/review/{quote(workflow_id, safe='')}"

    def headers(self, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}", **extra}

    async def queue(self) -> list[str]:
        answer = await self.http.get(self.url(), headers=self.headers(Accept="application/json"))
        assert answer.status_code == 200, answer.text
        return [item["workflow_id"] for item in answer.json()["items"]]

    async def card(self, workflow_id: str) -> httpx.Response:
        return await self.http.get(self.url(workflow_id), headers=self.headers())

    async def csrf(self, workflow_id: str) -> str:
        page = await self.card(workflow_id)
        assert page.status_code == 200, page.status_code
        found = CSRF.search(page.text)
        assert found, "no decision form on the card"
        return found.group(1)

    async def decide(self, workflow_id: str, fields: dict[str, str], csrf: str | None,
                     **headers: str) -> httpx.Response:
        body = dict(fields) | ({"csrf": csrf} if csrf is not None else {})
        return await self.http.post(self.url(workflow_id), content=urlencode(body),
                                    headers=self.headers(**FORM, **headers))


async def decisions(env: StackClient, workflow_id: str) -> list[dict[str, Any]]:
    rows = await env.db.fetch(
        "SELECT actor, action, detail FROM audit_log WHERE workflow_id = $1 "
        "AND action ~ '^(signal|update)_' ORDER BY audit_id", workflow_id)
    return [{"actor": r["actor"], "action": r["action"], **r["detail"]} for r in rows]


async def _two(rows: Awaitable[list[dict[str, Any]]]) -> list[dict[str, Any]] | None:
    found = await rows
    return found if len(found) >= 2 else None


async def test_two_reviewers_two_tenants_each_decides_only_their_own(
    env: StackClient, stack: Stack,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    dana = Desk(env, stack, add_reviewer(stack, f"dana-{suffix}", "acme"))
    gus = Desk(env, stack, add_reviewer(stack, f"gus-{suffix}", "globex"))
    acme_item = await env.deliver(no_sender_message())
    globex_item = await env.deliver(to_globex(no_sender_message()), **GLOBEX)
    await env.wait_state(acme_item, "awaiting_review")
    await env.wait_state(globex_item, "awaiting_review")
    acme_wait = (await env.query_status(acme_item))["review"]["wait_id"]

    # Each queue holds its own tenant's item and never the other's.
    assert acme_item in await dana.queue() and globex_item not in await dana.queue()
    assert globex_item in await gus.queue() and acme_item not in await gus.queue()
    # The other tenant's card and decisions are "not found", as if the item did not exist.
    assert (await dana.card(globex_item)).status_code == 404
    assert (await gus.card(acme_item)).status_code == 404
    dana_csrf = await dana.csrf(acme_item)
    foreign = await dana.decide(globex_item, {"action": "reject", "wait_id": "w1-review"},
                                dana_csrf)
    assert foreign.status_code == 404
    assert (await gus.decide(acme_item, {"action": "reject", "wait_id": acme_wait},
                             await gus.csrf(globex_item))).status_code == 404
    assert await decisions(env, globex_item) == [] and await decisions(env, acme_item) == []

    # Forged cross-site POSTs: refused before anything reaches the workflow.
    approve = {"action": "approve", "wait_id": acme_wait, "reviewer": "mallory",
               "sender_email": unique_email("forged")}
    assert (await dana.decide(acme_item, approve, dana_csrf, Origin="https://evil.test")
            ).status_code == 403
    assert (await dana.decide(acme_item, approve, dana_csrf, **{"Sec-Fetch-Site": "cross-site"})
            ).status_code == 403
    assert (await dana.decide(acme_item, approve, None)).status_code == 403
    assert (await dana.decide(acme_item, approve, "0" * 64)).status_code == 403
    assert (await env.state(acme_item))[0] == "awaiting_review"
    assert await decisions(env, acme_item) == []

    # A refused decision shows the workflow's own refusal; nothing changes.
    stale = await dana.decide(acme_item, approve | {"wait_id": "w9-review"}, dana_csrf)
    assert stale.status_code == 409 and "is not the open one" in stale.text

    # The decision on the desk: bound to the wait, answered, attributed to dana.
    email = unique_email("desk")
    answer = await dana.decide(acme_item, approve | {"sender_email": email}, dana_csrf,
                               Origin=stack.relay_url, **{"Sec-Fetch-Site": "same-origin"})
    assert answer.status_code == 200, answer.text
    assert f"accepted: approve at wait {acme_wait}" in answer.text
    await env.wait_state(acme_item, "completed")
    assert len(await env.crm_records_for(email)) == 1 and len(await env.emails_to(email)) == 1
    *refused, accepted = await decisions(env, acme_item)
    assert accepted["actor"] == f"reviewer:dana-{suffix}"  # not "mallory", the typed name
    assert (accepted["path"], accepted["authenticated"], accepted["typed_reviewer"]) == (
        "desk", True, "mallory")
    assert accepted["accepted"] and accepted["wait_id"] == acme_wait
    assert refused == []  # the update's validator refused the stale one before history

    # `inboxcrm audit` tells the same story: the path and the authenticated decider.
    story = cli(stack, "audit", "--workflow", acme_item)
    assert story.returncode == 0, story.stderr
    assert f"reviewer:dana-{suffix}" in story.stdout and "via desk (authenticated" in story.stdout


async def test_cli_acts_as_the_reviewer_token_and_revocation_ends_access(
    env: StackClient, stack: Stack,
) -> None:
    suffix = uuid.uuid4().hex[:6]
    token = add_reviewer(stack, f"gus-cli-{suffix}", "globex")
    acme_item = await env.deliver(no_sender_message())
    globex_item = await env.deliver(to_globex(no_sender_message()), **GLOBEX)
    await env.wait_state(acme_item, "awaiting_review")
    await env.wait_state(globex_item, "awaiting_review")
    as_gus = stack.env | {"INBOXCRM_REVIEWER_TOKEN": token}

    def gus_cli(*args: str) -> Any:
        import subprocess
        import sys
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=as_gus,
                              capture_output=True, text=True, timeout=60, check=False)

    outside = gus_cli("review", "hold", acme_item, "--reviewer", "dana")
    assert outside.returncode == 1 and "no item" in outside.stderr
    assert gus_cli("review", "show", acme_item).returncode == 1
    # The reviewer's CLI decides through the relay with their own token and holds no key:
    # without the decision secret, the database or Temporal it still decides.
    keyless = {k: v for k, v in as_gus.items() if k not in {
        "INBOXCRM_DECISION_SECRET", "INBOXCRM_REVIEW_TOKEN", "DATABASE_URL", "TEMPORAL_ADDRESS",
        "INBOXCRM_CODEC_KEYS_FILE"}}

    def keyless_cli(*args: str) -> Any:
        import subprocess
        import sys
        return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=keyless,
                              capture_output=True, text=True, timeout=60, check=False)

    held = keyless_cli("review", "hold", globex_item, "--reviewer", "someone-else")
    assert held.returncode == 0, held.stderr
    foreign = keyless_cli("review", "hold", acme_item, "--reviewer", "x")
    assert foreign.returncode == 1 and "no item" in foreign.stderr
    api = f"{stack.relay_url}/v1/decisions"
    body = {"workflow_id": globex_item, "action": "reject"}
    assert (await env.http.post(api, json=body)).status_code == 401
    assert (await env.http.post(api, json=body, headers={
        "Authorization": "Bearer not-a-token"})).status_code == 401
    assert (await env.http.post(api, json=body | {"decider": "operator"}, headers={
        "Authorization": f"Bearer {token}"})).status_code == 422
    [hold] = await decisions(env, globex_item)
    assert (hold["actor"], hold["path"], hold["authenticated"]) == (
        f"reviewer:gus-cli-{suffix}", "cli", True)

    # A signal that claims to be the desk's reviewer, with a made-up proof: refused (a proof
    # that does not match its body is never taken, issue 36) and recorded with the identity
    # Temporal recorded for the request, never as the claimed decider.
    await env.signal(globex_item, "reject", {"reviewer": "gus", "decider":
                                             f"reviewer:gus-cli-{suffix}", "path": "desk",
                                             "proof": "f" * 64})
    _, forged = await env.wait_for(
        lambda: _two(decisions(env, globex_item)), what="the forged signal recorded")
    assert forged["actor"].startswith("temporal:") and forged["authenticated"] is False
    assert (forged["accepted"], forged["ignored_reason"]) == (False, "proof_invalid")
    assert (forged["path"], forged["proof"], forged["identity_source"]) == (
        "temporal-ui signal", "invalid", "signal event")
    assert forged["temporal_identity"]  # the SDK client's identity (pid@host)
    assert (await env.state(globex_item))[0] == "held"

    # The operator (no reviewer token) decides in every tenant, recorded as the operator.
    operator = cli(stack, "review", "reject", acme_item, "--reviewer", "ops")
    assert operator.returncode == 0, operator.stderr
    assert (await decisions(env, acme_item))[-1]["actor"] == "operator"

    # Revoked: the token and its sessions stop working at once.
    login = await env.http.post(f"{stack.relay_url}/review/login",
                                content=urlencode({"token": token, "next": "/review/"}),
                                headers=FORM)
    assert login.status_code == 303
    cookie = login.headers["set-cookie"].split(";", 1)[0]
    assert "SameSite=strict" in login.headers["set-cookie"]
    assert (await env.http.get(f"{stack.relay_url}/review/", headers={"Cookie": cookie})
            ).status_code == 200
    assert cli(stack, "reviewer", "revoke", f"gus-cli-{suffix}").returncode == 0
    assert (await env.http.get(f"{stack.relay_url}/review/", headers={"Cookie": cookie})
            ).status_code == 401
    assert (await env.http.get(f"{stack.relay_url}/review/",
                               headers={"Authorization": f"Bearer {token}"})).status_code == 401
    listed = cli(stack, "reviewer", "list", "--json")
    assert any(r["name"] == f"gus-cli-{suffix}" and r["revoked_at"]
               for r in json.loads(listed.stdout))
    assert "revoked" in gus_cli("review", "hold", globex_item, "--reviewer", "x").stderr
