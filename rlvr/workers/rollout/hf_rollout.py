"""The default rollout engine: a KV-cached decode loop over a transformers causal LM (CPU and GPU).

Each step runs the model on the last token with the KV cache, through a decoder of
:mod:`~rlvr.workers.rollout.static_decode` (a growing transformers cache by default; a
preallocated static cache with ``rollout.static_cache``, its step compiled with ``rollout.compile``:
the GPU fast path), samples the next token from a seeded ``torch.Generator`` and records its exact
log-prob: the first token with :func:`~rlvr.workers.rollout.sampling.sample_tokens` on the prefill's
logits, every later one by the decoder's ``sample_step`` (model step and sampling in one compiled
function, one CUDA graph, with ``rollout.compile``) from the uniform numbers of
:func:`~rlvr.workers.rollout.sampling.draw_uniform`, drawn eagerly. With the growing cache, a prompt
that occurs several times in a batch (``n`` times, as the trainer sends it) is prefilled once and its
cache rows indexed out to every occurrence (the same token ids with other images are another
prompt). Rows with images (``multi_modal_inputs``, see :mod:`rlvr.utils.multimodal`) pass them to the
prefill; for an M-RoPE model the tokens after the prompt go on from its 3-D positions. A row stops at an EOS id (unless ``ignore_eos``) or when
its text ends a stop string; the loop ends when all rows have stopped or after ``response_length``
tokens; on CUDA whether all rows have stopped is read back every :data:`STOP_CHECK_EVERY` steps only
(the generator is rewound over the draws of the steps run past the end, so the results and the
generator's state are those of an every-step check).
Finished rows keep running through the model (static batch) but their tokens become padding.
With ``rollout.enable_rollout_routing_replay`` (a mixture-of-experts policy) the output carries
``routed_experts [B, P+R, layers, k]``, the experts every token was sent to
(:mod:`rlvr.workers.moe.rollout_routes`), for the actor to replay.
Every sampled token carries the engine's weights version (``response_versions``). The engine is
interruptible: once ``meta_info["interrupt"]`` is set, the decode loop stops after its current step
and the rows still running (those of micro-batches not started yet too) are listed in
``meta_info["interrupted_rows"]`` (see :mod:`rlvr.workers.rollout.base`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.utils import core_lending
from rlvr.utils.multimodal import (
    MULTI_MODAL_INPUTS, image_row_keys, model_inputs, position_offsets, with_multi_modal_rows,
)
from rlvr.workers.batching import distinct_prompts
from rlvr.workers.models import unwrap_hf_model
from rlvr.workers.moe.layout import ROUTED_EXPERTS, ROUTED_EXPERTS_NUM_EXPERTS, empty_routes
from rlvr.workers.moe.rollout_routes import RouteRecorder
from rlvr.workers.moe.routers import router_tap
from rlvr.workers.rollout.base import (
    CallSettings, Weights, as_named_tensors, call_settings, register_rollout_engine, response_tensors,
)
from rlvr.workers.rollout.fp8 import rollout_fp8_weights
from rlvr.workers.rollout.sampling import draw_uniform, sample_tokens
from rlvr.workers.rollout.static_decode import DynamicCacheDecoder, StaticCacheDecoder

__all__ = ["HFRollout"]

_PROMPT_KEYS = ("input_ids", "attention_mask", "position_ids")

STOP_CHECK_EVERY = 8
"""Decode steps between two reads of "has every row stopped?" on CUDA. The read (``bool(done.all())``)
waits for the GPU to finish every queued step, so the host cannot queue the next one meanwhile: done
every step it leaves the GPU idle for a launch latency per token. Checked every 8 steps, a call runs
at most 7 steps past its last row's end (their tokens are padding, their random draws are undone),
about 3% of a 256-token response, and the host stays ahead of the GPU. On CPU a read costs nothing
while an extra step costs a full forward, so there it stays 1 (and stop strings, decoded on the host
every step, keep 1 too)."""


def stop_check_interval(device: torch.device, stop_strings: bool) -> int:
    """Decode steps between two "has every row stopped?" reads: :data:`STOP_CHECK_EVERY` on CUDA,
    1 on other devices or with stop strings (see :data:`STOP_CHECK_EVERY`)."""
    return STOP_CHECK_EVERY if device.type == "cuda" and not stop_strings else 1


@register_rollout_engine("hf")
class HFRollout:
    """Generation with a transformers model.

    Args:
        config: the ``rollout`` section (``response_length``, ``micro_batch_size``, ``stop``,
            ``ignore_eos``, sampling settings, ``val_kwargs``, ``quantization``: ``fp8`` puts the
            linear layers in e4m3, see :mod:`~rlvr.workers.rollout.fp8`;
            ``enable_rollout_routing_replay``: record the experts of an MoE policy).
        module: the policy model (a ``PreTrainedModel`` or peft model, not FSDP-sharded).
        tokenizer: for the EOS/pad ids and for decoding stop strings.
        device: where generation runs.
        seed: seed of this engine's sampling generator.
        owns_module: the engine holds its own copy of the weights (it may move it to CPU in
            :meth:`sleep`); False when it shares the actor's module.
    """

    runs_torch_module = True
    interruptible = True

    def __init__(self, config, module: nn.Module, tokenizer: PreTrainedTokenizerBase, device: str | torch.device,
                 seed: int, owns_module: bool) -> None:
        self.config = config
        self.device = torch.device(device)
        # rollout.quantization=fp8: the linear layers in e4m3, re-quantised at every update_weights
        self.fp8 = rollout_fp8_weights(config.quantization, module, self.device, owns_module)
        self.module = module if self.fp8 is None else self.fp8.module
        self.tokenizer = tokenizer
        self.owns_module = owns_module
        self.weights_version = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.routes_tap = self._routes_tap(config)
        if config.compile and not config.static_cache:
            raise ValueError("rollout.compile needs rollout.static_cache=true (the compiled step has fixed shapes)")
        if config.static_cache:
            max_cache_len = int(config.prompt_length) + int(config.response_length)
            self.decoder = StaticCacheDecoder(self.module, max_cache_len, bool(config.compile))
        else:
            self.decoder = DynamicCacheDecoder(self.module)

    def _routes_tap(self, config):
        """The router tap that records ``routed_experts`` (``enable_rollout_routing_replay``), else None.
        An MoE model gets its tap either way (it turns off transformers' own load-balancing loss,
        which fails on a decode step)."""
        tap = router_tap(self.module)
        if not config.enable_rollout_routing_replay:
            return None
        if tap is None:
            raise ValueError("rollout.enable_rollout_routing_replay records the experts of a mixture-of-experts model, "
                             f"but {type(self.module).__name__} has no router rlvr knows; set it to false")
        if config.compile:
            raise ValueError("rollout.enable_rollout_routing_replay cannot record routes inside the compiled decode "
                             "step (rollout.compile); turn one of them off")
        return tap

    # ------------------------------------------------------------------ weights and memory
    @torch.no_grad()
    def update_weights(self, weights: Weights, version: int) -> None:
        """Copy new weights into the engine's module in place, by parameter name; the engine then
        holds weights ``version``.

        Names the module does not have raise ``KeyError``; parameters not named keep their
        values (a partial update, e.g. adapters only). Tied weights may come under any of their
        names (``lm_head.weight`` and ``model.embed_tokens.weight``). A tensor that already *is* the
        parameter's storage (the engine shares the actor's module) is skipped: nothing to copy.
        """
        params = dict(self.module.named_parameters(remove_duplicate=False))
        for name, tensor in as_named_tensors(weights) if self.fp8 is None else self.fp8.load(weights):
            if name not in params:
                raise KeyError(f"update_weights: the rollout model has no parameter {name!r}")
            target = params[name]
            if target.data_ptr() != tensor.data_ptr():
                target.data.copy_(tensor.to(dtype=target.dtype))
        self.weights_version = version

    def wake_up(self) -> None:
        """Move an owned copy of the weights to the device."""
        if self.owns_module:
            self.module.to(self.device)

    def sleep(self) -> None:
        """Free the KV cache(s); on GPU also move an owned copy of the weights to CPU and release
        cached device memory."""
        self.decoder.free()
        if self.device.type != "cuda":
            return
        if self.owns_module:
            self.module.to("cpu")
        torch.cuda.empty_cache()

    def get_rng_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_rng_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per prompt row (``meta_info["n"]`` rows per prompt if given).

        See :mod:`rlvr.workers.rollout.base` for the input and output keys.
        """
        interrupt = prompts.meta_info.get("interrupt")  # a per-call key (see the module docstring)
        prompts, settings = call_settings(self.config, self.tokenizer, prompts)
        self.module.eval()
        outputs, interrupted = [], []
        size = int(self.config.micro_batch_size)
        prompt_batch = with_multi_modal_rows({key: prompts.batch[key] for key in _PROMPT_KEYS},
                                             prompts.non_tensor_batch)
        for start in range(0, len(prompts), size):
            chunk = {key: value[start : start + size] for key, value in prompt_batch.items()}
            if interrupt is not None and interrupt.is_set():  # not started: cut with no token
                out, cut = self._empty(chunk, settings), list(range(len(chunk["input_ids"])))
            else:
                out, cut = self._generate(chunk, settings, interrupt)
            outputs.append(out)
            interrupted += [start + row for row in cut]
        tensors = {key: torch.cat([out[key] for out in outputs]) for key in outputs[0]}
        out_meta = {
            "rollout_log_prob_temperature": settings.sampling.log_prob_temperature,
            "rollout_log_probs_exact": next(self.module.parameters()).dtype == torch.float32 and self.fp8 is None,
            "rollout_weights_version": self.weights_version,
        }
        if self.routes_tap is not None:
            out_meta[ROUTED_EXPERTS_NUM_EXPERTS] = self.routes_tap.shape.num_experts
        if interrupt is not None:
            out_meta["interrupted_rows"] = interrupted
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=out_meta)

    def _empty(self, prompt: dict[str, torch.Tensor], settings: CallSettings) -> dict[str, torch.Tensor]:
        """The output of a micro-batch whose rows were cut before their first token."""
        rows, width = prompt["input_ids"].shape[0], settings.response_length
        responses = torch.full((rows, width), settings.pad_id, dtype=prompt["input_ids"].dtype)
        mask = torch.zeros(rows, width, dtype=prompt["attention_mask"].dtype)
        out = response_tensors(*(prompt[k] for k in _PROMPT_KEYS), responses, mask, torch.zeros(rows, width),
                               self.weights_version)
        if self.routes_tap is not None:
            shape = self.routes_tap.shape
            out[ROUTED_EXPERTS] = empty_routes(rows, out["input_ids"].shape[1], shape.layers, shape.top_k,
                                               shape.num_experts)
        return out

    def _stopped_by_string(self, responses: torch.Tensor, step: int, active: torch.Tensor,
                           stop: list[str]) -> torch.Tensor:
        """Rows (among ``active``) whose response text now contains a stop string ``[b]`` bool.

        Only the last tokens are decoded (enough characters for the longest stop string), so a stop
        string counts once the token that completes it has been sampled.
        """
        hit = torch.zeros_like(active)
        first = max(0, step + 1 - (max(len(s) for s in stop) + 2))
        for row in active.nonzero().flatten().tolist():
            text = self.tokenizer.decode(responses[row, first : step + 1].tolist(), skip_special_tokens=False)
            hit[row] = any(s in text for s in stop)
        return hit

    def _prefill(self, prompt: dict, start: int, routes: RouteRecorder | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the prompts from column ``start`` through the decoder, each distinct prompt (token ids
        and images) once with the growing cache (their routes to ``routes``); returns ``(next-token
        logits [b, vocab], position offsets [b] of the tokens to come)``
        (:func:`~rlvr.utils.multimodal.position_offsets`)."""
        input_ids, attention_mask, position_ids = (prompt[k] for k in _PROMPT_KEYS)
        images = prompt.get(MULTI_MODAL_INPUTS)
        prefill_rows, row_of_prompt = slice(None), None
        if isinstance(self.decoder, DynamicCacheDecoder):  # a static cache has fixed rows
            key_ids, key_mask = input_ids, attention_mask
            if images is not None:  # same ids, other images: another prompt
                key_ids = torch.cat([input_ids, image_row_keys(images)[:, None]], dim=1)
                key_mask = torch.cat([attention_mask, torch.ones_like(attention_mask[:, :1])], dim=1)
            first, inverse = distinct_prompts(key_ids, key_mask)
            if first.numel() < input_ids.shape[0]:
                prefill_rows, row_of_prompt = first, inverse.to(self.device)
        inputs = model_inputs(
            unwrap_hf_model(self.module), input_ids[prefill_rows, start:].to(self.device),
            attention_mask[prefill_rows, start:].to(self.device), position_ids[prefill_rows, start:].to(self.device),
            images[prefill_rows].to(self.device) if images is not None else None)
        logits = self.decoder.prefill(**inputs)
        if routes is not None:
            routes.prefill(start, row_of_prompt)
        offsets = position_offsets(inputs)
        if row_of_prompt is not None:
            self.decoder.select_rows(row_of_prompt)
            logits, offsets = logits[row_of_prompt], offsets[row_of_prompt]
        return logits, offsets

    def _decode(self, logits: torch.Tensor, next_pos: torch.Tensor, settings: CallSettings, interrupt,
                routes: RouteRecorder | None, out: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> list[int]:
        """The sampling loop: the first token from the prefill's ``logits`` ``[b, vocab]``, then one
        :meth:`sample_step` of the decoder per token (model step and sampling, one CUDA graph when
        compiled) from position ``next_pos`` ``[b]`` on. Fills ``out = (responses, log_probs,
        response_mask)`` (each ``[b, R]``, pre-filled with padding) in place; returns the rows cut short
        by ``interrupt``.

        Whether every row has stopped is read back every :data:`STOP_CHECK_EVERY` steps on CUDA (every
        step on CPU and with stop strings); the extra steps of finished rows only write padding, and
        the generator is rewound to where an every-step check would have left it.
        """
        responses, log_probs, response_mask = out
        params, pad_id, stop = settings.sampling, settings.pad_id, settings.stop
        rows, response_len = responses.shape
        done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        eos = torch.tensor(settings.eos_ids, device=self.device)
        can_stop = not self.config.ignore_eos or bool(stop)  # else no device read-back per step
        every = stop_check_interval(self.device, bool(stop))
        rng_before: dict[int, torch.Tensor] | None = {} if every > 1 and can_stop and not params.greedy else None
        cut: list[int] = []
        tokens, token_log_probs = sample_tokens(logits, params, self.generator)
        for step in range(response_len):
            if step:
                if rng_before is not None:
                    rng_before[step] = self.generator.get_state()
                uniform = draw_uniform(rows, params, self.generator, self.device)
                tokens, token_log_probs = self.decoder.sample_step(tokens, next_pos + step - 1, params, uniform)
                if routes is not None:
                    routes.step(step - 1)
            active = ~done
            responses[:, step] = torch.where(active, tokens, pad_id)
            log_probs[:, step] = torch.where(active, token_log_probs, 0.0)
            response_mask[:, step] = active.to(response_mask.dtype)
            if not self.config.ignore_eos:
                done |= torch.isin(tokens, eos)
            if stop:
                done |= self._stopped_by_string(responses, step, active & ~done, stop)
            if step == response_len - 1 or (can_stop and step % every == every - 1 and self._all_stopped(done)):
                break
            if rng_before is not None and step % every == every - 1:
                rng_before.clear()  # the check found rows running: the end lies after this step
            if interrupt is not None and interrupt.is_set():
                cut = (~done).nonzero().flatten().tolist()
                break
            core_lending.fit_threads()  # the trainer's cores, while it waits for samples
        if rng_before and bool(done.all()):
            last = int(response_mask.sum(dim=1).max()) - 1  # the step after which every row had stopped
            if last + 1 in rng_before:
                self.generator.set_state(rng_before[last + 1])
        return cut

    @staticmethod
    def _all_stopped(done: torch.Tensor) -> bool:
        """Whether every row of ``done`` ``[b]`` has stopped: a device read-back (a host sync on GPU);
        its own method so that ``benchmarks/profile_decode.py`` can time it."""
        return bool(done.all())

    def _generate(self, prompt: dict, settings: CallSettings, interrupt) -> tuple[dict[str, torch.Tensor], list[int]]:
        """Decode one micro-batch of prompts ``[b, P]`` (and their images) for up to
        ``settings.response_length`` tokens; returns the output tensors (CPU) and the rows cut short
        because ``interrupt`` (a ``threading.Event`` or None) was set."""
        input_ids, attention_mask, position_ids = (prompt[k] for k in _PROMPT_KEYS)
        rows, response_len = input_ids.shape[0], settings.response_length
        start = int(attention_mask.any(dim=0).nonzero()[0])
        if isinstance(self.decoder, StaticCacheDecoder) and input_ids.shape[1] - start + response_len > \
                self.decoder.max_cache_len:
            raise ValueError(
                f"a prompt batch {input_ids.shape[1] - start} tokens wide plus {response_len} new tokens does not "
                f"fit the static KV cache of {self.decoder.max_cache_len} columns (rollout.prompt_length + "
                "rollout.response_length); ask for fewer tokens with meta_info['response_length']")
        core_lending.fit_threads()
        routes = None if self.routes_tap is None else RouteRecorder(self.routes_tap, rows, input_ids.shape[1],
                                                                    response_len)
        logits, offsets = self._prefill(prompt, start, routes)
        next_pos = position_ids[:, -1].to(self.device) + 1 + offsets  # M-RoPE: text after images goes on from them
        responses = torch.full((rows, response_len), settings.pad_id, dtype=input_ids.dtype, device=self.device)
        log_probs = torch.zeros(rows, response_len, device=self.device)
        response_mask = torch.zeros(rows, response_len, dtype=attention_mask.dtype, device=self.device)
        cut = self._decode(logits, next_pos, settings, interrupt, routes, (responses, log_probs, response_mask))
        self.decoder.finish()
        out = response_tensors(input_ids, attention_mask, position_ids, responses.cpu(), response_mask.cpu(),
                               log_probs.cpu(), self.weights_version)
        if routes is not None:
            out[ROUTED_EXPERTS] = routes.finish(out["attention_mask"])
        return out, cut
