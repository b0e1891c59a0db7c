"""The IMAP benchmark's pure pieces (bench/imap_source.py): which store row belongs to which
sent message, the burst's rates and the IMAP ÷ webhook ratios."""

from __future__ import annotations

from typing import Any

from bench import imap_source


def _row(delivery_id: str, message_id: str, stored: float, settled: float | None,
         state: str = "completed") -> dict[str, Any]:
    return {"delivery_id": delivery_id, "message_id": message_id, "stored": stored,
            "settled": settled, "state": state}


def test_an_imap_row_is_keyed_by_message_id_a_webhook_row_by_delivery_id() -> None:
    assert imap_source.key_of(_row("INBOX:7:3", "<im-1@bench.example>", 0, 0)) == \
        "<im-1@bench.example>"
    assert imap_source.key_of(_row("wh-abc-00001", "<wh-abc-00001@bench.example>", 0, 0)) \
        == "wh-abc-00001"


def test_burst_rates_run_from_the_first_send_to_the_last_row() -> None:
    sent = {"<a>": 100.0, "<b>": 100.5}
    rows = [_row("INBOX:1:1", "<a>", 101.0, 102.0), _row("INBOX:1:2", "<b>", 102.0, 104.0)]
    out = imap_source.burst_figures(rows, sent, ["<a>", "<b>"])
    assert out["stored_per_second"] == 1.0 and out["stored_seconds"] == 2.0
    assert out["settled_per_second"] == 0.5 and out["settled"] == 2
    assert out["to_stored_ms"]["p50"] == 1250.0


def test_ratios_divide_imap_by_webhook_and_skip_what_is_missing() -> None:
    lat = {"p50": 100.0, "p95": 200.0}
    web = {"to_stored_ms": {"p50": 10.0, "p95": 20.0}, "to_done_ms": lat}
    result = {
        "paced": {"imap": {"to_stored_ms": lat, "to_done_ms": lat}, "webhook": web},
        "burst": {"imap": {"stored_per_second": 5.0, "to_stored_ms": {"count": 0}},
                  "webhook": {"stored_per_second": 50.0, "settled_per_second": 10.0,
                              "to_stored_ms": lat}},
    }
    r = imap_source.ratios(result)
    assert r["paced_to_stored_ms_p50"] == 10.0 and r["paced_to_done_ms_p95"] == 1.0
    assert r["burst_stored_per_second"] == 0.1
    assert r["burst_settled_per_second"] is None and r["burst_to_stored_ms_p50"] is None
