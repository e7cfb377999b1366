"""The vLLM rollout engine (``rollout.name=vllm``): vLLM's ``LLM`` inside the hybrid worker's process.

As in verl's hybrid engine, the engine lives in the same process as the actor (colocated,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine subprocess): with ``tensor_model_parallel_size=1`` one
engine per worker (vLLM's single-process executor; with several workers it finds their process group
initialised and treats the other ranks as independent engines), with ``tp > 1`` one engine per ``tp``
consecutive workers, on vLLM's ``external_launcher`` executor: vLLM builds its tensor-parallel groups
over the workers' process group, and the worker gives every rank of the engine the same rows
(:mod:`rlvr.workers.rollout.placement`). It keeps its own copy of
the weights: it starts from the policy's config and tokenizer written to a temporary folder with
random weights (``load_format=dummy``; ``auto`` reads the weights of the policy's model folder
instead) and the worker loads the actor's weights in place right after construction and after
every actor update (:meth:`VLLMRollout.update_weights`: no disk, no restart).

Generation follows the engine protocol (:mod:`rlvr.workers.rollout.base`) exactly like the HF
engine: each distinct prompt is one vLLM request with ``n`` = its number of rows (one request per row
for greedy decoding, which vLLM runs only with ``n=1``); a row stops after
an EOS id (``stop_token_ids``; vLLM's own EOS handling is off so that both engines stop on the same
ids) or after the token that completes a stop string (kept, mask 1); responses are right-padded with
the pad id to ``R`` = ``response_length``. Log-probs are vLLM's ``processed_logprobs`` of the sampled
token: ``log_softmax(logits / temperature)`` (``logits`` for greedy decoding), as the protocol asks.
With ``top_p < 1`` or ``top_k > 0`` vLLM renormalises them over the kept tokens instead, so config
validation refuses those for training (validation calls may use them: their log-probs go unused).
They are never reported exact (other kernels; bf16), so the actor recomputes ``old_log_probs`` and
the trainer's mismatch metrics show the gap. Every sampled token carries the engine's weights
version (``response_versions``). The engine is not interruptible (``LLM.generate`` runs its requests
to the end), so it runs no partial rollouts.

Memory: on GPU the engine is built with ``enable_sleep_mode`` and :meth:`VLLMRollout.sleep` frees its
weights and KV cache between phases (vLLM's level-1 sleep); on CPU vLLM has no sleep mode, so
``sleep``/``wake_up`` do nothing there (the KV cache is a fixed ``kv_cache_memory_bytes`` block).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from types import ModuleType

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import WEIGHT_FILE_FORMATS
from rlvr.utils.errors import VLLM_MISSING, RlvrError
from rlvr.workers.batching import distinct_prompts
from rlvr.workers.rollout.base import CallSettings, Weights, call_settings, register_rollout_engine, response_tensors
from rlvr.workers.rollout.vllm_cpu_shm import release_cpu_shm_names, unique_cpu_shm_names
from rlvr.workers.rollout.vllm_options import engine_options
from rlvr.workers.rollout.vllm_weights import PolicyWeightNames, refuse_moe_reload_on_cpu

__all__ = ["VLLMRollout", "VLLMEngineFactory"]

_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")
CPU_KV_CACHE_BYTES = 1 << 30
"""Default KV-cache size on CPU (vLLM would otherwise reserve most of the RAM)."""
CPU_BLOCK_SIZE = 32
"""Default KV-cache block on CPU: prefix caching reuses whole blocks, and vLLM's CPU default of 128
tokens is longer than typical prompts (CPU attention wants multiples of 32)."""


def _import_vllm() -> ModuleType:
    """The ``vllm`` package, imported on first use (rlvr runs without it).

    Raises:
        RlvrError: vLLM is not installed in this Python (the message names the install command).
    """
    try:
        import vllm
    except ModuleNotFoundError as err:
        if err.name != "vllm":  # vLLM is there but one of its own imports fails: that error says more
            raise
        raise RlvrError(VLLM_MISSING) from err
    return vllm


class VLLMRollout:
    """Generation with vLLM, in-process, colocated with the actor.

    Args:
        config: the ``rollout`` section (sampling settings, ``response_length``, ``stop``,
            ``ignore_eos``, ``val_kwargs`` and the vLLM keys: ``dtype``, ``gpu_memory_utilization``,
            ``enforce_eager``, ``enable_prefix_caching``, ``enable_sleep_mode``,
            ``max_num_batched_tokens``, ``max_num_seqs``, ``load_format``, ``kv_cache_memory_bytes``,
            ``block_size``, ``quantization``: vLLM's own ``quantization`` key).
        module: the policy model (plain, peft or FSDP-sharded: the engine reads its config, parameter
            names and LoRA scale; the weights come through :meth:`update_weights`).
        tokenizer: the policy's tokenizer.
        device: ``cpu`` or a CUDA device (vLLM's build decides where it runs).
        seed: seed of the per-request sampling seeds.
        owns_module: unused (the engine always keeps its own copy of the weights).
    """

    runs_torch_module = False
    interruptible = False  # LLM.generate runs its requests to the end; a server engine aborts them instead

    def __init__(self, config, module: nn.Module, tokenizer: PreTrainedTokenizerBase, device: str | torch.device,
                 seed: int, owns_module: bool) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.on_gpu = torch.device(device).type == "cuda"
        if not self.on_gpu:
            refuse_moe_reload_on_cpu(module)
        self.sleep_mode = bool(config.enable_sleep_mode) and self.on_gpu
        self.asleep = False
        self.weights_version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self.names = PolicyWeightNames(module)
        self._model_dir = tempfile.TemporaryDirectory(prefix="rlvr-vllm-")
        self.llm = self._start(module, seed)

    def _start(self, module: nn.Module, seed: int):
        """Start the engine from the policy's config and tokenizer, written to a temporary folder
        (``load_format`` auto / safetensors / pt: from the policy's model folder, weights included)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process, no subprocess
        LLM = _import_vllm().LLM

        folder = Path(self._model_dir.name)
        self.names.hf_config.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        model = self.names.hf_config.name_or_path if self.config.load_format in WEIGHT_FILE_FORMATS else str(folder)
        dtype = self.config.dtype or str(next(module.parameters()).dtype).removeprefix("torch.")
        cfg = self.config
        options = {
            "dtype": dtype, "seed": seed, "enforce_eager": bool(cfg.enforce_eager),
            "enable_prefix_caching": bool(cfg.enable_prefix_caching), "max_num_seqs": int(cfg.max_num_seqs),
            "tensor_parallel_size": int(cfg.tensor_model_parallel_size), "load_format": cfg.load_format,
            "gpu_memory_utilization": float(cfg.gpu_memory_utilization), "enable_sleep_mode": self.sleep_mode,
            "logprobs_mode": "processed_logprobs",
        }
        if cfg.quantization is not None:  # vLLM quantises the weights it loads (its own key and values)
            options["quantization"] = cfg.quantization
        if cfg.max_num_batched_tokens is not None:
            options["max_num_batched_tokens"] = int(cfg.max_num_batched_tokens)
        if cfg.kv_cache_memory_bytes is not None or not self.on_gpu:
            options["kv_cache_memory_bytes"] = int(cfg.kv_cache_memory_bytes or CPU_KV_CACHE_BYTES)
        if cfg.block_size is not None or not self.on_gpu:
            options["block_size"] = int(cfg.block_size or CPU_BLOCK_SIZE)
        options.update(engine_options(cfg))  # verl's keys (max_model_len, chunked prefill, ...) and engine_kwargs.vllm
        if int(cfg.tensor_model_parallel_size) == 1:
            return LLM(model=model, tokenizer=str(folder), **options)
        options["distributed_executor_backend"] = "external_launcher"  # the engine's ranks: the workers' (placement)
        unique_cpu_shm_names()
        llm = LLM(model=model, tokenizer=str(folder), **options)
        release_cpu_shm_names()
        return llm

    # ------------------------------------------------------------------ weights and memory
    @torch.no_grad()
    def update_weights(self, weights: Weights, version: int) -> None:
        """Load the actor's weights in place, given in the actor's own parameter names (LoRA adapters
        are merged into the base weights, tied weights sent under every name vLLM expects), and drop
        the prefix cache, whose prompt KV was computed with the old weights; the engine then holds
        weights ``version``. vLLM repacks the checkpoint-format tensors into its kernels' layout."""
        self.wake_up()
        self.llm.collective_rpc("reload_weights", kwargs={
            "weights_iterator": self.names.policy_weights(weights), "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()
        self.weights_version = version

    def wake_up(self) -> None:
        """GPU with sleep mode: bring weights and KV cache back; otherwise nothing to do."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        """GPU with sleep mode: free weights and KV cache (vLLM level-1 sleep) for the training
        phase. On CPU vLLM has no sleep mode: nothing is freed (a documented no-op)."""
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def get_rng_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_rng_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------ generation
    def _sampling_params(self, call: CallSettings, count: int):
        """vLLM's sampling parameters for ``count`` samples of one prompt, with a seed drawn from the
        engine's generator."""
        SamplingParams = _import_vllm().SamplingParams
        params = call.sampling
        seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
        return SamplingParams(
            n=count, temperature=0.0 if params.greedy else params.temperature, top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0, seed=seed, max_tokens=call.response_length, logprobs=0,
            stop=call.stop or None, include_stop_str_in_output=True, skip_special_tokens=False, ignore_eos=True,
            stop_token_ids=None if self.config.ignore_eos else call.eos_ids, detokenize=bool(call.stop),
        )

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per prompt row (``meta_info["n"]`` rows per prompt if given).

        See :mod:`rlvr.workers.rollout.base` for the input and output keys.
        """
        prompts, call = call_settings(self.config, self.tokenizer, prompts)
        params = call.sampling
        input_ids, attention_mask, position_ids = (prompts.batch[key] for key in _PROMPT_KEYS)
        if params.greedy:  # vLLM decodes greedily only with n=1: one request per row (prefix caching shares prompts)
            first = inverse = torch.arange(input_ids.shape[0])
        else:
            first, inverse = distinct_prompts(input_ids, attention_mask)
        requests, sampling = [], []
        for j, row in enumerate(first.tolist()):
            requests.append({"prompt_token_ids": input_ids[row][attention_mask[row].bool()].tolist()})
            sampling.append(self._sampling_params(call, int((inverse == j).sum())))
        self.wake_up()
        outputs = self.llm.generate(requests, sampling, use_tqdm=False)
        responses, response_mask, log_probs = self._pack(outputs, inverse, call.response_length, call.pad_id)
        tensors = response_tensors(input_ids, attention_mask, position_ids, responses, response_mask, log_probs,
                                   self.weights_version)
        out_meta = {"rollout_log_prob_temperature": params.log_prob_temperature, "rollout_log_probs_exact": False,
                    "rollout_weights_version": self.weights_version}
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=out_meta)

    @staticmethod
    def _pack(outputs, inverse: torch.Tensor, response_len: int, pad_id: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded ``responses``, ``response_mask`` and ``log_probs`` ``[b, R]``: the completions of
        distinct prompt ``j`` go, in order, to the rows whose ``inverse`` is ``j``."""
        rows = inverse.numel()
        responses = torch.full((rows, response_len), pad_id, dtype=torch.long)
        response_mask = torch.zeros(rows, response_len, dtype=torch.long)
        log_probs = torch.zeros(rows, response_len)
        for j, output in enumerate(outputs):
            for row, completion in zip((inverse == j).nonzero().flatten().tolist(), output.outputs, strict=True):
                tokens = list(completion.token_ids)[:response_len]
                length = len(tokens)
                responses[row, :length] = torch.tensor(tokens, dtype=torch.long)
                response_mask[row, :length] = 1
                log_probs[row, :length] = torch.tensor(
                    [step[token].logprob for step, token in zip(completion.logprobs, tokens)])
        return responses, response_mask, log_probs


@register_rollout_engine("vllm")
class VLLMEngineFactory:
    """The ``vllm`` engine: :class:`VLLMRollout` in the worker's process (``rollout.mode=sync``) or
    vLLM OpenAI servers (``rollout.mode=async``,
    :class:`~rlvr.workers.rollout.server.engine.ServerRollout`). Both keep their own weights."""

    runs_torch_module = False

    def __new__(cls, config, module: nn.Module, tokenizer: PreTrainedTokenizerBase, device: str | torch.device,
                seed: int, owns_module: bool):
        if config.mode == "async":
            from rlvr.workers.rollout.server import ServerRollout  # vllm's server runs in its own processes

            return ServerRollout(config, module, tokenizer, device, seed, owns_module)
        return VLLMRollout(config, module, tokenizer, device, seed, owns_module)
