"""The release: an Apache-2.0 license, the version from the git tag (setuptools-scm, with a
fallback for a tree without git), `python -m build` in CI (`make dist`), the image built with
the same version, CHANGELOG sections per release with "Unreleased" on top, and every
dependency pinned exactly in pyproject.toml and constraints.txt."""

from __future__ import annotations

import re
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

from tests.helpers.stack import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
RELEASE = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", re.M)


def constraint_entries() -> list[str]:
    """constraints.txt's entries, each with its continuation lines joined."""
    text = (ROOT / "constraints.txt").read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if line.strip()]


def constraints() -> dict[str, str]:
    pins = {}
    for line in constraint_entries():
        requirement, *_ = line.split()
        name, sep, version = requirement.partition("==")
        assert sep, f"constraints.txt: {line!r} is not an exact pin"
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    return pins


def test_every_pin_carries_the_hashes_of_its_files() -> None:
    """pip's hash-checking mode (`--require-hashes`, the Makefile and the Dockerfile) installs
    only files whose sha256 is listed; `make pin-hashes` writes them."""
    for line in constraint_entries():
        requirement, *options = line.split()
        assert options, f"constraints.txt: {requirement} has no --hash"
        for option in options:
            assert re.fullmatch(r"--hash=sha256:[0-9a-f]{64}", option), (requirement, option)
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -c constraints.txt" in makefile
    assert "--require-hashes -c constraints.txt" in (ROOT / "Dockerfile").read_text()


def test_license_is_apache_2() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]


def test_version_comes_from_the_tag_with_a_fallback() -> None:
    project, build = PYPROJECT["project"], PYPROJECT["build-system"]
    assert "version" not in project and project["dynamic"] == ["version"]
    requires = {Requirement(r).name: Requirement(r) for r in build["requires"]}
    for name in ("setuptools", "setuptools-scm"):
        assert str(requires[name].specifier).startswith("=="), f"{name} is not pinned"
    fallback = Version(PYPROJECT["tool"]["setuptools_scm"]["fallback_version"])
    released = [Version(v) for v, _ in RELEASE.findall((ROOT / "CHANGELOG.md").read_text())]
    assert released and fallback > max(released), (
        "the fallback version must be the release in preparation, after the last one")
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert set(re.findall(r"^ARG VERSION=(\S+)$", dockerfile, re.M)) == {str(fallback)}
    assert 'SETUPTOOLS_SCM_PRETEND_VERSION="$VERSION"' in dockerfile
    assert "LICENSE" in (ROOT / ".dockerignore").read_text()


def test_changelog_has_unreleased_on_top_and_dated_releases_newest_first() -> None:
    text = (ROOT / "CHANGELOG.md").read_text()
    headers = re.findall(r"^## .*$", text, re.M)
    assert headers[0] == "## [Unreleased]"
    releases = RELEASE.findall(text)
    assert len(releases) == len(headers) - 1, "a release header is not `## [X.Y.Z] - date`"
    versions = [Version(v) for v, _ in releases]
    assert versions == sorted(versions, reverse=True)
    dates = [d for _, d in releases]
    assert dates == sorted(dates, reverse=True)


def test_ci_builds_the_artifacts() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^dist: .*\n(?:\t.*\n)*\t\$\(BIN\)/python -m build ", makefile, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.index("make test\n") < ci.index("make dist\n")


def test_every_dependency_is_pinned_exactly_with_its_transitive_set() -> None:
    pins = constraints()
    project = PYPROJECT["project"]
    declared = [*project["dependencies"],
                *(r for extra in project["optional-dependencies"].values() for r in extra)]
    for text in declared:
        requirement = Requirement(text)
        spec = str(requirement.specifier)
        assert spec.startswith("=="), f"{text} is not an exact pin"
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert pins.get(name) == spec[2:], f"{text}: constraints.txt has {pins.get(name)}"
