"""An environment shows the model an image in its observation (env_agent loop, tiny Qwen2.5-VL, the
hybrid worker's HF engine): the image joins the conversation's image inputs, its tokens are inserted
with mask 0, and every sampled token's log-prob is the one of a plain forward with all the images."""

from __future__ import annotations

import pytest
import torch
from mm_helpers import COLOURS, image_batch, make_config, picture, reference_log_probs

from rlvr.agent import register_environment
from rlvr.agent.env_agent import ENVIRONMENTS, observation_parts
from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
from rlvr.utils.model import load_causal_lm
from rlvr.utils.multimodal import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from rlvr.utils.processor import save_processor
from rlvr.utils.tiny_vlm import tiny_qwen_vl, tiny_vl_processor
from rlvr.workers.engine_workers import ActorRolloutRefWorker


class PictureEnvironment:
    """After the first turn shows a second picture and asks again; the second turn ends the episode."""

    def reset(self, row):
        self.turns = 0
        return None

    def step(self, text):
        self.turns += 1
        if self.turns == 1:
            return {"text": "And this one? <image>", "images": [picture(COLOURS[1], mark=2)]}, 0.0, False, {}
        return "", 1.0, True, {}


@pytest.fixture(scope="module")
def eos_prone_vl_dir(tmp_path_factory) -> str:
    """The tiny Qwen2.5-VL made to end its turns after 1 to about 15 tokens: the embedding of its EOS (tied to
    the LM head) points along a typical final hidden state."""
    model, processor = tiny_qwen_vl("qwen2_5_vl", seed=0), tiny_vl_processor("qwen2_5_vl")
    ids = processor.tokenizer(["What colour is this?", "a picture"], return_tensors="pt", padding=True)["input_ids"]
    with torch.no_grad():
        direction = model.model(input_ids=ids).last_hidden_state.mean(dim=(0, 1))
        model.lm_head.weight[processor.tokenizer.eos_token_id] = 6.5 * direction / direction.norm()
    folder = tmp_path_factory.mktemp("eos_prone") / "model"
    model.save_pretrained(folder)
    save_processor(processor, folder)
    return str(folder)


@pytest.fixture(scope="module")
def picture_env():
    """The test's environment, registered for the module and removed after it (later tests list
    the registry's names)."""
    register_environment("picture_env")(PictureEnvironment)
    yield "picture_env"
    ENVIRONMENTS.pop("picture_env", None)


def test_an_observation_image_joins_the_conversation(eos_prone_vl_dir, image_data, picture_env):
    config = make_config(eos_prone_vl_dir, "actor_rollout_ref.rollout.response_length=40",
                         "actor_rollout_ref.rollout.agent.default_agent_loop=env_agent",
                         f"actor_rollout_ref.rollout.multi_turn.env_name={picture_env}",
                         "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2")
    hybrid = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(ActorRolloutRefWorker, config, "actor_rollout_ref"))
    hybrid.init_model()
    out = hybrid.generate_sequences(image_batch(eos_prone_vl_dir, image_data, n=2))
    image_token = load_causal_lm(eos_prone_vl_dir).config.image_token_id
    two_turns = [i for i in range(len(out)) if out.non_tensor_batch["num_turns"][i] == 2]
    assert len(two_turns) >= 4, out.non_tensor_batch["num_turns"]
    for i in two_turns:
        grids = out.non_tensor_batch[MULTI_MODAL_INPUTS][i]["image_grid_thw"]
        prompt_grid = out.non_tensor_batch[MULTI_MODAL_INPUTS][i]["image_grid_thw"][0]
        assert grids.shape == (2, 3) and grids[1].tolist() == [1, 4, 4]  # the prompt's image, then the observation's
        assert len(out.non_tensor_batch[MULTI_MODAL_DATA][i]["image"]) == 2
        inserted = (out.batch["responses"][i] == image_token) & (out.batch["response_mask"][i] == 0)
        assert int(inserted.sum()) == 4 and int((out.batch["responses"][i] == image_token).sum()) == 4
        assert int((out.batch["prompts"][i] == image_token).sum()) == int(prompt_grid.prod()) // 4
    out.meta_info["temperature"] = 1.0
    mask = out.batch["response_mask"].bool()
    reference = reference_log_probs(load_causal_lm(eos_prone_vl_dir), out)
    assert (out.batch["rollout_log_probs"] - reference)[mask].abs().max() < 1e-5
    actor = hybrid.compute_log_prob(out).batch["old_log_probs"]
    assert (actor - reference)[mask].abs().max() < 1e-5


def test_observation_parts():
    image = picture(COLOURS[0])
    assert observation_parts("plain") == ("plain", [])
    text, images = observation_parts({"text": "look", "images": [image]})
    assert text == "<image>look" and len(images) == 1 and images[0].size == (56, 56)
    with pytest.raises(ValueError, match=r"2 <image> placeholder\(s\) for 1 image"):
        observation_parts({"text": "<image> and <image>", "images": [image]})
    with pytest.raises(ValueError, match="needs a 'text' entry"):
        observation_parts({"images": [image]})
