-- Reviewers as people (docs/architecture.md §6, §7): each has a personal token (only its
-- SHA-256 is stored; the token is shown once by `inboxcrm reviewer add`) and the tenants whose
-- items they may read and decide. A revoked reviewer keeps their row (the audit names them);
-- a name is unique among the reviewers not revoked.
CREATE TABLE reviewers (
    reviewer_id  bigserial PRIMARY KEY,
    name         text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$'),
    token_sha256 bytea NOT NULL CHECK (octet_length(token_sha256) = 32),
    tenants      text[] NOT NULL CHECK (cardinality(tenants) > 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    created_by   text NOT NULL,
    revoked_at   timestamptz,
    revoked_by   text,
    CONSTRAINT reviewers_token_key UNIQUE (token_sha256)
);

CREATE UNIQUE INDEX reviewers_active_name_key ON reviewers (name) WHERE revoked_at IS NULL;
