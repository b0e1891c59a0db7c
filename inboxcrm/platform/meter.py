"""The steps' own counters on the worker's metrics endpoint (the Temporal runtime's meter).

`activity.metric_meter()` builds a meter for each activity run, and every `add` with labels
builds one more set of attributes: the four outbox counts of a happy item cost about half a
millisecond of worker CPU (`make bench`'s profile). A counter is bound once per label set,
with the labels the SDK's activity meter adds (namespace, task queue, activity type), and
reused. Labels are enums only, never personal data, so the set stays small.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.common import MetricCounter

_bound: dict[tuple[str, ...], MetricCounter] = {}


def count(name: str, description: str | None = None, **labels: str) -> None:
    """Add one to the counter `name` with `labels`, inside an activity."""
    info = activity.info()
    key = (info.namespace, info.task_queue, info.activity_type, name,
           *(f"{k}={v}" for k, v in sorted(labels.items())))
    counter = _bound.get(key)
    if counter is None:
        counter = activity.metric_meter().create_counter(name, description)
        if labels:
            counter = counter.with_additional_attributes(labels)
        _bound[key] = counter
    counter.add(1)
