"""The compiled decode step with sampling inside its CUDA graph, and the stop check every
``STOP_CHECK_EVERY`` steps, against the eager every-step loop on CUDA (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import tiny_causal_lm
from rlvr.workers.rollout import HFRollout, hf_rollout
from tests.workers.model_worker_utils import prompt_batch

pytestmark = pytest.mark.gpu


def _rollout(model, tokenizer, **overrides) -> HFRollout:
    config = OmegaConf.merge(OmegaConf.structured(RolloutConfig),
                             {"response_length": 40, "prompt_length": 32, **overrides})
    return HFRollout(config, model, tokenizer, "cuda", seed=3, owns_module=False)


@pytest.mark.parametrize("sampling", [{"temperature": 1.0}, {"temperature": 0.8, "top_k": 30, "top_p": 0.9}],
                         ids=["plain", "top_k_top_p"])
def test_compiled_sampling_graph_and_sparse_stop_check_match_the_eager_loop(monkeypatch, sampling):
    model, tokenizer = tiny_causal_lm(hidden_size=64, num_hidden_layers=2, seed=5)
    model = model.cuda()
    eos = list(range(0, len(tokenizer), 7))  # rows stop early, at different steps
    fast = _rollout(model, tokenizer, static_cache=True, compile=True)
    plain = _rollout(model, tokenizer)
    for _ in range(3):  # graph capture, then replays; the generators must stay in step
        prompts = prompt_batch(["1+1=", "hello there, how are", "abc", "the cat"] * 2, **sampling)
        prompts.meta_info["eos_token_id"] = eos
        got = fast.generate_sequences(prompts)  # stop check every STOP_CHECK_EVERY steps
        with monkeypatch.context() as patch:
            patch.setattr(hf_rollout, "stop_check_interval", lambda device, stop_strings: 1)
            want = plain.generate_sequences(prompts)
        assert torch.equal(got.batch["responses"], want.batch["responses"])
        assert torch.equal(got.batch["response_mask"], want.batch["response_mask"])
        torch.testing.assert_close(got.batch["rollout_log_probs"], want.batch["rollout_log_probs"],
                                   rtol=1e-4, atol=1e-4)
        assert torch.equal(fast.generator.get_state(), plain.generator.get_state())
        assert int(want.batch["response_mask"].sum(dim=1).max()) < 40  # every row stopped early
