-- When an operation's first attempt started: a provider idempotency key's window (Resend: 24 h
-- from its first request) is counted from it, so a repeat past the window is never mistaken
-- for a reconciliation. NULL until the first attempt; a reviewer's retry starts a new window.
ALTER TABLE operations ADD COLUMN first_attempt_at timestamptz;

-- A destination's daily limit parks a tenant's scope until the limit resets, like a pause:
-- settings key `parked.crm` / `parked.send` with value {"until": ..., "reason": ...}.
COMMENT ON TABLE settings IS
    'paused.{crm,send,all} = true: operator pause; parked.{crm,send} = {"until", "reason"}: '
    'a destination limit parks the scope until then';
