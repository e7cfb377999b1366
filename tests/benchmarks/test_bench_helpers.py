"""Helpers of the GRPO benchmark: the decode read floor, the reward, the workloads."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaForCausalLM

from benchmarks.decode_floor import floor_seconds, kv_bytes_per_token, weight_bytes
from benchmarks.workload import WORKLOADS, Stopwatch, make_prompts, model_config, score
from rlvr.utils.testing import tiny_causal_lm


def test_floor_adds_weights_and_the_growing_kv_cache_per_step():
    # 3 steps, 2 rows, prompt 4: cached tokens 2*(4+5+6) = 30; weights read 3 times
    assert floor_seconds(weights=100, kv_per_token=10, rows=2, prompt_len=4, steps=3, bytes_per_s=10.0) == pytest.approx(
        (3 * 100 + 10 * 30) / 10.0)


def test_weight_and_kv_bytes_of_a_tiny_llama():
    model, _ = tiny_causal_lm(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    assert weight_bytes(model) == 4 * sum(p.numel() for p in model.parameters())
    # 2 layers x (k, v) x 2 kv heads x head_dim 8 x 4 bytes
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 8 * 4


def test_smollm2_workload_has_the_135m_architecture():
    cfg = model_config(WORKLOADS["smollm2-135m"], 49152, 2, 1, 2)
    with torch.device("meta"):
        params = sum(p.numel() for p in LlamaForCausalLM(cfg).parameters())
    assert params == 134_515_008  # SmolLM2-135M: tied embeddings, 30 layers, GQA 9/3 heads
    assert WORKLOADS["smollm2-135m"].sequences == 256


def test_prompts_are_reproducible_and_the_reward_counts_letters():
    assert make_prompts(3, seed=5) == make_prompts(3, seed=5)
    assert score("ab12", "99") == pytest.approx(0.5)
    assert score("it is 42", "42") == pytest.approx(1.0 + 4 / 8)
    assert score("", "1") == 0.0


def test_stopwatch_accumulates_named_stages():
    watch = Stopwatch(torch.device("cpu"))
    for _ in range(2):
        with watch("a"):
            pass
    assert list(watch.seconds) == ["a"] and watch.seconds["a"] >= 0.0


@pytest.mark.slow
def test_side_by_side_run_on_a_micro_workload(tmp_path):
    pytest.importorskip("trl")
    from benchmarks.bench_grpo_vs_trl import main

    out = tmp_path / "result.json"
    assert main(["--size", "tiny", "--prompts", "2", "--samples", "2", "--response-len", "4", "--steps", "1",
                 "--warmup", "1", "--device", "cpu", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert len(result["rlvr"]["step_s"]) == len(result["trl"]["step_s"]) == 2
    assert set(result["rlvr"]["stages_median_s"]) == {"generation", "reward", "log_probs", "update", "weight_sync"}
    assert result["rlvr"]["reused_rollout_log_probs"] is True
    assert result["ratio_rlvr_over_trl"] > 0


def test_long_response_batch_has_the_rollout_layout():
    from benchmarks.bench_long_responses import make_batch, response_lengths

    lengths = response_lengths(5, 64, 2048, seed=0)
    assert all(64 <= n <= 2048 for n in lengths) and lengths == response_lengths(5, 64, 2048, seed=0)
    batch = make_batch([3, 1, 5], vocab=100, seed=0, prompt_range=(2, 4))
    mask = batch["attention_mask"]
    assert mask.shape == (3, 4 + 5)
    assert batch["response_mask"].sum(-1).tolist() == [3, 1, 5]
    for row in mask.tolist():  # prompts left-padded, responses right-padded: one block of real tokens
        text = "".join(map(str, row))
        assert text.strip("0") == "1" * sum(row) and row[3] == 1
    assert torch.equal(batch["responses"], batch["input_ids"][:, 4:])
    assert set(batch["advantages"][batch["response_mask"].bool()].abs().tolist()) == {1.0}
