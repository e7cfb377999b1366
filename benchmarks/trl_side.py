"""TRL's ``GRPOTrainer`` on the benchmark workload, timed step by step from inside its own loop.

TRL runs its real ``Trainer.train()`` loop; a callback times each optimizer step (generation with
``model.generate``, reward, forward/backward, optimizer) from ``on_step_begin`` to ``on_step_end``
and then hands control to ``between_steps`` (the benchmark runs one rlvr step there), so the two
frameworks alternate in one process.

The step's generation part (``GRPOTrainer._generate_and_score_completions``: generation, reward,
advantages) is timed too, so the rest (forward/backward of every micro-batch and the optimizer
step) is TRL's update. With ``work.trl_micro_batch`` set, TRL trains on micro-batches of that many
sequences with gradient accumulation (one optimizer step per batch; it still generates all the
batch's sequences in one ``generate`` call: ``steps_per_generation`` = the accumulation steps).
"""

from __future__ import annotations

import functools
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerBase, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from benchmarks.workload import PeakMemory, Workload, make_prompts, score, sync


@dataclass
class StepRecord:
    """One timed step: wall seconds, process CPU seconds, peak memory (bytes) and its rise over the
    step start, and the seconds of its generation part (generation, reward, advantages)."""

    seconds: float
    cpu_seconds: float
    peak_bytes: int
    rise_bytes: int
    generation_seconds: float = 0.0

    @property
    def update_seconds(self) -> float:
        """The step less its generation part: the micro-batches' forward/backward and the optimizer."""
        return self.seconds - self.generation_seconds


class _Reward:
    """TRL reward function (conversational completions) wrapping :func:`workload.score`; it also
    counts the sampled ids the tokenizer lacks (``beyond`` of ``tokens``: a model vocabulary larger
    than the tokenizer's, which TRL's ``batch_decode`` must survive)."""

    def __init__(self, tokenizer_len: int) -> None:
        self.__name__ = "workload_score"  # TRL names the reward's metrics after it
        self.tokenizer_len = tokenizer_len
        self.beyond = self.tokens = 0

    def __call__(self, prompts: list, completions: list, answer: list[str], completion_ids: list | None = None,
                 **_: object) -> list[float]:
        for ids in completion_ids or []:
            self.tokens += len(ids)
            self.beyond += sum(1 for i in ids if i >= self.tokenizer_len)
        return [score(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]


class _Timer(TrainerCallback):
    def __init__(self, device: torch.device, between_steps: Callable[[int, StepRecord], None]) -> None:
        self.device = device
        self.between_steps = between_steps
        self.records: list[StepRecord] = []
        self._meter = PeakMemory(device)
        self._t0 = self._cpu0 = 0.0
        self.generation_seconds = 0.0

    def timed(self, generate: Callable) -> Callable:
        """``generate`` (a bound method) that adds its synchronised wall time to ``generation_seconds``."""

        @functools.wraps(generate)
        def wrapper(*args, **kwargs):
            sync(self.device)
            start = time.perf_counter()
            try:
                return generate(*args, **kwargs)
            finally:
                sync(self.device)
                self.generation_seconds += time.perf_counter() - start

        return wrapper

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - transformers' signature
        self._meter.__enter__()
        sync(self.device)
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()
        self.generation_seconds = 0.0

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001 - transformers' signature
        sync(self.device)
        seconds, cpu_seconds = time.perf_counter() - self._t0, time.process_time() - self._cpu0
        self._meter.__exit__()
        self.records.append(StepRecord(seconds, cpu_seconds, self._meter.peak, self._meter.rise,
                                       self.generation_seconds))
        self.between_steps(len(self.records) - 1, self.records[-1])


class TrlSide:
    """Builds a ``GRPOTrainer`` for ``work`` and runs it for a number of optimizer steps.

    Args:
        work: the workload (model size, batch, response length).
        model_dir: folder with the random-init model (the same weights rlvr starts from).
        tokenizer: the chat tokenizer saved with it.
        device: ``cpu`` or ``cuda``.
        seed: model init and sampling seed.
        lr: AdamW learning rate.
        gradient_checkpointing: TRL's default is on; off is faster for models this small.
        static_cache: pass ``cache_implementation="static"`` to ``generate``.
    """

    def __init__(self, work: Workload, model_dir: str, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                 seed: int, lr: float, gradient_checkpointing: bool = False,
                 static_cache: bool = False) -> None:
        self.work = work
        self.device = device
        micro = work.trl_micro_batch or work.sequences
        if micro <= 0 or work.sequences % micro:
            raise ValueError(f"workload {work.name}: trl_micro_batch={micro} must divide the {work.sequences} "
                             "sequences of a step (prompts x samples); pick a divisor")
        dtype = getattr(torch, work.dtype)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation="sdpa")
        self._tmp = tempfile.TemporaryDirectory(prefix="bench_trl_")
        self.args = GRPOConfig(
            output_dir=self._tmp.name,
            per_device_train_batch_size=micro,
            num_generations=work.samples,
            gradient_accumulation_steps=work.sequences // micro,
            max_completion_length=work.response_len,
            # min_new_tokens masks EOS until the response is full: every response is work.response_len long.
            generation_kwargs={"min_new_tokens": work.response_len},
            cache_implementation="static" if static_cache else None,
            temperature=1.0,
            beta=0.0,
            learning_rate=lr,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            gradient_checkpointing=gradient_checkpointing,
            # The parameters already have the workload's dtype, as rlvr's do; bf16 autocast (TRL's
            # default) only where the workload is bf16.
            bf16=work.dtype == "bfloat16",
            use_cpu=device.type == "cpu",
            logging_steps=10_000,
            report_to="none",
            save_strategy="no",
            shuffle_dataset=False,  # the prompts in the order rlvr gets them
            seed=seed,
            data_seed=seed,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        self.tokenizer = tokenizer
        self.model = model
        self.reward = _Reward(len(tokenizer))

    def run(self, steps: int, between_steps: Callable[[int, StepRecord], None]) -> list[StepRecord]:
        """Train ``steps`` optimizer steps; ``between_steps(i, record)`` runs after TRL's step ``i``."""
        rows = make_prompts(self.work.prompts * steps, seed=1234)
        data = Dataset.from_list([{"prompt": r["messages"], "answer": r["answer"]} for r in rows])
        timer = _Timer(self.device, between_steps)
        self.args.max_steps = steps
        trainer = GRPOTrainer(
            model=self.model, reward_funcs=self.reward, args=self.args, train_dataset=data,
            processing_class=self.tokenizer, callbacks=[timer],
        )
        trainer._generate_and_score_completions = timer.timed(trainer._generate_and_score_completions)
        trainer.train()
        return timer.records
