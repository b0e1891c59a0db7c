"""The sandbox's command line (inboxcrm/sandbox/__main__.py): a negative timing is refused
before anything binds, with a line naming the options."""

from __future__ import annotations

import pytest

from inboxcrm.sandbox.__main__ import main


@pytest.mark.parametrize("option", ["--latency-ms", "--hang-seconds", "--search-lag-seconds"])
def test_a_negative_timing_is_refused(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--database-url", "postgresql://127.0.0.1:1/none", "--port", "0",
                 option, "-1"])
    assert code != 0
    assert "must not be negative" in capsys.readouterr().err


def test_a_negative_latency_from_the_environment_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SANDBOX_LATENCY_MS", "-5")
    assert main(["--database-url", "postgresql://127.0.0.1:1/none", "--port", "0"]) != 0
    assert "SANDBOX_LATENCY_MS must not be negative" in capsys.readouterr().err
