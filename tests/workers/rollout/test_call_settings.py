"""One ``generate_sequences`` call's settings, shared by every engine, and the weights-version check."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.errors import StaleRolloutError
from rlvr.utils.testing import tiny_tokenizer
from rlvr.workers.rollout.base import call_settings, check_weights_version


def _call(**meta):
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.stop = 16, ["\n\n"]
    prompts = DataProto.from_dict(tensors={"input_ids": torch.tensor([[5, 6], [7, 8]])}, meta_info=meta)
    return call_settings(cfg, tiny_tokenizer(), prompts)


def test_defaults_come_from_the_config_and_the_tokenizer():
    prompts, call = _call()
    assert len(prompts) == 2
    assert (call.eos_ids, call.pad_id, call.response_length, call.stop) == ([3], 0, 16, ["\n\n"])
    assert call.sampling.temperature == 1.0 and not call.sampling.greedy


def test_the_call_overrides_them():
    prompts, call = _call(n=3, eos_token_id=[3, 9], pad_token_id=None, response_length=4, stop=["x"],
                          validate=True)
    assert prompts.batch["input_ids"][:, 0].tolist() == [5, 5, 5, 7, 7, 7]  # each row n times, in place
    assert (call.eos_ids, call.pad_id, call.response_length, call.stop) == ([3, 9], 0, 4, ["x"])
    assert call.sampling.greedy  # validation: val_kwargs (greedy by default)


def test_a_response_length_over_the_config_is_an_error():
    with pytest.raises(ValueError, match="response_length.*\\[1, rollout.response_length=16\\]"):
        _call(response_length=17)


def test_weights_version_check():
    check_weights_version({"rollout_weights_version": 3, "actor_weights_version": 3})
    check_weights_version({"rollout_weights_version": 3})  # a rollout-only worker: nothing to compare
    with pytest.raises(StaleRolloutError, match="version 2, but the actor is at version 3"):
        check_weights_version({"rollout_weights_version": 2, "actor_weights_version": 3})
