"""Asynchronous training on the local backend: the actor trains in the driver while the rollout
generates in a child process (``actor_rollout_ref.hybrid_engine=false``). Per schedule: max_staleness=0
gives the synchronous trainer's metrics exactly; the bound is never exceeded (from the per-token
versions of every trained batch); partial rollouts mix versions along a row, oldest first; a killed
driver resumes without losing or repeating a prompt; SIGTERM stops with a checkpoint; a hung weight
push raises a timeout naming the rollout worker; a killed rollout worker is restarted alone and
goes on with the current weights. The kill-and-resume test runs on the Ray backend too (the Ray
versions of the others are in ``test_async_ray.py``)."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest
import torch
from async_helpers import (APART, BOUNDS, LONGER, MODES, SLOW_DECODE, VersionRecorder, comparable, faulty_rollout,
                           read_log, write_train_script)
from trainer_helpers import tiny_config

from rlvr.trainer.checkpoint import CheckpointManager
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.recovery import RestartLimitError
from rlvr.utils import core_lending
from rlvr.utils.errors import WorkerTimeoutError
from rlvr.utils.fault_injection import Fault
from rlvr.utils.tokenizer import hf_tokenizer

BASE = {"trainer.val_before_train": False, "trainer.report": False, "trainer.num_threads": 1,
        "trainer.total_training_steps": 4}


@pytest.fixture(autouse=True)
def no_weight_segment_is_left():
    """The weight pushes' shared memory (``/dev/shm/rlvr_w_*``) is released when a run ends, killed or not."""
    before = set(glob.glob("/dev/shm/rlvr_w_*"))
    yield
    deadline = time.monotonic() + 10  # a killed trainer's segment goes with its resource tracker, just after
    while (left := set(glob.glob("/dev/shm/rlvr_w_*")) - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left


@pytest.fixture
def run(tiny_model_dir, tiny_data, tmp_path):
    def go(name: str, record: bool = False, mapping=None, **extra):
        cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / name, **{**BASE, **extra})
        recorder = VersionRecorder(cfg, hf_tokenizer(str(tiny_model_dir))) if record else None
        trainer = run_ppo(cfg, mapping(cfg) if mapping else None, reward_fn=recorder)
        return trainer, recorder

    return go


def test_max_staleness_0_gives_the_synchronous_trainers_metrics_exactly(run):
    colocated, _ = run("colocated")
    apart, recorder = run("apart", record=True, **APART, **{"async_training.mode": "bounded",
                                                            "async_training.max_staleness": 0})
    assert comparable(apart.metrics_history) == comparable(colocated.metrics_history)
    assert [row["actor/reused_rollout_log_probs"] for row in apart.metrics_history[:4]] == [1.0] * 4
    assert [b["policy_version"] for b in recorder.batches] == [0, 1, 2, 3]
    assert recorder.staleness() == [[0] * 16] * 4


@pytest.mark.parametrize("mode", ["one_step", pytest.param("bounded_wait_partial", marks=pytest.mark.slow),
                                  pytest.param("bounded_drop_partial", marks=pytest.mark.slow)])
