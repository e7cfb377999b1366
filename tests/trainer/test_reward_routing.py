"""Training on a mixed batch (math + IFEval + code, tiny random model) through the command line,
each domain scored by its own reward worker group: every domain's training and validation metrics
over a few steps, the same run on Ray, and a domain without a route stopping the run before
anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trainer_helpers import tiny_overrides

from rlvr.data_prep.mixed import build
from rlvr.trainer.data import read_rows, write_rows
from rlvr.trainer.main_ppo import main
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer
from rlvr.trainer.tracking import read_metrics

DOMAINS = ("math", "ifeval", "code")
SAMPLES_PER_STEP = 6 * 4  # train_batch_size prompts x rollout.n
STEPS = 2


@pytest.fixture(scope="module")
def mixed_data(tmp_path_factory) -> dict[str, Path]:
    train, test = build(tmp_path_factory.mktemp("mixed"), train_size=24, test_size=6, seed=0)
    return {"train": train, "val": test}


def _argv(model_dir: Path, data: dict[str, Path], run_dir: Path, **extra) -> list[str]:
    settings = {"trainer.total_training_steps": STEPS, "trainer.val_before_train": False, "data.max_prompt_length": 192,
                "data.train_batch_size": 6,
                "actor_rollout_ref.actor.ppo_mini_batch_size": 6, **extra}
    overrides = tiny_overrides(model_dir, {**data, "reward": None}, run_dir, **settings)
    return ["--preset", "rlvr_mixed", *[o for o in overrides if not o.startswith("custom_reward_function")]]


def _check_per_domain_metrics(run_dir: Path) -> None:
    rows = read_metrics(run_dir / "metrics.jsonl")
    steps = [row for row in rows if "timing_s/step" in row]
    assert [row["step"] for row in steps] == list(range(1, STEPS + 1))
    for domain in DOMAINS:  # every domain was scored by its reward worker group and trained on
        trained = [row for row in steps if f"reward/{domain}/count" in row]
        assert trained, f"no training step had {domain} samples"
        assert all(f"reward/{domain}/mean_score" in row and f"train/{domain}/score" in row for row in trained)
    for row in steps:
        present = [d for d in DOMAINS if f"reward/{d}/count" in row]
        assert sum(row[f"reward/{d}/count"] for d in present) == SAMPLES_PER_STEP
        for domain in present:
            assert row[f"reward/{domain}/count"] % 4 == 0  # whole groups of rollout.n samples
            # what the router reported is what the trainer trained on
            assert row[f"train/{domain}/score"] == pytest.approx(row[f"reward/{domain}/mean_score"])
        if "code" in present:  # a random model writes no fenced code: the sandbox never runs
            assert row["reward/code/no_code"] == 1.0 and row["reward/code/mean_score"] == 0.0
        if "math" in present:
            assert row["reward/math/mean_score"] == 0.0 and row["reward/math/timeout"] == 0.0
        if "ifeval" in present:  # one instruction per prompt: the reward is its strict check
            assert row["reward/ifeval/mean_score"] == pytest.approx(row["reward/ifeval/instruction_strict"])
    validation = [row for row in rows if "val/acc" in row]
    assert len(validation) == 1 and all(f"val/{d}/acc" in validation[0] for d in DOMAINS)


@pytest.mark.slow  # about 12-25 s: keeps the default suite under 10 minutes (it runs in CI's slow step)
def test_mixed_domains_train_through_the_cli_with_one_reward_worker_group_each(tiny_model_dir, mixed_data, tmp_path):
    argv = _argv(tiny_model_dir, mixed_data, tmp_path / "run")
    result = subprocess.run([sys.executable, "-m", "rlvr.trainer.main_ppo", *argv], capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    _check_per_domain_metrics(tmp_path / "run")


@pytest.mark.ray
@pytest.mark.slow  # the local-backend version of this run is in the default suite
def test_mixed_domains_on_ray_with_two_processes_per_reward_worker(tiny_model_dir, mixed_data, tmp_path):
    argv = _argv(tiny_model_dir, mixed_data, tmp_path / "run", **{"trainer.backend": "ray", "reward.num_workers": 2})
    assert main(argv) == 0
    _check_per_domain_metrics(tmp_path / "run")


def test_a_domain_without_a_route_stops_the_run_before_anything_starts(tiny_model_dir, mixed_data, tmp_path,
                                                                       monkeypatch, capsys):
    def started(self):
        raise AssertionError("workers were started")

    monkeypatch.setattr(RayPPOTrainer, "init_workers", started)
    rows = read_rows(mixed_data["train"])
    write_rows([*rows, {**rows[0], "data_source": "chess"}], tmp_path / "train.jsonl")
    argv = _argv(tiny_model_dir, {**mixed_data, "train": tmp_path / "train.jsonl"}, tmp_path / "run")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "config error at 'reward.routes': the training data has data_source value(s) 'chess' with no reward " \
           "route (routes exist for: code, ifeval, math)" in err
    assert not (tmp_path / "run").exists()


def test_reward_worker_groups_can_be_torn_down_and_created_again(tiny_model_dir, mixed_data, tmp_path):
    from rlvr.reward.router import RewardRouter
    from rlvr.trainer.config import load_config
    from rlvr.trainer.ppo.ray_trainer import ResourcePoolManager
    from rlvr.trainer.ppo.utils import Role
    from rlvr.utils.testing import tiny_tokenizer
    from rlvr.workers.engine_workers import ActorRolloutRefWorker

    cfg = load_config("rlvr_mixed", [*_argv(tiny_model_dir, mixed_data, tmp_path / "run")[2:],
                                     "actor_rollout_ref.actor.use_kl_loss=false"])
    pools = ResourcePoolManager({"global_pool": [1]}, {Role.ActorRollout: "global_pool"}, use_gpu=False, backend="local")
    trainer = RayPPOTrainer(cfg, tiny_tokenizer(), {Role.ActorRollout: ActorRolloutRefWorker}, pools)
    assert trainer.reward_fn is None and trainer.reward_workers is None  # nothing started yet
    trainer.create_reward_worker_groups()
    handle = trainer.reward_workers
    first = handle.group
    assert sorted(first.groups) == ["code_sandbox", "ifeval", "math_rule"]
    assert isinstance(trainer.reward_fn, RewardRouter) and isinstance(trainer.val_reward_fn, RewardRouter)
    handle.rebuild()  # what a dead or hung reward worker triggers: tear the groups down, start them again
    assert handle.group is not first and sorted(handle.group.groups) == sorted(first.groups)
    assert first._stopped and not handle.group._stopped
    trainer.shutdown()
    assert handle.group._stopped
