"""Reliability on a 2-worker Ray run with a tiny random Llama: a worker killed with SIGKILL
in the middle of a step, or hung past the call timeout, is replaced, the last whole checkpoint is
restored and the run finishes with the metrics of a run resumed from that checkpoint; a stateless
group is restarted alone without rolling training back; past trainer.max_restarts the run stops
with every failure; SIGTERM in the middle of a step ends the run with a checkpoint from which
trainer.resume_mode=auto reaches the metrics of an uninterrupted run."""

from __future__ import annotations

import logging
import re
import signal

import pytest
import recovery_workers
import torch
from recovery_workers import CollectivePeer, RaiseWhilePeerHangs, ShareOfEvenTokens, SignalOnCall, TokenScoreWorker
from trainer_helpers import tiny_config

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalWorkerGroup, RayResourcePool, RayWorkerGroup
from rlvr.trainer.checkpoint import CheckpointManager
from rlvr.trainer.graceful_stop import StopNow
from rlvr.trainer.main_ppo import build_role_worker_mapping, run_ppo
from rlvr.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.trainer.ppo.utils import Role
from rlvr.trainer.recovery import RestartLimitError
from rlvr.trainer.tracking import read_metrics
from rlvr.utils.errors import WorkerDiedError, WorkerError, WorkerTimeoutError
from rlvr.utils.fault_injection import Fault, with_faults
from rlvr.utils.testing import local_ray_cluster, tiny_tokenizer

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # each starts a Ray run and kills or hangs workers: minutes in all

RAY = {"trainer.backend": "ray", "trainer.n_gpus_per_node": 2, "trainer.report": False, "trainer.num_threads": 1,
       "trainer.val_before_train": False, "trainer.total_training_steps": 4, "trainer.save_freq": 2,
       "trainer.call_timeout_s": 60}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    with local_ray_cluster(2, pickle_by_value=(recovery_workers,)):  # the Ray workers cannot import tests/
        yield


def _comparable(rows: list[dict]) -> list[dict]:
    """Metrics without wall-clock measurements and without the restart counter."""
    skip = ("timing", "perf/", "trainer/restarts", "rollout/weights_version")
    return [{k: v for k, v in row.items() if not k.startswith(skip) and "memory" not in k} for row in rows]


def _with_faults(cfg, *faults: Fault) -> dict[Role, type]:
    mapping, _ = build_role_worker_mapping(cfg)
    mapping[Role.ActorRollout] = with_faults(mapping[Role.ActorRollout], faults)
    return mapping


def _steps(rows: list[dict]) -> list[dict]:
    return [row for row in rows if "timing_s/step" in row]


def _resumed_from(tiny_model_dir, tiny_data, tmp_path, checkpoint, **extra) -> list[dict]:
    """The step rows of a fresh run resumed from ``checkpoint``."""
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "resumed", **{
        **RAY, **extra, "trainer.resume_mode": "resume_path", "trainer.resume_from_path": str(checkpoint)})
    return _steps(run_ppo(cfg).metrics_history)


def test_a_killed_worker_is_replaced_and_the_run_goes_on_from_the_checkpoint(tiny_model_dir, tiny_data, tmp_path):
    run_dir = tmp_path / "faulty"
    cfg = tiny_config(tiny_model_dir, tiny_data, run_dir, **{**RAY, "trainer.report": True})
    marker = tmp_path / "killed"
    # step 3, after generation, log-probs and the reference: rank 1 dies at the start of the update
    trainer = run_ppo(cfg, _with_faults(cfg, Fault("update_actor", rank=1, call=3, kind="kill", marker=str(marker))))
    assert marker.exists()
    steps = _steps(trainer.metrics_history)
    assert [row["step"] for row in steps] == [1, 2, 3, 4]
    assert [row["trainer/restarts"] for row in steps] == [0, 0, 1, 1]
    assert [row["step"] for row in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 4]  # + final validation
    (restart,) = trainer.recovery.restarts
    assert (restart.failed_step, restart.restored_step, restart.steps_redone) == (3, 2, 1)
    assert (restart.cause, restart.method, restart.rank) == ("worker died", "actor_rollout_update_actor", 1)
    assert "actor_rollout" in restart.group and restart.seconds > 0
    report = (run_dir / "report.md").read_text()
    assert "| worker restarts | 1 |" in report and "## Worker restarts" in report
    assert "| 3 | " in report and "| update_actor |" not in report  # the row names the remote method
    resumed = _resumed_from(tiny_model_dir, tiny_data, tmp_path, run_dir / "checkpoints" / "global_step_2")
    assert [row["step"] for row in resumed] == [3, 4]
    assert _comparable(steps[2:]) == _comparable(resumed)


