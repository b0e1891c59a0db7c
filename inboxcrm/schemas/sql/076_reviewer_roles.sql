-- A reviewer's role (docs/architecture.md §6, "Authority"; issue 37): a tenant's policy may
-- name the role that alone may repeat a customer-facing action (`authority.repeat_customer_facing`,
-- e.g. `lead`): a retry of an ambiguous send. Every existing reviewer is a plain `reviewer`,
-- so nothing they could do before changes until a policy names a role.
ALTER TABLE reviewers
    ADD COLUMN role text NOT NULL DEFAULT 'reviewer'
        CONSTRAINT reviewers_role_check CHECK (role ~ '^[a-z][a-z0-9_-]{0,31}$');
