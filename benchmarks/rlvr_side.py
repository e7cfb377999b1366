"""rlvr on the benchmark workload: the hybrid ``ActorRolloutRefWorker`` in the driver process.

One step is what ``RayPPOTrainer`` does for GRPO without a reference model: repeat the prompts
``rollout.n`` times, generate, score, GRPO advantages, old log-probs, one actor update (one
optimizer step: the mini-batch is the whole batch), and the actor -> rollout weight sync. The
worker runs through ``LocalWorkerGroup`` (the local backend: no Ray), so every call is timed
directly, stage by stage.

With ``bypass`` (``algorithm.rollout_correction.bypass_mode=true``) the step does what the trainer
does in bypass mode: the rollout's bf16 log-probs become ``old_log_probs``
(:func:`~rlvr.trainer.ppo.rollout_correction.bypass_old_log_probs`) and no old-log-prob forward
runs; the ``log_probs`` stage is then that copy. The rest of the rollout-correction section stays
at its defaults (``loss_type=ppo_clip``, no ``rollout_is`` / ``rollout_rs``): the PPO ratio
``pi_theta / pi_rollout`` and its clip then bound the rollout/actor gap; bypass needs
``rollout.calculate_log_probs=true`` (the default) and, for an MoE, no routing replay in R2.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.config.validate import check_config
from rlvr.trainer.ppo.core_algos import compute_grpo_outcome_advantage
from rlvr.trainer.ppo.rollout_correction import bypass_old_log_probs
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.engine_workers import ActorRolloutRefWorker

from benchmarks.workload import PeakMemory, Stopwatch, Workload, make_prompts, score, sync

STAGES = ("generation", "reward", "log_probs", "update", "weight_sync")


@dataclass
class RlvrStep:
    """One timed rlvr step: wall seconds, process CPU seconds, seconds per stage, peak memory and
    its rise (bytes), the worker's peak per stage (``gen``, ``old_log_prob``, ``update_actor``; GPU
    only), the largest and mean ``|rollout - old|`` log-prob gap on the response tokens, whether the
    step ran in bypass mode, and the real tokens of each sequence and of the responses (for the
    FLOP count), and how many sampled response ids the tokenizer lacks."""

    seconds: float
    cpu_seconds: float
    stages: dict[str, float]
    peak_bytes: int
    rise_bytes: int
    reused_log_probs: bool
    stage_peak_bytes: dict[str, int]
    log_prob_gap_max: float
    log_prob_gap_mean: float
    bypass: bool
    sequence_lengths: list[int]
    response_tokens: int
    beyond_tokenizer: int


def prompt_batches(tokenizer: PreTrainedTokenizerBase, work: Workload, steps: int) -> list[DataProto]:
    """``steps`` batches of ``work.prompts`` chat prompts, left-padded (the same questions TRL gets)."""
    rows = make_prompts(work.prompts * steps, seed=1234)
    batches = []
    for step in range(steps):
        chunk = rows[step * work.prompts : (step + 1) * work.prompts]
        texts = [tokenizer.apply_chat_template(r["messages"], add_generation_prompt=True, tokenize=False)
                 for r in chunk]
        enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        mask = enc["attention_mask"]
        batches.append(DataProto.from_dict(
            tensors={"input_ids": enc["input_ids"], "attention_mask": mask, "position_ids": compute_position_ids(mask)},
            non_tensors={"uid": np.array([f"{step}-{i}" for i in range(len(chunk))], dtype=object),
                         "answer": np.array([r["answer"] for r in chunk], dtype=object)},
        ))
    return batches


def run_config(work: Workload, model_dir: str, max_prompt_len: int, seed: int, lr: float, fast: bool,
               token_budget: int, overrides: list[str], bypass: bool = False):
    """The run config of the benchmark (GRPO, no reference, one optimizer step per batch), checked
    with the run's config check.

    ``fast`` turns on the GPU fast path: static KV cache with a compiled decode step, kept between
    steps. Training micro-batches are sized by ``token_budget`` (padded tokens per forward/backward).
    ``bypass`` sets ``algorithm.rollout_correction.bypass_mode=true``.
    """
    dotlist = [
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.model.dtype={work.dtype}",
        "actor_rollout_ref.model.attn_implementation=sdpa",
        f"data.train_batch_size={work.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={work.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={work.sequences}",
        f"actor_rollout_ref.actor.optim.lr={lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={token_budget}",
        f"actor_rollout_ref.rollout.n={work.samples}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.rollout.response_length={work.response_len}",
        f"actor_rollout_ref.rollout.prompt_length={max_prompt_len}",
        "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.rollout.micro_batch_size={work.sequences}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={work.sequences}",
        f"actor_rollout_ref.rollout.static_cache={str(fast).lower()}",
        f"actor_rollout_ref.rollout.compile={str(fast).lower()}",
        f"actor_rollout_ref.rollout.free_cache_engine={str(not fast).lower()}",
        f"algorithm.rollout_correction.bypass_mode={str(bypass).lower()}",
        f"trainer.seed={seed}",
    ]
    cfg = OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist(dotlist + overrides))
    check_config(cfg, require_data_files=False)
    return cfg


def _stage_peak_bytes(reply: DataProto) -> dict[str, int]:
    """``{stage: bytes}`` of the ``perf/<stage>/max_memory_allocated_gb`` a worker reply carries
    (the largest over ranks; empty on CPU)."""
    peaks = {}
    for name, value in reply.meta_info.get("metrics", {}).items():
        if name.startswith("perf/") and name.endswith("/max_memory_allocated_gb"):
            flat = [float(x) for x in (value if isinstance(value, list) else [value])]
            peaks[name.split("/")[1]] = int(max(flat) * 1024**3)
    return peaks


class RlvrSide:
    """The rlvr half of the benchmark.

    Args:
        work: the workload.
        model_dir: folder with the random-init model and tokenizer (``save_pretrained``).
        tokenizer: the same tokenizer (for prompts and decoding responses).
        device: where the worker runs (the worker picks CUDA when it sees a GPU).
        seed, lr: as for TRL.
        steps: batches to prepare.
        fast: GPU fast path (see :func:`run_config`).
        token_budget: padded tokens per training micro-batch; None puts the whole batch in one.
        overrides: extra dotted config overrides.
        bypass: bypass mode (see the module docstring) in the config and in every step; a step can
            also ask for it alone (``step(i, bypass=True)``: the bypass variant of the same config
            is checked here too, and the worker does not read the setting).
    """

    def __init__(self, work: Workload, model_dir: str, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                 seed: int, lr: float, steps: int, fast: bool, token_budget: int | None,
                 overrides: list[str], bypass: bool = False) -> None:
        self.work = work
        self.device = device
        self.tokenizer = tokenizer
        self.batches = prompt_batches(tokenizer, work, steps)
        max_prompt_len = max(int(b.batch["input_ids"].shape[1]) for b in self.batches)
        budget = token_budget or work.sequences * (max_prompt_len + work.response_len)
        self.config = run_config(work, model_dir, max_prompt_len, seed, lr, fast, budget, overrides, bypass)
        self.bypass = bool(self.config.algorithm.rollout_correction.bypass_mode)
        self._bypass_correction = run_config(work, model_dir, max_prompt_len, seed, lr, fast, budget, overrides,
                                             bypass=True).algorithm.rollout_correction
        pool = LocalResourcePool(use_gpu=device.type == "cuda")
        self.group = LocalWorkerGroup(pool, ClassWithInitArgs(ActorRolloutRefWorker, self.config, "actor_rollout"))
        self.group.init_model()

    @property
    def worker(self) -> ActorRolloutRefWorker:
        """The worker object itself (the local backend keeps it in the driver)."""
        return self.group._workers[0]

    def _rewards(self, out: DataProto, answers: np.ndarray) -> torch.Tensor:
        """``token_level_scores [B, R]``: the workload's score on the last response token."""
        responses, mask = out.batch["responses"], out.batch["response_mask"]
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        scores = torch.tensor([score(t, a) for t, a in zip(texts, answers, strict=True)])
        rewards = torch.zeros(responses.shape, dtype=torch.float32)
        last = (mask.sum(-1) - 1).clamp_min(0)
        rewards[torch.arange(len(texts)), last] = scores
        return rewards

    def step(self, index: int, bypass: bool | None = None) -> RlvrStep:
        """One GRPO step on prompt batch ``index``; ``bypass`` (None: the config's) skips the
        old-log-prob forward."""
        bypass = self.bypass if bypass is None else bypass
        watch = Stopwatch(self.device)
        prompts = self.batches[index].repeat(self.work.samples, interleave=True)
        with PeakMemory(self.device) as mem:
            start, cpu_start = time.perf_counter(), time.process_time()
            with watch("generation"):
                out = self.group.generate_sequences(prompts)
            with watch("reward"):
                scores = self._rewards(out, prompts.non_tensor_batch["answer"])
                adv, returns = compute_grpo_outcome_advantage(
                    token_level_rewards=scores, response_mask=out.batch["response_mask"],
                    index=prompts.non_tensor_batch["uid"])
                out.batch["token_level_rewards"] = scores
                out.batch["advantages"] = adv
                out.batch["returns"] = returns
            with watch("log_probs"):
                if bypass:  # the trainer's bypass mode: no actor forward
                    bypass_old_log_probs(out, self._bypass_correction)
                    old = None
                else:
                    old = self.group.compute_log_prob(out)
                    out.batch["old_log_probs"] = old.batch["old_log_probs"]
            with watch("update"):
                updated = self.group.update_actor(out)
            with watch("weight_sync"):
                self.group.update_weights()
            sync(self.device)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        # the worker's actor/reused_rollout_log_probs; in bypass mode the rollout's are the old ones
        reused = 1.0 if old is None else old.meta_info["metrics"]["actor/reused_rollout_log_probs"]
        # the worker resets the CUDA peak counter after each stage and reports the stage's peak
        replies = [reply for reply in (out, old, updated) if reply is not None]
        stage_peaks = {k: v for reply in replies for k, v in _stage_peak_bytes(reply).items()}
        peak = max([mem.peak, *stage_peaks.values()])
        mask = out.batch["response_mask"].bool()
        gap = (out.batch["old_log_probs"] - out.batch["rollout_log_probs"]).abs()[mask]
        return RlvrStep(seconds, cpu_seconds, dict(watch.seconds), peak, peak - mem.start,
                        bool(np.mean(reused) == 1.0), stage_peaks, gap.max().item(), gap.mean().item(),
                        bypass, out.batch["attention_mask"].sum(-1).tolist(), int(mask.sum()),
                        int((out.batch["responses"][mask] >= len(self.tokenizer)).sum()))
