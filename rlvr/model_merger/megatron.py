"""Merging a checkpoint of the Megatron workers: one ``megatron_tp<t>_pp<p>.pt`` per tensor-parallel rank
``t`` and pipeline stage ``p`` (:mod:`rlvr.workers.megatron.checkpoint`), joined into Hugging Face
tensors by the same rules that cut them (:mod:`rlvr.workers.megatron.hf_mapping`: slicing and
concatenation only, so the join is exact); a LoRA actor's adapters are merged into their weights
(``W_t + (alpha / r) B_t A``, :mod:`rlvr.workers.megatron.lora_layout`). Pure torch: megatron-core
need not be installed."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from rlvr.model_merger.base import BaseModelMerger, MergeError
from rlvr.workers.megatron.hf_mapping import LlamaShape, all_stage_rules
from rlvr.workers.megatron.lora_layout import merge_shard_adapters

__all__ = ["MegatronModelMerger"]

_SHARD = re.compile(r"^megatron_tp(\d+)_pp(\d+)\.pt$")


def _read_shard(file: Path) -> dict:
    try:
        shard = torch.load(file, map_location="cpu", weights_only=False, mmap=True)
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError... for a damaged file
        raise MergeError(f"checkpoint file {file} cannot be read ({type(err).__name__}: {err}); it is truncated "
                         "or corrupted: take another checkpoint") from None
    if not isinstance(shard, dict) or not {"layout", "model"} <= shard.keys():
        raise MergeError(f"checkpoint file {file} is not a Megatron shard of rlvr (no layout/model entries)")
    return shard


class MegatronModelMerger(BaseModelMerger):
    """Merge a checkpoint folder written by ``strategy=megatron`` workers (verl's class name)."""

    def _shards(self) -> tuple[int, int, dict[tuple[int, int], dict]]:
        """``(tp, pp, {(t, p): shard})``; every rank of the layout the shards record must be there."""
        found = {(int(m.group(1)), int(m.group(2))): p for p in self.local_dir.iterdir()
                 if (m := _SHARD.match(p.name))}
        if not found:
            held = "model.pt (an FSDP checkpoint: use --backend fsdp)" if (self.local_dir / "model.pt").is_file() \
                else "no megatron_tp<t>_pp<p>.pt file"
            raise MergeError(f"{self.local_dir} holds {held}")
        first = _read_shard(found[min(found)])
        tp, pp = first["layout"]["tensor_model_parallel_size"], first["layout"]["pipeline_model_parallel_size"]
        missing = [f"megatron_tp{t}_pp{p}.pt" for t in range(tp) for p in range(pp) if (t, p) not in found]
        if missing:
            raise MergeError(f"{self.local_dir} was written with tensor_model_parallel_size={tp}, "
                             f"pipeline_model_parallel_size={pp}, but {', '.join(missing)} is missing")
        shards = {key: first if key == min(found) else _read_shard(path) for key, path in found.items()
                  if key[0] < tp and key[1] < pp}
        return tp, pp, shards

    def load_state(self) -> dict[str, torch.Tensor]:
        """The HF state dict joined from the shards (a critic's as ``backbone.*`` and ``value_head.*``).

        Raises:
            MergeError: a shard is missing, unreadable, or lacks a parameter the model's layout needs.
        """
        tp, pp, shards = self._shards()
        value = self.config.is_value_model
        prefix = "backbone." if value else "model."
        shape = LlamaShape.from_hf_config(self.model_config, tp)
        for shard in shards.values():  # a LoRA actor's adapters merged into their weights
            if shard.get("lora_scale") is not None:
                shard["model"] = merge_shard_adapters(shard["model"], shape, tp, shard["lora_scale"])
        state: dict[str, torch.Tensor] = {}
        for stage, name, rule in all_stage_rules(shape, pp, prefix, lm_head=not value):
            ranks = range(tp) if rule.tensor_parallel else range(1)
            try:
                parts = [shards[(t, stage)]["model"][f"gpt.{name}"] for t in ranks]
            except KeyError:
                raise MergeError(f"{self.local_dir / f'megatron_tp0_pp{stage}.pt'} has no parameter gpt.{name}: the "
                                 f"shards do not match the config in {self.hf_model_config_path}") from None
            state.update(zip(rule.hf_names, rule.unshard(parts)))
        if value:
            last = shards[(0, pp - 1)]["model"]
            state.update({key: last[key] for key in ("value_head.weight", "value_head.bias") if key in last})
        return state
