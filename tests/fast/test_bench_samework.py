"""The same-work floor's pure pieces (bench/samework.py, bench/throughput.py): which process
a run is charged, the ratios against the floor and the result file's schema."""

from __future__ import annotations

from typing import Any

from bench import samework, throughput
from bench.report import same_work_rows


def _run(kind: str, per_second: float, cpu: dict[str, float], items: int = 10,
         round_no: int = 0) -> dict[str, Any]:
    key = "settled" if kind in ("product", "samework") else "workflows"
    return {"kind": kind, "round": round_no, "per_second": per_second, key: items,
            "cpu_seconds": cpu}


SHARED = {"postgres": 0.1, "temporal": 0.2, "sandbox": 0.05, "sandbox-postgres": 0.05,
          "bench": 5.0, "bare-endpoint": 1.0}


def runs() -> list[dict[str, Any]]:
    product = _run("product", 20.0, {**SHARED, "relay": 0.04, "worker": 0.3, "worker-2": 0.3,
                                     "samework-relay": 0.5, "samework-worker": 0.5,
                                     "floor-worker": 0.5})
    same = _run("samework", 25.0, {**SHARED, "samework-relay": 0.02, "samework-worker": 0.2,
                                   "samework-worker-2": 0.2, "relay": 0.5, "worker": 0.5})
    floor = _run("floor", 30.0, {**SHARED, "floor-worker": 0.1, "worker": 0.5})
    return [floor, same, product]


def test_each_run_is_charged_its_own_side_and_the_shared_processes() -> None:
    assert throughput.counts_for("product", "worker-2")
    assert not throughput.counts_for("product", "samework-worker")
    assert not throughput.counts_for("product", "floor-worker")
    assert throughput.counts_for("samework", "samework-relay")
    assert not throughput.counts_for("samework", "relay")
    assert throughput.counts_for("floor-same-shape", "floor-worker-2")
    for kind in ("product", "samework", "floor"):
        assert throughput.counts_for(kind, "temporal")
        assert throughput.counts_for(kind, "sandbox-postgres")
        assert not throughput.counts_for(kind, "bench")
        assert not throughput.counts_for(kind, "bare-endpoint")


def test_same_work_ratios_sum_every_process_of_each_side() -> None:
    cpu = throughput.cpu_per_item(runs())
    # product: shared 40 ms (bench, bare endpoint left out) + relay 4 + workers 60 = 104
    assert cpu["product"]["total"] == 104.0
    # same-work floor: shared 40 + its relay 2 + its workers 40 = 82; relay/workers roles
    assert cpu["samework"] == {"postgres": 10.0, "relay": 2.0, "sandbox": 5.0,
                               "sandbox-postgres": 5.0, "temporal": 20.0, "workers": 40.0,
                               "total": 82.0}
    same = throughput.same_work_summary(runs(), cpu)
    assert same is not None
    assert same["floor"] == "samework"
    assert same["cpu_ratio"] == round(104 / 82, 3)
    assert same["throughput_ratio"] == 0.8
    assert same["target_cpu_ratio"] == 1.10 and same["target_throughput_ratio"] == 0.95
    assert same["extra_cpu_ms_by_process"] == {
        "workers": 20.0, "relay": 2.0, "postgres": 0.0, "sandbox": 0.0,
        "sandbox-postgres": 0.0, "temporal": 0.0, "total": 22.0}
    assert same["throughput_ratio_by_round"] == [{"round": 1, "throughput_ratio": 0.8}]


def test_result_file_names_the_floor_of_every_ratio() -> None:
    out = throughput.same_work_summary(runs(), throughput.cpu_per_item(runs()))
    assert out is not None
    assert set(out) == {"floor", "what", "cpu_ms_per_email", "per_second", "cpu_ratio",
                        "throughput_ratio", "target_cpu_ratio", "target_throughput_ratio",
                        "extra_cpu_ms_by_process", "throughput_ratio_by_round",
                        "history_events_per_item", "history_event_types"}
    labels = [row[0] for row in same_work_rows(out)]
    assert labels[:2] == ["CPU per email, product / same-work floor",
                          "emails/s, product / same-work floor"]


def test_no_same_work_run_no_summary_and_no_division_by_zero() -> None:
    only_product = [r for r in runs() if r["kind"] == "product"]
    assert throughput.same_work_summary(only_product, throughput.cpu_per_item(only_product)) \
        is None
    assert throughput.ratio(1.0, 0.0) is None and throughput.ratio(None, 2.0) is None


def test_the_floor_parses_the_sender_and_keys_the_crm_record_by_tenant_and_address() -> None:
    raw = "From: Maria Lopez <Maria@Example.com>\r\nSubject: hi\r\n\r\nbody\r\n"
    assert samework.parse_sender(raw) == ("maria@example.com", "Maria Lopez")
    assert samework.external_id("acme", "a@x.test") != samework.external_id("beta", "a@x.test")
    assert len(samework.external_id("acme", "a@x.test")) == 32


def test_event_types_that_differ_side_by_side() -> None:
    both = runs()
    both[1]["steps_per_item"] = {"history_events": 8, "event_types": {
        "MARKER_RECORDED": 3, "WORKFLOW_TASK_COMPLETED": 2}}
    both[2]["steps_per_item"] = {"history_events": 13, "event_types": {
        "MARKER_RECORDED": 6, "WORKFLOW_TASK_COMPLETED": 2, "UPSERT_SEARCH_ATTRIBUTES": 1}}
    assert throughput.event_type_diff(both) == {
        "MARKER_RECORDED": {"product": 6, "samework": 3},
        "UPSERT_SEARCH_ATTRIBUTES": {"product": 1, "samework": 0}}
