"""Structured JSON logs: one object per line with the workflow ID and operation key when
known. Our code logs references and reasons only — never bodies or addresses — and the
formatter does not add any message content either."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

import temporalio.activity
import temporalio.workflow


class JsonFormatter(logging.Formatter):
    def __init__(self, component: str) -> None:
        super().__init__()
        self.component = component

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "message": record.getMessage(),
        }
        # temporalio's workflow/activity loggers attach their context as `extra`.
        activity = getattr(record, "temporal_activity", None)
        if isinstance(activity, dict):
            entry["workflow_id"] = activity.get("workflow_id")
            entry["activity"] = activity.get("activity_type")
            entry["attempt"] = activity.get("attempt")
            entry["run_id"] = activity.get("workflow_run_id")
        workflow = getattr(record, "temporal_workflow", None)
        if isinstance(workflow, dict):
            entry["workflow_id"] = workflow.get("workflow_id")
            entry["run_id"] = workflow.get("run_id")
        for key in ("op_key", "workflow_id"):
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["error"] = record.exc_info[0].__name__ if record.exc_info[0] else None
        return json.dumps(entry, default=str)


def configure_logging(component: str, level: int = logging.INFO) -> None:
    # The fields above carry temporalio's context; do not repeat it as a dict in the message.
    temporalio.activity.logger.activity_info_on_message = False
    temporalio.workflow.logger.workflow_info_on_message = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(component))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One line per outgoing HTTP request adds nothing to the outbox's own attempt log (which
    # carries the operation key); keep the client libraries to warnings.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
