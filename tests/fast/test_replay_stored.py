"""Stored histories replay against today's workflow code, in the fast tier (the Replayer
needs no server): every history under `tests/histories/`, written by an earlier version of
the workflow, stands for workflows still running somewhere. A change that breaks one needs
`workflow.patched` (CONTRIBUTING.md, "Changing workflow code safely"); the live-run replay
of this session's histories stays in the stack tier (`tests/test_replay.py`).

Payloads stay encrypted; `tests/histories/codec-keys.json` is a test-only key that decrypts
them (synthetic data only)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory
from temporalio.converter import encode_search_attributes
from temporalio.worker import Replayer

from inboxcrm.platform.codec import data_converter
from inboxcrm.platform.config import Settings
from schemas.contract import start_search_attributes
from tests.helpers.histories import HISTORIES, HISTORY_KEYS
from workflows.inbound_email import InboundEmailWorkflow


def _stored() -> list[Path]:
    return sorted(p for p in HISTORIES.glob("*.json") if p != HISTORY_KEYS)


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_there_are_stored_histories() -> None:
    assert len(_stored()) >= 10


@pytest.mark.parametrize("path", _stored(), ids=lambda p: p.stem)
async def test_stored_histories_replay(path: Path) -> None:
    """Workflows started by earlier versions of the code still replay (and so still run)."""
    settings = Settings(codec_keys_file=str(HISTORY_KEYS))
    document = _load(path)
    history = WorkflowHistory.from_json(document["workflow_id"], document["history"])
    replayer = Replayer(workflows=[InboundEmailWorkflow],
                        data_converter=data_converter(settings))
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None


def _started_without_search_attributes() -> list[Path]:
    return [p for p in _stored()
            if "searchAttributes" not in _load(p)["history"]["events"][0][
                "workflowExecutionStartedEventAttributes"]]


@pytest.mark.parametrize("path", _started_without_search_attributes(), ids=lambda p: p.stem)
async def test_an_older_builds_run_of_an_item_started_by_todays_relay_replays(
        path: Path) -> None:
    """During a rolling upgrade the relay may start an item with its search attributes
    (`start_search_attributes`) that a worker of an earlier build then runs: that build
    upserted them anyway. Today's code must replay such a history, so the start event alone
    cannot decide whether the run upserts them."""
    settings = Settings(codec_keys_file=str(HISTORY_KEYS))
    document = _load(path)
    history = WorkflowHistory.from_json(document["workflow_id"], document["history"])
    started = history.events[0].workflow_execution_started_event_attributes
    tenant = document["workflow_id"].split("/")[1]
    encode_search_attributes(start_search_attributes(tenant), started.search_attributes)
    replayer = Replayer(workflows=[InboundEmailWorkflow],
                        data_converter=data_converter(settings))
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
