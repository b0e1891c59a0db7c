"""An item held `ambiguous` at its follow-up send, for tests of what a person may do then."""

from __future__ import annotations

from inboxcrm.verify.probe import StackClient, message_from, unique_email

SEND_KEY = "{}:send"


async def hold_send_ambiguous(env: StackClient, prefix: str, first_attempt: str,
                              attempts_timeout: float = 90) -> tuple[str, str]:
    """Deliver a message whose first send attempt fails with the sandbox fault
    `first_attempt` (`timeout_after_commit`: the provider took it; `timeout_before_commit`:
    it did not) and whose later attempts hang; then a day passes, so the idempotency key's
    window is over and nothing can confirm the outcome: held `ambiguous`. (workflow ID,
    the sender's address)."""
    email = unique_email(prefix)
    await env.inject("mail.send", first_attempt)
    await env.inject("mail.send", "timeout_before_commit", count=50)
    workflow_id = await env.deliver(message_from(email))
    op_key = SEND_KEY.format(workflow_id)

    async def second_attempt_running() -> bool:
        op = await env.operation(op_key)
        return op is not None and op["attempts"] >= 2

    await env.wait_for(second_attempt_running, timeout=attempts_timeout,
                       what="a second send attempt")
    await env.db.execute("UPDATE operations SET first_attempt_at = first_attempt_at - "
                         "interval '25 hours', key_window_from = key_window_from - "
                         "interval '25 hours' WHERE op_key = $1", op_key)
    await env.move_sandbox_clock(advance_seconds=25 * 3600)
    await env.reset_faults()
    state, reason = await env.wait_state(workflow_id, "ambiguous", timeout=90)
    assert (state, reason) == ("ambiguous", "outcome_unconfirmed")
    return workflow_id, email
