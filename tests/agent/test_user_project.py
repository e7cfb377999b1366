"""The example user project (``examples/user_project``): a package of the user's own with an
environment, a tool, an advantage estimator, a policy loss and a reward manager. Copied to a folder
outside the repository (never on ``PYTHONPATH``), it trains one step through the ``rlvr`` console
script on the local backend, on the local backend with the rollout in a process of its own (an
asynchronous run) and on the Ray backend, where the environment and the tool run in the worker
process; a misspelt name still gets a suggestion. Each part is also checked against hand-computed
values."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from agent_helpers import ScriptedEngine, eos_prone_tiny_model, prompt_batch, rollout_config

from rlvr import DataProto
from rlvr.agent import AgentLoopManager
from rlvr.agent.chat import render_prompt_ids
from rlvr.agent.env_agent import ENVIRONMENTS
from rlvr.reward.managers import REWARD_MANAGER_REGISTRY
from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY
from rlvr.trainer.ppo.policy_loss import POLICY_LOSS_REGISTRY
from rlvr.utils.testing import tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "user_project"
REGISTRIES = (ENVIRONMENTS, ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY, REWARD_MANAGER_REGISTRY)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """The example copied outside the repository, with its data (8 training rows)."""
    root = tmp_path_factory.mktemp("elsewhere") / "guess_project"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("__pycache__", "data", "runs"))
    assert REPO not in root.parents
    subprocess.run([sys.executable, "make_data.py", "--train", "8", "--val", "4"], cwd=root, check=True, timeout=120)
    return root


@pytest.fixture(scope="module")
def eos_model_dir(tmp_path_factory) -> Path:
    """A tiny random model that ends its turns after a few tokens, so the environment answers."""
    path = tmp_path_factory.mktemp("eos_model") / "model"
    model, tokenizer = eos_prone_tiny_model()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _command_env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH pointing at the project."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


RLVR = str(Path(sys.executable).parent / "rlvr")  # the console script pip installed beside the interpreter


ROLLOUT_APART = ["actor_rollout_ref.hybrid_engine=false", "async_training.mode=one_step"]
"""An asynchronous run: on the local backend the rollout (agent loops, environment, tool) runs in a
child process, which imports the project's modules as a Ray worker does."""


@pytest.mark.parametrize("backend, apart", [("local", []), pytest.param("local", ROLLOUT_APART, marks=pytest.mark.slow,
                                                                          id="local-rollout_process"),
                                            pytest.param("ray", [], marks=[pytest.mark.ray, pytest.mark.slow])])
