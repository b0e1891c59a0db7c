"""Re-encryption of the values sealed at rest (`inboxcrm keys reencrypt`,
inboxcrm/platform/atrest.py): after a key rotation, a tenant's stored messages, provider
events, evidence quotes and edited drafts are sealed again under the active key, batch by
batch, so the old key can leave the key file.

A batch is one transaction: the next values of the tenant (by event ID, after a cursor) that
are not under the active key, opened and sealed again in this process, written back only where
the row still holds the value that was read (a row emptied by retention or `forget`
meanwhile stays empty), with one `reencrypted` audit entry of counts and key IDs. A run that
stops is resumed by running it again: values under the active key are not selected.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from inboxcrm.platform import atrest

if TYPE_CHECKING:
    from inboxcrm.platform.atrest import Sealer
    from inboxcrm.store.db import Conn

# The stored bytes: selected only where they are not under the active key in the current
# envelope version (a version 1 value, not bound to its row, is rewritten as version 2).
# `row`: the identity the value is bound to (associated data).
# $1 tenant, $2 cursor (event ID), $3 the active key's envelope header, $4 batch size.
STALE_RAW = """
SELECT event_id AS id, event_id::text AS row, raw AS value FROM inbound_events
WHERE tenant = $1 AND event_id > $2::uuid AND raw IS NOT NULL
  AND substring(raw FROM 1 FOR octet_length($3::bytea)) <> $3::bytea
ORDER BY event_id
LIMIT $4
"""

STALE_PROVIDER_EVENTS = """
SELECT p.event_id AS id, p.event_id::text AS row, p.body AS value
FROM provider_events p JOIN inbound_events e USING (event_id)
WHERE e.tenant = $1 AND p.event_id > $2::uuid
  AND substring(p.body FROM 1 FOR octet_length($3::bytea)) <> $3::bytea
ORDER BY p.event_id
LIMIT $4
"""

# The evidence quotes sit inside JSON (base64 text): every row with evidence is read and the
# quotes are checked here ($3, the header, unused by these two). An audit entry's quotes are
# bound to the event it is about (`row`; an `extracted` entry always names one).
STALE_EVIDENCE = """
SELECT event_id AS id, event_id::text AS row, extraction AS value FROM inbound_events
WHERE tenant = $1 AND event_id > $2::uuid AND extraction IS NOT NULL AND $3::bytea IS NOT NULL
ORDER BY event_id
LIMIT $4
"""

STALE_AUDIT_EVIDENCE = """
SELECT audit_id AS id, event_id::text AS row, detail AS value FROM audit_log
WHERE tenant = $1 AND audit_id > $2::bigint AND action = 'extracted' AND detail ? 'evidence'
  AND event_id IS NOT NULL
  AND $3::bytea IS NOT NULL
