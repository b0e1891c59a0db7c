-- The provider's own inbound event, kept next to the MIME rebuilt from it (docs/architecture.md
-- §5, "The provider's own event"): Postmark's JSON as posted, Mailgun's form fields as JSON.
-- A table of its own, so the hot `inbound_events` row stays narrow; written in the intake's
-- one statement, emptied with the raw message by retention and by `forget`.
CREATE TABLE provider_events (
    event_id     uuid        PRIMARY KEY REFERENCES inbound_events (event_id) ON DELETE CASCADE,
    content_type text        NOT NULL,
    body         bytea       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);
