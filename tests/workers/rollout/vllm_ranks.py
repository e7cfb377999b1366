"""What each gloo rank runs in the vLLM placement tests (a module of its own, so that spawned processes
can import it): in-process vLLM engines over 2 ranks, one each (data parallel) or one between them
(tensor parallel 2, vLLM's external launcher), generating their parts of a batch through
``RolloutPlacement`` before and after an in-place weight sync; the HF engine's greedy output and an
fp32 forward of the sampled rows as references; the results saved to disk."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import forward_log_probs, tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout, VLLMRollout
from rlvr.workers.rollout.placement import RolloutPlacement
from rlvr.workers.rollout.vllm_cpu_shm import SHM_TAG

TEXTS = ["1+1=", "hello there, how are", "abc", "the cat sat on", "x", "what is two plus", "zz top", "a b c d e"]


def tiny():
    """Head size 64 (vLLM's CPU attention supports it) and 2 key/value heads (they split over 2 ranks)."""
    return tiny_causal_lm(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=256, seed=4)


def rollout_config(tp: int):
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length, cfg.kv_cache_memory_bytes = 10, 32, 64 << 20
    cfg.name, cfg.tensor_model_parallel_size = "vllm", tp
    return cfg


def prompts(tokenizer, **meta) -> DataProto:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True, padding_side="left")
    mask = enc["attention_mask"]
    return DataProto.from_dict(tensors={"input_ids": enc["input_ids"], "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)}, meta_info=meta)


def new_weights(model):
    """The model moved by seeded noise: what an actor update hands the engines."""
    moved = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(9)
    with torch.no_grad():
        for param in moved.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=gen))
    return moved


def _calls(engine, placement: RolloutPlacement, part: DataProto, model) -> dict:
    """Greedy and sampled generation of this rank's rows, the sampled rows' fp32 forward log-probs."""
    out = {}
    for name, meta in (("greedy", {"do_sample": False}), ("sampled", {"temperature": 0.8})):
        data = part.select(batch_keys=list(part.batch.keys()))
        data.meta_info = dict(meta)
        rows, counts = placement.gather(data)
        result = placement.own(engine.generate_sequences(rows), counts)
        out[name] = {"batch": {k: v.clone() for k, v in result.batch.items()}, "meta": dict(result.meta_info)}
    out["sampled"]["forward"] = forward_log_probs(model, out["sampled"]["batch"], 0.8)
    return out


def run_rank(rank: int, world: int, tp: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    dist.init_process_group("gloo", rank=rank, world_size=world)  # the workers' group, as FSDP2 makes it
    torch.set_num_threads(1)
    model, tokenizer = tiny()
    placement = RolloutPlacement(tp, rank, world)
    engine = VLLMRollout(rollout_config(tp), model, tokenizer, "cpu", placement.engine_seed(1), owns_module=True)
    engine.update_weights(model.named_parameters(), 0)
    full = prompts(tokenizer)
    part = full.chunk(world)[rank]
    results = {"engine": placement.engine, "before": _calls(engine, placement, part, model),
               "shm_left": sorted(path.name for path in Path("/dev/shm").glob(f"{SHM_TAG}{port}*"))}
    moved = new_weights(model)
    engine.update_weights(moved.named_parameters(), 1)
    results["after"] = _calls(engine, placement, part, moved)
    if rank == 0:  # the HF engine's greedy rows of the whole batch, before and after
        for key, policy in (("hf_before", model), ("hf_after", moved)):
            hf = HFRollout(rollout_config(1), policy, tokenizer, "cpu", seed=0, owns_module=False)
            data = prompts(tokenizer, do_sample=False)
            results[key] = {k: v.clone() for k, v in hf.generate_sequences(data).batch.items()}
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
