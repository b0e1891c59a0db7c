"""Stored histories replay against today's workflow code, in the fast tier (the Replayer
needs no server): every history under `tests/histories/`, written by an earlier version of
the workflow, stands for workflows still running somewhere. A change that breaks one needs
`workflow.patched` (CONTRIBUTING.md, "Changing workflow code safely"); the live-run replay
of this session's histories stays in the stack tier (`tests/test_replay.py`).

Payloads stay encrypted; `tests/histories/codec-keys.json` is a test-only key that decrypts
them (synthetic data only)."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.workflow import NondeterminismError

from inboxcrm.platform.codec import data_converter
from inboxcrm.platform.config import Settings
from inboxcrm.schemas.mailboxes import GMAIL_STOP_PATCH
from inboxcrm.workflows import inbound_email, mailbox_gmail, mailbox_graph, mailbox_watch
from inboxcrm.workflows.inbound_email import InboundEmailWorkflow
from inboxcrm.workflows.mailbox_gmail import GmailWatchWorkflow
from inboxcrm.workflows.mailbox_graph import GraphMailboxWorkflow
from inboxcrm.workflows.mailbox_watch import MailboxWatchWorkflow
from tests.helpers.histories import HISTORIES, HISTORY_KEYS

WATCHER_HISTORIES = HISTORIES / "watchers"
# Each stored watcher history replays against its own class, told by its workflow type.
WATCHERS: dict[str, type] = {
    "GmailWatchWorkflow": GmailWatchWorkflow,
    "GraphMailboxWorkflow": GraphMailboxWorkflow,
    "MailboxWatchWorkflow": MailboxWatchWorkflow,
}


def _stored() -> list[Path]:
    return sorted(p for p in HISTORIES.glob("*.json") if p != HISTORY_KEYS)


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _watchers() -> list[Path]:
    return sorted(WATCHER_HISTORIES.glob("*.json"))


def _workflow_type(document: dict[str, Any]) -> str:
    started = document["history"]["events"][0]["workflowExecutionStartedEventAttributes"]
    return str(started["workflowType"]["name"])


def _history(document: dict[str, Any]) -> WorkflowHistory:
    return WorkflowHistory.from_json(document["workflow_id"], document["history"])


def test_there_are_stored_histories() -> None:
    assert len(_stored()) >= 8


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


def _patch_ids(document: dict[str, Any]) -> list[str]:
    """The patch markers a stored history recorded, in order."""
    ids = []
    for event in document["history"]["events"]:
        marker = event.get("markerRecordedEventAttributes")
        if marker and marker["markerName"] == "core_patch":
            data = marker["details"]["patch-data"]["payloads"][0]["data"]
            ids.append(json.loads(base64.b64decode(data))["id"])
    return ids


def _asked_patches(module: Any = inbound_email) -> set[str]:
    """The patch IDs the workflow asks of the SDK (`patched` or `deprecate_patch`)."""
    source = Path(module.__file__).read_text()
    asked = set()
    for name in re.findall(r"workflow\.(?:patched|deprecate_patch)\(([^)]*)\)", source):
        asked.add(name.strip("\"") if name.startswith("\"") else getattr(module, name))
    return asked


@pytest.mark.parametrize("path", _stored(), ids=lambda p: p.stem)
def test_every_stored_history_is_of_a_run_that_recorded_the_release_marker(
        path: Path) -> None:
    """The retirement boundary (docs/architecture.md §5): runs that did not record
    `patches-of-0.2`, first thing, took branches this code no longer has."""
    assert _patch_ids(_load(path))[:1] == [inbound_email.PATCHES_OF_0_2]


def test_every_patch_the_workflow_asks_is_replayed_by_a_stored_history() -> None:
    """No patch branch without a stored history that replays it, and no stored history
    with a marker the workflow no longer asks (it would not replay)."""
    recorded = {patch for path in _stored() for patch in _patch_ids(_load(path))}
    assert _asked_patches() == recorded


async def test_a_retired_run_fails_its_replay_instead_of_running_on() -> None:
    """A run of 0.1.0 (`tests/histories/retired/`) meets this code as a nondeterminism
    error: its workflow task fails and is retried, the run stays open and is never taken
    down another branch. That is why an operator drains such runs before upgrading."""
    settings = Settings(codec_keys_file=str(HISTORY_KEYS))
    document = _load(HISTORIES / "retired" / "v3-happy.json")
    history = WorkflowHistory.from_json(document["workflow_id"], document["history"])
    replayer = Replayer(workflows=[InboundEmailWorkflow],
                        data_converter=data_converter(settings))
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(history, raise_on_replay_failure=True)


def test_every_watcher_has_a_stored_history() -> None:
    """A Gmail, a Graph and an IMAP watcher run, each one that was removed (cancelled)."""
    kinds = {_workflow_type(_load(p)) for p in _watchers()}
    assert kinds == set(WATCHERS)


@pytest.mark.parametrize("path", _watchers(), ids=lambda p: p.stem)
async def test_stored_watcher_histories_replay(path: Path) -> None:
    """Mailbox watchers run for as long as their mailbox is registered: a run started by
    earlier code is still open when this code takes it over."""
    settings = Settings(codec_keys_file=str(HISTORY_KEYS))
    document = _load(path)
    replayer = Replayer(workflows=[WATCHERS[_workflow_type(document)]],
                        data_converter=data_converter(settings))
    result = await replayer.replay_workflow(_history(document), raise_on_replay_failure=True)
    assert result.replay_failure is None


def _activities(document: dict[str, Any]) -> list[str]:
    return [e["activityTaskScheduledEventAttributes"]["activityType"]["name"]
            for e in document["history"]["events"]
            if "activityTaskScheduledEventAttributes" in e]


def test_every_patch_a_watcher_asks_is_replayed_by_a_stored_history() -> None:
    """As for the item workflow: each watcher patch has a stored run that recorded it, and
    no stored watcher run records a patch the code no longer asks."""
    asked = set().union(*(_asked_patches(m) for m in (mailbox_gmail, mailbox_graph,
                                                      mailbox_watch)))
    recorded = {patch for path in _watchers() for patch in _patch_ids(_load(path))}
    assert asked == recorded == {GMAIL_STOP_PATCH}


def _gmail_removed() -> tuple[list[Path], list[Path]]:
    """The stored Gmail watcher runs that were removed: before `gmail-stop-on-remove`
    (no marker) and since."""
    removed = [p for p in _watchers() if _workflow_type(_load(p)) == "GmailWatchWorkflow"
               and _load(p)["history"]["events"][-1]["eventType"]
               == "EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED"]
    before = [p for p in removed if GMAIL_STOP_PATCH not in _patch_ids(_load(p))]
    return before, [p for p in removed if p not in before]


def test_a_gmail_watcher_removed_since_the_patch_stopped_its_watch() -> None:
    """Runs that recorded the marker call `users.stop` on removal, and runs before it did
    not: the two branches the patch keeps apart, each with a stored history."""
    before, since = _gmail_removed()
    assert before and since
    assert all("stop_gmail_watch" not in _activities(_load(p)) for p in before)
    assert all(_activities(_load(p))[-1] == "stop_gmail_watch" for p in since)


@pytest.mark.parametrize("path", _gmail_removed()[0], ids=lambda p: p.stem)
async def test_without_the_patch_a_run_removed_before_it_would_not_replay(
        path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard is what keeps a run removed before the change replaying: with
    `workflow.patched` answering True (the stop asked unconditionally, as if the guard
    were dropped), its history meets a command it never recorded."""
    monkeypatch.setattr(workflow, "patched", lambda patch_id: True)
    settings = Settings(codec_keys_file=str(HISTORY_KEYS))
    replayer = Replayer(workflows=[GmailWatchWorkflow], data_converter=data_converter(settings),
                        workflow_runner=UnsandboxedWorkflowRunner())
    with pytest.raises(NondeterminismError):
        await replayer.replay_workflow(_history(_load(path)), raise_on_replay_failure=True)
