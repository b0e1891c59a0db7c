-- When a watcher last finished a catch-up of its folder (docs/mailboxes.md, "Alerts"): a
-- quiet mailbox stores nothing for days, so `last_stored_at` cannot tell a stalled watcher
-- from an idle one; this can. NULL: never checked since it was added.
ALTER TABLE mailboxes ADD COLUMN last_checked_at timestamptz;
