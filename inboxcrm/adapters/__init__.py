"""Destination adapters. Each talks to one provider over HTTP and reports failures as
`AdapterError(Classified)` from the shared classifier in `inboxcrm.adapters.errors`."""
