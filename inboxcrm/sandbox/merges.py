"""Merging two CRM records, as a salesperson does in HubSpot or Salesforce (the shared part of
`crm.py`'s `POST /crm/v3/objects/contacts/merge` and `salesforce.py`'s
`POST /_sandbox/salesforce/merge`).

The record merged away leaves `sandbox.contacts` for `sandbox.merged_contacts`, naming its
survivor; its activities (notes, tasks, associations) and a Lead converted into it move to
the survivor, as both CRMs move related records. The survivor keeps its ID and its own
values; HubSpot fills the survivor's empty properties from the merged one and records
`hs_merged_object_ids` (`;`-separated) and the merged email in `hs_additional_emails`;
Salesforce keeps the master's fields. The merged record's external ID (a unique property /
External ID field) is not carried over: a later upsert by it finds nothing, which is what an
integration that does not follow the merge meets. Pipedrive (`PUT /v1/persons/{id}/merge`)
keeps the survivor's (`merge_with_id`) values and fills its empty fields from the merged
person, custom fields included, so our ID moves to a survivor that had none; the merged
person is removed (its ID answers 404). Salesforce merges Leads the same way (`merge_leads`):
the master Lead keeps its fields, the merged one leaves `sandbox.leads` for
`sandbox.merged_leads` with its Tasks moved; a converted Lead cannot be merged (Salesforce
refuses it).
"""

from __future__ import annotations

from typing import Any

import asyncpg

_LOCK = """
SELECT id, id_property, id_value, properties, created_at FROM sandbox.contacts
WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
"""
_KEEP = """
INSERT INTO sandbox.merged_contacts (id, survivor_id, crm, id_property, id_value, properties,
                                     created_at)
VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7)
"""
_MOVE = (
    "UPDATE sandbox.notes SET contact_id = $2 WHERE contact_id = $1",
    "INSERT INTO sandbox.note_contacts (note_id, contact_id) "
    "SELECT note_id, $2 FROM sandbox.note_contacts WHERE contact_id = $1 ON CONFLICT DO NOTHING",
    "UPDATE sandbox.leads SET converted_contact_id = $2 WHERE converted_contact_id = $1",
)
_DROP = "DELETE FROM sandbox.contacts WHERE id = $1"
_SURVIVOR = """
UPDATE sandbox.contacts SET properties = $2::jsonb, updated_at = clock_timestamp()
WHERE id = $1
RETURNING id, properties, created_at, updated_at
"""
# The record a merged-away ID now stands for (a survivor may itself be merged later).
SURVIVOR_OF = """
WITH RECURSIVE chain(id, survivor_id, depth) AS (
    SELECT id, survivor_id, 1 FROM sandbox.merged_contacts WHERE id = $1
    UNION ALL
    SELECT m.id, m.survivor_id, c.depth + 1 FROM sandbox.merged_contacts m
    JOIN chain c ON m.id = c.survivor_id WHERE c.depth < 20
)
SELECT survivor_id FROM chain ORDER BY depth DESC LIMIT 1
"""
MERGED_ROW = """
SELECT id, survivor_id, properties, created_at, merged_at FROM sandbox.merged_contacts
WHERE id = $1
"""


class MergeRefused(Exception):  # noqa: N818 - answered as the CRM's 400/404
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def merge(pool: asyncpg.Pool, *, crm: str, survivor: int,
                merged: int) -> asyncpg.Record:
    """Merge `merged` into `survivor` in one transaction; the survivor's row after it."""
    if survivor == merged:
        raise MergeRefused(400, "A record cannot be merged into itself.")
    async with pool.acquire() as conn, conn.transaction():
        rows = {r["id"]: r for r in await conn.fetch(_LOCK, [survivor, merged])}
        if survivor not in rows or merged not in rows:
            raise MergeRefused(404, "Object not found.")
        keep, gone = rows[survivor], rows[merged]
        await conn.execute(_KEEP, merged, survivor, crm, gone["id_property"], gone["id_value"],
                           gone["properties"], gone["created_at"])
        for statement in _MOVE:
            await conn.execute(statement, merged, survivor)
        await conn.execute(_DROP, merged)
        carried = {k: v for k, v in dict(gone["properties"] or {}).items()
                   if k != gone["id_property"]}
        properties = _merged_properties(crm, dict(keep["properties"] or {}), carried, merged)
        row: asyncpg.Record | None = await conn.fetchrow(_SURVIVOR, survivor, properties)
    assert row is not None  # locked above
    return row