@pytest.mark.slow  # waits out a 25 s call timeout, then a second whole run
def test_a_hung_worker_is_replaced_and_the_run_restarts_from_its_beginning(tiny_model_dir, tiny_data, tmp_path):
    """No checkpoint yet at the hang: training goes back to the run's start (fresh workers, the
    driver state of step 0) and gives the metrics of an uninterrupted run."""
    extra = {"trainer.call_timeout_s": 25, "trainer.total_training_steps": 3, "trainer.save_freq": -1}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "hung", **{**RAY, **extra})
    marker = tmp_path / "hung-marker"
    trainer = run_ppo(cfg, _with_faults(cfg, Fault("generate_sequences", rank=0, call=2, kind="hang",
                                                   marker=str(marker))))
    (restart,) = trainer.recovery.restarts
    assert (restart.failed_step, restart.restored_step, restart.cause) == (2, 0, "call timed out")
    assert restart.method == "actor_rollout_generate_sequences" and restart.rank == 0
    steps = _steps(trainer.metrics_history)
    assert [row["step"] for row in steps] == [1, 2, 3]
    clean = run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "clean", **{**RAY, **extra}))
    assert _comparable(steps) == _comparable(_steps(clean.metrics_history))


def test_a_worker_that_dies_in_the_first_start_is_started_again(tiny_model_dir, tiny_data, tmp_path, caplog):
    """The run's first start is retried like a restart: counted, logged, recorded (nothing to redo)
    and the run trains every step."""
    extra = {"trainer.total_training_steps": 2, "trainer.save_freq": -1}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "first-start", **{**RAY, **extra})
    marker = tmp_path / "killed-at-start"
    with caplog.at_level(logging.WARNING, logger="rlvr.trainer.recovery"):
        trainer = run_ppo(cfg, _with_faults(cfg, Fault("init_model", rank=1, call=1, kind="kill",
                                                       marker=str(marker))))
    assert marker.exists()
    logged = [r.getMessage() for r in caplog.records if r.name == "rlvr.trainer.recovery"]
    assert len(logged) == 2, logged
    assert logged[0].startswith("restart 1 of at most 3: worker died in worker group '")
    assert "', method 'actor_rollout_init_model', rank 1 at step 0 (the worker process died: " in logged[0]
    assert logged[0].endswith("; restarting the workers") and "\n" not in logged[0]
    assert re.fullmatch(r"recovered from the failure at step 0 in \d+\.\d s \(back to step 0, 0 step\(s\) to redo\)",
                        logged[1]), logged[1]
    (restart,) = trainer.recovery.restarts
    assert (restart.failed_step, restart.restored_step, restart.steps_redone) == (0, 0, 0)
    assert (restart.cause, restart.method, restart.rank) == ("worker died", "actor_rollout_init_model", 1)
    steps = _steps(trainer.metrics_history)
    assert [row["step"] for row in steps] == [1, 2]
    assert [row["trainer/restarts"] for row in steps] == [1, 1]
    assert all("actor/pg_loss" in row for row in steps)


def test_a_worker_that_dies_while_the_resume_checkpoint_loads_is_started_again(tiny_model_dir, tiny_data, tmp_path):
    """A run resumed with trainer.resume_mode=auto loses a worker while it loads the checkpoint: the
    workers start again, load it again, and the run goes on from that checkpoint."""
    extra = {**RAY, "trainer.save_freq": -1, "trainer.resume_mode": "auto"}
    run_dir = tmp_path / "resumed"
    run_ppo(tiny_config(tiny_model_dir, tiny_data, run_dir, **{**extra, "trainer.total_training_steps": 2}))
    cfg = tiny_config(tiny_model_dir, tiny_data, run_dir, **{**extra, "trainer.total_training_steps": 3})
    marker = tmp_path / "killed-while-loading"
    trainer = run_ppo(cfg, _with_faults(cfg, Fault("load_checkpoint", rank=1, call=1, kind="kill",
                                                   marker=str(marker))))
    assert marker.exists()
    (restart,) = trainer.recovery.restarts
    assert (restart.method, restart.rank, restart.cause) == ("actor_rollout_load_checkpoint", 1, "worker died")
    assert (restart.failed_step, restart.restored_step, restart.steps_redone) == (2, 2, 0)
    steps = _steps(trainer.metrics_history)
    assert [(row["step"], row["trainer/restarts"]) for row in steps] == [(3, 1.0)]
    assert "actor/pg_loss" in steps[0]


