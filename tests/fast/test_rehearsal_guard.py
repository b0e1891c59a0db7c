"""The rehearsal's pure parts: the guard over what the workers reported, and the per-case
lines the CLI prints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from inboxcrm.cli.verify import _case_lines
from inboxcrm.verify.rehearsal import (
    Outcome,
    OwnWorkers,
    destination_problems,
    same_origin,
)

SANDBOX = "http://127.0.0.1:8090"


def worker(**urls: str) -> dict[str, Any]:
    return {"worker_id": "host:1:ab", "task_queue": "inboxcrm", "crm_provider": "sandbox",
            "mail_provider": "sandbox", "crm_url": f"{SANDBOX}/", "mail_url": f"{SANDBOX}/",
            **urls}


def test_same_origin_is_scheme_host_and_port() -> None:
    assert same_origin("http://127.0.0.1:8090/", SANDBOX)
    assert same_origin("http://localhost:8090/crm", SANDBOX)
    assert not same_origin("http://127.0.0.1:8091/", SANDBOX)
    assert not same_origin("https://127.0.0.1:8090/", SANDBOX)
    assert not same_origin("https://api.hubapi.com/", SANDBOX)
    assert not same_origin("", SANDBOX)


def test_every_worker_on_the_sandbox_passes() -> None:
    assert destination_problems([worker(), worker(worker_id="other")], SANDBOX) == []


def test_no_worker_reporting_refuses() -> None:
    [problem] = destination_problems([], SANDBOX)
    assert "no live worker" in problem


def test_one_live_destination_refuses_naming_the_worker() -> None:
    problems = destination_problems(
        [worker(), worker(worker_id="w2", task_queue="q2", mail_provider="resend",
                          mail_url="https://api.resend.com/"),
         worker(worker_id="w3", crm_provider="unavailable", crm_url="")], SANDBOX)
    assert problems == [
        "worker w2 (task queue q2) would call mail resend at https://api.resend.com/",
        "worker w3 (task queue inboxcrm) would call crm unavailable at an unknown URL"]


def test_case_lines_show_record_queue_entry_and_evidence() -> None:
    outcome = Outcome("hand-off", "completed, 1 record, 1 email", 1, 1, "completed", True,
                      workflow_id="inbound/rehearsal/x",
                      record={"id": "501", "fields": {"email": "a@example.test"}},
                      queue_entry={"reason": "http_401", "owner": "integration",
                                   "escalate_at": "2026-12-03T12:00:00+00:00",
                                   "status": "resolved", "resolved_by": "operator"},
                      evidence={"audit_ids": [7, 9, 12],
                                "command": "inboxcrm audit --workflow inbound/rehearsal/x"})
    assert _case_lines(outcome) == [
        "hand-off — inbound/rehearsal/x",
        "  CRM record 501: email=a@example.test",
        "  queue entry: http_401, owner integration, escalates at 2026-12-03T12:00:00+00:00, "
        "resolved by operator",
        "  evidence: audit entries 7…12 (3): inboxcrm audit --workflow inbound/rehearsal/x"]
    bare = Outcome("auto-reply", "ignored", 0, 0, "ignored", True)
    assert _case_lines(bare)[1:] == ["  CRM record: none", "  queue entry: none"]


def test_a_killed_rehearsal_s_worker_is_stopped_by_the_next_one(tmp_path: Path) -> None:
    """A rehearsal killed itself (kill -9, a CI timeout) cannot stop the worker it started;
    the next rehearsal stops it, and only it: a process whose environment names another
    queue is left alone."""
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, "INBOXCRM_TASK_QUEUE": "q-rehearsal-aaaaaa"})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**os.environ, "INBOXCRM_TASK_QUEUE": "q-someone-else"})
    try:
        (tmp_path / "workers.pid").write_text(
            f"{ours.pid} q-rehearsal-aaaaaa\n{other.pid} q-rehearsal-bbbbbb\n")
        OwnWorkers({}, "q", log_dir=tmp_path)
        assert ours.wait(10) == -signal.SIGTERM
        assert other.poll() is None
        assert not (tmp_path / "workers.pid").exists()
    finally:
        for proc in (ours, other):
            proc.kill()
            proc.wait()
