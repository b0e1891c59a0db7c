"""`make dist`'s check of the built artifacts: one wheel and one sdist of the same version,
the wheel carrying what an installed inboxcrm needs at run time (the migrations, the
extraction schema, the license) and the console script.

    python -m tests.helpers.dist_check dist/
"""

from __future__ import annotations

import sys
import tarfile
import zipfile
from pathlib import Path

NEEDED_IN_WHEEL = ("schemas/extraction.schema.json", "schemas/sql/001_", "inboxcrm/worker.py",
                   "inboxcrm/ingress/main.py", "workflows/inbound_email.py")


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
    if not any(name.endswith("licenses/LICENSE") for name in names):
        raise SystemExit(f"{wheels[0].name} lacks the LICENSE")
    if "License-Expression: Apache-2.0" not in metadata:
        raise SystemExit("the wheel's metadata names no Apache-2.0 license")
    if "inboxcrm = " not in entry_points:
        raise SystemExit("the wheel has no `inboxcrm` console script")
    with tarfile.open(sdists[0]) as sdist:
        members = sdist.getnames()
    for needed in ("pyproject.toml", "LICENSE", "constraints.txt"):
        if not any(member.endswith(f"/{needed}") for member in members):
            raise SystemExit(f"{sdists[0].name} lacks {needed}")
    return version


if __name__ == "__main__":
    print(f"dist ok: inboxcrm {check(Path(sys.argv[1]))} (wheel + sdist)")
