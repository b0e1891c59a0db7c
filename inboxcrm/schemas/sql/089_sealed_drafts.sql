-- The edited draft is sealed at rest (docs/architecture.md §7, "Privacy in the store"):
-- `followup_intents.draft_text` holds `ixa1:` + base64 of the envelope, longer than the
-- 20,000 characters the text may have (its draft limits' `max_chars`, checked on the
-- plaintext before it is stored). The bound is on what is stored: 20,000 characters of up
-- to 4 bytes each, the envelope's header (a key ID of at most 64 characters), nonce and tag,
-- in base64.
ALTER TABLE followup_intents
    DROP CONSTRAINT followup_intents_draft_text_check,
    ADD CONSTRAINT followup_intents_draft_text_check
        CHECK (char_length(draft_text) <= 110000);
