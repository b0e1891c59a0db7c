"""Privacy in the store (docs/architecture.md §7): what the relay stores of a message is
ciphertext under the tenant's key, the item still goes through to the CRM, an access request
still returns the message, and a key rotation with `keys reencrypt` lets the old key leave
the key file while everything still reads."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from inboxcrm.domain.followup import draft_sha256
from inboxcrm.platform import atrest
from inboxcrm.platform.codec import Keyring
from inboxcrm.stack.stack import Stack
from inboxcrm.store import events, intents, retention
from inboxcrm.verify.probe import StackClient, message_from, unique_email
from tests.helpers.at_rest import opened, v1_sealed
from tests.helpers.cli import cli

# Not a tenant of the stack's policies: no step of the stack ever reads these rows.
ROTATION_TENANT = "atrest-rotation"
ROWS_TENANT = "atrest-rows"


async def test_the_stored_message_is_ciphertext_and_the_item_completes(
    env: StackClient, stack: Stack, db: asyncpg.Pool,
) -> None:
    email = unique_email("sealed")
    raw = message_from(email, name="Ada Sealed")

    workflow_id = await env.deliver(raw)  # a signed Standard Webhooks post through the relay

    row = await db.fetchrow("SELECT raw, event_id::text AS event_id FROM inbound_events "
                            "WHERE workflow_id = $1", workflow_id)
    assert row is not None
    stored, event_id = bytes(row["raw"]), row["event_id"]
    assert stored != raw.encode()
    assert email.encode() not in stored and b"Ada Sealed" not in stored
    sealer = atrest.sealer_for(stack.settings())
    assert sealer is not None and atrest.key_id_of(stored) == sealer.active
    assert opened(stack, stored, row=event_id) == raw.encode()
    # The content hash describes the message, not its ciphertext (it is the copy key).
    assert await db.fetchval("SELECT size_bytes FROM inbound_events WHERE workflow_id = $1",
                             workflow_id) == len(raw.encode())

    assert (await env.wait_state(workflow_id, "completed"))[0] == "completed"
    assert len(await env.crm_records_for(email)) == 1

    # The evidence the extraction quotes from the message is sealed too, in its record and in
    # its audit entry; the values themselves stay readable to the steps' SQL.
    extraction = await db.fetchval("SELECT extraction FROM inbound_events "
                                   "WHERE workflow_id = $1", workflow_id)
    quote = extraction["sender_email"]["evidence"]
    assert quote.startswith(atrest.TEXT_PREFIX) and email not in quote
    assert extraction["sender_email"]["value"] == email
    assert sealer.open_text(quote, tenant="acme", column=atrest.EVIDENCE, row=event_id) in raw
    detail = await db.fetchval("SELECT detail FROM audit_log WHERE workflow_id = $1 "
                               "AND action = 'extracted'", workflow_id)
    assert email not in json.dumps(detail["evidence"])

    exported = cli(stack, "export", "--email", email, "--tenant", "acme")
    assert exported.returncode == 0, exported.stderr
    messages = json.loads(exported.stdout)["messages"]
    assert [m["workflow_id"] for m in messages] == [workflow_id]
    assert base64.b64decode(messages[0]["raw_base64"]) == raw.encode()
    assert email in messages[0]["extraction"]["sender_email"]["evidence"]


def _keys(stack: Stack, key_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The operator CLI against the stack's database with a key file of this test's own (the
    stack's processes keep theirs)."""
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", "keys", *args],
                          env=stack.env | {"INBOXCRM_CODEC_KEYS_FILE": str(key_file)},
                          capture_output=True, text=True, timeout=60, check=False)


async def _insert(db: asyncpg.Pool, raw: bytes, provider_event: bytes | None,
                  tenant: str = ROTATION_TENANT) -> str:
    delivery_id = uuid.uuid4().hex
    async with db.acquire() as conn:
        row = await events.insert_event(
            conn, tenant=tenant, source="postmark", mailbox="sales@rotation.test",
            delivery_id=delivery_id, workflow_id=f"inbound/{tenant}/{delivery_id}",
            raw=raw, content_sha256=uuid.uuid4().hex, size_bytes=len(raw), actor="test",
            provider_event=provider_event,
            provider_event_type="application/json" if provider_event else None)
        assert row is not None and row["new"]
        await events.mark_started(conn, event_id=str(row["event_id"]))  # the sweeper stays off
    return str(row["event_id"])


async def _stored(db: asyncpg.Pool) -> list[asyncpg.Record]:
    return list(await db.fetch(
        "SELECT e.event_id, e.raw, p.body FROM inbound_events e "
        "LEFT JOIN provider_events p USING (event_id) WHERE e.tenant = $1 ORDER BY event_id",
        ROTATION_TENANT))