def test_the_staleness_bound_is_never_exceeded(run, mode):
    slow = SLOW_DECODE if "partial" in mode else {}
    trainer, recorder = run(mode, record=True, **MODES[mode], **LONGER, **slow, **{"trainer.total_training_steps": 5})
    staleness = recorder.staleness()
    assert max(max(s) for s in staleness) <= BOUNDS[mode]
    steps = trainer.metrics_history[:5]
    assert [row["async/staleness_max"] for row in steps] == [float(max(s)) for s in staleness]
    if mode == "one_step":  # batch k+1 is generated while batch k trains: exactly one version behind
        assert staleness == [[0] * 16] + [[1] * 16] * 4
    if "partial" in mode:  # weights arrived during generations, which went on with them, oldest tokens first
        rows = recorder.mixed_rows()
        interrupted = [row["async/interrupted_generations"] for row in steps]
        assert rows, f"no trained row mixes versions (interrupted generations per step: {interrupted})"
        assert all(bool((row[1:] >= row[:-1]).all()) for row in rows)
        assert sum(interrupted) > 0, f"no weight push landed in a generation: {interrupted}, staleness {staleness}"
    # decoupled PPO by default, one optimizer step per batch: the update's forward is the proximal policy
    assert all(row["actor/prox_from_update"] == 1.0 and "rollout_corr/rollout_is_mean" in row for row in steps)
    assert all("timing_s/old_log_prob" not in row and "actor/reused_rollout_log_probs" not in row for row in steps)
    # samples of the current version: proximal == behaviour (the HF engine's fp32 log-probs), no weight capped
    current = [row for row, s in zip(steps, staleness) if max(s) == 0]
    assert current and all(row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0 for row in current)
    assert all(row["training/rollout_log_probs_diff_max"] < 1e-4 for row in current)


def test_the_proximal_log_probs_are_recomputed_when_the_update_cannot_give_them(run):
    trainer, recorder = run("recompute", record=True, **MODES["one_step"], **{
        "async_training.prox_log_prob_from_update": False, "trainer.total_training_steps": 3})
    steps, staleness = trainer.metrics_history[:3], recorder.staleness()
    # the actor recomputes them unless every token is current (then the engine's exact ones are reused)
    assert [row["actor/reused_rollout_log_probs"] for row in steps] == [float(max(s) == 0) for s in staleness]
    assert all("rollout_corr/rollout_is_mean" in row and "actor/prox_from_update" not in row for row in steps)


USER_ESTIMATOR = '''
from rlvr.trainer.ppo.advantage import get_adv_estimator_fn, register_adv_est


@register_adv_est("grpo_reading_old", needs_groups=True, reads_old_log_prob=True)
def grpo_reading_old(token_level_rewards, response_mask, index, old_log_prob=None, config=None, **kwargs):
    if old_log_prob is None or old_log_prob.shape != response_mask.shape:
        raise ValueError(f"the proximal log-probs were not computed before the advantages: {old_log_prob}")
    return get_adv_estimator_fn("grpo")(token_level_rewards=token_level_rewards, response_mask=response_mask,
                                        index=index, config=config)
'''


def test_a_users_estimator_that_reads_old_log_probs_gets_them_before_the_update(run, tmp_path):
    from rlvr.trainer.ppo.advantage import ADV_ESTIMATOR_REGISTRY

    project = tmp_path / "user_project"  # outside the repository
    project.mkdir()
    (project / "reading_old_est.py").write_text(USER_ESTIMATOR)
    try:
        trainer, _ = run("reads_old", **MODES["one_step"], **{
            "trainer.user_modules": f"['{project / 'reading_old_est.py'}']",
            "algorithm.adv_estimator": "grpo_reading_old", "trainer.total_training_steps": 2})
    finally:
        ADV_ESTIMATOR_REGISTRY.pop("grpo_reading_old", None)
    steps = trainer.metrics_history[:2]
    assert all("timing_s/old_log_prob" in row and "actor/prox_from_update" not in row for row in steps)
    assert steps[1]["async/staleness_max"] == 1.0 and steps[1]["actor/reused_rollout_log_probs"] == 0.0


def test_lending_idle_cores_the_rollout_borrows_the_trainers_while_it_waits_for_samples(run):
    """``lend_idle_cores`` with the thread count left to the split: the first batch is generated while
    the trainer waits for it (it asks for it as soon as the rollout starts, before the child gets the
    call), so the rollout's decode steps ran on the trainer's cores too; the shared flags' file is
    gone after the run. (Not the slow-decode engine: its registration would outlive the test in this
    process, and the default suite checks the registries against the built-in names.)"""
    before = set(glob.glob("/dev/shm/rlvr_cores_*"))
    trainer, _ = run("lend", **MODES["one_step"], **{
        "trainer.num_threads": "null", "async_training.lend_idle_cores": True, "trainer.total_training_steps": 3})
    steps = trainer.metrics_history[:3]
    shares = [row["async/rollout_lent_core_share"] for row in steps]
    assert steps[0]["async/rollout_lent_core_share"] > 0.5, shares
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert all(0.0 <= row.get("async/trainer_lent_core_share", 0.0) <= 1.0 for row in steps)
    assert set(glob.glob("/dev/shm/rlvr_cores_*")) == before
    assert core_lending.ENV_VAR not in os.environ and core_lending.installed() is None


