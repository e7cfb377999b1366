"""Code-generation scorer: run the generated program against tests in the sandbox.

Ground truth formats (a dict, or the same dict as a JSON string):

* stdin/stdout — ``{"inputs": ["1 2\\n", ...], "outputs": ["3\\n", ...]}``: one run per case; the
  output matches when equal after stripping trailing whitespace on every line and trailing blank lines;
* assert-style — ``{"asserts": ["assert add(1, 2) == 3", ...], "setup": "import math"}``: the
  solution, the optional setup code and the asserts run as one program, which must exit with 0;
* HumanEval-style — ``{"test": "def check(candidate): ...", "entry_point": "add", "prompt": "def add..."}``:
  the program is the solution (prefixed with ``prompt`` when the solution does not define
  ``entry_point`` itself, i.e. it is a body completion), then ``test``, then ``check(entry_point)``.

The code is the last fenced block of the response (```` ```python ```` preferred, any fence
otherwise); a response without a fenced block is taken as raw code only when
``allow_raw_code`` is set.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rlvr.sandbox.config import SandboxResult
from rlvr.sandbox.local import LocalSandbox, SandboxJob
from rlvr.utils.errors import RewardError

_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str, allow_raw_code: bool = False) -> str | None:
    """The last ```python block of ``text`` (else the last fenced block); None when there is none."""
    blocks = _FENCE.findall(text)
    python = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    if python:
        return python[-1]
    if blocks:
        return blocks[-1][1]
    return text if allow_raw_code and text.strip() else None


@dataclass
class CodeTask:
    """The sandbox jobs of one sample and, for stdin/stdout tests, the expected output of each."""

    jobs: list[SandboxJob]
    expected_stdout: list[str | None]


def _parse_ground_truth(ground_truth: dict | str) -> dict:
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise RewardError(f"code ground truth is not valid JSON ({exc}): {ground_truth[:200]!r}") from exc
    if not isinstance(ground_truth, dict) or not ({"inputs", "asserts", "test"} & set(ground_truth)):
        raise RewardError(
            "code ground truth must be a dict with 'inputs'/'outputs' (stdin/stdout tests), 'asserts' "
            f"(assert-style) or 'test'/'entry_point' (HumanEval-style); got {str(ground_truth)[:200]!r}"
        )
    return ground_truth


def build_task(code: str, ground_truth: dict | str) -> CodeTask:
    """Turn extracted ``code`` and its tests into sandbox jobs."""
    gt = _parse_ground_truth(ground_truth)
    if "inputs" in gt:
        inputs, outputs = list(gt["inputs"]), list(gt["outputs"])
        if len(inputs) != len(outputs):
            raise RewardError(f"code ground truth has {len(inputs)} inputs but {len(outputs)} outputs")
        return CodeTask([SandboxJob(code, str(i)) for i in inputs], [str(o) for o in outputs])
    if "asserts" in gt:
        program = "\n".join([gt.get("setup", ""), code, "", *gt["asserts"], ""])
        return CodeTask([SandboxJob(program)], [None])
    entry = gt["entry_point"]
    defines_entry = re.search(rf"^\s*def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE) is not None
    prefix = "" if defines_entry else gt.get("prompt", "")
    program = f"{prefix}{code}\n\n{gt['test']}\n\ncheck({entry})\n"
    return CodeTask([SandboxJob(program)], [None])


def _normalise_output(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).rstrip()


def grade(task: CodeTask, results: list[SandboxResult], partial_credit: bool = False) -> float:
    """Score in [0, 1]: fraction of passed jobs if ``partial_credit`` else 1.0 only when all pass."""
    passed = 0
    for expected, result in zip(task.expected_stdout, results, strict=True):
        ok = result.passed and (expected is None or _normalise_output(result.stdout) == _normalise_output(expected))
        passed += int(ok)
    if partial_credit:
        return passed / len(results) if results else 0.0
    return float(passed == len(results) and len(results) > 0)


def compute_score(solution_str: str, ground_truth: dict | str, sandbox: LocalSandbox | None = None,
                  partial_credit: bool = False, allow_raw_code: bool = False) -> float:
    """Extract the code of ``solution_str``, run its tests in ``sandbox`` and grade it (0.0 without code)."""
    code = extract_code(solution_str, allow_raw_code)
    if code is None:
        return 0.0
    task = build_task(code, ground_truth)
    results = (sandbox or LocalSandbox()).run_many(task.jobs)
    return grade(task, results, partial_credit)
