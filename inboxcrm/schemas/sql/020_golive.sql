-- Going live (docs/architecture.md §6, "Going live"): shadow mode per tenant, the ramp of a
-- first live run, and the notices that tell reviewers about their work.

-- The mode an item runs under is fixed by its first extraction (the tenant's `mode` setting
-- then, else its policy's): NULL until then (and for items extracted before this existed,
-- which ran live). A shadowed item's plan is stored here, on the event, and nowhere else: no
-- contact, intent, operation or match row exists for it, so when the tenant goes live no
-- record can look as if it had been synced to the CRM.
ALTER TABLE inbound_events
    ADD COLUMN shadow      boolean,
    ADD COLUMN shadow_plan jsonb;
CREATE INDEX inbound_events_shadowed ON inbound_events (tenant, received_at) WHERE shadow;

-- Why a follow-up waits for a person's approval when the policy alone would not ask:
-- 'ramp_limit' (the hour's automatic follow-ups of a ramp are used up). NULL otherwise.
ALTER TABLE followup_intents ADD COLUMN approval_reason text;

-- A ramp's clock hours: how many automatic follow-ups each granted and how many it held for
-- a reviewer. The cap is enforced by the row lock of one conditional upsert
-- (inboxcrm/store/ramp.py), never by a count read before a write.
CREATE TABLE ramp_hours (
    tenant     text        NOT NULL,
    hour_start timestamptz NOT NULL,
    granted    integer     NOT NULL DEFAULT 0 CHECK (granted >= 0),
    held       integer     NOT NULL DEFAULT 0 CHECK (held >= 0),
    PRIMARY KEY (tenant, hour_start)
);

-- One notice per review wait and kind ('new', 'overdue'): the key is the promise that a
-- reviewer hears about each at most once per successful post. A batch claims its rows
-- ('sending') before it posts and marks them 'sent' after; a claim left by a crashed run is
-- taken over after a lease (inboxcrm/store/notices.py).
CREATE TABLE review_notices (
    task_id    bigint      NOT NULL REFERENCES review_tasks (task_id),
    wait_id    text        NOT NULL DEFAULT '',
    kind       text        NOT NULL,
    tenant     text        NOT NULL,
    batch_id   uuid        NOT NULL,
    status     text        NOT NULL DEFAULT 'sending',
    claimed_at timestamptz NOT NULL DEFAULT now(),
    sent_at    timestamptz,
    PRIMARY KEY (task_id, wait_id, kind),
    CONSTRAINT review_notices_kind_check CHECK (kind IN ('new', 'overdue')),
    CONSTRAINT review_notices_status_check CHECK (status IN ('sending', 'sent'))
);
CREATE INDEX review_notices_batch ON review_notices (batch_id);

COMMENT ON TABLE settings IS
    'paused.{crm,send,all} = true: operator pause; parked.{crm,send} = {"until", "reason"}: '
    'a destination limit parks the scope until then; mode = {"mode": "shadow"|"live", '
    '"since", "by"}: inboxcrm mode (a live mode since a time starts the policy''s ramp)';
