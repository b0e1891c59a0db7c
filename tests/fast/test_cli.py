"""The console script as people expect it, without a stack: `--version`, shell completion,
`--json` wherever data is printed, one `--since` parser, a question before a destructive
command, and expected failures as one line on stderr with a non-zero exit (no traceback)."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command

from inboxcrm.cli.common import parse_since
from inboxcrm.cli.main import app

# Nothing listens here: a command that reaches the database or the relay fails fast.
NOWHERE_DB = "postgresql://postgres@127.0.0.1:9/none"


def run(tmp_path: Path, *args: str, stdin: str | None = None, **env: str
        ) -> subprocess.CompletedProcess[str]:
    """`inboxcrm ARGS` in a clean environment (the local stack's rules unless overridden),
    in a folder with no .data/stack.env, stdin not a terminal."""
    environment = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "INBOXCRM_ENV": "local",
                   "DATABASE_URL": NOWHERE_DB, **env}
    return subprocess.run([sys.executable, "-m", "inboxcrm.cli", *args], env=environment,
                          cwd=tmp_path, input=stdin or "", capture_output=True, text=True,
                          timeout=60, check=False)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# ------------------------------------------------------------------ version, completion
def test_version_is_the_installed_distributions(tmp_path: Path) -> None:
    """What the installed distribution says (asked from outside the checkout, whose own
    stale *.egg-info would answer otherwise), and a real version, not a placeholder."""
    shown = run(tmp_path, "--version")
    assert shown.returncode == 0, shown.stderr
    installed = subprocess.run(
        [sys.executable, "-c", "from importlib.metadata import version; "
         "print(version('inboxcrm'))"], cwd=tmp_path, capture_output=True, text=True,
        timeout=60, check=True).stdout.strip()
    assert shown.stdout.strip() == f"inboxcrm {installed}"
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", installed), installed


def test_shell_completion_is_offered_and_prints_a_script(tmp_path: Path) -> None:
    assert "--install-completion" in run(tmp_path, "--help").stdout
    console_script = Path(sys.executable).parent / "inboxcrm"
    script = subprocess.run([str(console_script), "--show-completion", "bash"],
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=60, check=False)
    assert script.returncode == 0, script.stderr
    assert "complete -o default -F _inboxcrm_completion inboxcrm" in script.stdout
    assert "_INBOXCRM_COMPLETE=complete_bash" in script.stdout


# ------------------------------------------------------------------ --json everywhere
def _commands(group: Any, prefix: str = "") -> dict[str, Any]:
    """Every leaf command of the console script, by its full name (`review approve`)."""
    found: dict[str, Any] = {}
    for name, command in group.commands.items():
        if hasattr(command, "commands"):  # a group (typer's own click)
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[f"{prefix}{name}"] = command
    return found


def test_every_command_takes_json() -> None:
    commands = _commands(get_command(app))
    assert {"status", "audit", "purge", "forget", "rehearse", "chaos", "reconcile",
            "send-test", "review approve", "reviewer revoke", "shadow report"} <= set(commands)
    missing = [name for name, command in commands.items()
               if not any("--json" in getattr(p, "opts", []) for p in command.params)]
    assert missing == []


def test_destructive_commands_offer_a_dry_run_and_a_yes() -> None:
    commands = _commands(get_command(app))
    for name in ("purge", "forget"):
        options = {opt for p in commands[name].params for opt in getattr(p, "opts", [])}
        assert {"--dry-run", "--yes"} <= options, name


# ------------------------------------------------------------------ one --since
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "expected"), [
    ("30s", NOW - timedelta(seconds=30)),
    ("90m", NOW - timedelta(minutes=90)),
    (" 24h ", NOW - timedelta(hours=24)),
    ("7d", NOW - timedelta(days=7)),
    ("2026-12-01T10:00:00", datetime(2026, 12, 1, 10, 0, tzinfo=UTC)),
    ("2026-12-01T10:00:00Z", datetime(2026, 12, 1, 10, 0, tzinfo=UTC)),
    ("2026-12-01T11:00:00+01:00", datetime(2026, 12, 1, 10, 0, tzinfo=UTC)),
    ("2026-12-01", datetime(2026, 12, 1, tzinfo=UTC)),
])
def test_since_reads_spans_and_iso_times(text: str, expected: datetime) -> None:
    assert parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["3x", "yesterday", "-1h", "1000000h", ""])
def test_since_refuses_anything_else(text: str) -> None:
    with pytest.raises(typer.Exit) as refused:
        parse_since(text, NOW)
    assert refused.value.exit_code == 1


def test_both_commands_with_since_answer_alike(tmp_path: Path) -> None:
    """`reconcile` and `shadow report` take the same values and refuse alike, before they
    touch the database."""
    reconcile = run(tmp_path, "reconcile", "--since", "fortnight")
    shadow = run(tmp_path, "shadow", "report", "--tenant", "acme", "--since", "fortnight",
                 INBOXCRM_POLICY_DIR=str(Path(__file__).resolve().parents[2] / "policies"))
    assert reconcile.returncode == shadow.returncode == 1
    assert one_line_error(reconcile) == one_line_error(shadow)
    assert "30s, 90m, 24h, 7d" in reconcile.stderr


# ------------------------------------------------------------------ asking first
@pytest.mark.parametrize("args", [("purge", "--older-than", "30"),
                                  ("forget", "--email", "jane@example.com")])
def test_destructive_commands_refuse_without_a_terminal_unless_yes(
    tmp_path: Path, args: tuple[str, ...],
) -> None:
    policies = str(Path(__file__).resolve().parents[2] / "policies")
    refused = run(tmp_path, *args, stdin="y\n", INBOXCRM_POLICY_DIR=policies)
    assert refused.returncode == 1
    assert "pass --yes" in one_line_error(refused)
    # --yes (or --dry-run) goes ahead: to the database, which is not there.
    for extra in ("--yes", "--dry-run"):
        ahead = run(tmp_path, *args, extra, INBOXCRM_POLICY_DIR=policies)
        assert ahead.returncode == 1 and "cannot connect to the database" in one_line_error(ahead)


# ------------------------------------------------------------------ expected failures
def test_send_test_without_a_secret_says_where_it_comes_from(tmp_path: Path) -> None:
    result = run(tmp_path, "send-test")
    assert result.returncode == 1
    assert "no webhook secret" in one_line_error(result)


def test_send_test_with_the_relay_down_says_so(tmp_path: Path) -> None:
    result = run(tmp_path, "send-test", INBOXCRM_WEBHOOK_SECRET="whsec_" + "dGVzdA==" * 6,
                 RELAY_URL="http://127.0.0.1:9")
    assert result.returncode == 1
    assert "relay not reachable at http://127.0.0.1:9" in one_line_error(result)


def test_send_test_with_an_unreadable_eml_says_which(tmp_path: Path) -> None:
    result = run(tmp_path, "send-test", "--eml", "missing.eml",
                 INBOXCRM_WEBHOOK_SECRET="whsec_" + "dGVzdA==" * 6)
    assert result.returncode == 1 and "cannot read missing.eml" in one_line_error(result)


def test_without_stack_env_outside_local_the_error_points_at_make_up(tmp_path: Path) -> None:
    """A newcomer in the wrong folder (no .data/stack.env, so none of the local stack's
    settings): one line naming what is missing and where it would come from."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-m", "inboxcrm.cli", "send-test"], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 2
    line = one_line_error(result)
    assert "INBOXCRM_MAIL_FROM" in line and "stack.env" in line and "make up" in line


def test_status_of_nothing_reachable_is_one_line(tmp_path: Path) -> None:
    result = run(tmp_path, "status", "inbound/acme/standard/x")
    assert result.returncode == 1 and "is the stack up?" in one_line_error(result)

