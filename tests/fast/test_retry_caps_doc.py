"""The runbook's attempt caps (docs/architecture.md §4) are the code's: rendered from
`inboxcrm/workflows/step_options.py`. After changing a retry policy, regenerate the table
with `UPDATE_DOCS=1 pytest tests/fast/test_retry_caps_doc.py`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from inboxcrm.workflows.step_options import retry_caps_markdown

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BLOCK = re.compile(r"(<!-- retry-caps:begin[^>]*-->\n)(.*?)(\n<!-- retry-caps:end -->)", re.S)


def test_the_documented_caps_are_the_codes() -> None:
    text = DOC.read_text()
    found = BLOCK.search(text)
    assert found, "docs/architecture.md has no retry-caps block"
    expected = retry_caps_markdown()
    if os.environ.get("UPDATE_DOCS") == "1":
        DOC.write_text(text[:found.start(2)] + expected + text[found.end(2):])
        return
    assert found.group(2) == expected, (
        "docs/architecture.md's retry caps differ from step_options.py; regenerate with "
        "UPDATE_DOCS=1 pytest tests/fast/test_retry_caps_doc.py")