def test_past_max_restarts_the_run_stops_with_every_failure(tiny_model_dir, tiny_data, tmp_path):
    extra = {"trainer.max_restarts": 1, "trainer.total_training_steps": 2, "trainer.save_freq": 1}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "doomed", **{**RAY, **extra})
    # a segfault in step 1, then a SIGKILL while the restart loads the models (a failure too)
    first = tmp_path / "first"
    faults = [Fault("compute_log_prob", rank=0, call=1, kind="segfault", marker=str(first)),
              Fault("init_model", rank=1, call=1, kind="kill", marker=str(tmp_path / "second"), after=str(first))]
    with pytest.raises(RestartLimitError) as info:
        run_ppo(cfg, _with_faults(cfg, *faults))
    message = str(info.value)
    assert "training stopped after 2 worker failures; trainer.max_restarts=1 allows 1 restart(s)" in message
    assert "  1. step 1: worker died in worker group" in message
    assert "method 'actor_rollout_compute_log_prob', rank 0\n" in message
    assert message.split("  2. ")[1].startswith("step 1: worker died") and "'actor_rollout_init_model', rank 1" in message
    group = info.value.__cause__
    assert isinstance(group, ExceptionGroup) and [type(e) for e in group.exceptions] == [WorkerDiedError] * 2


def test_a_stateless_group_restarts_alone_without_rolling_back(tiny_model_dir, tiny_data, tmp_path):
    """The reward comes from a 2-worker Ray group of stateless scorers (the policy trains in the
    driver); one scorer is killed in the second step: that group alone starts again, the call is
    repeated and the run's metrics equal those of a run without the fault."""

    def run(name: str, fault: Fault | None) -> RayPPOTrainer:
        cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / name, preset="drgrpo",
                          **{"trainer.report": False, "trainer.val_before_train": False})
        mapping, pools = build_role_worker_mapping(cfg)
        pool_manager = ResourcePoolManager({"global_pool": [1]}, pools, use_gpu=False, backend="local")
        reward_fn = ShareOfEvenTokens()
        trainer = RayPPOTrainer(cfg, tiny_tokenizer(), mapping, pool_manager, ray_worker_group_cls=LocalWorkerGroup,
                                reward_fn=reward_fn, device_name="cpu")
        worker_cls = TokenScoreWorker if fault is None else with_faults(TokenScoreWorker, [fault])
        scorer_pool = RayResourcePool([2], use_gpu=False, name_prefix=f"scorers_{name}")
        try:
            trainer.init_workers()
            reward_fn.group = trainer.add_stateless_group(
                "scorers", lambda: RayWorkerGroup(scorer_pool, ClassWithInitArgs(worker_cls), call_timeout_s=60),
                TokenScoreWorker)
            trainer.fit()
        finally:
            trainer.shutdown()
            scorer_pool.remove()
        return trainer

    faulty = run("faulty", Fault("score", rank=1, call=2, kind="kill", marker=str(tmp_path / "scorer-killed")))
    (restart,) = faulty.recovery.restarts
    assert (restart.failed_step, restart.restored_step, restart.steps_redone) == (2, None, 0)
    assert (restart.method, restart.rank, restart.cause) == ("score", 1, "worker died")
    steps = _steps(faulty.metrics_history)
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert [row["trainer/restarts"] for row in steps] == [0, 1, 1]
    clean = run("clean", None)
    assert _comparable(steps) == _comparable(_steps(clean.metrics_history))
    assert all(row["critic/score/mean"] > 0 for row in steps)


