"""The demo tenant's sender is a default of the local stack only: outside INBOXCRM_ENV=local
an unset INBOXCRM_MAIL_FROM refuses to start, so a real tenant never mails as Acme."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from inboxcrm.platform.config import LOCAL_MAIL_FROM, ROOT, MissingSetting, Settings


@pytest.fixture(autouse=True)
def no_mail_from(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("INBOXCRM_"):
            monkeypatch.delenv(name)


def test_outside_the_local_stack_an_unset_sender_refuses_to_start() -> None:
    with pytest.raises(MissingSetting, match="INBOXCRM_MAIL_FROM is not set"):
        Settings()
    with pytest.raises(MissingSetting, match="INBOXCRM_MAIL_FROM"):
        Settings(env="production", mail_from="   ")


def test_the_local_stack_mails_as_its_demo_tenant_unless_told_otherwise() -> None:
    assert Settings(env="local").mail_from == LOCAL_MAIL_FROM == "Acme Sales <sales@acme.test>"
    assert Settings(env="local", mail_from="Ops <ops@example.com>").mail_from == (
        "Ops <ops@example.com>")


def test_a_set_sender_is_used_as_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INBOXCRM_MAIL_FROM", "Initech Sales <sales@initech.example>")
    assert Settings().mail_from == "Initech Sales <sales@initech.example>"


def test_no_production_default_names_the_demo_tenant() -> None:
    assert "acme" not in str(Settings.model_fields["mail_from"].default)


@pytest.mark.parametrize("module", ["inboxcrm.worker", "inboxcrm.ingress.main"])
def test_the_worker_and_the_relay_refuse_in_one_line(module: str, tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "INBOXCRM_POLICY_DIR": str(ROOT / "policies")}
    started = subprocess.run([sys.executable, "-m", module], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=60, check=False)
    assert started.returncode == 2
    assert "Traceback" not in started.stderr and "INBOXCRM_MAIL_FROM is not set" in started.stderr
