"""Rollout routing replay on a small MoE: how far the rollout's log-probs are from the trainer's, and how
often their routers pick other experts, without and with replaying the rollout's experts (R3).

The trainer is rlvr's actor on the float32 model; the rollout is the HF engine on a bfloat16 copy of
the same weights (the usual precision gap between a rollout engine and training), recording the
experts of every token (``rollout.enable_rollout_routing_replay``). On the rollout's samples:

- ``topk_differs``: share of (response token, MoE layer) pairs whose set of top-k experts differs
  between the rollout and the trainer's own routing (the actor's ``compute_log_prob`` under R2 records
  it); ``tokens_any_layer_differs``: share of response tokens with such a layer;
- ``|dlogp| mean / max``: ``|rollout log-prob - trainer log-prob|`` over the response tokens, with the
  trainer routing by itself (``before``) and replaying the rollout's experts (``after``, R3). The gap
  that remains after replay is the bf16 arithmetic alone.

With ``--model`` the model is a saved MoE (the MoE job's upcycled SmolLM2, or a checkpoint of its
run exported to HF) and the prompts are the chat prompts of ``--data`` (the job's held-out questions),
sampled at temperature 1 like the job's rollout.

Usage::

    python -m benchmarks.bench_moe_replay --arch qwen3_moe --json moe_replay.json
    python -m benchmarks.bench_moe_replay --arch mixtral --hidden 128 --layers 4 --experts 16
    python -m benchmarks.bench_moe_replay --model runs/moe/model --data data/arith/test.jsonl --response-len 20
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.ppo.metric_utils import infer_moe_num_experts
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.utils.testing import tiny_tokenizer
from rlvr.utils.tiny_moe import TINY_MOE_ARCHS, tiny_moe_lm
from rlvr.utils.torch_functional import compute_position_ids, left_pad
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.moe.layout import ROUTED_EXPERTS
from rlvr.workers.rollout import HFRollout


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=TINY_MOE_ARCHS, default="qwen3_moe")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers (all MoE)")
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4, help="responses per prompt")
    parser.add_argument("--response-len", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="a saved Hugging Face MoE model folder with its tokenizer (instead of a "
                        "tiny random --arch model)")
    parser.add_argument("--data", default="data/arith/test.jsonl", help="with --model: JSONL rows whose 'prompt' "
                        "is a chat; the first --prompts rows are used")
    parser.add_argument("--json", help="write the results here")
    return parser.parse_args(argv)


def _prompts(count: int, seed: int) -> DataProto:
    """Random byte prompts of 4-12 tokens, left-padded (the tiny tokenizer's ids 4-259)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 13, (count,), generator=gen).tolist()
    width = max(lengths)
    ids = torch.zeros(count, width, dtype=torch.long)
    mask = torch.zeros(count, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length:] = torch.randint(4, 260, (length,), generator=gen)
        mask[row, width - length:] = 1
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)})


def _chat_prompts(path: str, count: int, tokenizer) -> DataProto:
    """The first ``count`` chat prompts of the JSONL ``path`` through the tokenizer's chat template, left-padded."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()[:count]]
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    ids, mask = left_pad(encoded, max(len(tokens) for tokens in encoded), tokenizer.pad_token_id)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)})


def _actor(model: torch.nn.Module, mode: str) -> DataParallelPPOActor:
    config = OmegaConf.structured(RlvrConfig).actor_rollout_ref.actor
    return DataParallelPPOActor(config, model, None, mini_batch_size=1, log_prob_micro_batch_size=16, world_size=1,
                                device="cpu", router_replay=mode)


def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    diff = (a - b)[mask].abs()
    return {"mean": float(diff.mean()), "max": float(diff.max())}


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    if args.model:
        model, tokenizer = load_causal_lm(args.model).eval(), load_tokenizer(args.model)
        prompts = _chat_prompts(args.data, args.prompts, tokenizer)
        config = model.config
        described = {"path": args.model, "arch": config.model_type, "layers": config.num_hidden_layers,
                     "experts": infer_moe_num_experts(config),
                     "top_k": config.num_experts_per_tok, "data": args.data}
    else:
        model = tiny_moe_lm(args.arch, seed=args.seed, hidden_size=args.hidden, num_hidden_layers=args.layers,
                            num_experts=args.experts, top_k=args.top_k, expert_size=args.hidden // 2)
        tokenizer, prompts = tiny_tokenizer(), _prompts(args.prompts, args.seed)
        described = {"arch": args.arch, "hidden": args.hidden, "layers": args.layers, "experts": args.experts,
                     "top_k": args.top_k}
    rollout_cfg = OmegaConf.structured(RlvrConfig).actor_rollout_ref.rollout
    rollout_cfg.response_length, rollout_cfg.enable_rollout_routing_replay = args.response_len, True
    engine = HFRollout(rollout_cfg, copy.deepcopy(model).to(torch.bfloat16), tokenizer, "cpu", seed=args.seed,
                       owns_module=True)
    prompts.meta_info["n"] = args.samples
    out = engine.generate_sequences(prompts)
    out.meta_info["temperature"] = 1.0
    response = out.batch["response_mask"].bool()
    rollout_routes = out.batch[ROUTED_EXPERTS]
    own_log_probs, _, own_routes = _actor(model, "R2").compute_log_prob_and_routes(out)
    replayed_log_probs, _ = _actor(model, "R3").compute_log_prob(out)
    width = response.shape[1]
    theirs, ours = rollout_routes[:, -width:].long(), own_routes[:, -width:].long()
    known = response & (theirs >= 0).all(-1).all(-1)  # a row's last sampled token was never fed
    differs = (theirs.sort(-1).values != ours.sort(-1).values).any(-1)  # [B, R, layers]
    rollout_lp = out.batch["rollout_log_probs"]
    return {
        "model": described,
        "rows": int(response.shape[0]), "response_tokens": int(response.sum()), "compared_tokens": int(known.sum()),
        "rollout": "hf engine, bfloat16", "trainer": "actor, float32",
        "topk_differs": float(differs[known].float().mean()),
        "tokens_any_layer_differs": float(differs.any(-1)[known].float().mean()),
        "dlogp_before": _gap(rollout_lp, own_log_probs, response),
        "dlogp_after": _gap(rollout_lp, replayed_log_probs, response),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
