"""The data-parallel PPO actor: log-probs of responses and the clipped policy update.

PPO: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); the loss
itself comes from the policy-loss registry (``actor.policy_loss.loss_mode``) and is aggregated with
``actor.loss_agg_mode``; the update loop around it (epochs, mini-batches, gradient accumulation, the
optimizer step) is :mod:`rlvr.workers.ppo_update`. The module may be sharded with FSDP2 over the
worker group; every rank then runs the same number of forward passes (see :mod:`rlvr.workers.batching`).

Batch keys read (``[batch, ...]``): ``input_ids``, ``attention_mask``, ``position_ids`` (``[B, P+R]``),
``responses`` (``[B, R]``), the non-tensor ``multi_modal_inputs`` when the rows have images (see
:mod:`rlvr.utils.multimodal`); for the update also ``response_mask``, ``old_log_probs``, ``advantages``,
``ref_log_prob`` (with ``use_kl_loss``) and ``rollout_is_weights`` (optional: importance weights of
an off-policy correction, which the loss multiplies into its per-token losses). ``meta_info["temperature"]`` divides the logits, as in sampling.
With ``meta_info[PROX_FROM_UPDATE_KEY]`` (decoupled PPO, one optimizer step per batch) ``old_log_probs``
is not read: the update's own forward pass, detached, is the proximal policy's, and the IS weights of
the proximal/behaviour ratio are formed per micro-batch from ``rollout_log_probs``.

On one rank (no FSDP sharding) with a bias-free LM head, log-probs come from the final hidden
states through :func:`~rlvr.workers.actor.linear_log_probs.linear_log_probs`: the LM head and the
log-softmax run a chunk of tokens at a time, so no ``[batch, response_len, vocab]`` logits are
ever held (forward or backward). An entropy bonus with a gradient (``entropy_coeff != 0``) and
sharded modules use the full logits of a micro-batch instead. On that same one-rank path, each
distinct prompt of a micro-batch (its ids and images) runs through the model once
(``actor.share_prompt_forward``, see :mod:`~rlvr.workers.actor.shared_prompt`), and count-sized
micro-batches are cut from the rows grouped by prompt.

With ``model.use_remove_padding`` every forward runs on the micro-batch packed into one row
(:mod:`~rlvr.workers.actor.packed_log_probs`; no compute on padding, token budgets count real
tokens), and with ``ulysses_sequence_parallel_size > 1`` the ranks of a sequence-parallel group share
their rows and split each packed row between them (:mod:`rlvr.workers.ulysses`). Rows with images
run unpacked.

A mixture-of-experts policy's routers are watched (and, with ``router_replay``, steered) around every
forward pass (:mod:`rlvr.workers.moe.actor_routing`): routing replay from the batch's ``routed_experts``,
the load-balancing loss in the policy loss, the expert-load metrics. Its prompts are shared as a dense
policy's are, with the routers following the forward's two segments; a micro-batch that replays routes
whose rows of one prompt carry different prompt routes runs the plain forward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from omegaconf import OmegaConf
from peft import PeftModel
from torch import nn
from transformers import PreTrainedModel

from rlvr.protocol import DataProto
from rlvr.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from rlvr.trainer.ppo.distillation import (
    TEACHER_LOG_PROBS,
    TEACHER_TOPK_IDS,
    TEACHER_TOPK_LOG_PROBS,
    TeacherScores,
    combine_with_policy_loss,
    distillation_loss,
    distillation_metric_names,
    get_distillation_loss,
)
from rlvr.trainer.ppo.rollout_correction import (
    BYPASS_RS_KEY,
    PROX_FROM_UPDATE_KEY,
    ProxFromUpdate,
    bypass_correction,
    bypass_metric_names,
    compute_policy_loss_reinforce,
)
from rlvr.utils import core_lending
from rlvr.utils.multimodal import MULTI_MODAL_INPUTS, model_inputs, multi_modal_batch
from rlvr.utils.torch_functional import DEFAULT_CHUNK_ROWS, entropy_from_logits
from rlvr.workers.actor.linear_log_probs import linear_token_stats
from rlvr.workers.actor.packed_log_probs import pack_micro_batch, packed_log_probs
from rlvr.workers.actor.shared_prompt import PromptSharing, prompt_sharing, shared_prompt_hidden
from rlvr.workers.actor.token_stats import logits_token_stats
from rlvr.workers.batching import micro_batch_indices, prompt_grouped_order, select_batch_keys
from rlvr.workers.fsdp import clip_grad_norm
from rlvr.workers.models import unwrap_hf_model
from rlvr.workers.moe.actor_routing import ActorRouting, ForwardRouting
from rlvr.workers.moe.layout import ROUTED_EXPERTS, SharedPromptLayout, TokenLayout
from rlvr.workers.moe.routers import RoutingTap, router_tap
from rlvr.workers.optimizer import max_grad_norm
from rlvr.workers.ppo_update import run_ppo_epochs, update_mini_batch
from rlvr.workers.packing import PackedBatch
from rlvr.workers.ulysses import gather_rows, own_rows, sequence_parallel_group, shared_generator

__all__ = ["DataParallelPPOActor", "response_logits", "response_hidden", "response_window"]

logger = logging.getLogger(__name__)
_FORWARD_KEYS = ("input_ids", "attention_mask", "position_ids", "responses")
_METRICS = ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "kl_loss")


def response_window(batch: dict[str, torch.Tensor]) -> tuple[int, int, int]:
    """``(start, stop, num_response)``: the columns that are not padding in every row (left padding
    of the prompts, right padding after the longest response) and the response columns among them."""
    attention_mask = batch["attention_mask"]
    prompt_len = attention_mask.shape[1] - batch["responses"].shape[1]
    used = attention_mask.any(dim=0).nonzero().flatten()
    start = min(int(used[0]), prompt_len - 1)
    stop = max(int(used[-1]) + 1, prompt_len + 1)
    return start, stop, stop - prompt_len


def response_logits(module: nn.Module, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """Logits that predict the response tokens, divided by ``temperature``.

    Columns that are padding in every row are cut off first (left padding of the prompts, right
    padding after the longest response), and the LM head runs only on the response positions
    (``logits_to_keep``), so no logits are computed for the prompt.

    Args:
        batch: ``input_ids``/``attention_mask``/``position_ids`` ``[b, P+R]`` and ``responses`` ``[b, R]``.

    Returns:
        ``[b, r, vocab]`` in the model dtype, ``r <= R``: the logits of response tokens ``0..r-1``
        (tokens after ``r`` are padding in every row).
    """
    start, stop, num_response = response_window(batch)
    inputs = _window_inputs(unwrap_hf_model(module), batch, start, stop)
    logits = module(**inputs, use_cache=False, logits_to_keep=num_response + 1).logits[:, :-1]
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def response_hidden(module: nn.Module, batch: dict[str, torch.Tensor], share_prompts: bool = False,
                    sharing: PromptSharing | None = None, on_segment: Callable[[int], None] | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states that predict the response tokens, and the LM-head weight.

    The same window as :func:`response_logits`, through the model's decoder only (no LM head).
    With ``share_prompts``, each distinct prompt of the batch runs once and its KV cache serves all
    its responses (:func:`~rlvr.workers.actor.shared_prompt.shared_prompt_hidden`, with the caller's
    ``sharing`` plan and ``on_segment`` hook when given; same values and gradients).

    Returns:
        ``(hidden [b, r, H], weight [vocab, H])``.
    """
    start, stop, num_response = response_window(batch)
    model = unwrap_hf_model(module)
    weight = model.get_output_embeddings().weight
    if share_prompts:
        window = {key: batch[key][:, start:stop] for key in ("input_ids", "attention_mask", "position_ids")}
        prompt_len = stop - start - num_response
        hidden = shared_prompt_hidden(module, **window, prompt_len=prompt_len, num_response=num_response,
                                      multi_modal=batch.get(MULTI_MODAL_INPUTS), sharing=sharing,
                                      on_segment=on_segment)
        if hidden is not None:
            return hidden, weight
    # the base model: the decoder of a text model; the decoder with the vision encoder of a VLM
    hidden = model.base_model(**_window_inputs(model, batch, start, stop), use_cache=False).last_hidden_state
    return hidden[:, -(num_response + 1) : -1], weight


