"""The command line (``rlvr --help-config``, ``--print-config``, ``--dry-run``, config errors before any
heavy import, the derived settings, the resume command) and the checks the trainer makes before any
worker starts."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import tiny_config, tiny_overrides

from rlvr.trainer.config import check_names, load_config
from rlvr.trainer.config.builtin_names import BUILTIN_ESTIMATOR_NEEDS, BUILTIN_NAMES
from rlvr.trainer.config.validate import registered_names
from rlvr.trainer import main_ppo
from rlvr.trainer.checkpoint import CheckpointManager
from rlvr.trainer.main_ppo import build_role_worker_mapping, main, resume_command
from rlvr.trainer.run_settings import describe_run
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.errors import ConfigError, WorkerDiedError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.workers.engine_workers import ActorRolloutRefWorker, CriticWorker


def test_help_config(capsys):
    assert main(["--help-config"]) == 0
    out = capsys.readouterr().out
    assert "  algorithm.adv_estimator = 'grpo'\n      advantage estimator from the registry" in out


def test_config_error_exits_with_2_and_names_the_key(capsys, tmp_path):
    assert main(["--preset", "grpo", f"data.train_files={tmp_path / 'missing.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rlvr: config error at 'data.train_files': data file")


def test_print_config_applies_preset_and_overrides(capsys, tmp_path):
    data = tmp_path / "t.jsonl"
    data.write_text("")
    assert main(["--preset", "rloo", f"data.train_files={data}", "trainer.seed=5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "adv_estimator: rloo" in out and "seed: 5" in out


def test_role_worker_mapping_follows_the_config():
    mapping, pools = build_role_worker_mapping(load_config("ppo"))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker, Role.Critic: CriticWorker,
                       Role.RefPolicy: ActorRolloutRefWorker}
    assert set(pools.values()) == {"global_pool"}
    mapping, _ = build_role_worker_mapping(load_config("grpo", ["actor_rollout_ref.model.lora_rank=4"]))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker}  # the LoRA actor provides the reference
    mapping, _ = build_role_worker_mapping(load_config("drgrpo"))
    assert mapping == {Role.ActorRollout: ActorRolloutRefWorker}  # no KL term: no reference


def test_trainer_checks_roles_before_any_worker_starts(tiny_model_dir, tiny_data, tmp_path):
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False,
                                backend="local")
    actor_only = {Role.ActorRollout: ActorRolloutRefWorker}
    cases = [("grpo", {}, "actor_rollout_ref.actor.use_kl_loss", "needs a reference policy: add Role.RefPolicy"),
             ("ppo", {"actor_rollout_ref.rollout.n": 2}, "critic.enable", "has no Role.Critic")]
    for preset, extra, key, message in cases:
        cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset=preset, **extra)
        with pytest.raises(ConfigError, match=message) as info:
            RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools, reward_fn=object())
        assert info.value.key == key
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset="drgrpo")
    with pytest.raises(ConfigError, match="needs a reward_fn"):
        RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools)
    trainer = RayPPOTrainer(cfg, tiny_tokenizer(), actor_only, pools, reward_fn=object())
    assert trainer.total_training_steps == 3 and not trainer.use_reference and not trainer.use_critic


BLOCK_HEAVY = """
import builtins, sys
real_import = builtins.__import__
def guarded(name, *args, **kwargs):
    if name.split(".")[0] in ("torch", "ray", "transformers"):
        raise ImportError(f"{name} must not be imported to check a config")
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded
from rlvr.trainer.main_ppo import main
sys.exit(main(sys.argv[1:]))
"""


def _cli(*argv: str) -> subprocess.CompletedProcess:
    """``rlvr argv`` in a fresh interpreter where importing torch, Ray or transformers fails."""
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, "-c", BLOCK_HEAVY, *argv], cwd=repo, capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize(("override", "message"), [
    ("trainer.seedd=3", "config error at 'trainer.seedd': unknown key (from the command line) "
                        "(did you mean 'trainer.seed'?)"),
    ("trainer.train_batch_size=4", "(did you mean 'data.train_batch_size'?)"),
    ("algorithm.adv_estimator=grpoo", "config error at 'algorithm.adv_estimator': 'grpoo' is not valid "
                                      "(did you mean 'grpo'?)"),
    ("data.train_batch_size=6", "config error at 'actor_rollout_ref.actor.ppo_mini_batch_size': "
                                "data.train_batch_size=6 is not a multiple of ppo_mini_batch_size=4"),
    ("trainer.backend=rey", "(did you mean 'ray'?)"),
    ("data.max_prompt_length=abc", "config error at 'data.max_prompt_length': wrong value type"),
])
def test_config_errors_are_reported_before_any_heavy_import(tiny_data, tmp_path, override, message):
    result = _cli("--preset", "grpo", f"data.train_files={tiny_data['train']}", "data.train_batch_size=4",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=4", override)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr


def test_dry_run_prints_the_derived_settings_without_heavy_imports(tiny_data):
    result = _cli("--preset", "ppo", f"data.train_files={tiny_data['train']}", "trainer.n_gpus_per_node=2",
                  "data.train_batch_size=16", "actor_rollout_ref.rollout.n=2",
                  "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_epochs=2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_mini_batch_size=8",
                  "critic.ppo_micro_batch_size_per_gpu=4", "trainer.save_freq=5", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "16 prompts x 2 samples = 32 sequences of at most 256 + 128 = 384 tokens: up to 12,288 tokens per " \
           "step, 6,144 per worker" in result.stdout
    assert "actor updates  4 mini-batch(es) of 4 prompts (8 sequences) x 2 epoch(s) = 8 optimizer step(s) per " \
           "rollout; each worker takes 4 sequences per mini-batch in 2 micro-batch(es) of 2" in result.stdout
    assert "critic updates 2 mini-batch(es) of 8 prompts (16 sequences) x 1 epoch(s) = 2 optimizer step(s)" \
           in result.stdout
    assert "actor + rollout + reference + critic colocated in 2 Ray worker process(es)" in result.stdout
    assert "up to 3 restart(s) after a dead worker or a call over 3600 s" in result.stdout


def test_derived_settings_follow_the_config(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path, preset="grpo", **{
        "actor_rollout_ref.model.lora_rank": 4, "actor_rollout_ref.actor.use_dynamic_bsz": True,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 100, "trainer.max_time_s": 60})
    text = describe_run(cfg)
    assert "reference: the actor with its LoRA adapters off; KL: in the loss (low_var_kl, coef 0.001)" in text
    assert "16 sequences of at most 32 + 8 = 40 tokens: up to 640 tokens per step, 640 per worker" in text
    assert "in micro-batches of at most 100 tokens (at least 2 full-length sequences each)" in text
    assert "actor + rollout in the driver process (CPU)" in text
    assert "3 steps or 60 s, whichever comes first; validation: before training, at the end" in text
    assert "in-process workers: a crash ends the run" in text
    assert "generation: synchronous (generate, then train)" in text


def test_derived_settings_of_a_rollout_apart(tiny_model_dir, tiny_data, tmp_path):
    apart = {"actor_rollout_ref.hybrid_engine": False, "async_training.mode": "bounded",
             "async_training.max_staleness": 3, "async_training.partial_rollout": True}
    local = describe_run(tiny_config(tiny_model_dir, tiny_data, tmp_path, **apart))
    assert "actor + reference in the driver process (CPU); rollout in a child process" in local
    assert "generation: bounded (at most 3 version(s) stale, wait, partial rollouts)" in local
    ray = describe_run(tiny_config(tiny_model_dir, tiny_data, tmp_path, **apart, **{
        "trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "rollout.n_gpus_per_node": 3, "rollout.nnodes": 2}))
    assert "rollout in 6 Ray worker process(es) of its own (2 node(s) x 3)" in ray


def test_builtin_names_match_the_registries():
    """The command checks names, and what each estimator needs, against tables before the
    registries load; they must hold exactly what the registries hold: the names, and the
    ``needs_*`` flags of each ``@register_adv_est`` (add a new built-in entry to
    rlvr/trainer/config/builtin_names.py)."""
    assert {key: sorted(names) for key, names in registered_names().items()} == \
        {key: sorted(names) for key, names in BUILTIN_NAMES.items()}
    from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY, get_adv_estimator_needs

    # AdvantageEstimatorNeeds objects compare by their flags
    assert {name: get_adv_estimator_needs(name) for name in ADV_ESTIMATOR_REGISTRY.names()} == BUILTIN_ESTIMATOR_NEEDS
    with pytest.raises(ConfigError, match="'nope' is not valid"):
        check_names(load_config("grpo", ["reward_model.reward_manager=nope"]), BUILTIN_NAMES)


def test_resume_command_continues_from_the_same_directory(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["/usr/bin/rlvr"])
    command = resume_command(["--preset", "grpo", "trainer.resume_mode=disable", "data.train_files=a b.jsonl"])
    assert command == f"cd {shlex.quote(str(tmp_path))} && rlvr --preset grpo 'data.train_files=a b.jsonl' " \
                      "trainer.resume_mode=auto"
    monkeypatch.setattr(sys, "argv", ["/x/rlvr/trainer/main_ppo.py"])
    assert f"{sys.executable} -m rlvr.trainer.main_ppo --preset grpo trainer.resume_mode=auto" in \
        resume_command(["--preset", "grpo"])


def test_a_run_ended_by_a_worker_failure_names_the_last_whole_checkpoint_and_how_to_resume(
        monkeypatch, capsys, tiny_model_dir, tiny_data, tmp_path):
    """A worker lost while the run stops (a restart would be pointless) or past trainer.max_restarts
    ends the command with a message, not a traceback: the failure, the newest whole checkpoint on
    disk (an unfinished newer save is passed over) and the resume command."""
    run_dir = tmp_path / "run"

    def fails_after_a_checkpoint(cfg):
        manager = CheckpointManager(run_dir / "checkpoints")
        manager.commit(manager.begin(2), 2, {"global_steps": 2})
        manager.begin(3)  # the save of step 3 did not finish
        raise WorkerDiedError("actor_rollout", "actor_rollout_update_actor", 1, "the worker process died")

    monkeypatch.setattr(main_ppo, "run_ppo", fails_after_a_checkpoint)
    monkeypatch.chdir(tmp_path)
    argv = ["--preset", "grpo", *tiny_overrides(tiny_model_dir, tiny_data, run_dir)]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("rlvr: worker group 'actor_rollout', method 'actor_rollout_update_actor', rank 1 failed:\n"
                          "the worker process died\n")
    assert f"The run ended on a worker failure; the last whole checkpoint is {run_dir}/checkpoints/global_step_2.\n" \
           "Resume with:\n  cd " in err
    assert err.rstrip().endswith("trainer.resume_mode=auto")
