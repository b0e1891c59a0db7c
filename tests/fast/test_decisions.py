"""The one decision client (`inboxcrm/platform/decisions.py`, docs/architecture.md §6): the
desk and the CLI both route through it and neither builds, signs or sends a decision itself;
the body it builds is the one the workflow has always been sent; the desk's decision path
runs without a relay, against a Temporal that is not there."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Awaitable, Callable
from unittest import mock

from fastapi import Request
from temporalio.client import Client
from temporalio.converter import DataConverter

from inboxcrm.ingress.review import ReviewDesk, decision_request, send_form_decision
from inboxcrm.platform.config import Settings
from inboxcrm.platform.decisions import (
    UNAVAILABLE,
    DecisionRequest,
    accepted_text,
    decision_body,
    send_decision,
)
from inboxcrm.platform.reviewer_identity import (
    PATH_CLI,
    PATH_DESK,
    DecisionClaim,
    Principal,
    operator,
    verify_decision,
)
from inboxcrm.schemas.contract import Decision
from inboxcrm.schemas.models import ItemStatus, OpenReview
from inboxcrm.stack.processes import free_port
from tests.helpers.stack import ROOT

SECRET = "server-side-secret-of-32-bytes-or-more"
WF = "inbound/acme/standard/sales@acme.test/E-1"
DANA = Principal("reviewer:dana", "dana", frozenset({"acme"}), reviewer_id=7)
CLIENT = "inboxcrm/platform/decisions.py"
CALLERS = ("inboxcrm/ingress/review.py", "inboxcrm/cli/review.py")
# What only the client may do: send an update, sign a decision, build its body.
CLIENT_ONLY = frozenset({"execute_update", "start_update", "sign_decision", "DecisionBody"})


def _names(path: str) -> tuple[set[str], set[str]]:
    """Every name a module calls (`f(…)`, `x.f(…)`), and every name it imports."""
    tree = ast.parse((ROOT / path).read_text())
    called, imported = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        elif isinstance(node, ast.ImportFrom):
            imported |= {f"{node.module}.{alias.name}" for alias in node.names}
    return called, imported


def test_the_desk_and_the_cli_both_route_through_the_one_client() -> None:
    for path in CALLERS:
        called, imported = _names(path)
        assert not called & CLIENT_ONLY, (path, called & CLIENT_ONLY)
        assert not {i for i in imported if i.rsplit(".", 1)[-1] in CLIENT_ONLY}, path
        assert "inboxcrm.platform.decisions.send_decision" in imported, path
        assert "send_decision" in called or "send_form_decision" in called, path
    called, _ = _names(CLIENT)
    assert {"execute_update", "sign_decision", "DecisionBody"} <= called


def test_no_other_module_signs_or_sends_a_decision() -> None:
    """The proof is made in one place; the only other update the product sends is the
    mailbox watcher's (`inboxcrm mailbox sync`), which is no decision."""
    signers, senders = [], []
    for file in sorted((ROOT / "inboxcrm").rglob("*.py")):
        path = str(file.relative_to(ROOT))
        if path in (CLIENT, "inboxcrm/platform/reviewer_identity.py"):
            continue
        called, _ = _names(path)
        if "sign_decision" in called:
            signers.append(path)
        if called & {"execute_update", "start_update"}:
            senders.append(path)
    assert signers == []
    assert senders == ["inboxcrm/cli/mailbox.py"]


def test_the_body_is_the_one_the_workflow_was_always_sent() -> None:
    """Wire-identical to the desk's and the CLI's bodies before the client: the same fields
    under the same JSON names, the proof over the whole decision (issue 36)."""
    request = DecisionRequest(workflow_id=WF, action=Decision.APPROVE, decider=DANA,
                              path=PATH_DESK, reviewer="mallory", note="ok",
                              corrections={"sender_email": "a@b.test"}, wait_id="w3-review")
    body = decision_body(request, SECRET, "w3-review")
    payload = DataConverter.default.payload_converter.to_payloads([body])[0]
    assert payload.metadata["encoding"] == b"json/plain"
    wire = json.loads(payload.data)
    proof = wire.pop("proof")
    assert wire == {"reviewer": "mallory", "wait_id": "w3-review", "note": "ok",
                    "evidence": None, "corrections": {"sender_email": "a@b.test"},
                    "send_followup": True, "decider": "reviewer:dana", "path": "desk",
                    # Added with edited drafts (issue 37): null unless an approval binds one.
                    "draft_sha256": None}
    claim = DecisionClaim("reviewer:dana", "desk", WF, "w3-review", "approve",
                          reviewer="mallory", note="ok",
                          corrections={"sender_email": "a@b.test"})
    assert verify_decision(SECRET, proof, claim)
    assert not verify_decision(SECRET, proof, dataclasses.replace(claim, action="hold"))
    assert not verify_decision(SECRET, proof, dataclasses.replace(
        claim, corrections={"sender_email": "evil@b.test"}))


