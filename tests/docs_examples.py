"""The runnable command examples of the manual (README.md and docs/), and their output's shape.

A runnable example is a line ``$ offloadlab ARGS`` (continued by a trailing ``\\``) in a fenced
```` ```console ```` block; the lines after it, up to the next ``$`` line or the block's end,
are its output as the page shows it.  Examples too slow for the test suite go in ```` ```text
```` blocks, which nothing runs.  The examples of one page run in order in one folder, so that
a page may plan a file and then simulate it.  What a command prints on stdout and stderr is
one output, in the order printed, as a terminal shows it.

The shape of an output (:func:`shape_errors`): the exit status (2 where the page shows
``offloadlab: error: ...``, else 0), the first line with its numbers masked (unless the page
shows ``...`` there: lines left out), and every line of the page's output made of words only
(a table's column headers, ``wrote FILE``), which must appear in the output, spaces aside.

To refresh the outputs a page shows after a change (run from the repository root; add
``--fence text`` for the slow examples)::

    python tests/docs_examples.py --write docs/commands/plan.md
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT = "$ offloadlab "
FENCE = "```"
NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?")
HASH = re.compile(r"\b[0-9a-f]{12,}\b")
WORDS = re.compile(r"[A-Za-z_][\w.:>/-]*(?:\s+[A-Za-z_][\w.:>/-]*)+")
ERROR = "offloadlab: error:"
ELIDED = "..."


@dataclass
class Example:
    """One ``$ offloadlab ...`` line of a page and the output the page shows for it."""

    page: Path
    line: int                   # 1-based line of the ``$`` on the page
    argv: list[str]
    output: list[str] = field(default_factory=list)
    end: int = 0                # 0-based index of the line after the output

    @property
    def status(self) -> int:
        """The exit status the page implies."""
        return 2 if self.output and self.output[0].startswith(ERROR) else 0

    def __str__(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}: offloadlab {shlex.join(self.argv)}"


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def examples(page: Path, fence: str = "console") -> list[Example]:
    """The runnable examples of ``page``, in order (with ``fence="text"``, those shown but
    not run)."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found: list[Example] = []
    inside = console = False
    current: Example | None = None
    i = 0
    while i < len(lines):
        text = lines[i]
        if text.lstrip().startswith(FENCE):
            if current is not None:
                current.end = i
                current = None
            inside, console = not inside, not inside and text.strip() == FENCE + fence
            i += 1
            continue
        if console and text.startswith("$ "):
            if current is not None:
                current.end = i
                current = None
            start, command = i, text
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + " " + lines[i].strip()
            if command.startswith(PROMPT):
                current = Example(page, start + 1, shlex.split(command[len(PROMPT):]))
                found.append(current)
        elif current is not None:
            current.output.append(text)
        i += 1
    return found


class _Tee(io.StringIO):
    """A stream that also writes into ``both``, so that stdout and stderr keep their order."""

    def __init__(self, both: io.StringIO):
        super().__init__()
        self.both = both

    def write(self, text: str) -> int:
        self.both.write(text)
        return super().write(text)


def run(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """``offloadlab ARGV`` in this process: its status, and the lines it printed on stdout and
    stderr together, in order, and on stderr alone."""
    from offloadlab.lab.cli import main
    both = io.StringIO()
    err = _Tee(both)
    with contextlib.redirect_stdout(_Tee(both)), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, both.getvalue().splitlines(), err.getvalue().splitlines()


def mask(line: str) -> str:
    """``line`` with hashes and numbers as ``#`` and runs of spaces as one."""
    return " ".join(NUMBER.sub("#", HASH.sub("#", line)).split())


def shape_errors(example: Example, status: int, printed: list[str], err: list[str]) -> list[str]:
    """How the output of a run of ``example`` (``printed``: stdout and stderr in order;
    ``err``: stderr) differs in shape from what its page shows."""
    errors = []
    if status != example.status:
        errors.append(f"exit status {status}, the page implies {example.status}: {err[-1:]}")
    shown = [line for line in example.output if line.strip()]
    if shown and shown[0].strip() != ELIDED and (not printed
                                                 or mask(printed[0]) != mask(shown[0])):
        errors.append(f"first line {printed[:1]}, the page shows {shown[0]!r}")
    masked = {mask(line) for line in printed}
    for line in shown[1:]:
        if WORDS.fullmatch(line.strip()) and mask(line) not in masked:
            errors.append(f"no line {line.strip()!r} in the output")
    return errors


@contextlib.contextmanager
def folder() -> Iterator[Path]:
    """A fresh temporary working folder for one page's examples."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield Path(tmp)
        finally:
            os.chdir(here)


def write(page: Path, fence: str = "console") -> None:
    """Run ``page``'s examples (those in ``fence`` blocks) and put each one's real output on
    the page."""
    lines = page.read_text(encoding="utf-8").splitlines()
    found = examples(page, fence)
    with folder():
        outputs = []
        for example in found:
            status, printed, _ = run(example.argv)
            print(f"{example}: exit {status}", file=sys.stderr)
            outputs.append(printed)
    for example, output in reversed(list(zip(found, outputs))):
        start = example.end - len(example.output)
        lines[start:example.end] = output
    page.write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", nargs="+", type=Path, metavar="PAGE", required=True,
                        help="pages whose examples to run and whose outputs to replace")
    parser.add_argument("--fence", default="console",
                        help="the blocks whose examples to run: console (default), or text for "
                             "the examples too slow for the test suite")
    args = parser.parse_args()
    for path in args.write:
        write(path.resolve(), args.fence)
