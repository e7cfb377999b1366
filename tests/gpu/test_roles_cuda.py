"""The new roles and models on the device (issue 47, check 4), each against a direct forward:

- one PPO step of a tiny mixture-of-experts policy, with routing replay (R3: the actor replays the
  experts the rollout recorded) and without;
- the reward model's score against a plain forward of the classifier at the last valid token;
- one distillation step: the teacher's log-probs against a plain forward of the teacher, the loss
  against the k3 estimator of the teacher's and the student's log-probs;
- SFT steps: the loss against a direct cross-entropy of the model before the step, and going down
  over a few steps on one fixed batch.

Every role runs through its worker on the local backend (one rank). On CUDA the roles compute in
bfloat16 as they would in practice (the actor under mixed precision, the engines, reward model and
teacher with bf16 weights, SFT with bf16 parameters); on the CPU rehearsal
(``RLVR_GPU_TESTS_DEVICE=cpu``, see ``conftest.py``) in float32. The tolerances follow the dtype.
"""

from __future__ import annotations

import math
from itertools import pairwise

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from rlvr.protocol import DataProto
from rlvr.trainer.config import load_config
from rlvr.trainer.config.sft_check import load_sft_config
from rlvr.trainer.data.sft_dataset import MultiTurnSFTDataset, collate_sft_batch
from rlvr.trainer.sft_trainer import worker_config
from rlvr.utils.testing import (
    forward_log_probs,
    save_tiny_model,
    save_tiny_reward_model,
    tiny_tokenizer,
)
from rlvr.utils.tiny_moe import save_tiny_moe
from rlvr.workers.engine_workers import ActorRolloutRefWorker
from rlvr.workers.moe.actor_routing import ActorRouting
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.reward_model import RewardModelWorker
from rlvr.workers.sft_worker import SFTWorker
from rlvr.workers.teacher import TeacherWorker
from tests.trainer.ppo.distillation_reference import estimator
from tests.trainer.sft_helpers import write_conversations
from tests.workers.model_worker_utils import (
    local_group,
    make_config,
    prompt_batch,
    with_advantages,
)
from tests.workers.rm_batches import QUESTIONS, chat_rollout_batch, rm_expected_text

pytestmark = pytest.mark.gpu
CPU_REHEARSABLE = True  # conftest.py: runs on the CPU under RLVR_GPU_TESTS_DEVICE=cpu

R3 = ("actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
      "actor_rollout_ref.actor.fsdp_config.router_replay.mode=R3",
      "actor_rollout_ref.actor.use_rollout_log_probs=false")
TEACHER = "distillation.teacher_models.teacher_model"

TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (5e-2, 1e-2)}
"""``(atol, rtol)`` of a log-prob, score or loss computed twice from the same weights in the role's
dtype, by the worker (micro-batched, padded) and by a direct forward: fp32 differs by reduction
order only; bf16 keeps 8 significant bits (1 ulp = 0.4-0.8% of the value), and the GPU's kernels
for other shapes round differently. Measured on the CPU (fp32 and bf16): at most 1e-3."""


LOSS_TOLERANCE = {torch.float32: (1e-5, 1e-5), torch.bfloat16: (1e-2, 0.0)}
"""``(atol, rtol)`` of the k3 distillation loss (about 0.03 here) against the estimator of the
student's log-probs from ``compute_log_prob``: a log-prob error ``d`` moves each token's k3 by
``(exp(teacher - student) - 1) * d``, about a quarter of ``d`` at these differences."""


def assert_close(actual: torch.Tensor | float, expected: torch.Tensor | float, dtype: torch.dtype,
                 tolerance: dict = TOLERANCE) -> None:
    """``|actual - expected| <= atol + rtol * |expected|`` elementwise, with ``tolerance[dtype]``."""
    atol, rtol = tolerance[dtype]
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64),
                               atol=atol, rtol=rtol)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _on_device(group, device: str) -> None:
    """The worker of a one-rank local group picked ``device``."""
    assert group._workers[0].device.split(":")[0] == device, (group._workers[0].device, device)


# ---------------------------------------------------------------------------------- MoE actor step
@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    return str(save_tiny_moe(tmp_path_factory.mktemp("moe") / "qwen2_moe", "qwen2_moe", seed=0))