@pytest.mark.slow
def test_the_project_trains_one_step_through_the_command(backend, apart, project, eos_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    overrides = [*apart, f"actor_rollout_ref.model.path={eos_model_dir}", f"trainer.backend={backend}",
                 "trainer.total_training_steps=1", "trainer.val_before_train=false", "data.val_files=null",
                 "trainer.logger=[console,jsonl]", "trainer.progress_bar=false", "trainer.export_hf=false",
                 "trainer.report=false", f"trainer.default_local_dir={run_dir}", "actor_rollout_ref.rollout.n=2",
                 "data.max_prompt_length=256", "data.max_response_length=24", "trainer.call_timeout_s=600"]
    result = subprocess.run([RLVR, "--preset", "guess_number.yaml", *overrides], cwd=project,
                            env=_command_env(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    assert "group_median advantages, clipped_reinforce policy loss" in result.stdout
    assert "rewards: the guess_reward reward manager" in result.stdout
    [step] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert step["step"] == 1 and step["reward/guess_number/count"] == 8  # 4 prompts x 2 samples, scored
    assert "agent/env/answered" in step  # the project's environment stepped (in the rollout's process, if apart)
    assert step["agent/env_reward"] < 0  # -0.1 per wrong guess: a random model does not guess right
    assert "agent/tool_calls" in step  # the tool rows ran the tool_agent loop, which loaded the project's tool
    assert np.isfinite(step["actor/pg_loss"])


@pytest.mark.slow
def test_the_project_trains_the_embedded_model_through_the_command(project, tmp_path):
    """The preset as a user runs it, on the embedded SmolLM2-135M-Instruct: one step; the model
    answers, so the environment replies and the reward manager scores real guesses."""
    run_dir = tmp_path / "run"
    overrides = ["trainer.backend=local", "trainer.total_training_steps=1", "trainer.val_before_train=false",
                 "data.val_files=null", "trainer.logger=[console,jsonl]", "trainer.progress_bar=false",
                 "trainer.export_hf=false", "trainer.report=false", f"trainer.default_local_dir={run_dir}",
                 "data.max_prompt_length=512"]
    result = subprocess.run([RLVR, "--preset", "guess_number.yaml", *overrides], cwd=project,
                            env=_command_env(), capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    steps = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in steps] == [1]
    for metrics in steps:
        assert metrics["reward/guess_number/count"] == 16 and "agent/env/answered" in metrics
        assert metrics["agent/env/answered"] > 0  # the model wrote numbers the environment read
        assert np.isfinite(metrics["actor/pg_loss"])


@pytest.mark.slow
def test_a_misspelt_name_of_the_project_gets_a_suggestion(project):
    cases = [("algorithm.adv_estimator=group_medain",
              "config error at 'algorithm.adv_estimator': 'group_medain' is not valid (did you mean 'group_median'?)"),
             ("trainer.user_modules=[guess_numbr]", "config error at 'trainer.user_modules': importing 'guess_numbr' "
                                                    "failed: No module named 'guess_numbr'")]
    for override, message in cases:
        result = subprocess.run([RLVR, "--preset", "guess_number.yaml", override, "--dry-run"],
                                cwd=project, env=_command_env(), capture_output=True, text=True, timeout=300)
        assert result.returncode == 2 and message in result.stderr, result.stderr[-2000:]


@pytest.fixture
def guess_number(project, monkeypatch):
    """The project's package imported here; its registrations and modules are removed afterwards."""
    monkeypatch.syspath_prepend(str(project))
    yield importlib.import_module("guess_number")
    for registry in REGISTRIES:
        for name in [name for name, entry in registry.items() if entry.__module__.startswith("guess_number")]:
            registry.pop(name)
    for name in [name for name in sys.modules if name == "guess_number" or name.startswith("guess_number.")]:
        del sys.modules[name]


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _rows(secrets: list[int], extra_infos: list[dict]) -> dict[str, np.ndarray]:
    def column(values):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return {"data_source": column(["guess_number"] * len(secrets)),
            "raw_prompt": column([[{"role": "user", "content": "Guess."}] for _ in secrets]),
            "reward_model": column([{"ground_truth": str(s)} for s in secrets]), "extra_info": column(extra_infos)}


def test_the_environment_says_higher_or_lower_until_the_guess_is_right(guess_number):
    tok = tiny_tokenizer()
    eos = tok.eos_token_id
    prompt = render_prompt_ids(tok, [{"role": "user", "content": "Guess."}])
    low, right = enc(tok, "3") + [eos], enc(tok, "I say 5") + [eos]
    cfg = rollout_config(200, 64, env_name="guess_number", env_kwargs={"correct_reward": 1.0, "wrong_reward": -0.1},
                         max_assistant_turns=3)
    cfg.agent.default_agent_loop = "env_agent"
    out = AgentLoopManager(cfg, tok).generate_sequences(ScriptedEngine(tok, {tuple(prompt): [low, right]}),
                                                       prompt_batch(tok, [prompt], _rows([5], [{}])))
    hint = enc(tok, "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n")
    assert out.batch["responses"][0, : len(low) + len(hint) + len(right)].tolist() == low + hint + right
    scores = out.batch["turn_scores"][0]
    assert scores[len(low) - 1].item() == pytest.approx(-0.1) and scores.sum().item() == pytest.approx(0.9)
    assert out.meta_info["metrics"]["agent/env/distance"] == pytest.approx(2.0)  # |3 - 5| + 0 over the turns


def test_the_tool_compares_a_guess_with_the_rows_secret(guess_number, project):
    tok = tiny_tokenizer()
    eos = tok.eos_token_id
    prompt = render_prompt_ids(tok, [{"role": "user", "content": "Guess."}])
    call = enc(tok, '<tool_call>{"name": "compare", "arguments": {"guess": 7}}</tool_call>')
    answer = enc(tok, "6") + [eos]
    cfg = rollout_config(200, 64, tool_config_path=str(project / "tools.yaml"), max_assistant_turns=2)
    cfg.agent.default_agent_loop = "tool_agent"
    extra = {"tools_kwargs": {"compare": {"create_kwargs": {"secret": 6}}}}
    out = AgentLoopManager(cfg, tok).generate_sequences(ScriptedEngine(tok, {tuple(prompt): [call, answer]}),
                                                       prompt_batch(tok, [prompt], _rows([6], [extra])))
    width = out.batch["responses"].shape[1]
    text = tok.decode(out.batch["responses"][0][out.batch["attention_mask"][0, -width:].bool()])
    assert "<|im_start|>tool\ntoo big<|im_end|>" in text and text.endswith("6<|im_end|>")
    assert out.non_tensor_batch["num_tool_calls"][0] == 1
    assert out.meta_info["metrics"]["agent/tool/compare/distance"] == pytest.approx(1.0)


def test_the_estimator_subtracts_the_group_median(guess_number):
    scores = torch.tensor([1.0, 0.0, 0.5, 2.0, 0.0, 0.7])
    rewards = torch.zeros(6, 3)
    rewards[:, -1] = scores
    mask = torch.ones(6, 3)
    mask[4, 1:] = 0
    index = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)
    advantages, returns = ADV_ESTIMATOR_REGISTRY["group_median"](token_level_rewards=rewards, response_mask=mask,
                                                                 index=index)
    # medians: a = 0.5, b = 0 (the lower middle of [0, 2]); c is alone: 0
    expected = torch.tensor([0.5, -0.5, 0.0, 2.0, 0.0, 0.0]).unsqueeze(-1) * mask
    torch.testing.assert_close(advantages, expected)
    assert ADV_ESTIMATOR_REGISTRY.metadata("group_median").needs_groups


def test_the_loss_weighs_each_token_by_its_clipped_ratio(guess_number):
    old = torch.log(torch.tensor([[0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.75, 0.5]])).requires_grad_()  # ratios 1.5 (clipped to 1.2) and 1
    advantages, mask = torch.tensor([[1.0, -2.0]]), torch.ones(1, 2)
    loss, metrics = POLICY_LOSS_REGISTRY["clipped_reinforce"](old, new, advantages, mask, "token-mean", None)
    expected = (-(1.2 * 1.0 * np.log(0.75)) - (1.0 * -2.0 * np.log(0.5))) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    (grad,) = torch.autograd.grad(loss, new)
    torch.testing.assert_close(grad, torch.tensor([[-1.2 * 1.0 / 2, 2.0 / 2]]))  # -w * A / tokens
    assert metrics["pg_clipfrac"].item() == pytest.approx(0.5)


class _DecodeOnly:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids)


def test_the_reward_manager_scores_the_final_guess(guess_number):
    texts = ["3 then 5", "I say 3", "no idea"]
    width = max(len(t) for t in texts)
    responses = torch.zeros(3, width, dtype=torch.long)
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, text in enumerate(texts):
        responses[row, : len(text)] = torch.tensor([ord(c) for c in text])
        mask[row, : len(text)] = 1
    data = DataProto.from_dict(
        tensors={"prompts": torch.ones(3, 2, dtype=torch.long), "responses": responses,
                 "attention_mask": torch.cat([torch.ones(3, 2, dtype=torch.long), mask], dim=1)},
        non_tensors={"data_source": np.array(["guess_number"] * 3, dtype=object),
                     "reward_model": np.array([{"ground_truth": "5"}] * 3, dtype=object)})
    manager = REWARD_MANAGER_REGISTRY["guess_reward"](_DecodeOnly(), 0, span=8)
    result = manager(data, return_dict=True)
    assert result["reward_tensor"].sum(-1).tolist() == pytest.approx([1.0, 1 - 2 / 8, 0.0])
    assert result["reward_extra_info"]["acc"] == [1.0, 0.0, 0.0]
