-- Drafts a reviewer can edit (issue 37; docs/architecture.md §6, "Edited drafts"): a
-- follow-up held for approval may go out in words a reviewer edited within the limits its
-- rule declares. The edited text is personal data and lives with the intent, never in a
-- workflow payload: the desk or the CLI stores it here (`draft_text`, its SHA-256 and who
-- proposed it) before the decision, which carries only the hash; the approval binds that
-- hash (`approved_draft_sha256`), and the send uses the stored text only when its hash is
-- the approved one. One proposal per intent: a later one replaces it, so an approval of an
-- earlier text no longer finds its hash and is refused.
ALTER TABLE followup_intents
    ADD COLUMN draft_text text
        CONSTRAINT followup_intents_draft_text_check CHECK (char_length(draft_text) <= 20000),
    ADD COLUMN draft_sha256 text
        CONSTRAINT followup_intents_draft_sha256_check CHECK (draft_sha256 ~ '^[0-9a-f]{64}$'),
    ADD COLUMN draft_proposed_by text,
    ADD COLUMN approved_draft_sha256 text
        CONSTRAINT followup_intents_approved_draft_check
            CHECK (approved_draft_sha256 ~ '^[0-9a-f]{64}$'),
    ADD CONSTRAINT followup_intents_draft_check
        CHECK ((draft_text IS NULL) = (draft_sha256 IS NULL));