class ReplayLog:
    """The experts every micro-batch of the actor was given (the batch's ``routed_experts``) and
    those its forward pass used, both ``[b, S, layers, k]``, read from :class:`ActorRouting` as each
    forward pass ends (the next micro-batch's start, or the call's stop)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pairs: list[tuple[torch.Tensor | None, torch.Tensor]] = []
        self._given: torch.Tensor | None = None
        start, stop = ActorRouting.start, ActorRouting.stop

        def logged_start(routing, batch, layout):
            self._flush(routing)
            self._given = batch[ROUTED_EXPERTS].cpu() if routing.step.replay else None
            start(routing, batch, layout)

        def logged_stop(routing):
            self._flush(routing)
            stop(routing)

        monkeypatch.setattr(ActorRouting, "start", logged_start)
        monkeypatch.setattr(ActorRouting, "stop", logged_stop)

    def _flush(self, routing: ActorRouting) -> None:
        if routing.layout is not None and all(chosen is not None for chosen in routing.tap.selected):
            self.pairs.append((self._given, routing.routes()))
        self._given = None


def _precision(dtype: torch.dtype) -> tuple[str, ...]:
    """The actor under mixed precision (fp32 parameters, bf16 compute) and the engine's bf16 weights."""
    if dtype == torch.float32:
        return ()
    return ("actor_rollout_ref.actor.fsdp_config.dtype=bf16", "actor_rollout_ref.rollout.dtype=bfloat16")


@pytest.mark.parametrize("replay", [True, False], ids=["R3", "no-replay"])
def test_moe_actor_step_with_and_without_routing_replay(moe_dir, gpu_device, gpu_dtype, replay, monkeypatch):
    config = make_config(moe_dir, *(R3 if replay else ()), *_precision(gpu_dtype),
                         "actor_rollout_ref.actor.optim.lr=0.01")
    group = local_group(ActorRolloutRefWorker, config, "actor_rollout_ref")
    _on_device(group, gpu_device)
    out = group.generate_sequences(prompt_batch(n=2))
    out.meta_info["temperature"] = 1.0
    response = out.batch["response_mask"].bool()
    assert (ROUTED_EXPERTS in out.batch.keys()) == replay  # noqa: SIM118 - a TensorDict has no `in`
    log = ReplayLog(monkeypatch)
    old = group.compute_log_prob(out).batch["old_log_probs"]
    assert bool(torch.isfinite(old[response]).all())
    if replay:  # the actor's log-probs are the engine's, up to the dtype
        assert_close(old[response], out.batch["rollout_log_probs"][response], gpu_dtype)
    metrics = group.update_actor(with_advantages(out, [1.0, -1.0] * 4, old)).meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/moe_aux_loss"):
        assert all(math.isfinite(value) for value in metrics[key]), (key, metrics[key])
    assert metrics["actor/grad_norm"][0] > 0
    assert len(log.pairs) >= 2  # compute_log_prob's micro-batches and the update's
    if not replay:
        assert all(given is None for given, _ in log.pairs)
        return
    # every forward pass (compute_log_prob and the update) sent each token to the rollout's experts
    response_len = out.batch["responses"].shape[1]
    for given, used in log.pairs:
        assert given is not None
        both = (given >= 0).all(-1).all(-1) & (used >= 0).all(-1).all(-1)
        assert torch.equal(used[both], given[both].to(used.dtype))
        recorded = (given[:, -response_len:] >= 0).all(-1).all(-1)
        assert int(both[:, -response_len:].sum()) >= int(recorded.sum()) - given.shape[0] > 0, \
            "the replayed forward covered fewer response tokens than the rollout recorded"


# ---------------------------------------------------------------------------------- reward model
@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("policy") / "model", seed=0))


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory) -> str:
    return str(save_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", seed=3))


@torch.no_grad()
def test_reward_model_score_equals_a_direct_forward(policy_dir, rm_dir, gpu_device, gpu_dtype):
    config = load_config(None, [f"actor_rollout_ref.model.path={policy_dir}", "trainer.backend=local",
                                "trainer.num_threads=1", "reward.reward_model.enable=true",
                                f"reward.reward_model.model_path={rm_dir}", "reward.reward_model.micro_batch_size_per_gpu=3",
                                f"reward.reward_model.rollout.dtype={_name(gpu_dtype)}"])
    group = local_group(RewardModelWorker, config)
    _on_device(group, gpu_device)
    batch = chat_rollout_batch()
    scores = group.compute_rm_score(batch).batch["rm_scores"]
    model = AutoModelForSequenceClassification.from_pretrained(rm_dir, dtype=gpu_dtype).to(gpu_device).eval()
    tokenizer = tiny_tokenizer()
    direct = torch.tensor([float(model(input_ids=torch.tensor([tokenizer(rm_expected_text(i))["input_ids"]],
                                                              device=gpu_device)).logits[0, 0])
                           for i in range(len(QUESTIONS))])
    last = batch.batch["response_mask"].sum(-1) - 1
    picked = scores[torch.arange(len(QUESTIONS)), last]
    assert_close(picked, direct, gpu_dtype)
    assert float(scores.abs().sum() - picked.abs().sum()) == 0.0  # nothing but the last valid position
    assert float(direct.max() - direct.min()) > 0.1  # the samples' scores differ: a wrong pick shows


# ---------------------------------------------------------------------------------- distillation
@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory) -> str:
    """A bigger model than the student (48 wide, 3 layers, a vocabulary padded past the tokenizer's)."""
    return str(save_tiny_model(tmp_path_factory.mktemp("teacher") / "t", hidden_size=48, num_hidden_layers=3,
                               vocab_size=300, seed=5))


