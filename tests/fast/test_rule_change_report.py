"""`inboxcrm report rule-change` without a stack: a stored (hashed) rule version is traced
back to the rule's number with the template reference the intent keeps, only numbers below
`--version` count as older, and the lines and counts say so. The listing of real planned
items is tests/test_rule_change_report.py."""

from __future__ import annotations

from datetime import UTC, datetime

from inboxcrm.cli.report import classify, planned_items, render_text
from inboxcrm.domain.templates import derived_rule_version, planned_rule_number

AT = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
OLD_WORDS, NEW_WORDS = "ack@1111aaaa2222bbbb", "ack@3333cccc4444dddd"


def _group(number: int, ref: str, items: int) -> dict[str, object]:
    return {"rule_version": derived_rule_version("ack", number, ref.split("@")[1]),
            "template_id": ref, "items": items, "first_planned": AT, "last_planned": AT}


def test_a_stored_version_traces_back_to_its_rule_number() -> None:
    stored = derived_rule_version("ack", 3, "1111aaaa2222bbbb")
    assert planned_rule_number("ack", stored, OLD_WORDS, below=5) == 3
    assert planned_rule_number("ack", stored, OLD_WORDS, below=3) is None  # not older than 3
    assert planned_rule_number("ack", stored, NEW_WORDS, below=5) is None  # other words
    assert planned_rule_number("other", stored, OLD_WORDS, below=5) is None  # other rule


def test_only_lower_numbers_are_older_and_the_lines_count_them() -> None:
    rows = [_group(1, OLD_WORDS, 3), _group(1, NEW_WORDS, 1), _group(2, NEW_WORDS, 4)]
    versions = classify(rows, rule_id="ack", version=2)
    assert [(v.version, v.older, v.items) for v in versions] == [
        (1, True, 3), (1, True, 1), (None, False, 4)]
    item_rows = [{"workflow_id": f"acme-{n}", "tenant": "acme", "state": "completed",
                  "intent_status": status, "rule_version": rows[0]["rule_version"],
                  "template_id": OLD_WORDS, "planned_at": AT}
                 for n, status in enumerate(("sent", "sent", "awaiting_approval"))]
    items = planned_items(item_rows, versions)
    assert {i.planned_version for i in items} == {1}
    header = {"rule": "ack", "version": 2, "tenant": "acme", "limit": 3}
    lines = render_text(header, versions, items)
    assert lines[0] == (f"acme-0  completed  intent sent  planned v1 ({OLD_WORDS})  at "
                        f"{AT.isoformat()}")
    assert any(line.startswith(f"v1 ({OLD_WORDS}, stored ") and ": 3 item(s) older" in line
               for line in lines)
    assert any(line.startswith(f"v2 or later ({NEW_WORDS}") and "older" not in line
               for line in lines)
    assert lines[-1] == ("4 item(s) of rule ack planned under a version older than v2 (tenant "
                         "acme; intents: 1 awaiting_approval, 2 sent); 3 shown (--limit 3)")


def test_nothing_older_says_so() -> None:
    versions = classify([_group(1, OLD_WORDS, 2)], rule_id="ack", version=1)
    lines = render_text({"rule": "ack", "version": 1, "tenant": None, "limit": 1000},
                        versions, [])
    assert lines[-1] == ("0 item(s) of rule ack planned under a version older than v1 (tenant "
                         "all; intents: none)")
