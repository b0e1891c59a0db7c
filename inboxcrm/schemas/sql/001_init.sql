-- inboxcrm integration store. PostgreSQL is the arbiter of uniqueness: every "is this the
-- same X?" question of docs/architecture.md §2 is a unique constraint here, never read-then-write.

-- The delivery ledger. Raw content is stored once, here, and never passed through workflow
-- history (the workflow input is event_id).
CREATE TABLE inbound_events (
    event_id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant              text        NOT NULL,
    source              text        NOT NULL,
    mailbox             text        NOT NULL,
    delivery_id         text        NOT NULL,
    workflow_id         text        NOT NULL UNIQUE,
    raw                 bytea,                      -- NULL once purged past retention
    content_sha256      text        NOT NULL,
    size_bytes          integer     NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now(),
    workflow_started_at timestamptz,                -- NULL: stored but not started (sweeper)
    start_attempts      integer     NOT NULL DEFAULT 0,
    state               text        NOT NULL DEFAULT 'received',
    reason              text,
    extraction          jsonb,                      -- validated extraction record
    route               text,
    route_reasons       jsonb,
    canonical_email     text,
    contact_id          uuid,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT inbound_events_delivery_key UNIQUE (tenant, source, mailbox, delivery_id)
);
CREATE INDEX inbound_events_unstarted ON inbound_events (received_at)
    WHERE workflow_started_at IS NULL;
CREATE INDEX inbound_events_canonical ON inbound_events (tenant, canonical_email);

CREATE TABLE contacts (
    contact_id      uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant          text        NOT NULL,
    canonical_email text        NOT NULL,
    email           text        NOT NULL,
    name            text,
    company         text,
    status          text        NOT NULL DEFAULT 'active',
    crm_record_id   text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT contacts_identity_key UNIQUE (tenant, canonical_email)
);

CREATE TABLE match_decisions (
    decision_id bigserial PRIMARY KEY,
    event_id    uuid        NOT NULL REFERENCES inbound_events (event_id),
    tenant      text        NOT NULL,
    decision    text        NOT NULL,  -- new_contact | existing_contact | candidates | no_identity
    rule        text        NOT NULL,
    contact_id  uuid REFERENCES contacts (contact_id),
    candidates  jsonb       NOT NULL DEFAULT '[]',
    created_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT match_decisions_event_key UNIQUE (event_id)
);

CREATE TABLE review_tasks (
    task_id         bigserial PRIMARY KEY,
    event_id        uuid        NOT NULL REFERENCES inbound_events (event_id),
    workflow_id     text        NOT NULL,
    tenant          text        NOT NULL,
    reason          text        NOT NULL,
    owner           text        NOT NULL,
    status          text        NOT NULL DEFAULT 'open',  -- open | resolved
    first_seen      timestamptz NOT NULL DEFAULT now(),
    latest_attempt  timestamptz NOT NULL DEFAULT now(),
    destination_ref text,
    escalate_at     timestamptz NOT NULL,
    escalated_at    timestamptz,
    resolved_at     timestamptz,
    resolved_by     text,
    resolution      text
);
-- At most one open task per workflow: re-opening is idempotent.
CREATE UNIQUE INDEX review_tasks_one_open ON review_tasks (workflow_id) WHERE status = 'open';
CREATE INDEX review_tasks_queue ON review_tasks (first_seen) WHERE status = 'open';

CREATE TABLE followup_intents (
    intent_id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),  -- provider idempotency key
    event_id            uuid        NOT NULL REFERENCES inbound_events (event_id),
    tenant              text        NOT NULL,
    contact_id          uuid        NOT NULL REFERENCES contacts (contact_id),
    rule_id             text        NOT NULL,
    rule_version        integer     NOT NULL,
    template_id         text        NOT NULL,
    status              text        NOT NULL DEFAULT 'queued',
        -- queued | awaiting_approval | sending | sent | cancelled | ambiguous | blocked
    needs_approval      boolean     NOT NULL DEFAULT false,
    approved_by         text,
    cancel_reason       text,
    provider_message_id text,
    lease_owner         text,
    lease_until         timestamptz,
    created_at          timestamptz NOT NULL DEFAULT now(),
    sent_at             timestamptz,
    CONSTRAINT followup_intents_event_rule_key UNIQUE (event_id, rule_id, rule_version)
);
CREATE INDEX followup_intents_contact ON followup_intents (contact_id, rule_id, created_at);

-- The per-action ledger (the outbox). One row per logical side effect; every retry and
-- every replay reuses the same key.
CREATE TABLE operations (
    op_key              text PRIMARY KEY,           -- {workflow_id}:{action}
    workflow_id         text        NOT NULL,
    event_id            uuid        NOT NULL REFERENCES inbound_events (event_id),
    action              text        NOT NULL,       -- crm-upsert | send
    status              text        NOT NULL DEFAULT 'pending',
        -- pending | in_progress | waiting | completed | blocked | ambiguous | cancelled
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL,
    last_error_category text,                       -- transient | permanent | unknown
    last_error          text,                       -- never a payload
    external_ref        text,                       -- what the destination knows it by
    destination_id      text,                       -- CRM record ID / provider message ID
    evidence            text,
    first_seen          timestamptz NOT NULL DEFAULT now(),
    last_transition     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX operations_workflow ON operations (workflow_id);

CREATE TABLE suppressions (
    tenant          text        NOT NULL,
    canonical_email text        NOT NULL,
    reason          text        NOT NULL,
    source          text        NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, canonical_email)
);

CREATE TABLE audit_log (
    audit_id    bigserial PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT now(),
    tenant      text,
    event_id    uuid,
    workflow_id text,
    contact_id  uuid,
    actor       text        NOT NULL,   -- system component or reviewer name
    action      text        NOT NULL,
    detail      jsonb       NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_workflow ON audit_log (workflow_id, audit_id);
CREATE INDEX audit_log_contact ON audit_log (contact_id, audit_id);

-- Operational switches (pause). tenant '*' is the global row.
CREATE TABLE settings (
    tenant     text        NOT NULL,
    key        text        NOT NULL,
    value      jsonb       NOT NULL,
    updated_by text,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, key)
);
