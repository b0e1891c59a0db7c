-- Changes of address (issue 35): `inboxcrm contact link` joins a second address of one person
-- to the contact of the first. The planner looks an inbound address up here before it keys
-- the contact by address (contacts' own (tenant, canonical_email) stays the first address),
-- so mail from either reaches the one contact and its one CRM record. An address is linked
-- at most once per tenant; an address that is a contact's own address is never an alias.
CREATE TABLE contact_addresses (
    tenant          text NOT NULL,
    canonical_email text NOT NULL,
    contact_id      uuid NOT NULL REFERENCES contacts (contact_id) ON DELETE CASCADE,
    linked_by       text NOT NULL,
    linked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, canonical_email)
);
CREATE INDEX contact_addresses_contact ON contact_addresses (contact_id);
