"""inboxcrm: inbound email to CRM contacts and follow-ups without duplicates."""