def test_the_desk_form_becomes_a_request_bound_to_its_wait_and_the_signed_in_decider() -> None:
    form = {"action": ["approve"], "wait_id": ["w3-review"], "reviewer": ["  "],
            "decider": ["operator"], "sender_email": [" a@b.test "], "name": [""],
            "note": [""], "send_followup": ["no"]}
    request = decision_request(form, DANA, WF)
    assert isinstance(request, DecisionRequest)
    assert (request.action, request.decider, request.path) == (Decision.APPROVE, DANA,
                                                               PATH_DESK)
    assert (request.reviewer, request.wait_id, request.note) == ("dana", "w3-review", None)
    assert dict(request.corrections) == {"sender_email": "a@b.test"}
    assert request.send_followup is False
    assert decision_request({"action": ["approve-all"]}, DANA, WF) == (
        "refused: no such decision")


def _nowhere() -> Callable[[], Awaitable[Client]]:
    """A connect to a loopback port nobody listens on: Temporal really is not there."""
    port = free_port()

    async def connect() -> Client:
        return await Client.connect(f"127.0.0.1:{port}")
    return connect


async def test_without_a_secret_nothing_is_sent_and_without_temporal_it_says_so() -> None:
    form = {"action": ["hold"], "wait_id": ["w3-review"], "csrf": ["x"]}
    unsigned = await send_form_decision(_nowhere(), None, DANA, WF, form)
    assert (unsigned.accepted, unsigned.outcome) == (False, "unsigned")
    assert "INBOXCRM_DECISION_SECRET" in unsigned.message
    down = await send_form_decision(_nowhere(), SECRET, DANA, WF, form)
    assert (down.accepted, down.outcome, down.message) == (False, "unavailable", UNAVAILABLE)
    assert down.wait_id == "w3-review"
    cli = await send_decision(_nowhere(), SECRET, DecisionRequest(
        workflow_id=WF, action=Decision.REJECT, decider=operator(), path=PATH_CLI,
        reviewer="ops"))
    assert (cli.accepted, cli.outcome) == (False, "unavailable")


def test_an_accepted_decision_is_worded_once_for_both() -> None:
    held = ItemStatus(workflow_id=WF, state="held", review=OpenReview(
        reason="low_confidence", owner="sales", since="", allowed=["approve", "reject"],
        wait_id="w3-review"))
    assert accepted_text("hold", "w3-review", WF, held) == (
        f"accepted: hold at wait w3-review: {WF} is now held; the wait stays open; allowed: "
        "approve, reject")
    assert held.review is not None
    moved = dataclasses.replace(held, state="awaiting_review", reason="followup_approval",
                                review=dataclasses.replace(held.review, wait_id="w4-followup",
                                                           reason="followup_approval"))
    text = accepted_text("approve", "w3-review", WF, moved)
    assert text.startswith("accepted: approve at wait w3-review: ")
    assert "is now awaiting_review (followup_approval); open wait w4-followup" in text


async def test_a_desk_handler_is_callable_without_a_relay() -> None:
    env = {"INBOXCRM_REVIEW_TOKEN": "operator-token-of-32-bytes-or-more",
           "INBOXCRM_DECISION_SECRET": SECRET}
    with mock.patch.dict("os.environ", env):
        desk = ReviewDesk(Settings())
    request = Request({"type": "http", "method": "POST", "scheme": "http", "path": "/review/x",
                       "headers": [(b"host", b"127.0.0.1:8080"),
                                   (b"sec-fetch-site", b"cross-site")],
                       "query_string": b"", "server": ("127.0.0.1", 8080)})
    # Refused before it touches the store or Temporal (neither exists here).
    answer = await desk.decide(WF, request, None, None, None)  # type: ignore[arg-type]
    assert answer.status_code == 403
    assert desk.router().routes
