"""The store gauges the relay's `/metrics` reads at scrape time (inboxcrm/ingress/metrics.py):
one statement, so every relay replica reports the same truth about the store."""

from __future__ import annotations

from inboxcrm.store.drift import DUPLICATE_MESSAGE_IDS_ALL, LATEST_SCHEDULED_GAUGES

# The latest accepted delivery per source: a loose index scan over
# inbound_events (source, received_at), one index probe per source, not a table scan.
LAST_DELIVERY_PER_SOURCE = """
WITH RECURSIVE sources AS (
    (SELECT source FROM inbound_events ORDER BY source LIMIT 1)
    UNION ALL
    SELECT (SELECT e.source FROM inbound_events e WHERE e.source > s.source
            ORDER BY e.source LIMIT 1)
    FROM sources s WHERE s.source IS NOT NULL)
SELECT coalesce(jsonb_object_agg(source, (
    SELECT extract(epoch FROM max(e.received_at)) FROM inbound_events e
    WHERE e.source = sources.source)), '{}')
FROM sources WHERE source IS NOT NULL
"""

# Registered mailbox folders by kind and state, per kind the longest time since a watching
# folder was last read up to date (its watcher's catch-up) and the shortest time left before
# a watching push source's subscription lapses; no address leaves.
MAILBOX_GAUGES = """
SELECT coalesce(jsonb_agg(jsonb_build_object(
    'kind', kind, 'state', state, 'n', n, 'oldest_check_age', oldest_check_age,
    'soonest_expiry', soonest_expiry)), '[]')
FROM (SELECT m.kind, m.state, count(*) AS n,
             max(extract(epoch FROM now() - coalesce(m.last_checked_at, m.created_at)))
               FILTER (WHERE m.state = 'watching') AS oldest_check_age,
             min(extract(epoch FROM s.expires_at - now()))
               FILTER (WHERE m.state = 'watching') AS soonest_expiry
      FROM mailboxes m
      LEFT JOIN mailbox_subscriptions s USING (tenant, kind, address, folder)
      GROUP BY m.kind, m.state) m
"""

STORE_GAUGES = f"""
SELECT
  (SELECT coalesce(jsonb_object_agg(state, n), '{{}}') FROM
     (SELECT state, count(*) AS n FROM inbound_events GROUP BY state) s) AS items,
  (SELECT count(*) FROM review_tasks WHERE status = 'open') AS queue_size,
  (SELECT coalesce(extract(epoch FROM now() - min(first_seen)), 0)
     FROM review_tasks WHERE status = 'open') AS oldest_age,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND escalate_at <= now())
     AS overdue,
  (SELECT count(*) FROM followup_intents WHERE status = 'sending' AND lease_until < now())
     AS stuck_sending,
  (SELECT count(*) FROM ({DUPLICATE_MESSAGE_IDS_ALL}) d) AS duplicate_message_ids,
  (SELECT count(*) FROM followup_intents
     WHERE status = 'cancelled' AND cancel_reason IN ('suppressed', 'opt_out',
                                                      'unsubscribed')) AS suppression_blocks,
  (SELECT count(*) FROM audit_log WHERE action = 'redelivery_content_differs')
     AS redelivery_mismatches,
  (SELECT count(*) FROM audit_log WHERE action = 'attempt_failed'
     AND detail ->> 'reason' = 'response_mismatch') AS provider_response_mismatches,
  (SELECT count(*) FROM inbound_events WHERE workflow_started_at IS NULL) AS unstarted,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND reason = 'candidates')
     AS ambiguous_matches,
  (SELECT count(*) FROM review_tasks WHERE status = 'open' AND reason = 'ramp_limit')
     AS ramp_held,
  ({LAST_DELIVERY_PER_SOURCE}) AS last_delivery,
  ({MAILBOX_GAUGES}) AS mailboxes,
  ({LATEST_SCHEDULED_GAUGES}) AS drift
"""
