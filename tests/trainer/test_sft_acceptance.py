"""SFT learns a multi-turn pattern: on conversations that ask for the opposites of 2-3 words (a tool
turn of random letters in every other one), the loss falls and the greedy answers to held-out
conversations are the opposites, where the untrained model gets none; the result then trains a
GRPO step as the actor, rewarded for the opposite. About 35 minutes on 2 busy CPU cores."""

from __future__ import annotations

import json
import math
import random

import pytest
from sft_helpers import OPPOSITE, conversation, held_out_accuracy, write_conversations
from transformers import AutoModelForCausalLM

from rlvr.trainer.config import load_config
from rlvr.trainer.config.sft_check import load_sft_config
from rlvr.trainer.data import write_rows
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.sft_trainer import run_sft
from rlvr.utils.testing import save_tiny_model, tiny_tokenizer

pytestmark = pytest.mark.slow

REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(solution_str.strip() == ground_truth)
'''


def grpo_prompts(path, count: int, seed: int):
    """Held-out conversations up to their last user turn, the opposite as the ground truth."""
    rng = random.Random(seed)
    rows = []
    for i in range(count):
        messages = conversation(rng, i)["messages"]
        rows.append({"data_source": "opposites", "prompt": messages[:-1],
                     "reward_model": {"ground_truth": OPPOSITE[messages[-2]["content"]]}})
    write_rows(rows, path)
    return path


def test_sft_learns_the_pattern_and_starts_grpo(tmp_path):
    model = save_tiny_model(tmp_path / "model", hidden_size=64, intermediate_size=128)
    train = write_conversations(tmp_path / "train.parquet", 512, 0)
    val = write_conversations(tmp_path / "val.jsonl", 32, 1)
    trainer = run_sft(load_sft_config([
        f"model.path={model}", f"data.train_files={train}", f"data.val_files={val}", "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=16", "data.use_dynamic_bsz=false", "data.max_length=256", "optim.lr=3e-3",
        "trainer.total_training_steps=300", "trainer.test_freq=50", f"trainer.default_local_dir={tmp_path / 'sft'}",
        "trainer.device=cpu", "trainer.progress_bar=false", "trainer.logger=[jsonl]",
        "model.enable_gradient_checkpointing=false", "model.use_remove_padding=false"]))
    first = json.loads((tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()[0])["train/loss"]
    assert trainer.val_losses[-1][1] < 0.05 * first  # ln(260) = 5.6 nats per token untrained
    tokenizer = tiny_tokenizer()
    assert held_out_accuracy(AutoModelForCausalLM.from_pretrained(model), tokenizer) == 0.0
    assert held_out_accuracy(AutoModelForCausalLM.from_pretrained(tmp_path / "sft" / "hf_model"), tokenizer) >= 0.8

    (tmp_path / "reward.py").write_text(REWARD)
    prompts = grpo_prompts(tmp_path / "prompts.jsonl", 16, 5)
    cfg = load_config("grpo", [
        f"actor_rollout_ref.model.path={tmp_path / 'sft' / 'hf_model'}", f"data.train_files={prompts}",
        "data.max_prompt_length=128", "data.max_response_length=8", "data.train_batch_size=4",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        f"custom_reward_function.path={tmp_path / 'reward.py'}", "trainer.backend=local", "trainer.device=cpu",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.logger=[console]",
        f"trainer.default_local_dir={tmp_path / 'grpo'}", "trainer.export_hf=false", "trainer.progress_bar=false"])
    (step,) = [row for row in run_ppo(cfg).metrics_history if "actor/pg_loss" in row]
    assert math.isfinite(step["actor/pg_loss"]) and step["train/opposites/score"] >= 0.5  # sampled at temperature 1
