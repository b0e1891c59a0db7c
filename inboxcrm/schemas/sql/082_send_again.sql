-- A deliberate second send (issue 37, Authority; docs/architecture.md §6): a person with the
-- authority to repeat a customer-facing action sends an unconfirmed follow-up again as its
-- own business action. That is a new intent (its UUID is its own idempotency key) of the next
-- generation of the same event and rule version, naming the intent it repeats, who approved
-- it (`approved_by`), when and why. The intent it repeats is never changed: its history is
-- the evidence. One intent per event, rule version and generation; the planner's one
-- intent per event and rule version stays generation 1 (its ON CONFLICT names that index).
ALTER TABLE followup_intents
    ADD COLUMN generation integer NOT NULL DEFAULT 1
        CONSTRAINT followup_intents_generation_check CHECK (generation >= 1),
    ADD COLUMN repeats_intent_id uuid REFERENCES followup_intents (intent_id),
    ADD COLUMN repeat_reason text
        CONSTRAINT followup_intents_repeat_reason_check CHECK (char_length(repeat_reason) <= 2000),
    ADD COLUMN repeat_approved_at timestamptz,
    ADD CONSTRAINT followup_intents_repeat_check
        CHECK ((generation = 1) = (repeats_intent_id IS NULL)
               AND (generation = 1 OR (repeat_reason IS NOT NULL AND approved_by IS NOT NULL
                                       AND repeat_approved_at IS NOT NULL)));
ALTER TABLE followup_intents DROP CONSTRAINT followup_intents_event_rule_key;
ALTER TABLE followup_intents ADD CONSTRAINT followup_intents_event_rule_key
    UNIQUE (event_id, rule_id, rule_version, generation);
CREATE UNIQUE INDEX followup_intents_planned
    ON followup_intents (event_id, rule_id, rule_version) WHERE generation = 1;
-- An intent is repeated at most once: a second send-again answers the one already made.
CREATE UNIQUE INDEX followup_intents_repeats
    ON followup_intents (repeats_intent_id) WHERE repeats_intent_id IS NOT NULL;
