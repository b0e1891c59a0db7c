-- The words of each follow-up as planned (docs/architecture.md §5): a template's files at the
-- version an intent was planned with (`followup_intents.template_id` = `<name>@<version>`,
-- the version a hash of the files). The send, its retries and a reviewer's preview render
-- these, so a template edited after planning never changes a follow-up already decided.
-- Written with the plan (ON CONFLICT DO NOTHING: one row per tenant and version). Holds the
-- tenant's template text only, never personal data.
CREATE TABLE template_versions (
    tenant       text        NOT NULL,
    template_ref text        NOT NULL,
    sources      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT template_versions_pkey PRIMARY KEY (tenant, template_ref)
);
