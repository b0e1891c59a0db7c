"""Stored workflow histories (tests/histories/): what tests/test_replay.py replays to catch a
change that would break workflows already running. Payloads stay encrypted; the test-only
keys in `codec-keys.json` decrypt them (synthetic data only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from temporalio.client import WorkflowHistory

from inboxcrm.platform.config import Settings

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
HISTORY_KEYS = HISTORIES / "codec-keys.json"


def store_history(history: WorkflowHistory, name: str, settings: Settings) -> None:
    HISTORIES.mkdir(exist_ok=True)
    assert settings.codec_keys_file, "capturing needs the codec on"
    if not HISTORY_KEYS.exists():
        shutil.copyfile(settings.codec_keys_file, HISTORY_KEYS)
    stored = json.loads(HISTORY_KEYS.read_text())
    current = json.loads(Path(settings.codec_keys_file).read_text())
    stored["keys"].update(current["keys"])  # histories of several captures, one key file
    HISTORY_KEYS.write_text(json.dumps(stored, indent=1) + "\n")
    path = HISTORIES / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"workflow_id": history.workflow_id,
                    "history": json.loads(history.to_json())}, indent=None) + "\n")