def _window_inputs(model: PreTrainedModel, batch: dict, start: int, stop: int) -> dict[str, torch.Tensor]:
    """Model inputs of columns ``start:stop`` of the batch, with its images (:func:`model_inputs`)."""
    window = {key: batch[key][:, start:stop] for key in ("input_ids", "attention_mask", "position_ids")}
    return model_inputs(model, **window, multi_modal=batch.get(MULTI_MODAL_INPUTS))


def _has_plain_lm_head(module: nn.Module) -> bool:
    """A transformers (or peft) causal LM whose LM head is a bias-free ``nn.Linear``."""
    if not isinstance(module, (PreTrainedModel, PeftModel)):
        return False
    head = unwrap_hf_model(module).get_output_embeddings()
    return isinstance(head, nn.Linear) and head.bias is None


def _reinforce(old_log_prob: torch.Tensor, **kwargs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`compute_policy_loss_reinforce` called like a registered policy loss (in bypass mode
    ``old_log_prob`` is the rollout's)."""
    return compute_policy_loss_reinforce(rollout_log_prob=old_log_prob, **kwargs)


def _pad_right(values: torch.Tensor, length: int) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, length - values.shape[1]))


class DataParallelPPOActor:
    """Computes response log-probs and updates the policy.

    Args:
        config: the ``actor_rollout_ref.actor`` section.
        module: the policy model (plain or FSDP2-sharded).
        optimizer: AdamW over the module's trainable parameters; None for a frozen reference.
        mini_batch_size: sequences per optimizer step on this worker
            (``ppo_mini_batch_size x rollout.n / world_size``).
        log_prob_micro_batch_size: sequences per forward in :meth:`compute_log_prob`.
        world_size: ranks of the worker group (collectives keep them in step).
        device: where the module's (unsharded) compute runs.
        log_prob_use_dynamic_bsz: size the micro-batches of :meth:`compute_log_prob` by token budget.
        log_prob_max_token_len: that token budget (per rank).
        use_remove_padding: run every forward on packed micro-batches (the module must be on the
            packed attention, :func:`~rlvr.workers.packed_attention.use_packed_attention`).
        sp_size: Ulysses sequence-parallel ranks per group (needs ``use_remove_padding``).
        compute_dtype: mixed precision on one rank (``fsdp_config.dtype``): forward passes run
            under ``torch.autocast`` in this dtype, the parameters keep theirs (with several ranks
            FSDP2's mixed-precision policy does it: :func:`~rlvr.workers.fsdp.shard_module`).
        compile_forward: ``torch.compile`` the micro-batch forward (model and log-prob head; the
            rollout's calls of the same module stay eager); a forward that does not compile runs
            eagerly from then on, with a warning.
        distillation: the ``distillation`` section; when enabled, the update adds the distillation
            loss against the teacher's scores in the batch (:mod:`rlvr.trainer.ppo.distillation`).
        router_replay: a mixture-of-experts policy's ``router_replay.mode`` (disabled | R2 | R3, see
            :mod:`rlvr.workers.moe.actor_routing`); a frozen reference keeps ``"disabled"``. An MoE
            policy's forward runs eagerly (``compile_forward`` is then skipped, with a warning): the
            router hooks record and replay routes as Python side effects.

    ``config.use_fused_kernels`` (verl's key) selects the fused linear log-prob head on one rank
    (:func:`~rlvr.workers.actor.linear_log_probs.linear_token_stats`: no ``[b, r, vocab]`` logits);
    off, or on several ranks, the full logits of a micro-batch are used. The entropy is computed
    ``entropy_from_logits_chunk_size`` rows at a time with ``entropy_from_logits_with_chunking``.
    """

    clip_grad_norm_fn = staticmethod(clip_grad_norm)
    """``(module, max_norm) -> norm``: finishes and clips the gradients (a training backend's own)."""
    dp_group = None
    """The data-parallel process group (None: the default group, every rank holds its own data)."""

    def __init__(self, config, module: nn.Module, optimizer: torch.optim.Optimizer | None, *,
                 mini_batch_size: int, log_prob_micro_batch_size: int, world_size: int,
                 device: str | torch.device, log_prob_use_dynamic_bsz: bool = False,
                 log_prob_max_token_len: int = 16384, use_remove_padding: bool = False, sp_size: int = 1,
                 compute_dtype: torch.dtype | None = None, compile_forward: bool = False, distillation=None,
                 router_replay: str = "disabled") -> None:
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.mini_batch_size = mini_batch_size
        self.log_prob_micro_batch_size = log_prob_micro_batch_size
        self.log_prob_use_dynamic_bsz = log_prob_use_dynamic_bsz
        self.log_prob_max_token_len = log_prob_max_token_len
        self.world_size = world_size
        self.device = torch.device(device)
        self.use_remove_padding = use_remove_padding
        if sp_size > 1 and not use_remove_padding:
            raise ValueError("Ulysses sequence parallelism runs on packed sequences: it needs use_remove_padding")
        self.sp = sequence_parallel_group(sp_size, world_size)
        self.policy_loss_fn = get_policy_loss_fn(config.policy_loss.loss_mode)
        self.chunked_head = bool(config.use_fused_kernels) and world_size == 1 and _has_plain_lm_head(module)
        self.entropy_chunk = (int(config.entropy_from_logits_chunk_size) if config.entropy_from_logits_with_chunking
                              else DEFAULT_CHUNK_ROWS)
        self._compiled = torch.compile(self._forward_in_dtype, dynamic=True) if compile_forward else None
        self.share_prompts = self.chunked_head and config.share_prompt_forward and not use_remove_padding
        self.autocast_dtype = compute_dtype if world_size == 1 else None
        seed = config.data_loader_seed
        self.shuffle_generator = torch.Generator().manual_seed(int(seed)) if seed is not None else None
        # verl's loss_scale_factor reaches agg_loss through the loss's config (global_batch_info), as in verl
        self.loss_config = config if config.loss_scale_factor is None else OmegaConf.merge(
            config, {"global_batch_info": {"loss_scale_factor": float(config.loss_scale_factor)}})
        self.distill = distillation.distillation_loss if distillation is not None and distillation.enabled else None
        self.distill_topk = self.distill is not None and get_distillation_loss(self.distill.loss_mode)[1].uses_topk
        self.distill_metric_names = distillation_metric_names(self.distill) if self.distill is not None else []
        self.routing = self._moe_routing(router_replay)
        self.metric_names = [f"actor/{name}" for name in _METRICS] + self.distill_metric_names + (
            ["actor/moe_aux_loss"] if self.routing is not None else [])

    def _router_tap(self) -> RoutingTap | None:
        """The policy's router tap (None: a dense model)."""
        return router_tap(self.module)

    def _moe_routing(self, router_replay: str) -> ActorRouting | None:
        """The routing side of a mixture-of-experts policy (None for a dense one); an MoE policy runs
        eagerly (the router hooks are Python side effects that torch.compile would not replay)."""
        tap = self._router_tap()
        if tap is None:
            if router_replay != "disabled":
                raise ValueError(f"router_replay.mode={router_replay} replays the experts of a mixture-of-experts "
                                 f"model, but {type(self.module).__name__} has no router rlvr knows; set it to disabled")
            return None
        if self._compiled is not None:
            logger.warning("use_torch_compile: a mixture-of-experts actor's forward runs eagerly (its router hooks "
                           "record and replay routes); set actor_rollout_ref.actor.use_torch_compile=false to silence this")
            self._compiled = None
        coef = tap.aux_loss_coef if self.optimizer is not None else 0.0
        return ActorRouting(tap, router_replay, coef, self.sp, self.world_size, self.dp_group)

    def _start_routing(self, batch: dict[str, torch.Tensor], packed: bool, share: bool = False
                       ) -> tuple[PackedBatch | None, PromptSharing | None]:
        """Arm an MoE policy's routers for the forward pass of micro-batch ``batch``: a packed forward
        when ``packed`` (its packing is returned, for the forward to reuse), a shared-prompt forward
        when ``share`` and the micro-batch can run one (its plan is returned: prompts to share and,
        when replaying, equal prompt routes in the rows of each prompt), else the plain forward.
        ``(None, None)`` for a dense policy."""
        if self.routing is None:
            return None, None
        if packed:
            packing = pack_micro_batch(batch, self.sp)
            self.routing.start(batch, TokenLayout.packed(batch["attention_mask"], packing, self.sp))
            return packing, None
        start, stop, num_response = response_window(batch)
        prompt_stop = stop - num_response
        sharing = None
        if share:
            sharing = prompt_sharing(self.module, batch["input_ids"][:, start:stop],
                                     batch["attention_mask"][:, start:stop], prompt_stop - start,
                                     batch.get(MULTI_MODAL_INPUTS))
        if sharing is not None:
            layout = SharedPromptLayout.padded(batch["attention_mask"], start, prompt_stop, stop, sharing.first,
                                               sharing.inverse)
            if self.routing.can_share(batch, layout):
                self.routing.start(batch, layout)
                return None, sharing
        self.routing.start(batch, TokenLayout.padded(batch["attention_mask"], start, stop))
        return None, None

    def _micro_batches(self, batch: dict[str, torch.Tensor], size: int, use_dynamic_bsz: bool,
                       max_token_len: int) -> list[list[int]]:
        """Row indices of each micro-batch. Micro-batches by count take the rows grouped by prompt
        when prompts are shared, so each micro-batch holds as few distinct prompts as possible. A
        sequence-parallel group shares its token budget (``max_token_len x sp_size``)."""
        parts = micro_batch_indices(
            batch["attention_mask"].sum(-1), size, use_dynamic_bsz, max_token_len * self.sp.size, self.world_size,
            packed=self.use_remove_padding,
        )
        if not self.share_prompts or use_dynamic_bsz:
            return parts
        prompt_len = batch["input_ids"].shape[1] - batch["responses"].shape[1]
        order = prompt_grouped_order(batch["input_ids"][:, :prompt_len], batch["attention_mask"][:, :prompt_len])
        return [[order[i] for i in part] for part in parts]

    def _forward_stats(self, batch: dict[str, torch.Tensor], temperature: float, calculate_entropy: bool,
                       entropy_grad: bool, calculate_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": [b, R]}`` (float32, 0 past the last response column) and, when asked,
        ``"entropy"`` and ``"sum_pi_squared"`` ``[b, R]`` of each token's (tempered) distribution;
        under autocast in ``compute_dtype`` when set; an MoE policy's routers armed first."""
        share = self.share_prompts and not (calculate_entropy and entropy_grad)  # the hidden-state path's
        packed, sharing = self._start_routing(batch, self.use_remove_padding, share)
        args = (batch, temperature, calculate_entropy, entropy_grad, calculate_sum_pi_squared, packed, sharing)
        if self.autocast_dtype is None:
            return self._compiled_or_eager(*args)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            stats = self._compiled_or_eager(*args)
        return {name: values.float() for name, values in stats.items()}

    def _compiled_or_eager(self, *args) -> dict[str, torch.Tensor]:
        """The compiled forward while it works (``compile_forward``), else the eager one."""
        if self._compiled is not None:
            try:
                return self._compiled(*args)
            except Exception as err:  # noqa: BLE001 - any compiler failure: the eager forward is the same function
                logger.warning("torch.compile of the actor's forward failed (%s: %s); running it eagerly from now "
                               "on (actor_rollout_ref.actor.use_torch_compile=false skips the attempt)",
                               type(err).__name__, str(err).splitlines()[0] if str(err) else "")
                self._compiled = None
        return self._forward_in_dtype(*args)

    def _forward_in_dtype(self, batch: dict[str, torch.Tensor], temperature: float, calculate_entropy: bool,
                          entropy_grad: bool, calculate_sum_pi_squared: bool = False,
                          packed: PackedBatch | None = None, sharing: PromptSharing | None = None
                          ) -> dict[str, torch.Tensor]:
        """The forward of :meth:`_forward_stats` (``packed``: the micro-batch's packing, when made
        already; ``sharing``: an MoE policy's shared-prompt plan, its routers armed for it)."""
        core_lending.check_per_layer(self.module)  # the rollout's cores, while it waits
        if self.use_remove_padding:
            return packed_log_probs(self.module, batch, temperature, calculate_entropy, entropy_grad,
                                    self.chunked_head, self.sp, calculate_sum_pi_squared, self.entropy_chunk, packed)
        response_len = batch["responses"].shape[1]
        if self.chunked_head and not (calculate_entropy and entropy_grad):
            if self.routing is None:
                hidden, weight = response_hidden(self.module, batch, self.share_prompts)
            else:  # an MoE policy shares prompts only as its routers were armed
                hidden, weight = response_hidden(self.module, batch, sharing is not None, sharing,
                                                 self.routing.enter_segment)
            labels = batch["responses"][:, : hidden.shape[1]]
            stats = linear_token_stats(hidden, weight, labels, temperature, with_entropy=calculate_entropy,
                                       with_sum_pi_squared=calculate_sum_pi_squared)
        else:
            logits = response_logits(self.module, batch, temperature)
            labels = batch["responses"][:, : logits.shape[1]]
            stats = logits_token_stats(logits, labels, calculate_entropy, entropy_grad, calculate_sum_pi_squared,
                                       self.entropy_chunk)
        return {name: _pad_right(values, response_len) for name, values in stats.items()}

    def _forward(self, batch: dict[str, torch.Tensor], temperature: float, calculate_entropy: bool,
                 entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs ``[b, R]`` (float32, 0 past the last response column) and optional entropy."""
        stats = self._forward_stats(batch, temperature, calculate_entropy, entropy_grad)
        return stats["log_probs"], stats.get("entropy")

    @torch.no_grad()
    def compute_log_prob_stats(self, data: DataProto, calculate_entropy: bool = False,
                               calculate_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """Log-probability of each response token under the current policy, and its statistics.

        Args:
            data: ``input_ids``, ``attention_mask``, ``position_ids``, ``responses``;
                ``meta_info["temperature"]``; ``routed_experts`` for a policy that replays them
                (``router_replay.mode=R3``).
            calculate_entropy: also the per-token entropy of the (tempered) policy.
            calculate_sum_pi_squared: also the per-token ``sum_v pi(v)^2`` of the (tempered) policy.

        Returns:
            ``{"log_probs": [B, R]}`` plus ``"entropy"`` / ``"sum_pi_squared"`` ``[B, R]`` when
            asked, float32 on CPU; and ``"routed_experts"`` (``[B, S, layers, k]`` int16, the experts
            every token went to) when a mixture-of-experts policy records them (``router_replay.mode=R2``).
        """
        temperature = float(data.meta_info["temperature"])
        step = self.routing.log_prob_step() if self.routing is not None else ForwardRouting()
        keys = _FORWARD_KEYS + ((ROUTED_EXPERTS,) if step.replay else ())
        if self.routing is not None:
            self.routing.require_routes(step, data.batch.keys(), "compute_log_prob")
        batch = multi_modal_batch(gather_rows(select_batch_keys(data.batch, keys, "compute_log_prob"), self.sp),
                                  data.non_tensor_batch, self.module, self.world_size,
                                  "compute_log_prob", packed=self.use_remove_padding)
        rows, response_len = batch["responses"].shape
        names = ["log_probs", *(["entropy"] if calculate_entropy else []),
                 *(["sum_pi_squared"] if calculate_sum_pi_squared else [])]
        out = {name: torch.zeros(rows, response_len) for name in names}
        if step.record:
            shape = self.routing.tap.shape
            out[ROUTED_EXPERTS] = torch.full((rows, batch["input_ids"].shape[1], shape.layers, shape.top_k), -1,
                                             dtype=torch.int16)
        self.module.eval()
        self._set_routing(step)
        try:
            for idx in self._micro_batches(batch, self.log_prob_micro_batch_size, self.log_prob_use_dynamic_bsz,
                                           self.log_prob_max_token_len):
                index = torch.tensor(idx)
                micro = {key: value[index].to(self.device) for key, value in batch.items()}
                stats = self._forward_stats(micro, temperature, calculate_entropy, False, calculate_sum_pi_squared)
                for name in names:
                    out[name][index] = stats[name].cpu()
                if step.record:
                    out[ROUTED_EXPERTS][index] = self.routing.routes()
        finally:
            self._set_routing(None)
        return {name: own_rows(values, self.sp) for name, values in out.items()}

    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(log_probs [B, R], entropys [B, R] or None)`` of :meth:`compute_log_prob_stats`."""
        stats = self.compute_log_prob_stats(data, calculate_entropy)
        return stats["log_probs"], stats.get("entropy")

    def compute_log_prob_and_routes(self, data: DataProto, calculate_entropy: bool = False
                                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """:meth:`compute_log_prob`, and the experts every token went to (``routed_experts [B, S,
        layers, k]`` int16) when a mixture-of-experts policy records them (``router_replay.mode=R2``),
        else None."""
        stats = self.compute_log_prob_stats(data, calculate_entropy)
        return stats["log_probs"], stats.get("entropy"), stats.get(ROUTED_EXPERTS)

    def _set_routing(self, step: ForwardRouting | None) -> None:
        """Start an actor call's routing (``step``) or end it (None; disarms the routers)."""
        if self.routing is None:
            return
        if step is None:
            self.routing.stop()
        else:
            self.routing.step = step

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """``ppo_epochs`` passes over ``data`` in mini-batches, one optimizer step per mini-batch.

        Returns:
            metric name -> one value per mini-batch: ``actor/pg_loss``, ``actor/pg_clipfrac``,
            ``actor/ppo_kl``, ``actor/entropy``, ``actor/kl_loss`` (global means over the
            mini-batch on all ranks), ``actor/grad_norm``, ``actor/skipped_steps`` (1 when the
            gradient was not finite and the step was skipped); for an MoE policy also
            ``actor/moe_aux_loss`` and ``actor/moe_load_entropy/layer_<i>``.
        """
        if self.optimizer is None:
            raise RuntimeError("this actor has no optimizer (a frozen reference); it cannot be updated")
        temperature = float(data.meta_info["temperature"])
        keys = [*_FORWARD_KEYS, "response_mask", "old_log_probs", "advantages"]
        if self.config.use_kl_loss:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in data.batch.keys():
            keys.append("rollout_is_weights")
        if self.distill is not None:
            keys += [TEACHER_TOPK_LOG_PROBS, TEACHER_TOPK_IDS] if self.distill_topk else [TEACHER_LOG_PROBS]
        bypass_rs, prox_settings = data.meta_info.get(BYPASS_RS_KEY), data.meta_info.get(PROX_FROM_UPDATE_KEY)
        prox = ProxFromUpdate(prox_settings) if prox_settings is not None else None
        if prox is not None:
            keys.remove("old_log_probs")
            self._check_one_step(len(data))
        if bypass_rs is not None or prox is not None:
            keys.append("rollout_log_probs")
        step = self.routing.update_step() if self.routing is not None else None
        if step is not None and step.replay:
            self.routing.require_routes(step, data.batch.keys(), "update_actor")
            keys.append(ROUTED_EXPERTS)
        batch = multi_modal_batch(
            gather_rows(select_batch_keys(data.batch, keys, "update_actor"), self.sp, block=self.mini_batch_size),
            data.non_tensor_batch, self.module, self.world_size, "update_actor",
            packed=self.use_remove_padding)
        self.module.train()
        self._set_routing(step)
        try:
            metrics = run_ppo_epochs(
                batch, lambda mini: self._train_mini_batch(mini, temperature, bypass_rs, prox),
                epochs=self.config.ppo_epochs, mini_batch_size=self.mini_batch_size * self.sp.size,
                shuffle=self.config.shuffle,
                generator=self.shuffle_generator or (shared_generator(self.sp) if self.config.shuffle else None),
            )
        finally:
            self._set_routing(None)
        if prox is not None:
            metrics.update({name: [value] for name, value in prox.metrics().items()})
        return metrics

    def update_sft(self, data: DataProto) -> dict[str, float]:
        """One optimizer step on the negative log-likelihood of the tokens ``response_mask`` marks,
        averaged over all of them in the batch of every rank (token-mean): supervised fine-tuning,
        with the whole sequence after its first token as the "response". The same forward passes,
        micro-batches, packing and sequence parallelism as the policy update.

        Returns:
            ``loss`` (the batch's mean NLL over all ranks, before the step), ``grad_norm``,
            ``skipped_steps`` (1 when the gradient was not finite and the step was skipped).
        """
        if self.optimizer is None:
            raise RuntimeError("this actor has no optimizer (a frozen reference); it cannot be trained")
        keys = [*_FORWARD_KEYS, "response_mask"]
        batch = multi_modal_batch(
            gather_rows(select_batch_keys(data.batch, keys, "train_batch"), self.sp, block=len(data)),
            data.non_tensor_batch, self.module, self.world_size, "train_batch", packed=self.use_remove_padding)
        self.module.train()
        config = self.config
        micro_batches = self._micro_batches(batch, config.ppo_micro_batch_size_per_gpu, config.use_dynamic_bsz,
                                            config.ppo_max_token_len_per_gpu)
        update = update_mini_batch(
            self.module, self.optimizer, batch, micro_batches, self._nll_micro_loss, 1, loss_agg_mode="token-mean",
            grad_clip=config.grad_clip, world_size=self.world_size, device=self.device, sp_size=self.sp.size,
            clip_grad_norm_fn=self.clip_grad_norm_fn, group=self.dp_group,
        )
        return {"loss": float(update.metric_sums[0]), "grad_norm": update.grad_norm,
                "skipped_steps": 0.0 if update.stepped else 1.0}

    def _nll_micro_loss(self, micro: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean NLL of a micro-batch's marked tokens and that value as the one metric ``[1]``."""
        log_prob, _ = self._forward(micro, 1.0, False, entropy_grad=False)
        loss = agg_loss(-log_prob, micro["response_mask"], "token-mean")
        return loss, loss.detach().float().cpu()[None]

    def _check_one_step(self, rows: int) -> None:
        """The update's forward is the proximal policy's only for its first optimizer step: refuse a
        batch that takes more than one (several epochs or mini-batches)."""
        if self.config.ppo_epochs != 1 or rows > self.mini_batch_size:
            raise ValueError(
                f"update_actor: the proximal log-probs were to come from the update's forward pass, but "
                f"{rows} rows in mini-batches of {self.mini_batch_size} x {self.config.ppo_epochs} epoch(s) make more "
                "than one optimizer step; set async_training.prox_log_prob_from_update=false (the actor then "
                "recomputes them) or ppo_epochs=1 with ppo_mini_batch_size >= data.train_batch_size")

    def _micro_loss(self, micro: dict[str, torch.Tensor], temperature: float, bypass_rs: dict | None = None,
                    prox: ProxFromUpdate | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one micro-batch (aggregated over it) and its metrics ``[len(metric_names)]``; in bypass
        mode with rejection (``bypass_rs``) the tokens whose ``pi_theta / pi_rollout`` leaves the band
        leave the loss; with ``prox`` (proximal log-probs from the update) the forward pass, detached,
        is ``old_log_probs`` and ``prox`` gives the IS weights (and keeps the micro-batch for its metrics)."""
        config = self.config
        mask = micro["response_mask"]
        student_topk = None
        if self.distill_topk:
            log_prob, entropy, student_topk = self._forward_topk(micro, temperature, config.entropy_coeff != 0)
        else:
            log_prob, entropy = self._forward(micro, temperature, True, entropy_grad=config.entropy_coeff != 0)
        bypass_weights, bypass_metrics = None, {}
        if bypass_rs is not None:
            bypass_weights, mask, bypass_metrics = bypass_correction(log_prob, micro["rollout_log_probs"], mask,
                                                                     bypass_rs)
        if prox is not None:
            old_log_prob, is_weights = prox.micro_batch(log_prob, micro["rollout_log_probs"], mask)
        else:
            old_log_prob, is_weights = micro["old_log_probs"], micro.get("rollout_is_weights")
        loss_fn = self.policy_loss_fn
        if bypass_rs is not None and bypass_rs["loss_type"] == "reinforce":  # verl's bypass REINFORCE
            is_weights, loss_fn = bypass_weights, _reinforce
        pg_loss, pg_metrics = loss_fn(
            old_log_prob=old_log_prob, log_prob=log_prob, advantages=micro["advantages"],
            response_mask=mask, loss_agg_mode=config.loss_agg_mode, config=self.loss_config,
            rollout_is_weights=is_weights,
        )
        scale = config.loss_scale_factor
        entropy_loss = agg_loss(entropy, mask, config.loss_agg_mode, loss_scale_factor=scale)
        loss = pg_loss - config.entropy_coeff * entropy_loss if config.entropy_coeff != 0 else pg_loss
        kl_loss = torch.zeros(())
        if config.use_kl_loss:
            kl_loss = agg_loss(kl_penalty(log_prob, micro["ref_log_prob"], config.kl_loss_type), mask,
                               config.loss_agg_mode, loss_scale_factor=scale)
            loss = loss + config.kl_loss_coef * kl_loss
        values = [pg_metrics["pg_loss"], pg_metrics["pg_clipfrac"], pg_metrics["ppo_kl"], entropy_loss, kl_loss]
        if self.distill is not None:
            scores = TeacherScores(self.distill.loss_mode, log_prob, micro.get(TEACHER_LOG_PROBS), student_topk,
                                   micro.get(TEACHER_TOPK_LOG_PROBS))
            distill_loss, distill_metrics = distillation_loss(
                scores, self.distill, mask, config.loss_agg_mode, old_log_prob=old_log_prob,
                rollout_is_weights=is_weights, global_batch_info=config.global_batch_info)
            loss = combine_with_policy_loss(loss, distill_loss, self.distill)
            values += [distill_metrics[name] for name in self.distill_metric_names]
        if self.routing is not None:
            aux_loss = self.routing.aux_loss()
            self.routing.count_load()
            if self.routing.aux_coef != 0:
                loss = loss + self.routing.aux_coef * aux_loss
            values.append(aux_loss * self.sp.size)  # a sequence-parallel rank's part; the metric sums count rows once
        values += [torch.tensor(bypass_metrics[name]) for name in sorted(bypass_metrics)]  # bypass_metric_names' order
        return loss, torch.stack([v.detach().float().cpu() for v in values])

    def _forward_topk(self, batch: dict[str, torch.Tensor], temperature: float, entropy_grad: bool
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Log-probs ``[b, R]``, entropy ``[b, R]`` and the log-probs of the teacher's top-k tokens
        ``[b, R, K]`` (``batch["teacher_topk_ids"]``), all from the micro-batch's full logits
        (float32, 0 past the last response column)."""
        core_lending.check_per_layer(self.module)
        self._start_routing(batch, packed=False)  # the full-logits path: no shared prompts
        response_len = batch["responses"].shape[1]
        logits = response_logits(self.module, batch, temperature)
        r = logits.shape[1]
        log_softmax = logits.float().log_softmax(-1)
        log_probs = log_softmax.gather(-1, batch["responses"][:, :r, None]).squeeze(-1)
        topk = log_softmax.gather(-1, batch[TEACHER_TOPK_IDS][:, :r].long())
        if entropy_grad:
            entropy = entropy_from_logits(logits, self.entropy_chunk)
        else:
            with torch.no_grad():
                entropy = entropy_from_logits(logits.detach(), self.entropy_chunk)
        topk = torch.nn.functional.pad(topk, (0, 0, 0, response_len - r))
        return _pad_right(log_probs, response_len), _pad_right(entropy, response_len), topk

    def _train_mini_batch(self, mini: dict[str, torch.Tensor], temperature: float, bypass_rs: dict | None = None,
                          prox: ProxFromUpdate | None = None) -> dict[str, float]:
        """Gradient accumulation over micro-batches, then one clipped optimizer step."""
        config = self.config
        micro_batches = self._micro_batches(mini, config.ppo_micro_batch_size_per_gpu, config.use_dynamic_bsz,
                                            config.ppo_max_token_len_per_gpu)
        names = self.metric_names + (bypass_metric_names(bypass_rs) if bypass_rs is not None else [])
        update = update_mini_batch(
            self.module, self.optimizer, mini, micro_batches,
            lambda micro: self._micro_loss(micro, temperature, bypass_rs, prox),
            len(names), loss_agg_mode=config.loss_agg_mode, grad_clip=max_grad_norm(config),
            world_size=self.world_size, device=self.device, sp_size=self.sp.size,
            clip_grad_norm_fn=self.clip_grad_norm_fn, group=self.dp_group,
        )
        out = {name: float(v) for name, v in zip(names, update.metric_sums, strict=True)}
        out["actor/grad_norm"] = update.grad_norm
        out["actor/skipped_steps"] = 0.0 if update.stepped else 1.0
        if self.routing is not None:
            out.update(self.routing.load_metrics(self.device))
        return out
