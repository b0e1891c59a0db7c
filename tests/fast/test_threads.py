"""Threads without a stack: which IDs a message names, and the headers our follow-up
writes (docs/architecture.md §5, "Threads")."""

from __future__ import annotations

from inboxcrm.domain.extraction.minimise import MAX_THREAD_REFS, minimise, thread_refs
from inboxcrm.domain.followup import MAX_REFERENCES, Thread, followup_message_id


def test_references_then_in_reply_to_newest_kept() -> None:
    refs = " ".join(f"<m{i}@x.test>" for i in range(30))
    found = thread_refs(refs, "<m29@x.test> <other@y.test>")
    assert len(found) == MAX_THREAD_REFS
    assert found[-2:] == ["<m29@x.test>", "<other@y.test>"]
    assert thread_refs(None, "not an id") == []


def test_a_long_references_header_keeps_its_newest_ids() -> None:
    refs = " ".join(f"<{'a' * 40}{i}@example.com>" for i in range(60))  # ~3,300 characters
    raw = (f"From: a@example.com\r\nTo: b@acme.test\r\nSubject: Re: x\r\nReferences: {refs}"
           "\r\nIn-Reply-To: <ours@acme.test>\r\n\r\nhello\r\n").encode()
    routing = minimise(raw).routing_headers
    found = thread_refs(routing.get("References"), routing.get("In-Reply-To"))
    assert found[-1] == "<ours@acme.test>"
    assert found[-2] == f"<{'a' * 40}59@example.com>"


def test_the_followup_answers_the_message() -> None:
    mid = followup_message_id("0f0e", "Acme Sales <sales@acme.test>")
    assert mid == "<0f0e@acme.test>"
    assert Thread(mid).headers() == {"Message-ID": mid}
    chain = tuple(f"<r{i}@x>" for i in range(15))
    headers = Thread(mid, "<in@x>", chain).headers()
    assert headers["In-Reply-To"] == "<in@x>"
    written = headers["References"].split()
    assert len(written) == MAX_REFERENCES
    assert written[0] == "<r0@x>" and written[-1] == "<in@x>"


def test_the_crm_gets_what_the_policy_allows_of_a_message() -> None:
    """`crm_email_text` (docs/architecture.md §5, "The conversation in the CRM"): a snippet
    by default, the minimised text, or the subject only."""
    from inboxcrm.domain.policy import CRM_SNIPPET_CHARS, CRM_TEXT_CHARS, get_policy

    policy = get_policy("acme")
    assert policy.crm_email_text == "snippet"
    text = "Hi,\n\n  could you send\tpricing?\n" + "x" * 500
    snippet = policy.crm_text(text)
    assert snippet.startswith("Hi, could you send pricing? x")
    assert len(snippet) == CRM_SNIPPET_CHARS and snippet.endswith("…")
    assert policy.crm_text("Short.") == "Short."
    whole = policy.model_copy(update={"crm_email_text": "minimised"})
    assert whole.crm_text(text) == text.strip()[:CRM_TEXT_CHARS]
    none = policy.model_copy(update={"crm_email_text": "subject_only"})
    assert none.crm_text(text) == ""
