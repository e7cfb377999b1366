"""LoRA adapters on a Megatron stage (verl's ``actor_rollout_ref.model.lora`` with ``strategy=megatron``).

:func:`apply_lora` freezes the stage's weights and gives every targeted ``ColumnParallelLinear`` /
``RowParallelLinear`` of its decoder layers a :class:`LoraAdapter` (a submodule ``adapter`` of the
layer, called by a forward hook, so the weights keep their names and HF mapping). With ``x`` the
layer's input and ``s = alpha / r`` (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language
Models"; layout and tensors: :mod:`~rlvr.workers.megatron.lora_layout`):

- column parallel (``linear_qkv``, ``linear_fc1``; weight shard ``W_t [out/tp, in]``):
  ``h = A x`` (``A [r, in]`` replicated), then megatron's ``copy_to_tensor_model_parallel_region``
  (identity forward, all-reduce of the gradient backward: ``A``'s gradient and the input's are full
  and equal on every rank), ``y_t += s * B_t h`` (``B_t [out/tp, r]`` cut like ``W_t``);
- row parallel (``linear_proj``, ``linear_fc2``; ``W_t [out, in/tp]``, input ``x_t`` split):
  ``h = reduce_from_tensor_model_parallel_region(A_t x_t)`` (all-reduce forward), ``y += s * B h``
  added to the layer's reduced output (``B [out, r]`` replicated).

Dropout (``dropout_position`` pre: on ``x``, post: on the adapter's output, before the scale) draws
its mask over the full tensor from the default generator, which the model's ranks share
(:func:`~rlvr.workers.megatron.parallel.broadcast_rng_state`), and a rank keeps its slice of a split
tensor: every tensor-parallel layout drops the same elements.

:func:`merged_shard` gives ``W_t + s * B_t A`` / ``W_t + s * B A_t`` for the weight sync and the HF
export; :func:`adapters_disabled` runs the base model (the reference of a LoRA run).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core.tensor_parallel.mappings import (copy_to_tensor_model_parallel_region,
                                                    reduce_from_tensor_model_parallel_region)
from torch import nn

from rlvr.workers.megatron.hf_mapping import Rule, _split, stage_layers
from rlvr.workers.megatron.lora_layout import full_adapter, fuse, shard_delta, shard_part, unshard_part
from rlvr.workers.megatron.lora_spec import LoraSpec, Site, layer_sites

__all__ = ["LoraAdapter", "apply_lora", "adapters_disabled", "merged_shard", "lora_rules", "full_adapters"]


def _dropped(x: torch.Tensor, p: float, tp: int, local: Callable[[torch.Tensor], torch.Tensor] | None
             ) -> torch.Tensor:
    """Inverted dropout of ``x`` with a mask drawn from the default generator over the full tensor
    (``x``'s last dim times ``tp``) and cut to this rank's features by ``local`` (None: ``x`` is whole)."""
    full = (*x.shape[:-1], x.shape[-1] * (tp if local is not None else 1))
    keep = torch.rand(full, device=x.device) >= p
    if local is not None:
        keep = local(keep)
    return x * keep.to(x.dtype) / (1.0 - p)


class LoraAdapter(nn.Module):
    """The adapter of one megatron linear layer: parameters ``A_<part>``, ``B_<part>`` (this rank's).

    Args:
        site: the layer and its adapted parts.
        adapters: part -> this rank's ``(A, B)`` (float32; cast to ``dtype``).
        spec: the run's LoRA settings. shape: the model's shape. tp, tp_rank: the tensor-parallel layout.
    """

    def __init__(self, site: Site, adapters: dict[str, tuple[torch.Tensor, torch.Tensor]], spec: LoraSpec,
                 shape, tp: int, tp_rank: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.site, self.spec, self.shape, self.tp, self.tp_rank = site, spec, shape, tp, tp_rank
        self.enabled = True
        for part, (a, b) in adapters.items():
            setattr(self, f"A_{part}", nn.Parameter(a.to(dtype)))
            setattr(self, f"B_{part}", nn.Parameter(b.to(dtype)))

    def pair(self, part: str) -> tuple[torch.Tensor, torch.Tensor]:
        """``(A, B)`` of ``part``."""
        return getattr(self, f"A_{part}"), getattr(self, f"B_{part}")

    def _dropout(self, x: torch.Tensor, split: bool, part: str = "fused") -> torch.Tensor:
        """Dropout of ``x``; ``split``: ``x``'s last dim is this rank's slice (a row layer's input, a
        column layer's output ``part``: a fused fc1 output holds this rank's gate rows, then its up rows)."""
        if not self.training or self.spec.dropout == 0.0:
            return x
        if not split or self.tp == 1:
            return _dropped(x, self.spec.dropout, self.tp, None)
        tp, rank = self.tp, self.tp_rank
        if self.site.module == "linear_fc1" and part == "fused":
            def local(keep):
                return torch.cat([_split(half, tp, -1)[rank] for half in _split(keep, 2, -1)], dim=-1)
        else:
            def local(keep):
                return _split(keep, tp, keep.dim() - 1)[rank]
        return _dropped(x, self.spec.dropout, tp, local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The adapter's output ``s * B A x`` for the layer's input ``x [s, b, in(/tp)]``: ``[s, b, out/tp]``
        for a column layer, ``[s, b, out]`` for a row layer."""
        pre = self.spec.dropout_position == "pre"
        if not self.site.column:  # row parallel: x is this rank's slice of the input features
            a, b = self.pair("fused")
            x = self._dropout(x, split=True) if pre else x
            h = reduce_from_tensor_model_parallel_region(F.linear(x, a.to(x.dtype)))
            y = F.linear(h, b.to(h.dtype))
            return self.spec.scale * (y if pre else self._dropout(y, split=False))
        x = self._dropout(x, split=False) if pre else x
        outs = {}
        for part in self.site.parts:
            a, b = self.pair(part)
            h = copy_to_tensor_model_parallel_region(F.linear(x, a.to(x.dtype)))
            y = F.linear(h, b.to(h.dtype))
            outs[part] = y if pre else self._dropout(y, split=True, part=part)
        return self.spec.scale * fuse(self.shape, self.tp, self.site.module, outs)

    def delta(self) -> torch.Tensor:
        """``s * B A`` shaped like this rank's weight shard (float32)."""
        adapters = {part: tuple(t.detach() for t in self.pair(part)) for part in self.site.parts}
        return shard_delta(self.shape, self.tp, self.site.module, adapters, self.spec.scale)


def _add_adapter(layer: nn.Module, inputs: tuple, output):
    """Forward hook of an adapted layer: ``(out + adapter(x), bias)`` (megatron's linear layers return a pair)."""
    adapter: LoraAdapter = layer.adapter
    if not adapter.enabled:
        return output
    out, bias = output
    return out + adapter(inputs[0]).to(out.dtype), bias


def apply_lora(model: nn.Module, spec: LoraSpec) -> dict[str, LoraAdapter]:
    """Freeze ``model`` (a :class:`~rlvr.workers.megatron.model.MegatronStage`) and add the adapters of
    ``spec`` to its decoder layers; returns and records ``model.lora_adapters`` (weight name -> adapter).

    Raises:
        ValueError: bad settings, a mixture-of-experts model, sequence parallelism, or no layer matched.
    """
    problems = spec.problems()
    if model.shape.num_experts:
        problems.append("LoRA on a mixture-of-experts model (adapters on the experts are not in rlvr)")
    if model.gpt.config.sequence_parallel:
        problems.append("LoRA with sequence_parallel (rlvr's adapters run on whole sequences)")
    if problems:
        raise ValueError("strategy=megatron LoRA: " + "; ".join(problems))
    p = model.parallel
    model.requires_grad_(False)
    dtype = getattr(torch, spec.dtype) if spec.dtype else model.gpt.config.params_dtype
    adapters: dict[str, LoraAdapter] = {}
    first = stage_layers(model.shape.num_layers, p.pp, p.pp_rank).start
    cfg = model.gpt.config
    for local in range(len(model.gpt.decoder.layers)):
        for site in layer_sites(spec, first + local, local):
            full = {part: full_adapter(spec, model.shape, cfg.hidden_size, cfg.ffn_hidden_size, first + local,
                                       site.module, part) for part in site.parts}
            mine = {part: shard_part(model.shape, site.module, part, a, b, p.tp, p.tp_rank)
                    for part, (a, b) in full.items()}
            layer = model.gpt.get_submodule(site.path)
            layer.adapter = LoraAdapter(site, mine, spec, model.shape, p.tp, p.tp_rank, dtype).to(layer.weight.device)
            layer.register_forward_hook(_add_adapter)
            adapters[f"gpt.{site.path}.weight"] = layer.adapter
    if not adapters and model.gpt.decoder.layers:
        raise ValueError(f"strategy=megatron LoRA: no layer matches target_modules={list(spec.targets)} "
                         f"exclude_modules={list(spec.excludes)}")
    model.lora_adapters = adapters
    return adapters


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """Run ``model`` without its adapters (the base model) inside the block."""
    adapters = getattr(model, "lora_adapters", {}).values()
    for adapter in adapters:
        adapter.enabled = False
    try:
        yield
    finally:
        for adapter in adapters:
            adapter.enabled = True


def merged_shard(model: nn.Module, name: str, weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (this rank's shard of parameter ``name``) with its adapter merged in (``W_t + s B_t A``
    or ``W_t + s B A_t``, in float32, cast back); unchanged without adapter."""
    adapter = getattr(model, "lora_adapters", {}).get(name)
    if adapter is None:
        return weight
    return (weight.float() + adapter.delta().to(weight.device)).to(weight.dtype)


def lora_rules(model: nn.Module) -> dict[str, Rule]:
    """For the gradient finishing: a :class:`Rule` per adapter parameter, ``rows`` for the split ones
    (a column layer's ``B``, a row layer's ``A``), ``replicated`` for the others."""
    rules = {}
    for weight, adapter in getattr(model, "lora_adapters", {}).items():
        prefix = weight.removesuffix("weight") + "adapter."
        for part in adapter.site.parts:
            split = "B" if adapter.site.column else "A"
            for which in ("A", "B"):
                kind = "rows" if which == split and adapter.tp > 1 else "replicated"
                rules[f"{prefix}{which}_{part}"] = Rule(kind, (), model.shape)
    return rules


def full_adapters(model: nn.Module, group, grads: bool = False) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{"<weight name>:<part>": (A, B)}``: the stage's full adapters (``grads``: their gradients),
    gathered over the tensor-parallel ``group`` (collective over it; None: one rank)."""
    out = {}
    for weight, adapter in getattr(model, "lora_adapters", {}).items():
        for part in adapter.site.parts:
            shards = []
            for param in adapter.pair(part):
                t = (param.grad if grads else param).detach().clone()  # a copy, not a view of the parameter
                if group is None:
                    shards.append([t])
                    continue
                parts = [torch.empty_like(t) for _ in range(adapter.tp)]
                dist.all_gather(parts, t, group=group)
                shards.append(parts)
            out[f"{weight}:{part}"] = unshard_part(model.shape, adapter.site.module, part, shards[0], shards[1])
    return out
