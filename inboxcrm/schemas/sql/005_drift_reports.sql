-- Drift check reports (docs/architecture.md §4): what a run sampled and what the destination
-- disagreed with. One row per run; a retried activity rewrites its own row (run_id).
-- Findings hold IDs only (operation keys, contact/intent IDs, CRM record and message IDs).
CREATE TABLE drift_reports (
    report_id             bigserial PRIMARY KEY,
    run_id                text        NOT NULL,   -- the workflow ID, or cli:{uuid}
    trigger               text        NOT NULL,   -- schedule | on_demand
    crm                   text        NOT NULL,   -- the adapters asked
    mail                  text        NOT NULL,
    window_start          timestamptz NOT NULL,
    window_end            timestamptz NOT NULL,
    completed_in_window   integer     NOT NULL,
    sampled               integer     NOT NULL,
    missing               integer     NOT NULL,
    changed               integer     NOT NULL,
    duplicate_message_ids integer     NOT NULL,
    unverifiable          integer     NOT NULL,
    unchecked             integer     NOT NULL,
    findings              jsonb       NOT NULL DEFAULT '[]',
    finished_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT drift_reports_run_key UNIQUE (run_id),
    CONSTRAINT drift_reports_trigger_check CHECK (trigger IN ('schedule', 'on_demand'))
);
CREATE INDEX drift_reports_latest ON drift_reports (trigger, report_id DESC);

-- The sample: completed operations by completion time.
CREATE INDEX operations_completed ON operations (last_transition) WHERE status = 'completed';
-- The relay's inbound-silence gauge: the latest accepted delivery per source.
CREATE INDEX inbound_events_source_received ON inbound_events (source, received_at);
