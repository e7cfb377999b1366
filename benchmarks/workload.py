"""The GRPO workload shared by both sides of the benchmark: model, prompts, reward, memory meter.

Both rlvr and TRL get the same randomly initialised model (same config and seed), the same chat
prompts ("What is a + b?", rendered with the tokenizer's chat template), the same reward function
and the same batch shape: ``prompts x samples`` sequences of ``response_len`` tokens each (random
weights rarely emit EOS, and both sides are told to never stop early, so every response runs to
full length and the two sides do the same amount of work).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import resource
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
import torch
from transformers import LlamaConfig

_LETTERS = re.compile(r"[A-Za-z]")


@dataclass(frozen=True)
class Workload:
    """One benchmark size."""

    name: str = field(metadata={"help": "name printed in the results"})
    hidden_size: int = field(metadata={"help": "model width"})
    num_hidden_layers: int = field(metadata={"help": "decoder layers"})
    num_attention_heads: int = field(metadata={"help": "query heads"})
    num_key_value_heads: int = field(metadata={"help": "key/value heads (GQA)"})
    intermediate_size: int = field(metadata={"help": "MLP width"})
    prompts: int = field(metadata={"help": "prompts per step"})
    samples: int = field(metadata={"help": "responses sampled per prompt (GRPO group size)"})
    response_len: int = field(metadata={"help": "generated tokens per response (forced, no early stop)"})
    dtype: str = field(default="float32", metadata={"help": "compute dtype: float32 | bfloat16"})

    @property
    def sequences(self) -> int:
        """Sequences per step: prompts x samples."""
        return self.prompts * self.samples


WORKLOADS = {
    "tiny": Workload(
        name="tiny", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, prompts=8, samples=8, response_len=64,
    ),
    # Architecture of SmolLM2-135M-Instruct (random init), the GPU benchmark's workload.
    "smollm2-135m": Workload(
        name="smollm2-135m", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, intermediate_size=1536, prompts=32, samples=8, response_len=256,
        dtype="bfloat16",
    ),
}


def model_config(work: Workload, vocab_size: int, pad_token_id: int, bos_token_id: int,
                 eos_token_id: int) -> LlamaConfig:
    """The Llama config of the workload (SmolLM2 family settings: tied embeddings, rope 1e5)."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=work.hidden_size, intermediate_size=work.intermediate_size,
        num_hidden_layers=work.num_hidden_layers, num_attention_heads=work.num_attention_heads,
        num_key_value_heads=work.num_key_value_heads, max_position_embeddings=2048,
        rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, hidden_act="silu",
        pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
    )


def make_prompts(count: int, seed: int) -> list[dict]:
    """``count`` addition questions: ``{"messages": [...], "answer": "a+b"}``, reproducible by seed."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        rows.append({"messages": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)})
    return rows


def score(completion: str, answer: str) -> float:
    """Reward of one response: 1 if the answer appears in it, plus the fraction of ASCII letters.

    The second term varies between samples even for a random model, so groups with equal rewards
    are rare and both frameworks run a real backward pass on (almost) every sequence.
    """
    hit = 1.0 if answer in completion else 0.0
    return hit + len(_LETTERS.findall(completion)) / max(len(completion), 1)


def peak_rss_bytes() -> int:
    """The process's lifetime maximum resident set size (``ru_maxrss``, Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    """Peak memory of one timed region.

    On CUDA: ``torch.cuda.max_memory_allocated`` after a reset at the start of the region. On CPU:
    the resident set size sampled every ``interval_s`` by a background thread (the thread lives
    only inside the ``with`` block). ``peak`` is absolute; ``rise`` is the peak minus the value at
    the start (the region's own transient memory).
    """

    def __init__(self, device: torch.device, interval_s: float = 0.005) -> None:
        self.device = device
        self.interval_s = interval_s
        self.start = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    @property
    def rise(self) -> int:
        return self.peak - self.start

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            self.start = self._proc.memory_info().rss
            self._stop.clear()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        self.peak = self.start
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak = torch.cuda.max_memory_allocated(self.device)
            return
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=5.0)
        self.peak = max(self.peak, self._proc.memory_info().rss)


def sync(device: torch.device) -> None:
    """Wait for queued device work so that wall-clock timings are real."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Named wall-clock stages: ``with watch("generation"): ...`` adds to ``watch.seconds[name]``."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}
        self._name = ""
        self._t0 = 0.0

    def __call__(self, name: str) -> Stopwatch:
        self._name = name
        return self

    def __enter__(self) -> Stopwatch:
        sync(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        sync(self.device)
        self.seconds[self._name] = self.seconds.get(self._name, 0.0) + time.perf_counter() - self._t0


def json_main(parse_args: Callable[[list[str] | None], argparse.Namespace],
              run: Callable[[argparse.Namespace], dict], argv: list[str] | None = None) -> int:
    """A benchmark's command: parse ``argv``, run, and write the results to ``--json`` when given."""
    args = parse_args(argv)
    results = run(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
