-- Provider sources (inboxcrm/sources.py) and one-click unsubscribe (inboxcrm/unsubscribe.py).

-- Webhook tokens seen, one use each (Mailgun signs only timestamp + token, not the body, so a
-- captured signature must not be reusable). This is replay protection, not dedupe: a genuine
-- redelivery carries a new token and is deduplicated by inbound_events' delivery key. Rows
-- older than the tolerance window are pruned by the relay (their timestamps are rejected).
CREATE TABLE webhook_replay_tokens (
    source    text        NOT NULL,
    token     text        NOT NULL,
    signed_at timestamptz NOT NULL,          -- the provider's signed timestamp
    seen_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, token)
);
CREATE INDEX webhook_replay_tokens_signed_at ON webhook_replay_tokens (source, signed_at);


-- One-click unsubscribe needs no table of its own: it writes `suppressions` (reason
-- 'list_unsubscribe'), cancels `followup_intents` and records one `audit_log` entry.
