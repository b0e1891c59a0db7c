"""The `match_decisions` table: who an event's sender is (a new or existing contact, name
candidates, or no identity) and by which rule; with an exact match, the CRM operations it
queues."""

from __future__ import annotations

# What an earlier run of this event's plan decided, if one ran (a local activity's result
# dies with a killed worker, so a plan can run again after its follow-up went on the wire):
# its match to this contact by address, and the follow-up it created.
EARLIER_PLAN = """
SELECT m.decision, i.intent_id, i.status AS intent_status, i.approval_reason
FROM (SELECT 1) AS one
LEFT JOIN match_decisions m
       ON m.event_id = $1 AND m.contact_id = $2 AND m.rule = 'exact_canonical_email'
LEFT JOIN LATERAL (SELECT intent_id, status, approval_reason FROM followup_intents
                   WHERE event_id = $1 ORDER BY created_at LIMIT 1) i ON true
"""

# $1 event_id, $2 tenant, $3 decision, $4 rule, $5 contact_id, $6 candidates.
RECORD_MATCH_DECISION = """
INSERT INTO match_decisions (event_id, tenant, decision, rule, contact_id, candidates)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (event_id) DO UPDATE
SET decision = EXCLUDED.decision, rule = EXCLUDED.rule, contact_id = EXCLUDED.contact_id,
    candidates = EXCLUDED.candidates
"""

# An exact match, in one statement: the decision, the event's contact, the audit entry and
# the two CRM operations (upsert $9, note $12). Parameters as RECORD_MATCH_DECISION, then
# $7 workflow_id, $8 audit detail, $9/$10 upsert key/action, $11 max attempts,
# $12/$13 note key/action.
RECORD_CONTACT_MATCH = f"""
WITH decision AS ({RECORD_MATCH_DECISION.strip()}),
linked AS (UPDATE inbound_events SET contact_id = $5 WHERE event_id = $1),
audited AS (
    INSERT INTO audit_log (tenant, event_id, workflow_id, contact_id, actor, action, detail)
    VALUES ($2, $1, $7, $5, 'planner', 'contact_matched', $8)
)
INSERT INTO operations (op_key, workflow_id, event_id, action, max_attempts, external_ref)
VALUES ($9, $7, $1, $10, $11, $5::text), ($12, $7, $1, $13, $11, $1::text)
ON CONFLICT (op_key) DO NOTHING
"""
