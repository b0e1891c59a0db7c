-- Where a provider's only tool is an idempotency key with a window (Resend: 24 h), the window
-- that matters starts with the first attempt whose outcome is not known to be a refusal: an
-- attempt the destination certainly refused (a 429 or 503 answered before it took anything, a
-- connection never made) sent nothing, so it opens no window. Set when an attempt starts,
-- given back when the attempt ends certainly refused; NULL while no attempt can have taken
-- effect. A reviewer's retry starts afresh (NULL).
ALTER TABLE operations ADD COLUMN key_window_from timestamptz;

-- Rows in flight keep the conservative start they had: their first attempt's time.
UPDATE operations SET key_window_from = first_attempt_at
WHERE status NOT IN ('completed', 'cancelled') AND first_attempt_at IS NOT NULL;
