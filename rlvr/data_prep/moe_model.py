"""The MoE job's model: the embedded SmolLM2-135M-Instruct upcycled into a Mixtral mixture of experts.

Sparse upcycling (Komatsuzaki et al. 2023, "Sparse Upcycling: Training Mixture-of-Experts from Dense
Checkpoints", arXiv:2212.05055). SmolLM2 is a Llama model, and Mixtral is Llama with its MLPs replaced by
routed experts: every layer's MLP becomes ``experts`` copies of itself behind a router with small random
weights, ``top_k`` of them per token. Mixtral renormalises the chosen experts' weights to sum to 1, so with
identical experts the model computes exactly what SmolLM2 does: a dense warm start, which learns the main
job's task on CPU where a random MoE would not. Each expert is a whole MLP, so the model is large for its
compute: with the default 4 experts about 380M parameters (6 GB with AdamW's state in fp32) for the
compute of SmolLM2 with two MLPs per token. ``noise`` then moves each expert's weights apart by that
fraction of the MLP's weight scale, so the router's choices matter from the first step (and the rollout's
and the trainer's routers can disagree): at the default 0.005 the log-probs of a short text move by at
most 0.38 from SmolLM2's (0.002: 0.15, 0.01: 0.76; exact copies: 2e-5). Attention, norms, embeddings and the tokenizer are SmolLM2's.

Usage::

    python -m rlvr.data_prep.moe_model --out runs/moe/model --experts 4 --top-k 2 --noise 0.005
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM, PreTrainedModel

from rlvr.utils.model import DEFAULT_MODEL, load_causal_lm, load_tokenizer

__all__ = ["upcycle", "save_moe_model"]


def upcycle(dense: PreTrainedModel, experts: int, top_k: int, noise: float, seed: int) -> MixtralForCausalLM:
    """A Mixtral model whose experts are copies of ``dense``'s (a Llama model) MLPs, each perturbed by
    ``noise`` times the MLP weights' standard deviation (module docstring)."""
    config = dense.config
    moe_config = MixtralConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads, hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
        rope_parameters=config.rope_parameters, tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        num_local_experts=experts, num_experts_per_tok=top_k, router_jitter_noise=0.0, sliding_window=None,
        attention_dropout=0.0,
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MixtralForCausalLM(moe_config)
    dense_state = dense.state_dict()
    state = {name: tensor for name, tensor in dense_state.items() if ".mlp." not in name}
    for layer in range(config.num_hidden_layers):
        mlp = f"model.layers.{layer}.mlp"
        gate_up = torch.cat([dense_state[f"{mlp}.gate_proj.weight"], dense_state[f"{mlp}.up_proj.weight"]])
        down = dense_state[f"{mlp}.down_proj.weight"]
        state[f"{mlp}.experts.gate_up_proj"] = _copies(gate_up, experts, noise, generator)
        state[f"{mlp}.experts.down_proj"] = _copies(down, experts, noise, generator)
        state[f"{mlp}.gate.weight"] = torch.randn(experts, config.hidden_size, generator=generator) * 0.02
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"upcycling left weights unset {missing} or unused {unexpected}")
    model.generation_config = dense.generation_config
    return model.eval()


def _copies(weight: torch.Tensor, experts: int, noise: float, generator: torch.Generator) -> torch.Tensor:
    """``[experts, *weight.shape]``: ``weight`` plus ``noise * std(weight)`` Gaussian noise per copy."""
    copies = weight.float()[None].repeat(experts, *([1] * weight.dim()))
    copies += torch.randn(copies.shape, generator=generator) * (noise * float(weight.float().std()))
    return copies.to(weight.dtype)


def save_moe_model(out: str | Path, experts: int, top_k: int, noise: float, seed: int) -> Path:
    """Upcycle the embedded SmolLM2-135M-Instruct and write it with its tokenizer to the folder ``out``."""
    dense = load_causal_lm(DEFAULT_MODEL)
    model = upcycle(dense, experts, top_k, noise, seed)
    out = Path(out)
    model.save_pretrained(out)
    load_tokenizer(DEFAULT_MODEL).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder to write the model and tokenizer to")
    parser.add_argument("--experts", type=int, default=4)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--noise", type=float, default=0.005, help="expert perturbation, relative to the weights' std")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(save_moe_model(args.out, args.experts, args.top_k, args.noise, args.seed))


if __name__ == "__main__":
    main(sys.argv[1:])
