"""Extraction quality of the rules extractor over the labelled synthetic set
(tests/helpers/corpus.py): per-route precision / recall, unsafe routings and identity
leaks. Numbers, not pass/fail (the pass/fail bar lives in tests/fast/extraction).

    python bench/extraction_quality.py [--tenant acme]

Prints a table and writes bench/results/extraction_quality.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inboxcrm.domain.extraction import extract_and_route  # noqa: E402
from inboxcrm.domain.extraction.rules import RULES_VERSION  # noqa: E402
from inboxcrm.domain.policy import get_policy  # noqa: E402
from tests.helpers.corpus import CASES, ROUTES  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "extraction_quality.json"


async def run(tenant: str) -> dict[str, Any]:
    policy = get_policy(tenant)
    rows = []
    started = time.perf_counter()
    for case in CASES:
        outcome = await extract_and_route(case.raw, policy)
        rows.append((case, outcome))
    elapsed = time.perf_counter() - started

    per_route: dict[str, dict[str, float | int]] = {}
    for route in ROUTES:
        tp = sum(1 for c, o in rows if c.route == route and o.route == route)
        predicted = sum(1 for _, o in rows if o.route == route)
        actual = sum(1 for c, _ in rows if c.route == route)
        per_route[route] = {
            "support": actual,
            "predicted": predicted,
            "true_positive": tp,
            "precision": round(tp / predicted, 4) if predicted else 1.0,
            "recall": round(tp / actual, 4) if actual else 1.0,
        }
    unsafe = [c.id for c, o in rows if c.route != "auto" and o.route == "auto"]
    leaks = [c.id for c, o in rows
             if o.canonical_email is not None
             and o.canonical_email in {p.lower() for p in c.planted}]
    missed_reasons = [
        {"case": c.id, "missing": [r for r in c.reasons if r not in o.reasons]}
        for c, o in rows if any(r not in o.reasons for r in c.reasons)
    ]
    confusion = Counter(f"{c.route}->{o.route}" for c, o in rows)
    mismatches = [{"case": c.id, "expected": c.route, "got": o.route, "reasons": o.reasons}
                  for c, o in rows if c.route != o.route]
    return {
        "extractor": RULES_VERSION,
        "tenant": tenant,
        "messages": len(rows),
        "accuracy": round(sum(1 for c, o in rows if c.route == o.route) / len(rows), 4),
        "per_route": per_route,
        "unsafe_auto_routings": unsafe,
        "identity_leaks": leaks,
        "missed_reasons": missed_reasons,
        "confusion": dict(sorted(confusion.items())),
        "mismatches": mismatches,
        "messages_per_second": round(len(rows) / elapsed, 1),
        "python": platform.python_version(),
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def print_table(result: dict[str, Any]) -> None:
    per_route = result["per_route"]
    print(f"extraction quality - {result['extractor']} - tenant {result['tenant']} - "
          f"{result['messages']} labelled messages")
    print(f"{'route':<9} {'support':>7} {'predicted':>9} {'precision':>9} {'recall':>7}")
    for route, row in per_route.items():
        print(f"{route:<9} {row['support']:>7} {row['predicted']:>9} "
              f"{row['precision']:>9.3f} {row['recall']:>7.3f}")
    print(f"accuracy {result['accuracy']:.3f}   unsafe auto routings: "
          f"{len(result['unsafe_auto_routings'])}   identity leaks: "
          f"{len(result['identity_leaks'])}   "
          f"{result['messages_per_second']} msg/s")
    for mismatch in result["mismatches"]:
        print(f"  {mismatch['case']}: labelled {mismatch['expected']}, routed {mismatch['got']} "
              f"({', '.join(mismatch['reasons'])})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tenant", default="acme")
    args = parser.parse_args()
    result = asyncio.run(run(args.tenant))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print_table(result)
    print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
