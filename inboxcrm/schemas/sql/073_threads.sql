-- Threads (docs/architecture.md §5, "Threads"): our follow-up answers the inbound message
-- (`In-Reply-To`, `References`) under a Message-ID recorded with its intent, and a message
-- that names one of ours, or an earlier inbound message of the same tenant, is a reply in
-- a thread we know: logged to its contact, never acknowledged again.
-- `thread_refs`: the message-IDs the message names (References, then In-Reply-To), as
-- extraction read them; NULL for an item extracted before this migration (no thread).
ALTER TABLE inbound_events ADD COLUMN thread_refs text[];
-- The Message-ID our follow-up went out with (`<intent_id@sender domain>`), set with the
-- send's lease, before the provider is called.
ALTER TABLE followup_intents ADD COLUMN message_id text;
CREATE UNIQUE INDEX followup_intents_message_id
    ON followup_intents (tenant, message_id) WHERE message_id IS NOT NULL;
