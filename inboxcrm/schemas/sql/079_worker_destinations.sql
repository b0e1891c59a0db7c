-- What each running worker would call, per tenant (docs/architecture.md §5 and §10,
-- `rehearse`; issue 37): providers and base URLs, never a secret. Each worker writes its
-- rows at start and refreshes them every few seconds; a graceful stop deletes them, a
-- killed worker's age out. `inboxcrm rehearse` refuses unless every live worker of the
-- rehearsal tenant points at the sandbox, instead of trusting the CLI's own environment.
CREATE TABLE worker_destinations (
    worker_id     text        NOT NULL,
    tenant        text        NOT NULL,
    task_queue    text        NOT NULL,
    crm_provider  text        NOT NULL,
    crm_url       text        NOT NULL,
    mail_provider text        NOT NULL,
    mail_url      text        NOT NULL,
    started_at    timestamptz NOT NULL,
    seen_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (worker_id, tenant)
);
CREATE INDEX worker_destinations_tenant_seen ON worker_destinations (tenant, seen_at);
