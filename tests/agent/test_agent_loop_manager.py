"""The agent-loop registry and manager on the real hf engine (tiny random model): single_turn is the
engine itself, rows pick their loop by agent_name, multi-turn log-probs are the actor's, a
multi-turn batch goes through the existing advantage estimators unchanged, and a tiny model trained
to call the calculator gets its call ended by the stop string and the result inserted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_helpers import (check_tool_calling_rollout, eos_prone_tiny_model, prompt_batch, rollout_config,
                           tool_calling_rollout, tool_calling_rollout_config, tool_calling_tiny_model,
                           write_tools_file)
from omegaconf import OmegaConf

from rlvr.agent import AGENT_LOOPS, AgentLoopManager
from rlvr.agent.chat import render_prompt_ids
from rlvr.trainer.config.schema import ActorConfig
from rlvr.trainer.config import AlgorithmConfig
from rlvr.trainer.ppo.core_algos import get_adv_estimator_fn
from rlvr.workers.actor.dp_actor import DataParallelPPOActor
from rlvr.workers.rollout import HFRollout

QUESTIONS = ["What is 1+1?", "hello there", "abc", "What is 40+2?"]


@pytest.fixture(scope="module")
def model_and_tokenizer():
    return eos_prone_tiny_model()


def engine(model, tokenizer, cfg) -> HFRollout:
    return HFRollout(cfg, model, tokenizer, "cpu", seed=11, owns_module=False)


def rows(n: int) -> dict[str, np.ndarray]:
    def column(values):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return {"data_source": column(["openai/gsm8k"] * n),
            "raw_prompt": column([[{"role": "user", "content": q}] for q in QUESTIONS[:n]]),
            "reward_model": column([{"ground_truth": "2"}] * n), "extra_info": column([{}] * n)}


def prompts(tokenizer, **meta):
    ids = [render_prompt_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    return prompt_batch(tokenizer, ids, rows(len(ids)), **meta)


def test_single_turn_is_the_engine_bit_for_bit(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    cfg = rollout_config(24, 32)
    direct = engine(model, tokenizer, cfg).generate_sequences(prompts(tokenizer, n=2))
    through = AgentLoopManager(cfg, tokenizer).generate_sequences(engine(model, tokenizer, cfg), prompts(tokenizer, n=2))
    assert sorted(direct.batch.keys()) == sorted(through.batch.keys())
    for key in direct.batch.keys():
        assert torch.equal(direct.batch[key], through.batch[key]), key
    assert direct.meta_info == through.meta_info


def test_rows_pick_their_loop_and_come_back_in_order(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    cfg = rollout_config(40, 32, env_name="retry", env_kwargs={"feedback": "no"}, max_assistant_turns=2)
    names = np.array([None, "env_agent", "single_turn", "env_agent"], dtype=object)
    batch = prompts(tokenizer, n=2, do_sample=False)
    batch.non_tensor_batch["agent_name"] = names
    out = AgentLoopManager(cfg, tokenizer).generate_sequences(engine(model, tokenizer, cfg), batch)
    assert len(out) == 8 and out.batch["responses"].shape == (8, 40)
    assert out.non_tensor_batch["agent_name"].tolist() == [n for n in names for _ in range(2)]
    turns = out.non_tensor_batch["num_turns"].tolist()
    assert turns[0:2] == [None, None] and turns[4:6] == [None, None]  # single-turn rows have no count
    assert all(t >= 1 for t in turns[2:4] + turns[6:8])
    single = engine(model, tokenizer, cfg).generate_sequences(prompts(tokenizer, n=2, do_sample=False))
    for row in (0, 1, 4, 5):  # greedy single-turn rows equal the engine's own output
        width = int(single.batch["response_mask"][row].sum())
        assert torch.equal(out.batch["responses"][row, :width], single.batch["responses"][row, :width])
        assert out.batch["turn_scores"][row].abs().sum() == 0
    for row in range(8):  # prompts stay aligned with their rows
        assert torch.equal(out.batch["prompts"][row][-5:], batch.batch["input_ids"][row // 2][-5:])


def test_unknown_agent_name_lists_the_loops(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    cfg = rollout_config(8, 32)
    batch = prompts(tokenizer)
    batch.non_tensor_batch["agent_name"] = np.array(["single_turn", "nope", None, None], dtype=object)
    with pytest.raises(KeyError, match="row 1 has agent_name='nope'.*valid names: env_agent, openai_agent, single_turn, single_turn_agent, tool_agent"):
        AgentLoopManager(cfg, tokenizer).generate_sequences(engine(model, tokenizer, cfg), batch)
    assert "single_turn" in AGENT_LOOPS


@pytest.fixture(scope="module")
def multi_turn_batch(model_and_tokenizer):
    """Sampled multi-turn trajectories of the tiny model against the retry environment (it is never right)."""
    model, tokenizer = model_and_tokenizer
    cfg = rollout_config(64, 32, env_name="retry", env_kwargs={"feedback": "no"}, max_assistant_turns=3)
    cfg.agent.default_agent_loop = "env_agent"
    cfg.temperature = 1.0
    out = AgentLoopManager(cfg, tokenizer).generate_sequences(engine(model, tokenizer, cfg), prompts(tokenizer, n=2))
    assert (out.batch["response_mask"] < out.batch["attention_mask"][:, -64:]).any(), "no inserted tokens"
    return out


def test_multi_turn_rollout_log_probs_are_the_actors(model_and_tokenizer, multi_turn_batch):
    model, _ = model_and_tokenizer
    out = multi_turn_batch.select(deepcopy=True)
    actor_cfg = OmegaConf.structured(ActorConfig)
    actor = DataParallelPPOActor(actor_cfg, model, None, mini_batch_size=8, log_prob_micro_batch_size=8,
                                 world_size=1, device="cpu")
    out.meta_info["temperature"] = 1.0
    log_probs, _ = actor.compute_log_prob(out)
    mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(log_probs[mask], out.batch["rollout_log_probs"][mask], rtol=0, atol=1e-4)
    assert out.batch["rollout_log_probs"][~mask].abs().sum() == 0


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus", "gae"])
def test_multi_turn_batches_go_through_the_advantage_estimators(multi_turn_batch, estimator):
    out = multi_turn_batch
    mask = out.batch["response_mask"]
    scores = out.batch["turn_scores"].clone()
    last = mask.shape[1] - 1 - mask.flip(-1).float().argmax(-1)
    scores[torch.arange(len(out)), last] += torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.5])
    values = torch.randn(mask.shape) * mask if estimator == "gae" else None
    advantages, returns = get_adv_estimator_fn(estimator)(
        token_level_rewards=scores, response_mask=mask, index=np.repeat(np.arange(4), 2), values=values,
        reward_baselines=None, old_log_prob=None, rollout_log_prob=None, gamma=1.0, lam=1.0,
        config=AlgorithmConfig(gamma=1.0, lam=1.0))
    assert advantages.shape == mask.shape
    assert advantages[mask == 0].abs().sum() == 0  # inserted tokens and padding carry no advantage
    assert advantages[mask == 1].abs().sum() > 0


@pytest.mark.slow  # about 12-25 s: keeps the default suite under 10 minutes (it runs in CI's slow step)
def test_tool_agent_stops_at_the_call_and_inserts_the_result_on_the_hf_engine(tmp_path):
    model, tokenizer = tool_calling_tiny_model()
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    hf = HFRollout(tool_calling_rollout_config(tools), model, tokenizer, "cpu", seed=5, owns_module=False)
    out = tool_calling_rollout(hf, tokenizer, tools)
    check_tool_calling_rollout(model, tokenizer, out, atol=1e-4)
    assert out.meta_info["metrics"]["agent/tool_calls"] > 0.5
