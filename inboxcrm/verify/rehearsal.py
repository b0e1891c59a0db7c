"""`inboxcrm rehearse`: the synthetic failure rehearsal, run against the running stack before
live mail is connected. Each scenario injects a real fault into the sandbox, drives items
through the relay and the reviewer signals, and counts records on the destination side.

It uses the `rehearsal` tenant (policies/rehearsal.json) so its items are easy to tell
apart, and refuses to run against anything but the sandbox (faults are injected there).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from inboxcrm.schemas.contract import Decision
from inboxcrm.verify.probe import StackClient, message_from, unique_email

TENANT = "rehearsal"
MAILBOX = "inbox@rehearsal.test"


@dataclass
class Outcome:
    scenario: str
    expected: str
    crm_records: int
    emails: int
    final_state: str
    passed: bool
    note: str = ""


@dataclass(frozen=True)
class Expect:
    state: str
    crm_records: int
    emails: int

    def describe(self) -> str:
        return f"{self.state}, {self.crm_records} record, {self.emails} email"


class Rehearsal:
    def __init__(self, client: StackClient, timeout: float = 90,
                 progress: Callable[[str], None] | None = None) -> None:
        self.client = client
        self.timeout = timeout
        # A line per scenario as it starts and ends (the CLI prints them on stderr).
        self.progress = progress or (lambda line: None)

    def raw(self, email: str, **kwargs: str) -> str:
        return message_from(email, **kwargs).replace("sales@acme.test", MAILBOX)

    async def deliver(self, raw: str, delivery_id: str | None = None) -> str:
        return await self.client.deliver(raw, delivery_id, tenant=TENANT, mailbox=MAILBOX)

    async def settle(self, workflow_id: str, states: set[str]) -> str:
        state, _ = await self.client.wait_state(workflow_id, states, timeout=self.timeout)
        return state

    async def observe(self, name: str, expect: Expect, email: str, workflow_id: str,
                      note: str = "") -> Outcome:
        state = await self.settle(workflow_id, {expect.state})
        crm = len(await self.client.crm_records_for(email))
        emails = len(await self.client.emails_to(email))
        passed = (state, crm, emails) == (expect.state, expect.crm_records, expect.emails)
        return Outcome(name, expect.describe(), crm, emails, state, passed, note)

    # --- scenarios -------------------------------------------------------------------------
    async def duplicate_delivery(self) -> Outcome:
        email = unique_email("rh-dup")
        raw, delivery_id = self.raw(email), f"RH-{uuid.uuid4().hex[:10]}"
        answers = await asyncio.gather(*(self.client.post(raw, delivery_id, tenant=TENANT,
                                                          mailbox=MAILBOX) for _ in range(3)))
        statuses = sorted(a.json().get("status", "?") for a in answers)
        workflow_id = answers[0].json()["workflow_id"]
        outcome = await self.observe("duplicate delivery ×3", Expect("completed", 1, 1), email,
                                     workflow_id, note=",".join(statuses))
        outcome.passed &= statuses == ["accepted", "duplicate", "duplicate"]
        return outcome

    async def same_identity_same_second(self) -> Outcome:
        email = unique_email("rh-twin")
        first, second = await asyncio.gather(self.deliver(self.raw(email, subject="Pricing")),
                                             self.deliver(self.raw(email, subject="Demo")))
        await self.settle(first, {"completed"})
        outcome = await self.observe("two emails, one person, same second",
                                     Expect("completed", 1, 1), email, second)
        contacts = await self.client.contacts_for(email)
        outcome.passed &= contacts == 1
        outcome.note = f"{contacts} contact"
        return outcome

    async def crm_rate_limit(self) -> Outcome:
        email = unique_email("rh-429")
        await self.client.inject("crm.upsert", "rate_limit", count=2, retry_after=1)
        return await self.observe("CRM 429 with Retry-After", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def crm_invalid_field(self) -> Outcome:
        email = unique_email("rh-400")
        await self.client.inject("crm.upsert", "invalid_field")
        workflow_id = await self.deliver(self.raw(email))
        await self.settle(workflow_id, {"blocked"})
        await self.client.signal(workflow_id, Decision.RETRY, {"reviewer": "rehearsal",
                                                        "note": "field mapping fixed"})
        return await self.observe("CRM 400 → blocked → reviewer retry",
                                  Expect("completed", 1, 1), email, workflow_id)

    async def crm_expired_credential(self) -> Outcome:
        email = unique_email("rh-401")
        await self.client.inject("crm.upsert", "unauthorized")
        workflow_id = await self.deliver(self.raw(email))
        await self.settle(workflow_id, {"blocked"})
        await self.client.signal(workflow_id, Decision.REJECT, {"reviewer": "rehearsal"})
        return await self.observe("CRM 401 → blocked → reviewer reject",
                                  Expect("rejected", 0, 0), email, workflow_id)

    async def crm_timeout_after_commit(self) -> Outcome:
        email = unique_email("rh-crm-timeout")
        await self.client.inject("crm.upsert", "timeout_after_commit")
        return await self.observe("CRM timeout after commit", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def mail_timeout_after_commit(self) -> Outcome:
        email = unique_email("rh-mail-timeout")
        await self.client.inject("mail.send", "timeout_after_commit")
        return await self.observe("mail timeout after accept", Expect("completed", 1, 1), email,
                                  await self.deliver(self.raw(email)))

    async def search_index_lag(self) -> Outcome:
        email = unique_email("rh-lag")
        await self.client.sandbox_config(search_lag_seconds=120)
        await self.client.inject("crm.upsert", "timeout_after_commit")
        try:
            return await self.observe("CRM timeout + lagging search", Expect("completed", 1, 1),
                                      email, await self.deliver(self.raw(email)))
        finally:
            await self.client.sandbox_config(search_lag_seconds=2)

    async def auto_reply_ignored(self) -> Outcome:
        email = unique_email("rh-ooo")
        raw = self.raw(email, subject="Automatic reply", body="I am out of the office.\n")
        raw = "Auto-Submitted: auto-replied\r\n" + raw
        return await self.observe("auto-reply", Expect("ignored", 0, 0), email,
                                  await self.deliver(raw))

    async def opt_out(self) -> Outcome:
        email = unique_email("rh-optout")
        opt_out = await self.deliver(self.raw(email, subject="unsubscribe",
                                              body="Please unsubscribe me.\n"))
        await self.settle(opt_out, {"suppressed"})
        return await self.observe("opt-out, then an inquiry", Expect("suppressed", 1, 0), email,
                                  await self.deliver(self.raw(email)))

    async def review_then_approve(self) -> Outcome:
        email = unique_email("rh-review")
        raw = (f"To: {MAILBOX}\r\nSubject: pricing\r\nMessage-ID: <{uuid.uuid4().hex}@x>\r\n"
               "Content-Type: text/plain\r\n\r\nPricing please.\r\n")
        workflow_id = await self.deliver(raw)
        await self.settle(workflow_id, {"awaiting_review"})
        await self.client.signal(workflow_id, Decision.APPROVE, {
            "reviewer": "rehearsal", "corrections": {"sender_email": email}})
        return await self.observe("no sender → review → approve", Expect("completed", 1, 1),
                                  email, workflow_id)

    def scenarios(self) -> list[Callable[[], Awaitable[Outcome]]]:
        return [self.duplicate_delivery, self.same_identity_same_second, self.crm_rate_limit,
                self.crm_invalid_field, self.crm_expired_credential,
                self.crm_timeout_after_commit, self.mail_timeout_after_commit,
                self.search_index_lag, self.auto_reply_ignored, self.opt_out,
                self.review_then_approve]

    async def run(self) -> list[Outcome]:
        outcomes = []
        scenarios = self.scenarios()
        for number, scenario in enumerate(scenarios, 1):
            name = scenario.__name__.replace("_", " ")
            self.progress(f"[{number}/{len(scenarios)}] {name}…")
            await self.client.reset_faults()
            try:
                outcomes.append(await scenario())
            except (AssertionError, KeyError, ValueError) as exc:
                outcomes.append(Outcome(name, "see note", 0, 0, "?", False, str(exc)[:120]))
            done = outcomes[-1]
            self.progress(f"[{number}/{len(scenarios)}] {done.scenario}: "
                          f"{'pass' if done.passed else 'FAIL'} ({done.final_state})")
        await self.client.reset_faults()
        return outcomes
