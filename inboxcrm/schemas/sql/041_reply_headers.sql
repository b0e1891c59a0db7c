-- What the answer to a message needs of its headers, stored by the extraction step: when it
-- was written (its Date, with a time zone; the CRM note's time) and the languages it names
-- (Content-Language, then Accept-Language; the follow-up's language). Extraction reads them
-- in its work pool, under the work budget; before this the CRM note and the send each read
-- the first 64 KiB of the raw message and parsed its headers on the worker's event loop.
-- `languages` is NULL only for an item extracted before this migration: those steps then
-- read the head as before ('{}': the message names none).
ALTER TABLE inbound_events
    ADD COLUMN written_at timestamptz,
    ADD COLUMN languages text[];