def _k3_mean(teacher: torch.Tensor, student: torch.Tensor, mask: torch.Tensor) -> float:
    """Token-mean of verl's k3 estimator (the reference's plain loop over float64 scalars)."""
    values = [estimator(s, t, "k3") for s, t, m in zip(student.flatten().tolist(), teacher.flatten().tolist(),
                                                       mask.flatten().tolist()) if m]
    return sum(values) / len(values)


def test_distillation_step_scores_with_the_teacher_and_moves_the_student_to_it(policy_dir, teacher_dir, gpu_device,
                                                                               gpu_dtype):
    config = load_config(None, [
        f"actor_rollout_ref.model.path={policy_dir}", "trainer.backend=local", "trainer.num_threads=1",
        "distillation.enabled=true", f"{TEACHER}.model_path={teacher_dir}", f"{TEACHER}.log_prob_micro_batch_size_per_gpu=3",
        f"{TEACHER}.inference.dtype={_name(gpu_dtype)}", "distillation.distillation_loss.use_task_rewards=false",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=1", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=0.01",
        *_precision(gpu_dtype)[:1]])
    teacher = local_group(TeacherWorker, config)
    _on_device(teacher, gpu_device)
    batch = chat_rollout_batch()
    mask = batch.batch["response_mask"]
    scores = teacher.compute_teacher_log_prob(batch).batch["teacher_log_probs"]
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=gpu_dtype).to(gpu_device).eval()
    with torch.no_grad():
        direct = forward_log_probs(model, {k: v.to(gpu_device) for k, v in batch.batch.items()}, 1.0).cpu()
    assert_close(scores[mask.bool()], direct[mask.bool()], gpu_dtype)
    actor = local_group(ActorRolloutRefWorker, config, "actor")
    _on_device(actor, gpu_device)
    before = actor.compute_log_prob(batch).batch["old_log_probs"]
    batch.batch.update(teacher_log_probs=scores, old_log_probs=before, advantages=torch.zeros_like(before))
    metrics = actor.update_actor(batch).meta_info["metrics"]
    loss = metrics["distillation/loss"][0]
    assert math.isfinite(loss) and math.isfinite(metrics["actor/grad_norm"][0])
    assert_close(loss, _k3_mean(scores, before, mask), gpu_dtype, LOSS_TOLERANCE)
    after = actor.compute_log_prob(batch).batch["old_log_probs"]
    assert _k3_mean(scores, after, mask) < _k3_mean(scores, before, mask)


# ---------------------------------------------------------------------------------- SFT
SFT_ROWS, SFT_STEPS = 4, 4


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("sft")
    return {"model": save_tiny_model(root / "model"), "train": write_conversations(root / "train.jsonl", SFT_ROWS, 0)}


def _direct_sft_loss(model, batch: dict[str, torch.Tensor], device: str) -> float:
    """Token-mean cross-entropy of the marked tokens (``response_mask``) from one plain forward."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"].to(device),
                       attention_mask=batch["attention_mask"].to(device)).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), batch["responses"].to(device), reduction="none")
        mask = batch["response_mask"].to(device).float()
        return float((nll * mask).sum() / mask.sum())


def test_sft_steps_start_at_the_direct_cross_entropy_and_go_down(sft_files, gpu_device, gpu_dtype):
    cfg = load_sft_config([f"model.path={sft_files['model']}", f"data.train_files={sft_files['train']}",
                           f"data.train_batch_size={SFT_ROWS}", "data.micro_batch_size_per_gpu=2",
                           "data.use_dynamic_bsz=false", "data.max_length=256", "optim.lr=0.01",
                           f"engine.model_dtype={_name(gpu_dtype)}", f"trainer.device={gpu_device}",
                           "trainer.num_threads=1"])
    group = local_group(SFTWorker, worker_config(cfg, 1, SFT_STEPS))
    _on_device(group, gpu_device)
    tokenizer = tiny_tokenizer()
    dataset = MultiTurnSFTDataset(str(sft_files["train"]), tokenizer, cfg.data)
    batch = collate_sft_batch([dataset[i] for i in range(SFT_ROWS)], tokenizer.pad_token_id)
    model = AutoModelForCausalLM.from_pretrained(sft_files["model"], dtype=gpu_dtype).to(gpu_device).eval()
    direct = _direct_sft_loss(model, batch, gpu_device)
    losses = []
    for _ in range(SFT_STEPS):
        metrics = group.train_batch(DataProto.from_single_dict(dict(batch), meta_info={"temperature": 1.0}))
        losses.append(metrics.meta_info["metrics"]["train/loss"][0])
    assert all(math.isfinite(loss) for loss in losses), losses
    assert_close(losses[0], direct, gpu_dtype)
    assert all(b < a for a, b in pairwise(losses)), losses
