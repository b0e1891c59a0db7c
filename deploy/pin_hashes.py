"""Write the sha256 of every released file of each pin into constraints.txt.

`make pin-hashes` runs it after a pin changes. pip checks a constraint's hashes against the
file it downloads (wheel or sdist, from PyPI or a mirror of it), so a fresh machine installs
the bytes that were tested, not only the same version numbers. The hashes come from PyPI's
simple index (PEP 691 JSON), every file of the pinned version, so any platform's wheel
matches. The same for deploy/pip.txt, the pip that reads them: a fresh venv's pip may be too
old to honour a constraint's hashes, so it is first replaced by that one, checked by its own
hash. Run from the project root: `python deploy/pin_hashes.py [--index URL] [FILE ...]`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import Version

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")
ACCEPT = "application/vnd.pypi.simple.v1+json"


def read_pins(text: str) -> list[tuple[str, str]]:
    """The `name==version` pins of a constraints file, with or without hashes."""
    pins = []
    for line in text.splitlines():
        found = PIN.match(line.strip())
        if found:
            pins.append((found.group(1), found.group(2)))
    return pins


def file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (InvalidWheelFilename, InvalidSdistFilename):
        return None


def hashes_of(index: str, name: str, version: str) -> list[str]:
    request = urllib.request.Request(f"{index.rstrip('/')}/{canonicalize_name(name)}/",
                                     headers={"Accept": ACCEPT})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    wanted = Version(version)
    found = sorted({f["hashes"]["sha256"] for f in files
                    if "sha256" in f.get("hashes", {})
                    and file_version(f["filename"]) == wanted})
    if not found:
        raise SystemExit(f"{name}=={version}: no files with a sha256 on {index}")
    return found


def render(pins: list[tuple[str, str]], index: str) -> str:
    lines = []
    for name, version in pins:
        digests = hashes_of(index, name, version)
        lines.append(f"{name}=={version} \\")
        lines += [f"    --hash=sha256:{d} \\" for d in digests[:-1]]
        lines.append(f"    --hash=sha256:{digests[-1]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--index", default="https://pypi.org/simple")
    parser.add_argument("files", nargs="*", type=Path,
                        default=[Path("constraints.txt"), Path("deploy/pip.txt")])
    args = parser.parse_args(argv)
    for path in args.files:
        pins = read_pins(path.read_text())
        path.write_text(render(pins, args.index))
        print(f"{path}: {len(pins)} pins with their hashes")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
