"""The vLLM engine on the embedded SmolLM2-135M-Instruct (fp32) against the HF engine on the main
job's held-out prompts: greedy ids and masks equal, sampled log-probs within the fp32 kernel gap of
a transformers forward. Needs vLLM (``make test-vllm``) and the real model (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.data_prep.reasoning_gym import main as make_arith_data
from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.model import load_causal_lm, load_tokenizer
from rlvr.utils.testing import forward_log_probs
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout import HFRollout, VLLMRollout

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm")

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("arith")
    make_arith_data(["--out", str(folder)])
    rows = [json.loads(line) for line in (folder / "test.jsonl").read_text().splitlines()[:8]]
    tokenizer, model = load_tokenizer(MODEL), load_causal_lm(MODEL).eval()
    texts = [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]
    enc = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    prompts = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
               "position_ids": compute_position_ids(enc["attention_mask"])}
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length = 20, int(enc["input_ids"].shape[1])
    engine = VLLMRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=True)
    engine.update_weights(model.named_parameters(), 0)
    return model, tokenizer, cfg, prompts, engine


def test_greedy_ids_and_masks_equal_the_hf_engine(setup):
    model, tokenizer, cfg, prompts, engine = setup
    expected = HFRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=False).generate_sequences(
        DataProto.from_dict(tensors=prompts, meta_info={"do_sample": False}))
    got = engine.generate_sequences(DataProto.from_dict(tensors=prompts, meta_info={"do_sample": False}))
    for key in ("responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(expected.batch[key], got.batch[key]), key
    assert (got.batch["response_mask"].sum(-1) < 20).any()  # some rows end at EOS (kept, mask 1)


def test_sampled_log_probs_match_an_fp32_forward(setup):
    model, _, _, prompts, engine = setup
    out = engine.generate_sequences(DataProto.from_dict(tensors=prompts, meta_info={"n": 8, "temperature": 1.0}))
    mask = out.batch["response_mask"].bool()
    diff = (forward_log_probs(model, out.batch, 1.0) - out.batch["rollout_log_probs"])[mask].abs()
    assert diff.max() < 1e-3 and diff.mean() < 1e-4, (diff.max(), diff.mean())
