"""One item's trace, end to end, from processes configured as an operator configures them: a
worker and a relay of the test's own that reach Temporal only through a temporal.toml profile
(TEMPORAL_CONFIG_FILE / TEMPORAL_PROFILE, no TEMPORAL_ADDRESS), with OTEL_* pointing their
OTLP/HTTP exporter at a receiver in the test. The spans of one delivery must form one trace —
the relay's request, the workflow, each step, each destination call and database statements —
and carry no personal data. The CLI connects through the same profile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg

from inboxcrm.stack.processes import ManagedProcess, free_port, http_ok, python
from inboxcrm.stack.stack import WORKER_READY, Stack
from inboxcrm.verify.probe import Endpoints, StackClient, message_from, unique_email
from tests.helpers.otlp import OtlpReceiver, ReceivedSpan

STEPS = ("extract_message", "match_and_plan", "upsert_contact_in_crm", "log_email_on_contact",
         "submit_followup_email")
DESTINATION_CALLS = ("POST /crm/v3/objects/contacts/batch/upsert",
                     "POST /crm/v3/objects/notes/batch/upsert", "POST /emails")


def profile_environment(stack: Stack, tmp_path: Path) -> dict[str, str]:
    """The stack's environment with Temporal given by a profile file instead of an address."""
    profile = tmp_path / "temporal.toml"
    profile.write_text(f'[profile.inboxcrm-test]\naddress = "{stack.temporal_address}"\n'
                       'namespace = "default"\n')
    env = {k: v for k, v in stack.env.items() if not k.startswith(("TEMPORAL_", "OTEL_"))}
    env.update(TEMPORAL_CONFIG_FILE=str(profile), TEMPORAL_PROFILE="inboxcrm-test")
    return env


def ancestors(span: ReceivedSpan, by_id: dict[str, ReceivedSpan]) -> Iterator[ReceivedSpan]:
    while span.parent_id and span.parent_id in by_id:
        span = by_id[span.parent_id]
        yield span


async def test_one_item_is_one_trace_from_the_webhook_to_the_crm_without_personal_data(
        stack: Stack, db: asyncpg.Pool, tmp_path: Path) -> None:
    relay_port = free_port()
    env = profile_environment(stack, tmp_path) | {
        "INBOXCRM_TASK_QUEUE": f"inboxcrm-trace-{uuid.uuid4().hex[:6]}",
        "INBOXCRM_RELAY_PORT": str(relay_port),
        "INBOXCRM_RELAY_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
        "INBOXCRM_WORKER_METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    sender = unique_email("tracy.quinn")
    name, subject = "Tracy Quinnborough", "Zanzibar office rollout quote"
    body = f"Hello, we need a quote for the Zanzibar office rollout.\n\nBest,\n{name}\nQuinncorp\n"
    personal = [sender, sender.split("@")[0], name, "Quinnborough", subject, "Zanzibar",
                "Quinncorp"]

    with OtlpReceiver() as receiver:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = receiver.endpoint
        worker = ManagedProcess("trace-worker", python("inboxcrm.worker"), env,
                                stack.log_dir).start()
        relay = ManagedProcess("trace-relay", python("inboxcrm.ingress.main"), env,
                               stack.log_dir).start()
        client = StackClient(Endpoints(f"http://127.0.0.1:{relay_port}", stack.sandbox_url,
                                       stack.temporal_address, env["INBOXCRM_WEBHOOK_SECRET"]),
                             db)
        try:
            worker.wait_ready(worker.log_has(WORKER_READY))  # connected through the profile
            relay.wait_ready(http_ok(f"http://127.0.0.1:{relay_port}/healthz"))  # temporal: ok
            workflow_id = await client.deliver(message_from(sender, name=name, subject=subject,
                                                            body=body))
            await client.wait_state(workflow_id, "completed", timeout=60)

            def the_trace() -> list[ReceivedSpan] | None:
                spans = receiver.snapshot()
                roots = [s for s in spans if s.name == "POST /v1/inbound/standard"]
                if not roots:
                    return None
                mine = [s for s in spans if s.trace_id == roots[-1].trace_id]
                names = {s.name for s in mine}
                wanted = {"RunWorkflow:InboundEmailWorkflow", *DESTINATION_CALLS,
                          *(f"RunActivity:{step}" for step in STEPS)}
                # A span is exported when it ends, its parent later: a statement's step may
                # still be on its way (CI saw a claim statement whose step was not yet in).
                ids = {s.span_id for s in mine}
                whole = all(s.parent_id in ids for s in mine if s.parent_id)
                return mine if wanted <= names and whole else None

            spans = await client.wait_for(lambda: _now(the_trace()), timeout=30,
                                          what="the item's whole trace")
        finally:
            worker.stop()
            relay.stop()
            await client.aclose()

        # One trace: the relay's request is the root; both processes are in it.
        [root] = [s for s in spans if s.name == "POST /v1/inbound/standard"]
        assert root.parent_id == "" and root.service == "inboxcrm-relay"
        assert root.attributes["http.response.status_code"] == "200"
        assert {s.service for s in spans} == {"inboxcrm-relay", "inboxcrm-worker"}
        by_id = {s.span_id: s for s in spans}
        for span in spans:
            if span is not root:
                assert root in ancestors(span, by_id), f"{span.name} is not under the request"
        assert any(s.name == "StartWorkflow:InboundEmailWorkflow" for s in spans)
        # Each destination call sits inside the step that made it.
        steps_of = {call: {a.name for a in ancestors(s, by_id)}
                    for s in spans for call in DESTINATION_CALLS if s.name == call}
        assert "RunActivity:upsert_contact_in_crm" in steps_of[DESTINATION_CALLS[0]]
        assert "RunActivity:log_email_on_contact" in steps_of[DESTINATION_CALLS[1]]
        assert "RunActivity:submit_followup_email" in steps_of[DESTINATION_CALLS[2]]
        # The database, from both processes, with statements and never their parameters.
        statements = [s for s in spans if "db.statement" in s.attributes]
        assert {s.service for s in statements} == {"inboxcrm-relay", "inboxcrm-worker"}
        assert any(s.attributes["db.statement"].lstrip().upper().startswith("INSERT")
                   for s in statements)
        # No personal data anywhere in what left the processes.
        exported = json.dumps([s.raw for s in spans])
        for value in personal:
            assert value not in exported, f"{value!r} was exported in a span"
        assert "@" not in exported, "an email address was exported in a span"

    # The CLI reaches Temporal through the same profile (it lists parked items there).
    cli = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "inboxcrm.cli", "resume", "--tenant", "acme"],
        env=profile_environment(stack, tmp_path), capture_output=True, text=True, timeout=60,
        check=False)
    assert cli.returncode == 0 and "woke" in cli.stdout, cli.stdout + cli.stderr


async def _now(value: list[ReceivedSpan] | None) -> list[ReceivedSpan] | None:
    return value
