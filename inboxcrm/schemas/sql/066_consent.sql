-- Consent from both sides (issue 35, docs/consent.md).
--
-- A suppression's scope: `all` (no email of ours at all) or `marketing` (marketing sends
-- stop; a service reply, e.g. the acknowledgment of an inquiry the person sent, may still
-- go). Every suppression recorded before this migration stopped every send: `all`.
ALTER TABLE suppressions ADD COLUMN scope text NOT NULL DEFAULT 'all'
    CONSTRAINT suppressions_scope_check CHECK (scope IN ('all', 'marketing'));

-- inboxcrm's own suppressions written to the CRM's opt-out field (HubSpot
-- `hs_email_optout`, Salesforce `HasOptedOutOfEmail`), each as its own operation with its
-- own key, `consent/{tenant}/{write_id}:crm-opt-out`. Inserted in the suppression's own
-- transaction (the outbox), worked off by the scheduled ConsentSyncWorkflow with a claim
-- lease, bounded attempts and backoff; setting an opt-out is idempotent, so a repeat after
-- an unknown outcome is its reconciliation.
CREATE TABLE crm_consent_writes (
    op_key              text PRIMARY KEY,
    tenant              text        NOT NULL,
    canonical_email     text        NOT NULL,
    contact_id          uuid,
    reason              text        NOT NULL,
    scope               text        NOT NULL DEFAULT 'all',
    status              text        NOT NULL DEFAULT 'pending',
        -- pending | in_progress | completed | blocked
    attempts            integer     NOT NULL DEFAULT 0,
    max_attempts        integer     NOT NULL DEFAULT 12,
    next_attempt_at     timestamptz NOT NULL DEFAULT now(),
    lease_until         timestamptz,
    last_error_category text,
    last_error          text,       -- never a payload
    provider            text,
    crm_field           text,
    destination_id      text,       -- the CRM record IDs written, comma-separated
    created_at          timestamptz NOT NULL DEFAULT now(),
    last_transition     timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT crm_consent_writes_status_check
        CHECK (status IN ('pending', 'in_progress', 'completed', 'blocked'))
);
CREATE INDEX crm_consent_writes_due ON crm_consent_writes (next_attempt_at)
    WHERE status IN ('pending', 'in_progress');
CREATE INDEX crm_consent_writes_identity ON crm_consent_writes (tenant, canonical_email);
