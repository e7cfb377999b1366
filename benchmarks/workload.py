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
from transformers import LlamaConfig, PretrainedConfig, Qwen2Config

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
    architecture: str = field(default="llama", metadata={"help": "model family of model_config: llama | qwen2"})
    vocab_size: int | None = field(default=None, metadata={
        "help": "model vocabulary (None: the tokenizer's length; larger: ids the tokenizer lacks, as in Qwen)"})
    rlvr_token_budget: int | None = field(default=None, metadata={
        "help": "rlvr's padded tokens per training micro-batch on GPU (None: 40960)"})
    trl_micro_batch: int | None = field(default=None, metadata={
        "help": "TRL per_device_train_batch_size (None: all sequences in one; else gradient accumulation)"})

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
    # A Qwen2-architecture micro model whose vocabulary (Qwen's 151936) exceeds the tokenizer's: the
    # CPU rehearsal of qwen2.5-1.5b (biases, GQA, sampled ids the tokenizer cannot decode).
    "tiny-qwen2": Workload(
        name="tiny-qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=256, prompts=8, samples=8, response_len=64, architecture="qwen2", vocab_size=151936,
    ),
    # Qwen2.5-1.5B's shape (random init), the realistic size of issue 47; memory in QWEN_1P5B_MEMORY.
    "qwen2.5-1.5b": Workload(
        name="qwen2.5-1.5b", hidden_size=1536, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, intermediate_size=8960, prompts=32, samples=8, response_len=256,
        dtype="bfloat16", architecture="qwen2", vocab_size=151936, rlvr_token_budget=64 * 304,
        trl_micro_batch=64,
    ),
}

QWEN_1P5B_MEMORY = """Memory of the qwen2.5-1.5b workload on one H200 (141 GB), per side, bf16 throughout.

N = 1,543,714,304 parameters (embedding 151936 x 1536 = 233.4M, tied with the LM head; 28 layers of
46.80M: q/k/v with bias 3.15M, o 2.36M, MLP 3 x 1536 x 8960 = 41.29M, two norms).
- Weights 2N = 3.1 GB, gradients 2N = 3.1 GB, AdamW m and v 4N = 6.2 GB: both sides keep the
  parameters in bf16 (rlvr: model.dtype=bfloat16 without fsdp_config.dtype; TRL: loaded in bf16),
  so torch's AdamW keeps its states in bf16 too: 12.3 GB. (fp32 states would add 6.2 GB, fp32
  master weights another 6.2 GB: still under 25 GB.)
- rlvr's static KV cache for 256 rows x ~300 tokens, kept between steps: 28 layers x 2 x 2 KV
  heads x 128 x 2 B = 28.7 KB per token, 2.2 GB.
- Activations without checkpointing, per token and layer (bf16, sdpa): 108 KB, measured on CPU with
  saved-tensor hooks on two layers of this shape (the norms' fp32 upcasts included); x 28 layers =
  3.0 MB per token at most. The same measure gives 26 KB for the 135M shape, whose GPU run peaked
  at 34.2 GiB for 75,776 tokens, about 0.6 of it: so 1.9-3.0 MB per token here.
- Logits: the whole batch (256 x 256 response tokens x 151936) would be 19.9 GB in bf16 and 39.8 GB
  in fp32, each copy (log-softmax, its gradient) as much again: hence micro-batches.
  rlvr never forms them: its fused head runs about 1 GiB of fp32 logits at a time, forward and
  backward. TRL forms them per micro-batch: 64 x 256 x 151936 x 2 B = 5.0 GB, with its gradient
  and the log-softmax (its Triton kernel on GPU, else row by row) at most about 3 such copies, 15 GB.
- Micro-batches, the same on both sides: 64 sequences (64 x 296 = 18,944 tokens: prompts are at
  most 40 tokens), 4 per optimizer step. rlvr: rlvr_token_budget = 64 x 304 padded tokens (rows x
  longest row); TRL: per_device_train_batch_size = 64 with gradient_accumulation_steps = 4 (it still
  generates all 256 sequences in one call). Activations 18,944 x 1.9-3.0 MB = 36-57 GB.
- Peak: rlvr 12.3 + 2.2 + 36-57 + 2 (head chunk) = 53-74 GB; TRL 12.3 + 36-57 + 15 = 63-84 GB. In
  the benchmark's one process each side's peak also holds the other side's weights and AdamW
  states (9-12 GB): at most about 96 GB of 141. The whole batch in one micro-batch would need
  144-227 GB of activations.
Neither side uses gradient checkpointing.
"""


def model_config(work: Workload, vocab_size: int, pad_token_id: int, bos_token_id: int,
                 eos_token_id: int) -> PretrainedConfig:
    """The model config of the workload: ``work.architecture`` picks the family.

    ``llama``: SmolLM2 family settings (tied embeddings, rope 1e5). ``qwen2``: Qwen2.5 settings
    (q/k/v biases, rope 1e6, RMS eps 1e-6, tied embeddings, no sliding window). ``vocab_size`` is
    the tokenizer's length; ``work.vocab_size``, when set, replaces it (Qwen's embedding has more
    rows than its tokenizer has tokens).
    """
    if work.architecture == "qwen2":
        return Qwen2Config(
            vocab_size=work.vocab_size or vocab_size, hidden_size=work.hidden_size,
            intermediate_size=work.intermediate_size, num_hidden_layers=work.num_hidden_layers,
            num_attention_heads=work.num_attention_heads, num_key_value_heads=work.num_key_value_heads,
            max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
            hidden_act="silu", use_sliding_window=False,
            pad_token_id=pad_token_id, bos_token_id=bos_token_id, eos_token_id=eos_token_id,
        )
    if work.architecture != "llama":
        raise ValueError(f"workload {work.name}: architecture must be llama or qwen2, got {work.architecture!r}")
    return LlamaConfig(
        vocab_size=work.vocab_size or vocab_size, hidden_size=work.hidden_size, intermediate_size=work.intermediate_size,
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
