-- Mailbox sources (docs/mailboxes.md): mailboxes a tenant registered to be watched, the IMAP
-- cursor per folder and UIDVALIDITY, and the identity of every message read from a folder.

-- One row per watched folder; its watcher is the Temporal workflow
-- `mailbox/{tenant}/{kind}/{address}/{folder}`. The credential is the *name* of an
-- environment variable the workers read when they connect, never its value.
CREATE TABLE mailboxes (
    tenant          text        NOT NULL,
    kind            text        NOT NULL CHECK (kind IN ('imap', 'gmail', 'graph')),
    address         text        NOT NULL,
    folder          text        NOT NULL,
    host            text,
    port            integer,
    tls             text        CHECK (tls IN ('none', 'starttls', 'tls')),
    username        text,
    password_env    text,
    oauth_token_env text,
    max_connections integer     NOT NULL DEFAULT 2 CHECK (max_connections BETWEEN 1 AND 20),
    -- What is done to a message once it is stored: nothing (the folder is opened read-only),
    -- `seen` (flag it \Seen) or `move:FOLDER`.
    after_store     text        NOT NULL DEFAULT 'none'
                                CHECK (after_store IN ('none', 'seen') OR after_store LIKE 'move:_%'),
    state           text        NOT NULL DEFAULT 'watching'
                                CHECK (state IN ('watching', 'stopped', 'error')),
    last_error      text,                               -- a category and code, no payload
    last_stored_at  timestamptz,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kind, address, folder),
    CHECK (kind <> 'imap' OR (host IS NOT NULL AND port IS NOT NULL AND tls IS NOT NULL
                              AND username IS NOT NULL
                              AND (password_env IS NULL) <> (oauth_token_env IS NULL)))
);

-- The highest UID stored per folder and UIDVALIDITY; written in the same transaction as the
-- message it covers. A new UIDVALIDITY starts a new row at 0 (the folder is read again).
CREATE TABLE imap_cursors (
    tenant         text        NOT NULL,
    address        text        NOT NULL,
    folder         text        NOT NULL,
    uidvalidity    bigint      NOT NULL CHECK (uidvalidity > 0),
    highest_uid    bigint      NOT NULL DEFAULT 0 CHECK (highest_uid >= 0),
    highest_modseq numeric(20),                 -- CONDSTORE, where the server offers it
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, address, folder, uidvalidity)
);

-- Every message read from a folder, under its identity (tenant, address, folder,
-- UIDVALIDITY, UID). `role`: `item` (it made the inbound event `event_id`), `copy` (the same
-- Message-ID and content hash was already stored for the tenant elsewhere: `event_id` is
-- the first item's), `reseen` (the same message found again in this folder after a
-- UIDVALIDITY change: `matched_from` is the row it was seen as before; no item, no copy),
-- `too_large` (over the size limit: not read, no item).
CREATE TABLE imap_messages (
    message_row    bigserial   PRIMARY KEY,
    tenant         text        NOT NULL,
    address        text        NOT NULL,
    folder         text        NOT NULL,
    uidvalidity    bigint      NOT NULL,
    uid            bigint      NOT NULL CHECK (uid > 0),
    role           text        NOT NULL CHECK (role IN ('item', 'copy', 'reseen', 'too_large')),
    event_id       uuid        REFERENCES inbound_events (event_id) ON DELETE SET NULL,
    matched_from   bigint      REFERENCES imap_messages (message_row),
    message_id     text,                        -- the Message-ID header (an identifier)
    content_sha256 text,
    size_bytes     integer     NOT NULL,
    stored_at      timestamptz NOT NULL DEFAULT now(),
    after_store_at timestamptz,                 -- when the mailbox's after-store action ran
    CONSTRAINT imap_messages_identity UNIQUE (tenant, address, folder, uidvalidity, uid),
    -- One earlier sighting is matched by at most one message after a UIDVALIDITY change.
    CONSTRAINT imap_messages_matched_once UNIQUE (matched_from)
);
CREATE INDEX imap_messages_message ON imap_messages (tenant, message_id, content_sha256);
CREATE INDEX imap_messages_event ON imap_messages (event_id);
CREATE INDEX imap_messages_after_store ON imap_messages (tenant, address, folder, uidvalidity)
    WHERE after_store_at IS NULL;