ORDER BY audit_id
LIMIT $4
"""

# A reviewer's edited follow-ups (text; few): every stored draft is read and checked here.
STALE_DRAFT = """
SELECT intent_id AS id, intent_id::text AS row, draft_text AS value FROM followup_intents
WHERE tenant = $1 AND intent_id > $2::uuid AND draft_text IS NOT NULL AND $3::bytea IS NOT NULL
ORDER BY intent_id
LIMIT $4
"""

# $1 IDs, $2 the values read, $3 the values sealed again (same order): written only where
# the row still holds what was read.
RESEAL_RAW = """
UPDATE inbound_events e SET raw = u.new
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS u(id, old, new)
WHERE e.event_id = u.id AND e.raw = u.old
RETURNING e.event_id AS id
"""

RESEAL_PROVIDER_EVENTS = """
UPDATE provider_events p SET body = u.new
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS u(id, old, new)
WHERE p.event_id = u.id AND p.body = u.old
RETURNING p.event_id AS id
"""

RESEAL_EVIDENCE = """
UPDATE inbound_events e SET extraction = u.new
FROM unnest($1::uuid[], $2::jsonb[], $3::jsonb[]) AS u(id, old, new)
WHERE e.event_id = u.id AND e.extraction = u.old
RETURNING e.event_id AS id
"""

RESEAL_AUDIT_EVIDENCE = """
UPDATE audit_log a SET detail = u.new
FROM unnest($1::bigint[], $2::jsonb[], $3::jsonb[]) AS u(id, old, new)
WHERE a.audit_id = u.id AND a.detail = u.old
RETURNING a.audit_id AS id
"""

# The draft's hash (`draft_sha256`) is over the plaintext: it stays as it is.
RESEAL_DRAFT = """
UPDATE followup_intents i SET draft_text = u.new
FROM unnest($1::uuid[], $2::text[], $3::text[]) AS u(id, old, new)
WHERE i.intent_id = u.id AND i.draft_text = u.old
RETURNING i.intent_id AS id
"""

RECORD = """
INSERT INTO audit_log (tenant, actor, action, detail) VALUES ($1, $2, 'reencrypted', $3)
"""

PLAINTEXT = "plaintext"
UUID_START = str(uuid.UUID(int=0))


@dataclass(frozen=True)
class Column:
    stale: str
    reseal: str
    start: str
    # JSON values: the function that passes each quote of one through a change
    quotes: Callable[[dict[str, Any], Callable[[str], str]], dict[str, Any]] | None = None
    # a text column (`ixa1:` + base64), not bytes
    text: bool = False

    def cursor(self, value: Any) -> Any:
        return str(value) if self.start == UUID_START else int(value)


COLUMNS = {
    atrest.RAW: Column(STALE_RAW, RESEAL_RAW, UUID_START),
    atrest.PROVIDER_EVENT: Column(STALE_PROVIDER_EVENTS, RESEAL_PROVIDER_EVENTS, UUID_START),
    atrest.EVIDENCE: Column(STALE_EVIDENCE, RESEAL_EVIDENCE, UUID_START, atrest.map_evidence),
    atrest.AUDIT_EVIDENCE: Column(STALE_AUDIT_EVIDENCE, RESEAL_AUDIT_EVIDENCE, "0",
                                  atrest.map_audit_evidence),
    atrest.DRAFT: Column(STALE_DRAFT, RESEAL_DRAFT, UUID_START, text=True),
}


@dataclass(frozen=True)
class ResealBatch:
    column: str
    read: int
    resealed: int
    # written meanwhile (emptied by retention, say): left as they are
    skipped: int
    # where the next batch goes on; None: nothing left in this column
    cursor: str | None
    # the values resealed by the key they were under (`plaintext`: written unencrypted)
    from_keys: dict[str, int] = field(default_factory=dict)


def _source(envelope: bytes) -> str:
    """Where a value came from, for the counts: its key ID (`k1 (v1)` for a version 1
    envelope, bound to tenant and column only) or `plaintext`."""
    key_id = atrest.key_id_of(envelope)
    if key_id is None:
        return PLAINTEXT
    return f"{key_id} (v1)" if envelope[len(atrest.MAGIC)] == atrest.V1 else key_id


def _resealed_bytes(value: bytes, sealer: Sealer, tenant: str, column: str, row: str
                    ) -> tuple[bytes, list[str]]:
    plain = sealer.open(value, tenant=tenant, column=column, row=row)
    return sealer.seal(plain, tenant=tenant, column=column, row=row), [_source(value)]


def _resealed_text(value: str, sealer: Sealer, tenant: str, column: str, row: str
                   ) -> tuple[str, list[str]]:
    """The text sealed again ([]: it is under the active key already)."""
    envelope = atrest.text_envelope(value, column)
    if atrest.is_sealed_text(value) and sealer.is_current(envelope):
        return value, []
    return (sealer.seal_text(sealer.open_text(value, tenant=tenant, column=column, row=row),
                             tenant=tenant, column=column, row=row),
            [_source(envelope)])


def _resealed_quotes(value: dict[str, Any], spec: Column, sealer: Sealer, tenant: str,
                     column: str, row: str) -> tuple[dict[str, Any], list[str]]:
    """The JSON with each quote not under the active key sealed again ([]: none was)."""
    assert spec.quotes is not None
    sources: list[str] = []

    def again(quote: str) -> str:
        envelope = atrest.text_envelope(quote, column)
        if atrest.is_sealed_text(quote) and sealer.is_current(envelope):
            return quote
        sources.append(_source(envelope))
        return sealer.seal_text(sealer.open_text(quote, tenant=tenant, column=column, row=row),
                                tenant=tenant, column=column, row=row)

    return spec.quotes(value, again), sources


async def reseal_batch(conn: Conn, *, tenant: str, column: str, sealer: Sealer,
                       after: str, limit: int, actor: str) -> ResealBatch:
    """One batch of `column` (a key of COLUMNS) in one transaction. An unknown key ID or a
    value that fails authentication raises `SealedValueError` (naming key IDs only) and
    nothing of the batch is written."""
    spec = COLUMNS[column]
    async with conn.transaction():
        rows = await conn.fetch(spec.stale, tenant, spec.cursor(after),
                                atrest.header(sealer.active), limit)
        ids, old, new = [], [], []
        sources: dict[str, list[str]] = {}
        for row in rows:
            again: Any
            if spec.text:
                value: Any = str(row["value"])
                again, found = _resealed_text(value, sealer, tenant, column, row["row"])
                if not found:
                    continue
            elif spec.quotes is None:
                value = bytes(row["value"])
                again, found = _resealed_bytes(value, sealer, tenant, column, row["row"])
            else:
                value = row["value"]
                again, found = _resealed_quotes(value, spec, sealer, tenant, column,
                                                row["row"])
                if not found:
                    continue
            ids.append(row["id"])
            old.append(value)
            new.append(again)
            sources[str(row["id"])] = found
        done = [str(r["id"]) for r in await conn.fetch(spec.reseal, ids, old, new)] \
            if ids else []
        from_keys = dict(Counter(k for i in done for k in sources[i]))
        if done:
            await conn.execute(RECORD, tenant, actor, {
                "column": column, "rows": len(done), "values": sum(from_keys.values()),
                "key": sealer.active, "from_keys": from_keys, "skipped": len(ids) - len(done)})
    cursor = str(rows[-1]["id"]) if len(rows) == limit else None
    return ResealBatch(column, len(rows), sum(from_keys.values()), len(ids) - len(done),
                       cursor, from_keys)
