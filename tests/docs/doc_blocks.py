"""Run the code blocks of a documentation page, so that a page cannot drift from the code.

Every fenced block of a checked page has a marker on the line before it (blank lines between are
allowed) saying how it is checked:

- ``<!-- test: shell -->``: the block runs as a bash script (``set -euo pipefail``);
  ``<!-- test: shell exit=2 -->`` expects that exit status instead of 0.
- ``<!-- test: dry-run -->``: the same, after ``--dry-run`` is appended to every command that starts
  a training run (``rlvr ...``, ``python -m rlvr.trainer.main_ppo ...``, ``bash <script>.sh ...``), so
  the config is loaded and checked and the derived settings printed, but nothing trains.
- ``<!-- test: make -->``: every line is a ``make TARGET ...`` command, checked with ``make -n`` in the
  repository (the target exists and its recipe expands; nothing is built).
- ``<!-- test: python -->``: the block runs as a Python script.
- ``<!-- test: file PATH -->``: the block is written to ``PATH`` (later blocks use it).
- ``<!-- test: output -->``: the output of the block run before it must contain these lines, in
  this order, each as a part of one line of the real output (spaces normalised; a ``...`` line
  skips; a long output line may be shown wrapped over several lines).

The blocks of one page run in order in one scratch directory, which is also ``$HOME``; ``rlvr``
and ``python`` there are the test's interpreter with this checkout first on the path.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- test: (?P<kind>[a-z-]+)(?: (?P<arg>[^>]*?))? -->$")
FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)\s*$")
KINDS = ("shell", "dry-run", "make", "python", "file", "output")
TRAINING_COMMAND = re.compile(r"^(rlvr\b|python3? -m rlvr\.trainer\.main_ppo\b|bash \S+\.sh\b)")
TIMEOUT_S = 600  # per block; generous: the shared CI machine can be loaded many times over


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page and the marker that says how it is checked."""

    page: str
    line: int
    lang: str
    kind: str
    arg: str
    text: str

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def parse(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` with their markers; a block without a marker raises."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        close = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence["fence"]), None)
        if close is None:
            raise ValueError(f"{path.name}:{i + 1}: the code block is never closed")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = MARKER.match(before.strip())
        if marker is None or marker["kind"] not in KINDS:
            raise ValueError(f"{path.name}:{i + 1}: the code block has no '<!-- test: KIND -->' marker on the line "
                             f"before it (KIND: {', '.join(KINDS)}); every block of this page is run by its test")
        blocks.append(Block(path.name, i + 1, fence["lang"], marker["kind"], marker["arg"] or "",
                            "\n".join(lines[i + 1:close]) + "\n"))
        i = close + 1
    return blocks


def commands(text: str) -> list[str]:
    """The shell commands of a block: continuation lines joined, comments and blank lines dropped."""
    joined = re.sub(r"\s*\\\n\s*", " ", text)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def with_dry_run(text: str) -> str:
    """The block with ``--dry-run`` appended to each command that starts a training run."""
    out = []
    for command in commands(text):
        body, _, comment = command.partition("  #")
        body = body.rstrip()
        if TRAINING_COMMAND.match(body) and "--dry-run" not in body.split():
            body += " --dry-run"
        out.append(body)
    return "\n".join(out) + "\n"


def expect_lines(expected: str, actual: str) -> str | None:
    """None when the lines of ``expected`` appear in ``actual`` in order, else why not. Each expected
    line must be a part of one actual line (spaces normalised); the next expected line is looked for
    after it, on the rest of the same line first, so a long output line may be shown wrapped."""
    norm = lambda s: " ".join(s.split())  # noqa: E731
    actual_lines = [norm(line) for line in actual.splitlines()]
    row, col = 0, 0
    for line in expected.splitlines():
        want = norm(line)
        if not want or want == "...":
            continue
        while row < len(actual_lines):
            found = actual_lines[row].find(want, col)
            if found >= 0:
                col = found + len(want)
                break
            row, col = row + 1, 0
        else:
            return f"expected line not found (in order): {want!r}"
    return None


class PageRunner:
    """Runs the blocks of one page in a scratch directory ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.bin = root / ".doc-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        for name, target in (("rlvr", f'exec {shlex.quote(sys.executable)} -m rlvr.cli "$@"'),
                             ("python", f'exec {shlex.quote(sys.executable)} "$@"'),
                             ("python3", f'exec {shlex.quote(sys.executable)} "$@"')):
            shim = self.bin / name
            shim.write_text(f"#!/bin/sh\n{target}\n")
            shim.chmod(0o755)
        self.env = {**os.environ, "HOME": str(root), "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                    "PYTHONPATH": os.pathsep.join([str(REPO), str(root)]), "TOKENIZERS_PARALLELISM": "false",
                    "PYTHONUNBUFFERED": "1"}
        self.last_output = ""

    def _run(self, argv: list[str], block: Block, cwd: Path, expect_rc: int = 0) -> str:
        proc = subprocess.run(argv, cwd=cwd, env=self.env, capture_output=True, text=True, timeout=TIMEOUT_S)
        output = proc.stdout + proc.stderr
        if proc.returncode != expect_rc:
            raise AssertionError(f"{block.where()}: exit status {proc.returncode}, expected {expect_rc}\n"
                                 f"--- block ---\n{block.text}--- output ---\n{output[-6000:]}")
        return output

    def run(self, block: Block) -> None:
        """Check one block (see the module docstring)."""
        if block.kind == "file":
            target = self.root / block.arg
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.text, encoding="utf-8")
        elif block.kind == "output":
            problem = expect_lines(block.text, self.last_output)
            if problem:
                raise AssertionError(f"{block.where()}: {problem}\n--- real output ---\n{self.last_output[-6000:]}")
        elif block.kind == "python":
            script = self.root / f".doc-block-{block.line}.py"
            script.write_text(block.text, encoding="utf-8")
            self.last_output = self._run([sys.executable, str(script)], block, self.root)
        elif block.kind == "make":
            outputs = []
            for command in commands(block.text):
                argv = shlex.split(command.partition("  #")[0])
                if argv[0] != "make" or len(argv) < 2:
                    raise AssertionError(f"{block.where()}: a make block holds only `make TARGET` lines, got {command!r}")
                outputs.append(self._run(["make", "-n", *argv[1:]], block, REPO))
            self.last_output = "".join(outputs)
        else:
            script = block.text if block.kind == "shell" else with_dry_run(block.text)
            match = re.fullmatch(r"exit=(\d+)", block.arg)
            rc = int(match[1]) if match else 0
            self.last_output = self._run(["bash", "-c", "set -euo pipefail\n" + script], block, self.root, rc)