async def test_rotation_reencrypts_and_the_old_key_can_go(
    stack: Stack, db: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    key_file = tmp_path / "keys.json"
    created = _keys(stack, key_file, "rotate", "--json")
    assert created.returncode == 0, created.stderr
    k1 = json.loads(created.stdout)["active"]
    first = Keyring.from_json(json.loads(key_file.read_text()))

    # Five values under k1 (three messages, two provider events) and one plaintext row, as
    # written before encryption was on.
    plain = {}
    monkeypatch.setattr(atrest, "process_sealer", lambda: atrest.Sealer(first))
    for n in range(3):
        raw = f"From: p{n}@example.com\r\nSubject: n{n}\r\n\r\nhello {n}\r\n".encode()
        event = json.dumps({"From": f"p{n}@example.com"}).encode() if n < 2 else None
        plain[await _insert(db, raw, event)] = (raw, event)
    monkeypatch.setattr(atrest, "process_sealer", lambda: None)
    legacy = b"From: legacy@example.com\r\n\r\nwritten in plaintext\r\n"
    plain[await _insert(db, legacy, None)] = (legacy, None)
    # Evidence quotes: one record under k1, one in plaintext, and an audit entry under k1.
    old = atrest.Sealer(first)
    under_k1, written_plain = sorted(plain)[:2]
    quote = "p0@example.com"
    await db.execute("UPDATE inbound_events SET extraction = $2 WHERE event_id = $1::uuid",
                     under_k1, {"intent": "pricing", "sender_email": {
                         "value": quote, "confidence": 0.9, "evidence": old.seal_text(
                             quote, tenant=ROTATION_TENANT, column=atrest.EVIDENCE,
                             row=under_k1)}})
    await db.execute("UPDATE inbound_events SET extraction = $2 WHERE event_id = $1::uuid",
                     written_plain, {"intent": "pricing", "contact_name": {
                         "value": "Pat", "confidence": 0.6, "evidence": "Thanks, Pat"}})
    await db.execute(
        "INSERT INTO audit_log (tenant, event_id, actor, action, detail) "
        "VALUES ($1, $2::uuid, 'extractor', 'extracted', $3)", ROTATION_TENANT, under_k1,
        {"route": "auto", "evidence": {"sender_email": old.seal_text(
            quote, tenant=ROTATION_TENANT, column=atrest.AUDIT_EVIDENCE, row=under_k1),
            "company": None}})
    before = await _stored(db)
    assert {atrest.key_id_of(bytes(r["raw"])) for r in before} == {k1, None}

    try:
        rotated = _keys(stack, key_file, "rotate", "--json")
        assert rotated.returncode == 0, rotated.stderr
        k2 = json.loads(rotated.stdout)["active"]
        assert k2 != k1

        result = _keys(stack, key_file, "reencrypt", "--tenant", ROTATION_TENANT,
                       "--batch-size", "2", "--json")

        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout)
        counts = report["tenants"][ROTATION_TENANT]
        assert report["key"] == k2
        assert counts[atrest.RAW] == {"resealed": 4, "skipped": 0,
                                      "from_keys": {k1: 3, "plaintext": 1}}
        assert counts[atrest.PROVIDER_EVENT] == {"resealed": 2, "skipped": 0,
                                                 "from_keys": {k1: 2}}
        assert counts[atrest.EVIDENCE] == {"resealed": 2, "skipped": 0,
                                           "from_keys": {k1: 1, "plaintext": 1}}
        assert counts[atrest.AUDIT_EVIDENCE] == {"resealed": 1, "skipped": 0,
                                                 "from_keys": {k1: 1}}
        audited = await db.fetch(
            "SELECT detail FROM audit_log WHERE tenant = $1 AND action = 'reencrypted'",
            ROTATION_TENANT)
        assert sum(a["detail"]["values"] for a in audited) == 9 and len(audited) == 5
        assert all(a["detail"]["key"] == k2 for a in audited)

        # Resumable: a second run finds nothing left under another key.
        again = _keys(stack, key_file, "reencrypt", "--tenant", ROTATION_TENANT, "--json")
        assert again.returncode == 0, again.stderr
        assert {c["resealed"] for c in
                json.loads(again.stdout)["tenants"][ROTATION_TENANT].values()} == {0}

        # k1 leaves the file: everything still reads under k2 alone.
        document = json.loads(key_file.read_text())
        del document["keys"][k1]
        key_file.write_text(json.dumps(document))
        listed = _keys(stack, key_file, "list", "--json")
        assert json.loads(listed.stdout) == {"active": k2, "keys": [k2]}
        only_k2 = atrest.Sealer(Keyring.from_json(document))
        for row in await _stored(db):
            raw, event = plain[str(row["event_id"])]
            assert atrest.key_id_of(bytes(row["raw"])) == k2
            assert only_k2.open(bytes(row["raw"]), tenant=ROTATION_TENANT,
                                column=atrest.RAW, row=str(row["event_id"])) == raw
            if event is not None:
                assert only_k2.open(bytes(row["body"]), tenant=ROTATION_TENANT,
                                    column=atrest.PROVIDER_EVENT,
                                    row=str(row["event_id"])) == event
        records = {str(r["event_id"]): r["extraction"] for r in await db.fetch(
            "SELECT event_id, extraction FROM inbound_events WHERE tenant = $1",
            ROTATION_TENANT)}
        assert only_k2.open_text(records[under_k1]["sender_email"]["evidence"],
                                 tenant=ROTATION_TENANT, column=atrest.EVIDENCE,
                                 row=under_k1) == quote
        assert only_k2.open_text(records[written_plain]["contact_name"]["evidence"],
                                 tenant=ROTATION_TENANT, column=atrest.EVIDENCE,
                                 row=written_plain) == "Thanks, Pat"
        entry = await db.fetchval("SELECT detail FROM audit_log WHERE tenant = $1 "
                                  "AND action = 'extracted'", ROTATION_TENANT)
        assert only_k2.open_text(entry["evidence"]["sender_email"], tenant=ROTATION_TENANT,
                                 column=atrest.AUDIT_EVIDENCE, row=under_k1) == quote

        # A value under a key the file no longer holds: the error names key IDs, not data.
        monkeypatch.setattr(atrest, "process_sealer", lambda: atrest.Sealer(first))
        orphan = await _insert(db, b"From: orphan@example.com\r\n\r\nx\r\n", None)
        failed = _keys(stack, key_file, "reencrypt", "--tenant", ROTATION_TENANT)
        assert failed.returncode == 1
        assert f"unknown key ID {k1!r} (known key IDs: {k2})" in failed.stderr
        assert "orphan" not in failed.stderr
        await db.execute("DELETE FROM inbound_events WHERE event_id = $1::uuid", orphan)
    finally:
        await db.execute("DELETE FROM audit_log WHERE tenant = $1 AND action = 'extracted'",
                         ROTATION_TENANT)
        await db.execute("DELETE FROM inbound_events WHERE tenant = $1", ROTATION_TENANT)


