-- The provider's request ID of an operation's last attempt (issue 37, Evidence): what a
-- provider's support asks for, recorded with the attempt's outcome in the same UPDATE
-- (store/ledger.py) and in its audit entry. Nullable: SMTP and older rows have none. Not
-- indexed, so the ledger's updates stay HOT (migration 040). The adapters keep only a
-- bounded, plain value (adapters/http.py); the check is the store's own bound.
ALTER TABLE operations
    ADD COLUMN last_request_id text
        CONSTRAINT operations_last_request_id_check CHECK (char_length(last_request_id) <= 128);
