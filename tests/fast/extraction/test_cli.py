"""`inboxcrm extract FILE.eml --json`: answers for every input, writes nothing."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inboxcrm.cli.extract import run_extract_command
from inboxcrm.domain.extraction import extract_and_route
from inboxcrm.domain.extraction.route import ALL_REASONS, schema_errors
from inboxcrm.domain.policy import TenantPolicy
from tests.helpers.corpus import CASES

KEYS = {"extraction", "route", "reasons", "canonical_email"}
ROUTES = {"auto", "review", "ignore", "opt_out"}


def _cpython_email_data() -> list[Path]:
    try:
        import test.test_email as test_email
    except ImportError:
        return []
    directory = Path(test_email.__file__).parent / "data"
    return sorted(directory.glob("msg_*.txt"))


CPYTHON_MESSAGES = _cpython_email_data()


def _check_document(out: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    assert len(lines) == 1, out
    doc: dict[str, Any] = json.loads(lines[0])
    assert set(doc) >= KEYS and set(doc) - KEYS <= {"authentication"}
    assert doc["route"] in ROUTES
    assert isinstance(doc["reasons"], list) and set(doc["reasons"]) <= ALL_REASONS
    assert doc["canonical_email"] is None or isinstance(doc["canonical_email"], str)
    assert not schema_errors(doc["extraction"])
    return doc


def test_json_output_for_a_corpus_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INBOXCRM_POLICY_DIR", raising=False)
    case = next(c for c in CASES if c.id == "auto_pricing_plain")
    path = tmp_path / "in.eml"
    path.write_bytes(case.raw)
    monkeypatch.chdir(tmp_path)
    assert run_extract_command(path, "acme", True) == 0
    doc = _check_document(capsys.readouterr().out)
    assert doc["route"] == "auto" and doc["canonical_email"] == "jane.doe@initech.example"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.eml"]  # wrote nothing


def test_readable_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "in.eml"
    path.write_bytes(next(c for c in CASES if c.id == "opt_out_de").raw)
    assert run_extract_command(path, "acme", False) == 0
    out = capsys.readouterr().out
    assert "route:" in out and "opt_out" in out


def test_errors_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_extract_command(tmp_path / "missing.eml", "acme", True) == 1
    assert "cannot read" in capsys.readouterr().err
    path = tmp_path / "in.eml"
    path.write_bytes(b"x")
    assert run_extract_command(path, "no-such-tenant", True) == 1
    captured = capsys.readouterr()
    assert "unknown tenant" in captured.err and captured.out == ""


@pytest.mark.parametrize("seed", range(40))
def test_garbage_bytes_always_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    rng = random.Random(seed)
    if seed % 2:
        data = rng.randbytes(rng.randint(0, 5000))
    else:
        base = bytearray(rng.choice(CASES).raw[:20000])
        for _ in range(rng.randint(1, 50)):
            if base:
                base[rng.randrange(len(base))] = rng.randrange(256)
        data = bytes(base[: rng.randint(0, len(base))])
    path = tmp_path / "garbage.eml"
    path.write_bytes(data)
    assert run_extract_command(path, "acme", True) == 0
    _check_document(capsys.readouterr().out)


async def test_fuzzed_corpus_never_crashes(acme: TenantPolicy) -> None:
    rng = random.Random(20261101)
    for _ in range(400):
        raw = bytearray(rng.choice(CASES).raw[:30000])
        operation = rng.random()
        if operation < 0.3 and raw:
            del raw[rng.randrange(len(raw)):]
        elif operation < 0.6:
            for _ in range(rng.randint(1, 30)):
                if raw:
                    raw[rng.randrange(len(raw))] = rng.randrange(256)
        else:
            cut = rng.randrange(len(raw) or 1)
            raw[cut:cut] = rng.choice([b"\r\n\r\n", b"=?utf-8?b?", b"--==b0undary42==\r\n",
                                       b"\xff\xfe", b"Content-Type: multipart/mixed\r\n",
                                       b"<div style='display:none'>", b"\x00" * 10])
        outcome = await extract_and_route(bytes(raw), acme)
        assert outcome.route in ROUTES
        json.dumps(outcome.section10_json())


@pytest.mark.skipif(not CPYTHON_MESSAGES, reason="CPython's test_email data is not installed")
@pytest.mark.parametrize("path", CPYTHON_MESSAGES, ids=[p.name for p in CPYTHON_MESSAGES])
def test_cpython_email_test_data(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_extract_command(path, "acme", True) == 0
    _check_document(capsys.readouterr().out)


def test_cpython_email_test_data_present_here() -> None:
    if not CPYTHON_MESSAGES:
        pytest.skip("CPython's test_email data is not installed")
    assert len(CPYTHON_MESSAGES) >= 40


def test_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "inboxcrm"  # the venv's, PATH or not
    assert script.exists(), "the inboxcrm console script is not installed"
    path = tmp_path / "in.eml"
    path.write_bytes(next(c for c in CASES if c.id == "review_injection_body").raw)
    env = {k: v for k, v in os.environ.items() if not k.startswith("INBOXCRM_")}
    result = subprocess.run(
        [str(script), "extract", str(path), "--json"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    doc = _check_document(result.stdout)
    assert doc["route"] == "review" and "prompt_injection" in doc["reasons"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.eml"]
    assert sys.executable  # the subprocess ran the installed console script
