"""End-to-end runs of the trainer on the local backend (workers in the test process) with a tiny
random Llama and a tiny synthetic dataset: several algorithms, same-seed determinism, exact
resume, checkpoints, report, HF export, and errors that name the stage."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_config

from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.tracking import read_metrics

STEP_METRICS = [
    "train/tiny/score", "train/tiny/acc", "train/acc", "critic/score/mean", "actor/entropy", "actor/pg_clipfrac",
    "actor/grad_norm", "actor/pg_loss", "response_length/mean", "response_length/max", "response_length/clip_ratio",
    "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor", "timing_s/step",
    "timing_per_token_ms/gen", "perf/throughput",
]


def _comparable(rows: list[dict]) -> list[dict]:
    """Metrics without wall-clock measurements (timings, throughput, memory)."""
    skip = ("timing", "perf/", "actor/peak", "memory", "rollout/weights_version")  # the version: a per-process count
    return [{k: v for k, v in row.items() if not k.startswith(skip) and "memory" not in k} for row in rows]


def _differences(rows: list[dict], expected: list[dict]) -> list[tuple]:
    """``(row, key, value, expected value)`` of every comparable metric that differs (or is missing)."""
    return [(i, key, got.get(key), want.get(key)) for i, (got, want) in enumerate(zip(_comparable(rows), _comparable(expected)))
            for key in sorted(set(got) | set(want)) if got.get(key) != want.get(key)] + (
        [("rows", len(rows), len(expected))] if len(rows) != len(expected) else [])


@pytest.fixture
def run(tiny_model_dir, tiny_data, tmp_path):
    def go(preset: str, name: str = "run", **extra):
        cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / name, preset=preset, **extra)
        return run_ppo(cfg)

    return go


def test_grpo_end_to_end(run, tmp_path):
    trainer = run("grpo", **{"trainer.export_hf": True, "trainer.save_freq": 2})
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 3]  # val before, 3 steps, final val
    assert set(rows[0]) == {"step", "val/tiny/score", "val/tiny/acc", "val/acc", "val-core/tiny/acc/mean@1",
                            "val-aux/tiny/reward/mean@1", "val-aux/tiny/score/mean@1"}  # verl's names, 1 sample
    for row in rows[1:4]:
        missing = [k for k in STEP_METRICS + ["actor/kl_loss", "timing_s/ref"] if k not in row]
        assert not missing, missing
        assert row["response_length/max"] <= 8
    assert trainer.global_steps == 3
    ckpts = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["global_step_2", "global_step_3",
                                                       "latest_checkpointed_iteration.txt"]
    report = (tmp_path / "run" / "report.md").read_text()
    assert "| val/acc before (step 0) |" in report and "## Sample generations" in report
    assert f"| val/acc by step | 0: {rows[0]['val/acc']:.2f}, 3: {rows[-1]['val/acc']:.2f} |" in report
    for plot in ("reward", "val_accuracy"):
        assert (tmp_path / "run" / "plots" / f"{plot}.png").is_file()
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "hf_model")
    assert exported.config.vocab_size == 260


@pytest.mark.parametrize("preset", ["ppo", "rloo", "dapo", "remax", "grpo_lora"])
def test_other_algorithms_end_to_end(run, tmp_path, preset):
    steps = 2 if preset == "ppo" else 1
    extra = {"trainer.total_training_steps": steps, "trainer.val_before_train": False, "trainer.report": False}
    if preset == "ppo":
        extra["actor_rollout_ref.rollout.n"] = 2
    if preset == "dapo":
        extra["reward_model.overlong_buffer.len"] = 4
    if preset == "grpo_lora":  # the reference is the LoRA actor with its adapters disabled
        preset, extra["actor_rollout_ref.model.lora_rank"] = "grpo", 4
    trainer = run(preset, **extra)
    rows = trainer.metrics_history
    assert [r["step"] for r in rows] == [*range(1, steps + 1), steps]  # steps, then the final validation
    expected = {"ppo": ["critic/vf_loss", "critic/values/mean", "timing_s/values", "timing_s/update_critic",
                        "actor/reward_kl_penalty", "timing_s/ref"],
                "rloo": ["actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff", "timing_s/ref"],
                "dapo": ["train/num_gen_batches", "train/kept_group_ratio", "train/filter_groups_incomplete",
                         "train/unfiltered_score_mean", "train/unfiltered_acc"],
                "remax": ["actor/reward_kl_penalty"], "grpo": ["actor/kl_loss", "timing_s/ref"]}[preset]
    for row in rows[:steps]:
        missing = [k for k in STEP_METRICS + expected if k not in row]
        assert not missing, missing
    if preset == "ppo":
        assert rows[0]["critic/vf_loss"] > 0
    if preset == "grpo":
        assert trainer.ref_in_actor and trainer.ref_policy_wg is trainer.actor_rollout_wg


@pytest.mark.slow
def test_same_seed_same_metrics_and_exact_resume(run, tmp_path):
    """Two runs with one seed agree on every metric; a run resumed from the step-2 checkpoint
    gives the step-3 metrics of the uninterrupted run."""
    extra = {"trainer.save_freq": 2, "trainer.report": False, "trainer.val_before_train": False}
    first = run("grpo", "a", **extra).metrics_history
    second = run("grpo", "b", **extra).metrics_history
    assert _comparable(first) == _comparable(second)
    assert first[0]["critic/score/mean"] != first[2]["critic/score/mean"]  # the steps differ
    resumed = run("grpo", "c", **extra, **{"trainer.resume_mode": "resume_path",
                                            "trainer.resume_from_path": str(tmp_path / "a/checkpoints/global_step_2")})
    assert [r["step"] for r in resumed.metrics_history] == [3, 3]
    assert _differences(resumed.metrics_history, first[2:]) == []
    other_seed = run("grpo", "d", **extra, **{"trainer.seed": 8, "trainer.total_training_steps": 1}).metrics_history
    assert _comparable(other_seed)[0] != _comparable(first)[0]


def test_auto_resume_continues_the_run_directory(run, tmp_path):
    extra = {"trainer.report": False, "trainer.val_before_train": False, "trainer.resume_mode": "auto"}
    run("grpo", "r", **extra, **{"trainer.total_training_steps": 1})
    trainer = run("grpo", "r", **extra, **{"trainer.total_training_steps": 2})
    assert [r["step"] for r in trainer.metrics_history] == [2, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl")] == [1, 1, 2, 2]


def test_a_failing_stage_is_named(run, tiny_data, tmp_path):
    bad = tmp_path / "bad_reward.py"
    bad.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                   "    raise ValueError('scorer exploded')\n")
    with pytest.raises(Exception, match="scorer exploded") as info:
        run("grpo", **{"custom_reward_function.path": str(bad), "trainer.val_before_train": False})
    assert "(raised during the trainer stage 'reward')" in info.value.__notes__


def test_a_user_estimator_that_needs_a_greedy_baseline_gets_one(run):
    """The trainer reads the registry entry, not the estimator's name: a user estimator registered
    with ``needs_greedy_baseline=True`` receives the greedy responses' rewards as ReMax does."""
    from rlvr.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_remax_outcome_advantage, register_adv_est

    received = []

    @register_adv_est("test_greedy_baseline", needs_greedy_baseline=True)
    def greedy_baseline(token_level_rewards, response_mask, reward_baselines=None, **kwargs):
        received.append(reward_baselines)
        return compute_remax_outcome_advantage(token_level_rewards, reward_baselines, response_mask)

    try:
        run("grpo", **{"algorithm.adv_estimator": "test_greedy_baseline", "trainer.total_training_steps": 1,
                       "trainer.val_before_train": False, "trainer.report": False})
    finally:
        del ADV_ESTIMATOR_REGISTRY["test_greedy_baseline"]
    assert len(received) == 1 and received[0] is not None and received[0].shape == (16,)  # 4 prompts x n=4