def test_without_decoupled_ppo_the_engines_log_probs_are_the_old_ones(run):
    trainer, _ = run("behaviour", **MODES["one_step"], **{"async_training.compute_prox_log_prob": False,
                                                            "trainer.total_training_steps": 2})
    steps = trainer.metrics_history[:2]
    assert [row["actor/reused_rollout_log_probs"] for row in steps] == [1.0, 1.0]
    assert all("rollout_corr/rollout_is_mean" not in row for row in steps)


@pytest.mark.slow  # about 12-25 s: keeps the default suite under 10 minutes (it runs in CI's slow step)
def test_a_hung_weight_push_raises_a_timeout_naming_the_rollout_worker(run, tmp_path):
    marker = tmp_path / "hung-push"
    faults = [Fault("update_weights", rank=0, call=2, kind="hang", marker=str(marker))]  # 1: the push at start
    start = time.monotonic()
    with pytest.raises(RestartLimitError) as info:
        run("hung", mapping=lambda cfg: faulty_rollout(cfg, *faults), **MODES["one_step"],
            **{"async_training.weight_sync_timeout_s": 5, "trainer.max_restarts": 0})
    assert marker.exists() and time.monotonic() - start < 120
    message = str(info.value)
    # the push made after step 1's update runs in the background, beside step 2: its timeout lands in step 2
    assert "1. step 2: call timed out in worker group 'rollout_" in message
    assert "method 'update_weights', rank 0" in message
    (cause,) = info.value.__cause__.exceptions
    assert isinstance(cause, WorkerTimeoutError) and "within 5.0 s" in str(cause)


@pytest.mark.slow  # waits for a new rollout process
def test_a_killed_rollout_worker_is_restarted_alone_with_the_current_weights(run, tmp_path):
    marker = tmp_path / "rollout-killed"
    faults = [Fault("generate_sequences", rank=0, call=3, kind="kill", marker=str(marker))]
    trainer, recorder = run("killed", record=True, mapping=lambda cfg: faulty_rollout(cfg, *faults),
                            **MODES["one_step"])
    assert marker.exists()
    (restart,) = trainer.recovery.restarts
    assert restart.group.startswith("rollout_") and restart.restored_step is None
    # the weight push may be in flight beside the generation: the thread awaiting either may see the death
    # first, and the error names every call the child was running
    assert restart.cause == "worker died" and restart.method in ("generate_sequences", "update_weights")
    ((_, error),) = trainer.recovery.failures
    assert "(exit code -9, signal SIGKILL) while it ran generate_sequences" in str(error)
    assert [row["step"] for row in trainer.metrics_history] == [1, 2, 3, 4, 4]  # nothing rolled back
    assert max(max(s) for s in recorder.staleness()) <= 1
    # the batch generated again after the restart came from the weights pushed last, not the start's
    third = recorder.batches[2]
    assert third["versions"][third["mask"].bool()].min() >= 1


