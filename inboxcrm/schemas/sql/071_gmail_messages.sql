-- The Gmail API source (docs/mailboxes.md): the Pub/Sub topic a registration's
-- `users.watch` publishes to, and every message read from a Gmail mailbox under its
-- identity (tenant, address, Gmail message ID), written in the same transaction as the
-- item's inbound event and the mailbox's historyId (mailbox_subscriptions.cursor).
ALTER TABLE mailboxes ADD COLUMN push_topic text;

-- `role`: `item` (it made the inbound event `event_id`) or `copy` (the same Message-ID and
-- content hash was stored for the tenant before: `event_id` is the first item's).
CREATE TABLE gmail_messages (
    tenant         text        NOT NULL,
    address        text        NOT NULL,
    gmail_id       text        NOT NULL,
    role           text        NOT NULL CHECK (role IN ('item', 'copy', 'too_large')),
    event_id       uuid        REFERENCES inbound_events (event_id) ON DELETE SET NULL,
    message_id     text,                        -- the Message-ID header (an identifier)
    content_sha256 text,
    size_bytes     integer     NOT NULL,
    history_id     numeric(20),                 -- the history record it was found in
    stored_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, address, gmail_id)
);
CREATE INDEX gmail_messages_event ON gmail_messages (event_id);