def test_scores_of_the_stateless_worker_are_the_share_of_even_tokens():
    data = DataProto.from_dict(tensors={"responses": torch.tensor([[2, 4, 5, 0], [1, 3, 6, 0]]),
                                        "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])})
    out = TokenScoreWorker().score(data)
    assert out.batch["scores"].tolist() == pytest.approx([2 / 3, 0.0])


def test_a_peer_death_is_reported_as_the_cause_of_the_other_ranks_failure():
    """Rank 0 raises first (its collective lost the peer); rank 1 dies a second later. The group
    reports the death, a recoverable failure, with rank 0's error as the context."""
    pool = RayResourcePool([2], use_gpu=False, name_prefix="peers")
    group = RayWorkerGroup(pool, ClassWithInitArgs(CollectivePeer), name_prefix="peers", call_timeout_s=60)
    try:
        with pytest.raises(WorkerDiedError) as info:
            group.fail_then_die()
        assert (info.value.method, info.value.rank) == ("fail_then_die", 1)
        assert "Connection closed by peer" in str(info.value.__cause__)
    finally:
        group.shutdown()
        pool.remove()


def test_a_raise_while_a_peer_hangs_is_a_timeout_with_the_raise_as_its_cause():
    """Rank 1 raises, rank 0 is still running at the call's deadline: the group is stuck, which a
    restart cures, so the failure is a (recoverable) timeout naming the hung rank."""
    pool = RayResourcePool([2], use_gpu=False, name_prefix="hung_peer")
    group = RayWorkerGroup(pool, ClassWithInitArgs(RaiseWhilePeerHangs), name_prefix="hung_peer", call_timeout_s=8)
    try:
        with pytest.raises(WorkerTimeoutError) as info:
            group.raise_while_peer_hangs()
        assert (info.value.method, info.value.rank) == ("raise_while_peer_hangs", 0)
        assert "rank 1 raised and rank(s) [0] gave no result within 8.0 s" in str(info.value)
        cause = info.value.__cause__
        assert isinstance(cause, WorkerError) and cause.rank == 1
        assert "gloo: the collective failed on this rank" in str(cause)
        with pytest.raises(WorkerError, match="raise_while_peer_hangs"):  # the group refuses further calls
            group.raise_while_peer_hangs()
    finally:
        group.shutdown()
        pool.remove()


def _signalled_run(cfg, signals: tuple[int, ...], call: int) -> RayPPOTrainer:
    """A Ray run whose reward function sends ``signals`` to the driver in its ``call``-th call."""
    return run_ppo(cfg, reward_fn=SignalOnCall(load_reward_manager(cfg, tiny_tokenizer(), 0), call, signals))


@pytest.mark.slow  # three Ray runs; test_graceful_stop.py checks the same through the command on one process
def test_sigterm_in_a_step_then_auto_resume_gives_the_uninterrupted_metrics(tiny_model_dir, tiny_data, tmp_path):
    extra = {**RAY, "trainer.save_freq": -1}
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "stopped", **extra)
    handler = signal.getsignal(signal.SIGTERM)  # Ray's own, in this driver
    stopped = _signalled_run(cfg, (signal.SIGTERM,), call=2)  # in the reward stage of step 2
    assert stopped.stop.requested and stopped.stop.signal_name == "SIGTERM"
    assert stopped.global_steps == 2  # the step in progress was finished
    assert stopped.checkpoints.manager.steps() == [2]
    assert not (tmp_path / "stopped" / "hf_model").exists()
    assert signal.getsignal(signal.SIGTERM) is handler  # given back
    resumed = run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "stopped", **{**extra,
                                                                                      "trainer.resume_mode": "auto"}))
    uninterrupted = run_ppo(tiny_config(tiny_model_dir, tiny_data, tmp_path / "whole", **extra))
    rows = read_metrics(tmp_path / "stopped" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 4]
    assert _comparable(rows) == _comparable(read_metrics(tmp_path / "whole" / "metrics.jsonl"))
    assert _comparable(resumed.metrics_history) == _comparable(uninterrupted.metrics_history[2:])


def test_a_second_signal_stops_at_once_and_the_checkpoints_stay_whole(tiny_model_dir, tiny_data, tmp_path):
    cfg = tiny_config(tiny_model_dir, tiny_data, tmp_path / "run", **{**RAY, "trainer.save_freq": 1})
    with pytest.raises(StopNow, match="SIGINT received twice: stopping at once"):
        _signalled_run(cfg, (signal.SIGINT, signal.SIGINT), call=3)
    manager = CheckpointManager(tmp_path / "run" / "checkpoints")
    assert manager.steps() == [1, 2] and manager.latest() == tmp_path / "run" / "checkpoints" / "global_step_2"
    assert [row["step"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
