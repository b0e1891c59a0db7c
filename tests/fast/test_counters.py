"""The steps' counters (inboxcrm/activities/counters.py) on a real Temporal runtime meter:
bound once per label set, and every count still reaches the exporter with its labels."""

from __future__ import annotations

import dataclasses

from temporalio.runtime import MetricBuffer, Runtime, TelemetryConfig
from temporalio.testing import ActivityEnvironment

from inboxcrm.activities import counters
from inboxcrm.platform import meter


def _count_twice(outcome: str) -> None:
    counters.count("inboxcrm_test_counted", "a test counter", action="send", outcome=outcome)
    counters.count("inboxcrm_test_counted", "a test counter", action="send", outcome=outcome)


def test_counts_reach_the_runtime_with_their_labels_and_the_activity_labels() -> None:
    buffer = MetricBuffer(1000)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=buffer))
    env = ActivityEnvironment()
    env.metric_meter = runtime.metric_meter
    env.info = dataclasses.replace(env.info, activity_type="submit_followup_email",
                                   task_queue="counters-test")
    env.run(_count_twice, "completed")
    env.run(_count_twice, "failed")
    bound = [key for key in meter._bound if "counters-test" in key]
    assert len(bound) == 2  # one per label set, however many counts

    totals: dict[tuple[str, str, str], int] = {}
    for update in buffer.retrieve_updates():
        if update.metric.name != "inboxcrm_test_counted":
            continue
        attrs = update.attributes
        key = (str(attrs["activity_type"]), str(attrs["action"]), str(attrs["outcome"]))
        totals[key] = totals.get(key, 0) + int(update.value)
    assert totals == {("submit_followup_email", "send", "completed"): 2,
                      ("submit_followup_email", "send", "failed"): 2}
