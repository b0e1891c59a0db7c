"""A reviewer's name is theirs for good (issue 36: a revoked reviewer's name could be given to
someone else, who then decided under the same `reviewer:NAME` in the audit and the proofs);
`inboxcrm reviewer rotate` gives the same person a new token, ending the old one."""

from __future__ import annotations

import json
import uuid

from inboxcrm.stack.stack import Stack
from inboxcrm.verify.probe import StackClient
from tests.helpers.cli import cli
from tests.test_reviewers import Desk, add_reviewer


async def test_a_revoked_name_is_never_given_again(stack: Stack) -> None:
    name = f"leaver-{uuid.uuid4().hex[:6]}"
    add_reviewer(stack, name, "acme")
    assert cli(stack, "reviewer", "revoke", name).returncode == 0
    again = cli(stack, "reviewer", "add", name, "--tenant", "acme")
    assert again.returncode != 0
    assert "belonged to a revoked reviewer" in again.stderr
    active = [r for r in json.loads(cli(stack, "reviewer", "list", "--json").stdout)
              if r["name"] == name and not r["revoked_at"]]
    assert active == []


async def test_rotate_gives_the_same_reviewer_a_new_token(env: StackClient,
                                                          stack: Stack) -> None:
    name = f"rotor-{uuid.uuid4().hex[:6]}"
    old = add_reviewer(stack, name, "acme")
    assert (await Desk(env, stack, old).card("")).status_code == 200  # the queue
    rotated = cli(stack, "reviewer", "rotate", name, "--json")
    assert rotated.returncode == 0, rotated.stderr
    answer = json.loads(rotated.stdout)
    assert answer["name"] == name and answer["tenants"] == ["acme"]
    assert (await Desk(env, stack, old).card("")).status_code == 401
    assert (await Desk(env, stack, answer["token"]).card("")).status_code == 200
    listed = [r for r in json.loads(cli(stack, "reviewer", "list", "--json").stdout)
              if r["name"] == name]
    assert sum(1 for r in listed if not r["revoked_at"]) == 1 and len(listed) == 2
    missing = cli(stack, "reviewer", "rotate", f"nobody-{uuid.uuid4().hex[:6]}")
    assert missing.returncode != 0 and "no active reviewer" in missing.stderr
