"""bench_grpo_vs_trl on a micro Qwen2 workload whose vocabulary exceeds the tokenizer, on CPU; the
config of its bypass mode."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_grpo_vs_trl import parse_args, workload_from
from benchmarks.rlvr_side import run_config
from benchmarks.workload import WORKLOADS
from rlvr.trainer.config.validate import check_config
from rlvr.utils.errors import ConfigError


def test_side_by_side_on_tiny_qwen2_reports_update_flops_and_survives_ids_beyond_the_tokenizer(tmp_path):
    pytest.importorskip("trl")
    from benchmarks.bench_grpo_vs_trl import main

    out = tmp_path / "result.json"
    assert main(["--size", "tiny-qwen2", "--prompts", "2", "--samples", "2", "--response-len", "4", "--steps", "1",
                 "--warmup", "0", "--device", "cpu", "--trl-micro-batch", "2", "--token-budget", "64",
                 "--bypass-steps", "1", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["workload"]["architecture"] == "qwen2" and result["params"] == 9_847_360
    for side in ("rlvr", "trl"):
        assert all(s > 0 for s in result[side]["step_s"])
        update = result[side]
        assert update["median_update_s"] > 0 and update["update_tflops"] > 0 and update["update_mfu"] is None
        assert update["update_tflops"] == pytest.approx(update["update_flops"] / update["median_update_s"] / 1e12)
        # both sides train the same batch: one FLOP count
        assert update["update_flops"] == result["rlvr"]["update_flops"]
        # two thirds of a random model's samples are ids the 49152-token tokenizer lacks
        assert result[side]["sampled_beyond_tokenizer"] > 0.2
    assert result["trl"]["update_s"][0] + result["trl"]["generation_s"][0] == pytest.approx(result["trl"]["step_s"][0])
    assert result["peak_tflops"] is None
    assert result["rlvr"]["bypass"] is False and result["rlvr_bypass"]["bypass"] is True
    assert result["rlvr_bypass"]["reused_rollout_log_probs"] is True
    assert set(result["rlvr_bypass"]["stages_median_s"]) == set(result["rlvr"]["stages_median_s"])


def _config(**changes):
    work = WORKLOADS["qwen2.5-1.5b"]
    kwargs = {"work": work, "model_dir": "/nonexistent", "max_prompt_len": 40, "seed": 1, "lr": 1e-6, "fast": True,
              "token_budget": work.rlvr_token_budget, "overrides": []} | changes
    return run_config(**kwargs)


def test_bypass_mode_passes_the_config_check_with_the_benchmark_settings():
    cfg = _config(bypass=True)
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 64 * 304
    assert _config().algorithm.rollout_correction.bypass_mode is False


def test_bypass_mode_needs_the_rollout_log_probs():
    cfg = _config(bypass=True)
    cfg.actor_rollout_ref.rollout.calculate_log_probs = False
    with pytest.raises(ConfigError, match="calculate_log_probs"):
        check_config(cfg, require_data_files=False)


def test_trl_micro_batch_must_divide_the_batch():
    args = parse_args(["--size", "qwen2.5-1.5b", "--prompts", "3"])
    with pytest.raises(SystemExit, match="--trl-micro-batch"):
        workload_from(args)
    assert workload_from(parse_args(["--size", "qwen2.5-1.5b"])).trl_micro_batch == 64


def test_make_model_writes_a_qwen2_model_with_the_larger_vocab(tmp_path):
    from transformers import AutoConfig

    from benchmarks.gpu_steps import main, parse_args

    assert main(["make-model", "--size", "tiny-qwen2", "--out", str(tmp_path)]) == 0
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert (cfg.model_type, cfg.vocab_size, cfg.hidden_size) == ("qwen2", 151936, 64)
    assert (tmp_path / "tokenizer.json").exists()
    assert parse_args(["make-model", "--size", "qwen2.5-1.5b", "--out", "x"]).size == "qwen2.5-1.5b"
