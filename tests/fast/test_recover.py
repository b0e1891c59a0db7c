"""`inboxcrm recover` without a stack: its bounds are checked before anything is read, and the
selection refuses an ambiguous send unless `--include-ambiguous` says so, saying why. The
run on real blocked items is tests/test_recover.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.cli.recover import AMBIGUOUS_SEND_WHY, plan, render_text

NOWHERE_DB = "postgresql://postgres@127.0.0.1:9/none"
BASE = ("recover", "--tenant", "acme", "--reason", "http_401", "--since", "1h")


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "INBOXCRM_ENV": "local",
                   "DATABASE_URL": NOWHERE_DB}
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=environment,
                          cwd=tmp_path, input="", capture_output=True, text=True, timeout=60,
                          check=False)


@pytest.mark.parametrize(("extra", "says"), [
    (("--limit", "0"), "--limit must be between 1 and"),
    (("--limit", "1001"), "--limit must be between 1 and"),
    (("--limit", "5", "--rate", "0"), "--rate must be more than 0"),
    (("--limit", "5", "--rate", "100"), "--rate must be more than 0"),
])
def test_bounds_are_refused_before_the_database(tmp_path: Path, extra: tuple[str, ...],
                                                 says: str) -> None:
    result = run(tmp_path, *BASE, *extra, "--dry-run")
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "cannot connect" not in result.stderr and "Traceback" not in result.stderr


def test_a_bad_since_and_a_missing_option_are_refused(tmp_path: Path) -> None:
    since = run(tmp_path, "recover", "--tenant", "acme", "--reason", "http_401", "--since",
                "yesterday", "--limit", "5")
    assert since.returncode == 1 and "30s, 90m, 24h, 7d" in since.stderr
    missing = run(tmp_path, "recover", "--tenant", "acme", "--since", "1h", "--limit", "5")
    assert missing.returncode == 2 and "--reason" in missing.stderr


def test_valid_arguments_go_on_to_the_database(tmp_path: Path) -> None:
    result = run(tmp_path, *BASE, "--limit", "40", "--rate", "5", "--dry-run")
    assert result.returncode == 1 and "cannot connect to the database" in result.stderr


def _row(n: int, state: str = "blocked", action: str = "crm-upsert",
         allowed: tuple[str, ...] = ("reject", "resolve", "retry")) -> dict[str, Any]:
    return {"workflow_id": f"wf-{n}", "tenant": "acme", "state": state,
            "reason": "outcome_unconfirmed" if state == "ambiguous" else "http_401:X",
            "blocked_at": "2026-12-02T09:00:00+00:00", "wait_id": "w1",
            "allowed": list(allowed), "op_key": f"wf-{n}:{action}", "action": action,
            "op_status": state, "attempts": 1, "max_attempts": 6}


def test_ambiguous_sends_are_refused_without_the_flag_and_say_why() -> None:
    rows = [_row(1), _row(2, "ambiguous", "send"), _row(3, "ambiguous", "crm-upsert"), _row(4)]

    without = plan(rows, limit=10, include_ambiguous=False)
    assert [i.workflow_id for i in without.selected] == ["wf-1", "wf-4"]
    assert [(i.workflow_id, i.outcome) for i in without.refused] == [
        ("wf-2", "refused"), ("wf-3", "refused")]
    send = without.refused[0]
    assert send.message == AMBIGUOUS_SEND_WHY
    assert "second email" in AMBIGUOUS_SEND_WHY and "--include-ambiguous" in AMBIGUOUS_SEND_WHY
    assert "--include-ambiguous" in (without.refused[1].message or "")

    flagged = plan(rows, limit=10, include_ambiguous=True)
    assert [i.workflow_id for i in flagged.selected] == ["wf-1", "wf-2", "wf-3", "wf-4"]
    assert flagged.refused == []


def test_the_limit_caps_the_selection_and_keys_are_shown_unchanged() -> None:
    rows = [_row(n) for n in range(5)] + [_row(9, allowed=("reject",))]
    capped = plan(rows, limit=3, include_ambiguous=False)
    assert [i.workflow_id for i in capped.selected] == ["wf-0", "wf-1", "wf-2"]
    assert [i.op_key for i in capped.selected] == ["wf-0:crm-upsert", "wf-1:crm-upsert",
                                                   "wf-2:crm-upsert"]
    assert capped.over_limit == 2
    assert [i.workflow_id for i in capped.refused] == ["wf-9"]
    assert "retry is not allowed" in (capped.refused[0].message or "")


def test_the_table_shows_step_key_and_outcome_per_item() -> None:
    chosen = plan([_row(1), _row(2), _row(3, "ambiguous", "send")], limit=1,
                  include_ambiguous=False)
    header = {"tenant": "acme", "reason": "http_401", "since": "2026-12-02T09:00:00+00:00",
              "limit": 1}
    before = render_text(chosen, header, ran=False)
    assert before[0] == ("wf-1  blocked  http_401:X  step crm-upsert  key wf-1:crm-upsert  "
                         "attempts 1/6  -> would retry")
    assert before[1].startswith("wf-3  ambiguous") and "not retried: ambiguous" in before[1]
    assert before[-1] == ("1 selected; 1 not retried; 1 over --limit 1 (tenant acme, reason "
                          "http_401, since 2026-12-02T09:00:00+00:00)")
    chosen.selected[0].outcome, chosen.selected[0].new_state = "accepted", "crm_pending"
    after = render_text(chosen, header, ran=True)
    assert after[0].endswith("-> accepted: now crm_pending")
    assert after[-1].startswith("1 accepted, 0 refused, 0 failed; 1 not retried")
