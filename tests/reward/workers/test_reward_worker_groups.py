"""All eight reward workers through a 2-worker Ray group and through the local backend.

The eight workers are colocated (one process per rank hosts all of them, as the trainer colocates
roles) and ``spawn`` gives one group per worker. The Ray cluster is module-scoped (2 CPUs) and shut down afterwards unless it was already running.
A batch of 5 is padded to 6 for the 2 data-parallel ranks and unpadded on the way back.
"""

import pytest
import ray
from reward_worker_batch import build_batch

from rlvr.sandbox import SandboxConfig
from rlvr.single_controller import (
    ClassWithInitArgs,
    create_colocated_worker_cls,
    get_resource_pool_cls,
    get_worker_group_cls,
    init_ray,
)
from rlvr.utils.testing import judge_stub_server
from rlvr.reward import workers as rw

IFEVAL = {"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}
BOX = [{"bbox": [0, 0, 10, 10], "label": "a"}]
CODE = {"asserts": ["assert f(2) == 4"]}
# worker name -> (worker class, config class, extra config, responses, ground truths, expected rewards)
CASES = {
    "math": (rw.MathRuleRewardWorker, rw.MathRuleRewardConfig, {},
             ["\\boxed{0.5}", "\\boxed{2}", "<think>\\boxed{1/2}", "1/2", "\\boxed{\\frac12}"], ["1/2"] * 5, [1, 0, 0, 0, 1]),
    "code": (rw.CodeSandboxRewardWorker, rw.CodeSandboxRewardConfig,
             {"sandbox": SandboxConfig(wall_timeout_s=3.0, cpu_seconds=2, max_concurrency=1)},
             ["```python\ndef f(x):\n    return x * 2\n```", "```python\ndef f(x):\n    return x + 3\n```",
              "```python\nwhile True:\n    pass\n```", "def f(x): return 4", "```python\nf = lambda x: x * x\n```"],
             [CODE] * 5, [1, 0, 0, 0, 1]),
    "judge": (rw.LLMJudgeRewardWorker, rw.LLMJudgeRewardConfig, {}, ["4", "5", "4", "x", "4"], ["4"] * 5, [0.9, 0, 0.9, 0, 0.9]),
    "general_val": (rw.GeneralValRuleRewardWorker, rw.GeneralValRuleRewardConfig, {},
                    ["Paris", "the paris!", "Rome", "<answer>paris</answer>", "Lyon"], ["Paris"] * 5, [1, 1, 0, 1, 0]),
    "crossthinkqa": (rw.CrossThinkQARuleRewardWorker, rw.CrossThinkQARuleRewardConfig, {"reward_type": "strict"},
                     ["Answer: B", "Answer: C", "B", "The answer is (B).", "\\boxed{A}"], ["B"] * 5, [1, 0, 0, 1, 0]),
    "mc_boxed": (rw.MultipleChoiceBoxedRuleRewardWorker, rw.MultipleChoiceBoxedRuleRewardConfig, {},
                 ["\\boxed{A}", "\\boxed{B}", "A", "\\boxed{(a)}", "\\boxed{C}"], ["A"] * 5, [1, 0, 0, 1, 0]),
    "ifeval": (rw.GeneralRuleRewardWorker, rw.GeneralRuleRewardConfig, {},
               ["no commas", "a, b", "ok", "x,", "fine"], [IFEVAL] * 5, [1, 0, 1, 0, 1]),
    "detection": (rw.DetectionRewardWorker, rw.DetectionRewardConfig, {"accuracy_metric": "f1", "format_weight": 0.5, "accuracy_weight": 0.5},
                  ["[0, 0, 10, 10]", "[50, 50, 60, 60]", "none", '[{"bbox": [0, 0, 10, 9], "label": "a"}]', "[0, 0, 10, 10] [20, 20, 30, 30]"],
                  [BOX] * 5, [1, 0.5, 0, 1, 0.5 + 0.5 * 2 / 3]),
}


@pytest.fixture(scope="module")
def judge_url():
    with judge_stub_server(lambda prompt: "Score: 9/10" if "Candidate answer:\n4\n" in prompt else "incorrect") as (url, _):
        yield url


@pytest.fixture(scope="module")
def ray_cluster():
    started = not ray.is_initialized()
    init_ray(num_cpus=2)
    yield
    if started:
        ray.shutdown()


def _config(name, tokenizer_path, judge_url):
    _, config_cls, extra, *_ = CASES[name]
    if name == "judge":
        extra = {"judge_api_base": judge_url, "request_timeout_s": 20}
    return config_cls(tokenizer_path=tokenizer_path, **extra)


def _groups(backend, tokenizer_path, judge_url):
    """One colocated group (all eight workers share each process), spawned into one group per worker."""
    roles = {name: ClassWithInitArgs(CASES[name][0], _config(name, tokenizer_path, judge_url)) for name in CASES}
    pool = get_resource_pool_cls(backend)(process_on_nodes=[2 if backend == "ray" else 1], use_gpu=False)
    group = get_worker_group_cls(backend)(pool, create_colocated_worker_cls(roles), name_prefix=f"rewards_{backend}", call_timeout_s=120)
    return pool, group, group.spawn(list(CASES))


@pytest.fixture(scope="module")
def local_groups(tokenizer_path, judge_url):
    pool, group, groups = _groups("local", tokenizer_path, judge_url)
    yield groups
    group.shutdown()
    pool.remove()


@pytest.fixture(scope="module")
def ray_groups(tokenizer_path, judge_url, ray_cluster):
    pool, group, groups = _groups("ray", tokenizer_path, judge_url)
    yield groups
    group.shutdown()
    pool.remove()


def _check(group, name):
    _, _, _, responses, truths, expected = CASES[name]
    group.initialize(None)
    out = group.compute_rewards(build_batch(responses, truths))
    assert out.batch["response_level_rewards"].tolist() == pytest.approx([float(e) for e in expected])
    assert out.batch["token_level_rewards"].sum(dim=-1).tolist() == pytest.approx([float(e) for e in expected])
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_local_group(name, local_groups):
    _check(local_groups[name], name)


@pytest.mark.slow
@pytest.mark.ray
@pytest.mark.parametrize("name", sorted(CASES))
def test_two_worker_ray_group(name, ray_groups):
    assert ray_groups[name].world_size == 2
    out = _check(ray_groups[name], name)
    metrics = out.meta_info["metrics"]
    assert metrics and all(len(v) == 6 for v in metrics.values())  # 2 ranks x 3 samples (one padding row)
