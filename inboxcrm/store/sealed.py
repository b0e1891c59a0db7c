"""Re-encryption of the values sealed at rest (`inboxcrm keys reencrypt`,
inboxcrm/platform/atrest.py): after a key rotation, a tenant's stored messages and provider
events are sealed again under the active key, batch by batch, so the old key can leave the
key file.

A batch is one transaction: the next values of the tenant (by event ID, after a cursor) that
are not under the active key, opened and sealed again in this process, written back only where
the row still holds the value that was read (a row emptied by retention or `forget`
meanwhile stays empty), with one `reencrypted` audit entry of counts and key IDs. A run that
stops is resumed by running it again: values under the active key are not selected.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from inboxcrm.platform import atrest

if TYPE_CHECKING:
    from inboxcrm.platform.atrest import Sealer
    from inboxcrm.store.db import Conn

# $1 tenant, $2 cursor (event ID), $3 the active key's envelope header, $4 batch size.
STALE_RAW = """
SELECT event_id, raw AS value FROM inbound_events
WHERE tenant = $1 AND event_id > $2::uuid AND raw IS NOT NULL
  AND substring(raw FROM 1 FOR octet_length($3::bytea)) <> $3::bytea
ORDER BY event_id
LIMIT $4
"""

STALE_PROVIDER_EVENTS = """
SELECT p.event_id, p.body AS value
FROM provider_events p JOIN inbound_events e USING (event_id)
WHERE e.tenant = $1 AND p.event_id > $2::uuid
  AND substring(p.body FROM 1 FOR octet_length($3::bytea)) <> $3::bytea
ORDER BY p.event_id
LIMIT $4
"""

# $1 event IDs, $2 the values read, $3 the values sealed again (same order).
RESEAL_RAW = """
UPDATE inbound_events e SET raw = u.new
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS u(event_id, old, new)
WHERE e.event_id = u.event_id AND e.raw = u.old
RETURNING e.event_id
"""

RESEAL_PROVIDER_EVENTS = """
UPDATE provider_events p SET body = u.new
FROM unnest($1::uuid[], $2::bytea[], $3::bytea[]) AS u(event_id, old, new)
WHERE p.event_id = u.event_id AND p.body = u.old
RETURNING p.event_id
"""

RECORD = """
INSERT INTO audit_log (tenant, actor, action, detail) VALUES ($1, $2, 'reencrypted', $3)
"""

COLUMNS = {atrest.RAW: (STALE_RAW, RESEAL_RAW),
           atrest.PROVIDER_EVENT: (STALE_PROVIDER_EVENTS, RESEAL_PROVIDER_EVENTS)}

START = str(uuid.UUID(int=0))
PLAINTEXT = "plaintext"


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


async def reseal_batch(conn: Conn, *, tenant: str, column: str, sealer: Sealer,
                       after: str, limit: int, actor: str) -> ResealBatch:
    """One batch of `column` (atrest.RAW, atrest.PROVIDER_EVENT) in one transaction. An
    unknown key ID or a value that fails authentication raises `SealedValueError` (naming key
    IDs only) and nothing of the batch is written."""
    stale, reseal = COLUMNS[column]
    async with conn.transaction():
        rows = await conn.fetch(stale, tenant, after, atrest.header(sealer.active), limit)
        if not rows:
            return ResealBatch(column, 0, 0, 0, None)
        ids, old, new = [], [], []
        keys: dict[str, str] = {}
        for row in rows:
            value = bytes(row["value"])
            plain = sealer.open(value, tenant=tenant, column=column)
            ids.append(row["event_id"])
            old.append(value)
            new.append(sealer.seal(plain, tenant=tenant, column=column))
            keys[str(row["event_id"])] = atrest.key_id_of(value) or PLAINTEXT
        done = [str(r["event_id"]) for r in await conn.fetch(reseal, ids, old, new)]
        from_keys = dict(Counter(keys[i] for i in done))
        if done:
            await conn.execute(RECORD, tenant, actor, {
                "column": column, "values": len(done), "key": sealer.active,
                "from_keys": from_keys, "skipped": len(rows) - len(done)})
    cursor = str(rows[-1]["event_id"]) if len(rows) == limit else None
    return ResealBatch(column, len(rows), len(done), len(rows) - len(done), cursor, from_keys)
