"""Every console block in README.md is either executed by a test or marked as illustrative.

A shell block (```console, ```bash, ```sh, ```shell) carries an HTML comment on the line
before it: `<!-- illustrative -->`, or `<!-- run: SCRIPT -->` naming the script that runs
its commands (CI runs `.ci/smoke`: `make up`, `inboxcrm send-test`, `inboxcrm status` as a
newcomer would). For a `run:` block every command line must appear in that script; a
workflow ID in the README (`inbound/…`) stands for whatever ID the script got back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SHELL_LANGUAGES = {"console", "bash", "sh", "shell", "zsh", "shell-session"}
MARK = re.compile(r"^<!--\s*(illustrative|run:\s*(?P<script>\S+))\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")


@dataclass
class Block:
    line: int              # of the opening fence, 1-based
    language: str
    mark: str | None       # "illustrative", "run", or None
    script: str | None
    body: list[str]

    def commands(self) -> list[str]:
        """The command lines: `$ …` prompts in a console block, every line that is not a
        comment in a script block; trailing `# comments` dropped."""
        if self.language in ("console", "shell-session"):
            lines = [line[2:] for line in self.body if line.startswith("$ ")]
        else:
            lines = [line for line in self.body if line.strip() and
                     not line.lstrip().startswith("#")]
        return [re.sub(r"\s+#\s.*$", "", line).strip() for line in lines]


def blocks(text: str) -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        fence = FENCE.match(lines[index])
        if not fence:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        language = fence["lang"]
        if language in SHELL_LANGUAGES:
            mark = MARK.match(lines[index - 1].strip()) if index else None
            found.append(Block(
                index + 1, language,
                None if mark is None else ("run" if mark["script"] else "illustrative"),
                mark["script"] if mark else None, lines[index + 1:end]))
        index = end + 1
    return found


def appears_in(command: str, script: str) -> bool:
    """The command, with any workflow ID standing for the one the script holds, occurs in
    the script (e.g. `.venv/bin/inboxcrm status "$id"` for `… status inbound/acme/…`)."""
    pattern = re.escape(command)
    pattern = re.sub(r"inbound/\S+", r"\\S+", pattern.replace(r"\ ", " "))
    pattern = r"\s+".join(part for part in pattern.split(" ") if part)
    return re.search(pattern, script) is not None


def test_the_checker_reads_marks_and_commands() -> None:
    text = ("<!-- illustrative -->\n```bash\nmake up  # start\n# a comment\n```\n"
            "text\n```console\n$ inboxcrm status inbound/acme/x\n{}\n```\n"
            "<!-- run: .ci/smoke -->\n```console\n$ make up\noutput\n```\n"
            "```json\n{}\n```\n")
    found = blocks(text)
    assert [(b.mark, b.script) for b in found] == [
        ("illustrative", None), (None, None), ("run", ".ci/smoke")]
    assert found[0].commands() == ["make up"]
    assert found[1].commands() == ["inboxcrm status inbound/acme/x"]
    assert appears_in("inboxcrm status inbound/acme/x", 'x=1\n.venv/bin/inboxcrm status "$id"\n')
    assert not appears_in("inboxcrm send-test", "inboxcrm status x\n")
    assert appears_in("make up", "make up >\"$log\" 2>&1 &\n")


def test_every_shell_block_in_the_readme_is_marked() -> None:
    unmarked = [f"README.md:{b.line} ({b.language})" for b in blocks(README.read_text())
                if b.mark is None]
    assert unmarked == [], ("mark each shell block with <!-- illustrative --> or "
                            "<!-- run: SCRIPT --> on the line before it")


def test_the_quick_start_is_what_ci_runs() -> None:
    """The newcomer's path (start the stack, send a test email, look at it) is marked as
    run by the smoke script, not as illustrative."""
    run = [c for b in blocks(README.read_text()) if b.mark == "run" for c in b.commands()]
    assert "make up" in run
    assert any(c.endswith("inboxcrm send-test") for c in run)
    assert any(re.search(r"inboxcrm status inbound/", c) for c in run)


def test_every_command_of_a_run_block_is_in_its_script() -> None:
    run_blocks = [b for b in blocks(README.read_text()) if b.mark == "run"]
    missing_scripts = sorted({b.script for b in run_blocks
                              if b.script and not (ROOT / b.script).exists()})
    if missing_scripts:
        pytest.skip(f"{', '.join(missing_scripts)} is not in this tree yet: the README's "
                    "run: blocks cannot be checked against it")
    absent = [f"README.md:{b.line}: {command!r} not in {b.script}"
              for b in run_blocks for command in b.commands()
              if not appears_in(command, (ROOT / str(b.script)).read_text())]
    assert absent == []
