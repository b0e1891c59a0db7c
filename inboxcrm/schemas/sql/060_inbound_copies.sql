-- Copies (docs/architecture.md §2, docs/mailboxes.md): the same message (Message-ID and
-- content hash) delivered to a tenant again, by another mailbox, folder or source, is one
-- item. The first delivery is the inbound event; every further one is a row here, linked to
-- it, with a `copy_recorded` audit entry, and starts nothing.

-- The Message-ID of each event (an identifier, never personal data), so that any source can
-- find the tenant's first item of a message. Events stored before this migration by the
-- IMAP watcher get theirs from their message identity.
ALTER TABLE inbound_events ADD COLUMN message_id text;
UPDATE inbound_events e SET message_id = m.message_id
FROM imap_messages m
WHERE m.event_id = e.event_id AND m.role = 'item' AND m.message_id IS NOT NULL;
-- One item per message and tenant: a second event of the same Message-ID and content hash
-- is refused by the database, whatever the source.
CREATE UNIQUE INDEX inbound_events_one_item_per_message
    ON inbound_events (tenant, message_id, content_sha256) WHERE message_id IS NOT NULL;

-- Each further delivery of an item's message, under its own delivery key (a redelivery of a
-- copy is answered as one and recorded once).
CREATE TABLE inbound_copies (
    copy_row       bigserial   PRIMARY KEY,
    tenant         text        NOT NULL,
    event_id       uuid        NOT NULL REFERENCES inbound_events (event_id) ON DELETE CASCADE,
    source         text        NOT NULL,
    mailbox        text        NOT NULL,
    delivery_id    text        NOT NULL,
    -- The workflow ID this delivery would have had (`inbound/{tenant}/{source}/{mailbox}/
    -- {delivery_id}`): `inboxcrm status` of it shows the item it is a copy of.
    workflow_id    text        NOT NULL,
    message_id     text        NOT NULL,
    content_sha256 text        NOT NULL,
    received_at    timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbound_copies_delivery UNIQUE (tenant, source, mailbox, delivery_id)
);
CREATE INDEX inbound_copies_event ON inbound_copies (event_id);
CREATE INDEX inbound_copies_workflow ON inbound_copies (workflow_id);