def _train(tmp_path, tiny_model_dir, tiny_data, name: str, log: str, **extra) -> subprocess.Popen:
    """The training script in a process of its own (a new session: killed with its children)."""
    script = write_train_script(tmp_path / "train.py")
    args = {"model": str(tiny_model_dir), "data": {k: str(v) for k, v in tiny_data.items()},
            "run": str(tmp_path / name), "log": str(tmp_path / log), "extra": extra}
    return subprocess.Popen([sys.executable, str(script), json.dumps(args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_step(run_dir, step: int, process: subprocess.Popen, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and any(json.loads(line).get("step", 0) >= step and "timing_s/step" in line
                                    for line in metrics.read_text().splitlines()):
            return
        assert process.poll() is None, process.stderr.read()[-3000:]
        time.sleep(0.2)
    raise AssertionError(f"step {step} not reached within {timeout_s} s")


EPOCH = {**BASE, **MODES["bounded_wait_partial"], **LONGER, **SLOW_DECODE, "trainer.total_training_steps": 8,
         "data.val_files": "null", "trainer.save_freq": 2, "trainer.resume_mode": "auto"}
"""One epoch of the 32 tiny prompts (8 steps of 4), a checkpoint every 2 steps. The slow-decode engine
makes a step last at least a generation (~0.7 s): a kill sent when step 5 is seen lands before step 7
ends (with the tiny model's 0.1-0.2 s steps the whole epoch could finish first)."""


@pytest.mark.slow  # two training processes, one killed in the middle of a step
@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_sigkill_mid_run_then_resume_trains_every_prompt_of_the_epoch_once(tmp_path, tiny_model_dir, tiny_data,
                                                                           backend):
    """The driver is killed with its whole process group (on Ray the cluster it started too)."""
    extra = {**EPOCH, "trainer.backend": backend}
    first = _train(tmp_path, tiny_model_dir, tiny_data, "killed", "first.jsonl", **extra)
    _wait_for_step(tmp_path / "killed", 5, first)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and its rollout child, in the middle of a step
    first.wait(timeout=30)
    checkpoint = CheckpointManager(tmp_path / "killed" / "checkpoints").latest()
    step = int(checkpoint.name.removeprefix("global_step_"))
    assert step in (4, 6)
    state = CheckpointManager.load_trainer_state(checkpoint)["async_rollout"]
    assert state["policy_version"] == step and len(state["unfinished"]) >= 4  # drawn ahead: in flight or buffered
    second = _train(tmp_path, tiny_model_dir, tiny_data, "killed", "second.jsonl", **extra)
    assert second.wait(timeout=600) == 0, second.stderr.read()[-3000:]
    committed = [b for b in read_log(tmp_path / "first.jsonl") if b["policy_version"] < step]
    resumed = read_log(tmp_path / "second.jsonl")
    assert [b["policy_version"] for b in resumed] == list(range(step, 8))
    trained = Counter(i for b in committed + resumed for i in b["index"])  # n = 4 samples per prompt
    assert trained == Counter({i: 4 for i in range(32)})


@pytest.mark.slow  # a training process of its own
def test_sigterm_stops_cleanly_with_a_checkpoint_of_the_prompts_in_flight(tmp_path, tiny_model_dir, tiny_data):
    extra = {**EPOCH, "trainer.save_freq": -1}
    process = _train(tmp_path, tiny_model_dir, tiny_data, "stopped", "log.jsonl", **extra)
    _wait_for_step(tmp_path / "stopped", 2, process)
    os.kill(process.pid, signal.SIGTERM)
    assert process.wait(timeout=300) == 0, process.stderr.read()[-3000:]  # run_ppo returns: a clean stop
    checkpoint = CheckpointManager(tmp_path / "stopped" / "checkpoints").latest()
    step = int(checkpoint.name.removeprefix("global_step_"))
    assert 2 <= step < 8
    state = CheckpointManager.load_trainer_state(checkpoint)["async_rollout"]
    assert state["policy_version"] == step and state["unfinished"]
    trained = [b for b in read_log(tmp_path / "log.jsonl") if b["policy_version"] < step]
    unfinished = [int(row.non_tensor_batch["index"][0]) for row, _ in state["unfinished"]]
    assert not set(unfinished) & {i for b in trained for i in b["index"]}
    assert torch.tensor([v is None or 0 <= v <= step for _, v in state["unfinished"]]).all()