def _merged_properties(crm: str, keep: dict[str, Any], gone: dict[str, Any],
                       merged: int) -> dict[str, Any]:
    if crm == "pipedrive":
        # The survivor's values win; its empty fields take the merged person's (our ID
        # field among them: Pipedrive keeps it in a custom field, not a unique property).
        out = {**{k: v for k, v in gone.items() if v not in (None, "")},
               **{k: v for k, v in keep.items() if v not in (None, "")}}
        out["email"] = keep.get("email", "")
        return out
    if crm != "hubspot":
        return keep  # Salesforce: the master's fields
    out = {**{k: v for k, v in gone.items() if v not in (None, "")},
           **{k: v for k, v in keep.items() if v not in (None, "")}}
    out["email"] = keep.get("email", "")
    ids = [*str(keep.get("hs_merged_object_ids") or "").split(";"),
           *str(gone.get("hs_merged_object_ids") or "").split(";"), str(merged)]
    out["hs_merged_object_ids"] = ";".join(dict.fromkeys(i for i in ids if i))
    emails = [*str(keep.get("hs_additional_emails") or "").split(";"),
              *str(gone.get("hs_additional_emails") or "").split(";"),
              str(gone.get("email") or "")]
    extra = [e for e in dict.fromkeys(emails) if e and e != out["email"]]
    if extra:
        out["hs_additional_emails"] = ";".join(extra)
    return out


async def survivor_of(pool: asyncpg.Pool, record_id: int) -> int | None:
    """The record `record_id` was merged into (followed to the end), None when it was not."""
    value: int | None = await pool.fetchval(SURVIVOR_OF, record_id)
    return value


_LOCK_LEADS = """
SELECT id, id_property, id_value, properties, converted_contact_id, created_at
FROM sandbox.leads WHERE id = ANY($1::bigint[]) ORDER BY id FOR UPDATE
"""
_KEEP_LEAD = """
INSERT INTO sandbox.merged_leads (id, survivor_id, id_property, id_value, properties,
                                  created_at)
VALUES ($1, $2, $3, $4, $5::jsonb, $6)
"""
_MOVE_LEAD_TASKS = "UPDATE sandbox.notes SET lead_id = $2 WHERE lead_id = $1"
_DROP_LEAD = "DELETE FROM sandbox.leads WHERE id = $1"
LEAD_SURVIVOR_OF = """
WITH RECURSIVE chain(id, survivor_id, depth) AS (
    SELECT id, survivor_id, 1 FROM sandbox.merged_leads WHERE id = $1
    UNION ALL
    SELECT m.id, m.survivor_id, c.depth + 1 FROM sandbox.merged_leads m
    JOIN chain c ON m.id = c.survivor_id WHERE c.depth < 20
)
SELECT survivor_id FROM chain ORDER BY depth DESC LIMIT 1
"""


async def merge_leads(pool: asyncpg.Pool, *, survivor: int, merged: int) -> None:
    """Merge Lead `merged` into Lead `survivor` in one transaction, as Salesforce does: the
    master keeps its fields (and its external ID), the merged Lead is deleted with its
    master named, its Tasks moved. A converted Lead is refused (Salesforce cannot merge
    one)."""
    if survivor == merged:
        raise MergeRefused(400, "A record cannot be merged into itself.")
    async with pool.acquire() as conn, conn.transaction():
        rows = {r["id"]: r for r in await conn.fetch(_LOCK_LEADS, [survivor, merged])}
        if survivor not in rows or merged not in rows:
            raise MergeRefused(404, "Object not found.")
        if any(r["converted_contact_id"] is not None for r in rows.values()):
            raise MergeRefused(400, "Converted leads cannot be merged.")
        gone = rows[merged]
        await conn.execute(_KEEP_LEAD, merged, survivor, gone["id_property"], gone["id_value"],
                           gone["properties"], gone["created_at"])
        await conn.execute(_MOVE_LEAD_TASKS, merged, survivor)
        await conn.execute(_DROP_LEAD, merged)


async def lead_survivor_of(pool: asyncpg.Pool, lead: int) -> int | None:
    """The Lead `lead` was merged into (followed to the end), None when it was not."""
    value: int | None = await pool.fetchval(LEAD_SURVIVOR_OF, lead)
    return value