async def test_a_value_is_bound_to_its_row_and_version_1_values_are_upgraded(
    stack: Stack, db: asyncpg.Pool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Envelope version 2 binds the row's identity: Ada's stored message copied into Pat's
    row (same tenant, same column) does not open, and the export that reads it stops with an
    error naming the column, returning and recording nothing. Values written by version 1
    (a message, an edited draft) still open, and `keys reencrypt` rewrites them as version
    2, bound to their rows."""
    key_file = tmp_path / "keys.json"
    created = _keys(stack, key_file, "rotate", "--json")
    assert created.returncode == 0, created.stderr
    k1 = json.loads(created.stdout)["active"]
    sealer = atrest.Sealer(Keyring.from_json(json.loads(key_file.read_text())))
    monkeypatch.setattr(atrest, "process_sealer", lambda: sealer)
    ada_raw = b"From: ada@example.com\r\nSubject: ada\r\n\r\nAda's own words\r\n"
    pat_raw = b"From: pat@example.com\r\nSubject: pat\r\n\r\nPat's own words\r\n"
    old_raw = b"From: old@example.com\r\nSubject: old\r\n\r\nwritten by version 1\r\n"
    ada = await _insert(db, ada_raw, None, ROWS_TENANT)
    pat = await _insert(db, pat_raw, None, ROWS_TENANT)
    old = await _insert(db, old_raw, None, ROWS_TENANT)
    await db.execute("UPDATE inbound_events SET raw = $2 WHERE event_id = $1::uuid", old,
                     v1_sealed(sealer, old_raw, tenant=ROWS_TENANT, column=atrest.RAW))
    # Old's follow-up with an edited draft sealed by version 1 (its hash over the plaintext).
    draft = "Hi Old,\n\nwritten before rows were bound.\n"
    contact = await db.fetchval(
        "INSERT INTO contacts (tenant, canonical_email, email) VALUES ($1, $2, $2) "
        "RETURNING contact_id::text", ROWS_TENANT, f"old-{uuid.uuid4().hex[:8]}@example.com")
    intent = await db.fetchval(
        "INSERT INTO followup_intents (event_id, tenant, contact_id, rule_id, rule_version, "
        "template_id, status, needs_approval, draft_text, draft_sha256) VALUES ($1::uuid, $2, "
        "$3::uuid, 'ack', 1, 'ack@1', 'awaiting_approval', true, $4, $5) "
        "RETURNING intent_id::text", old, ROWS_TENANT, contact,
        atrest.TEXT_PREFIX + base64.b64encode(v1_sealed(
            sealer, draft.encode(), tenant=ROWS_TENANT, column=atrest.DRAFT)).decode(),
        draft_sha256(draft))
    try:
        # The copy: Ada's ciphertext in Pat's row.
        await db.execute("UPDATE inbound_events p SET raw = a.raw, canonical_email = $3 "
                         "FROM inbound_events a WHERE p.event_id = $2::uuid "
                         "AND a.event_id = $1::uuid", ada, pat, "pat@example.com")
        copied = bytes(await db.fetchval("SELECT raw FROM inbound_events "
                                         "WHERE event_id = $1::uuid", pat))
        assert sealer.open(copied, tenant=ROWS_TENANT, column=atrest.RAW, row=ada) == ada_raw
        with pytest.raises(atrest.SealedValueError) as refused:
            sealer.open(copied, tenant=ROWS_TENANT, column=atrest.RAW, row=pat)
        assert "inbound_events.raw" in str(refused.value)
        with pytest.raises(atrest.SealedValueError) as refused:
            async with db.acquire() as conn:
                await retention.export(conn, [ROWS_TENANT], "pat@example.com", "test")
        said = str(refused.value)
        assert "inbound_events.raw" in said and "failed authentication" in said
        assert "Ada" not in said and "ada@" not in said and pat not in said
        assert await db.fetchval("SELECT count(*) FROM audit_log WHERE tenant = $1 "
                                 "AND action = 'exported'", ROWS_TENANT) == 0
        # Pat's row gets its own message back (an operator's restore).
        await db.execute("UPDATE inbound_events SET raw = $2 WHERE event_id = $1::uuid", pat,
                         sealer.seal(pat_raw, tenant=ROWS_TENANT, column=atrest.RAW, row=pat))

        # Version 1 values still open, in whatever row they sit (they are not bound to one).
        stored_old = bytes(await db.fetchval(
            "SELECT raw FROM inbound_events WHERE event_id = $1::uuid", old))
        assert stored_old.startswith(atrest.header(k1, atrest.V1))
        assert sealer.open(stored_old, tenant=ROWS_TENANT, column=atrest.RAW, row=old) == old_raw
        async with db.acquire() as conn:
            facts = await conn.fetchrow("SELECT intent_id, draft_text FROM followup_intents "
                                        "WHERE intent_id = $1::uuid", intent)
        assert facts is not None
        assert intents.opened_draft(facts, tenant=ROWS_TENANT) == draft

        result = _keys(stack, key_file, "reencrypt", "--tenant", ROWS_TENANT, "--json")
        assert result.returncode == 0, result.stderr
        counts = json.loads(result.stdout)["tenants"][ROWS_TENANT]
        assert counts[atrest.RAW] == {"resealed": 1, "skipped": 0,
                                      "from_keys": {f"{k1} (v1)": 1}}
        assert counts[atrest.DRAFT] == {"resealed": 1, "skipped": 0,
                                        "from_keys": {f"{k1} (v1)": 1}}

        # Now version 2, bound to their rows: the message opens in its row only.
        upgraded = bytes(await db.fetchval(
            "SELECT raw FROM inbound_events WHERE event_id = $1::uuid", old))
        assert upgraded.startswith(atrest.header(k1))
        assert sealer.open(upgraded, tenant=ROWS_TENANT, column=atrest.RAW, row=old) == old_raw
        with pytest.raises(atrest.SealedValueError):
            sealer.open(upgraded, tenant=ROWS_TENANT, column=atrest.RAW, row=ada)
        row = await db.fetchrow("SELECT intent_id, draft_text, draft_sha256 "
                                "FROM followup_intents WHERE intent_id = $1::uuid", intent)
        assert row is not None
        envelope = atrest.text_envelope(row["draft_text"], atrest.DRAFT)
        assert envelope.startswith(atrest.header(k1))
        assert intents.opened_draft(row, tenant=ROWS_TENANT) == draft
        assert row["draft_sha256"] == draft_sha256(draft)  # over the plaintext, unchanged
        with pytest.raises(atrest.SealedValueError):
            sealer.open(envelope, tenant=ROWS_TENANT, column=atrest.DRAFT, row=ada)
        again = _keys(stack, key_file, "reencrypt", "--tenant", ROWS_TENANT, "--json")
        assert {c["resealed"] for c in
                json.loads(again.stdout)["tenants"][ROWS_TENANT].values()} == {0}
    finally:
        await db.execute("DELETE FROM followup_intents WHERE tenant = $1", ROWS_TENANT)
        await db.execute("DELETE FROM contacts WHERE tenant = $1", ROWS_TENANT)
        await db.execute("DELETE FROM audit_log WHERE tenant = $1", ROWS_TENANT)
        await db.execute("DELETE FROM inbound_events WHERE tenant = $1", ROWS_TENANT)
