-- Push mailbox sources (docs/mailboxes.md): Gmail's `users.watch` and Microsoft Graph's
-- subscriptions. One row per registered gmail/graph mailbox folder: the API's cursor (Gmail's
-- `historyId`, Graph's delta link), the subscription the provider pushes under and when it
-- runs out. Both expire (Gmail after 7 days, Graph mail after about 3): the watcher renews
-- them, and `inboxcrm_mailbox_subscription_expiry_seconds` alerts before one lapses.
CREATE TABLE mailbox_subscriptions (
    tenant              text        NOT NULL,
    kind                text        NOT NULL CHECK (kind IN ('gmail', 'graph')),
    address             text        NOT NULL,
    folder              text        NOT NULL,
    -- Graph's subscription ID; Gmail has one watch per user and no ID (NULL).
    subscription_id     text,
    -- The SHA-256 of the secret the provider echoes on every notification (Graph's
    -- `clientState`); the secret itself is never stored.
    client_state_sha256 text,
    cursor              text,                   -- historyId / deltaLink; NULL: none yet
    expires_at          timestamptz,            -- when the watch or subscription lapses
    renewed_at          timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, kind, address, folder),
    FOREIGN KEY (tenant, kind, address, folder)
        REFERENCES mailboxes (tenant, kind, address, folder) ON DELETE CASCADE
);
-- A notification names its subscription: it must lead to one mailbox folder.
CREATE UNIQUE INDEX mailbox_subscriptions_id ON mailbox_subscriptions (kind, subscription_id)
    WHERE subscription_id IS NOT NULL;
