"""The worker's slots (inboxcrm/worker.py `slot_options`, docs/capacity.md): fixed counts by
default; with INBOXCRM_WORKFLOW_TASK_TARGET_CPU the item slots follow the CPU between the
minimum and the maximum, and every other kind stays fixed."""

from __future__ import annotations

from temporalio.worker import (
    FixedSizeSlotSupplier,
    ResourceBasedSlotConfig,
    ResourceBasedSlotSupplier,
    ResourceBasedTunerConfig,
)

from inboxcrm.platform.config import Settings
from inboxcrm.worker import MAX_CONCURRENT_LOCAL_ACTIVITIES, slot_options


def test_fixed_counts_by_default() -> None:
    options = slot_options(Settings(env="local"))
    assert options == {"max_concurrent_activities": 50, "max_concurrent_workflow_tasks": 6,
                       "max_concurrent_local_activities": MAX_CONCURRENT_LOCAL_ACTIVITIES}


def test_item_slots_follow_the_cpu_between_the_minimum_and_the_maximum() -> None:
    tuner = slot_options(Settings(env="local", workflow_task_target_cpu=0.8,
                                  max_concurrent_workflow_tasks=40))["tuner"]
    items = tuner.workflow_slot_supplier
    assert isinstance(items, ResourceBasedSlotSupplier)
    assert items.tuner_config == ResourceBasedTunerConfig(target_memory_usage=0.9,
                                                          target_cpu_usage=0.8)
    config = items.slot_config
    assert isinstance(config, ResourceBasedSlotConfig)
    assert (config.minimum_slots, config.maximum_slots) == (2, 40)
    assert tuner.activity_slot_supplier == FixedSizeSlotSupplier(50)
    assert tuner.local_activity_slot_supplier == FixedSizeSlotSupplier(
        MAX_CONCURRENT_LOCAL_ACTIVITIES)


def test_a_minimum_above_the_maximum_is_the_maximum() -> None:
    tuner = slot_options(Settings(env="local", workflow_task_target_cpu=0.5,
                                  min_concurrent_workflow_tasks=10,
                                  max_concurrent_workflow_tasks=4))["tuner"]
    assert tuner.workflow_slot_supplier.slot_config.minimum_slots == 4
