"""Where the test stacks live and the webhook secret they share."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEST_WEBHOOK_SECRET = "whsec_dGVzdC1zZWNyZXQtZm9yLWluYm94Y3JtLXRlc3RzLTAwMDA="


def policies_for_tests(data_dir: Path) -> Path:
    """The repository's tenant policies plus the test-only ones in tests/fixtures/policies
    (the `approvals` tenant: follow-ups to new prospects need a reviewer's approval). The
    test stacks point INBOXCRM_POLICY_DIR here, so product policies stay product-only."""
    target = data_dir / "policies"
    target.mkdir(parents=True, exist_ok=True)
    for source in (ROOT / "policies", ROOT / "tests" / "fixtures" / "policies"):
        for path in source.glob("*.json"):
            shutil.copyfile(path, target / path.name)
        for path in source.glob("*.toml"):
            shutil.copyfile(path, target / path.name)
    return target
