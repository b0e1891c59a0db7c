-- Where a contact's CRM record came from (issue 35): `created` (our create), `adopted` (a
-- record with the email that someone else created, matched before create) or `merged` (the
-- survivor a merge in the CRM was followed to). Written with the record ID, in the same
-- statement (the CRM step's success, `ledger.AlsoRecord.CRM_RECORD_ON_CONTACT`, or the merge
-- followed). A record we did not create is never written over: later upserts fill only the
-- fields the policy allows and the record has empty (docs/architecture.md §5). NULL with a
-- record ID: not known (an upsert reconciled after an unknown outcome, a record a reviewer
-- named), treated as a record we did not create.
ALTER TABLE contacts ADD COLUMN crm_origin text
    CHECK (crm_origin IN ('created', 'adopted', 'merged'));

-- The records stored before this migration, as the audit tells them: the merge followed to
-- the stored record, else its adoption, else our create.
UPDATE contacts c SET crm_origin = CASE
    WHEN EXISTS (SELECT 1 FROM audit_log a WHERE a.contact_id = c.contact_id
                 AND a.action = 'crm_record_merged'
                 AND a.detail ->> 'survivor' = c.crm_record_id) THEN 'merged'
    WHEN EXISTS (SELECT 1 FROM audit_log a WHERE a.contact_id = c.contact_id
                 AND a.action = 'crm_record_adopted'
                 AND a.detail ->> 'crm_record_id' = c.crm_record_id) THEN 'adopted'
    ELSE 'created' END
WHERE c.crm_record_id IS NOT NULL;
