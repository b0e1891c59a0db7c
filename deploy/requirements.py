"""Print the project's direct requirements (pyproject.toml), with the named extras.

The installs pin them by constraints.txt in pip's hash-checking mode, which refuses an
editable project; so the dependencies are installed from this list first and the project
itself after them with `--no-deps` (the Makefile's venv, the Dockerfile's image). Run from
the project root: `python deploy/requirements.py [EXTRA ...]`.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path


def requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    unknown = sorted(set(extras) - set(optional))
    if unknown:
        raise SystemExit(f"unknown extras: {', '.join(unknown)}")
    return [*project["dependencies"], *(r for extra in extras for r in optional[extra])]


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))  # noqa: T201
