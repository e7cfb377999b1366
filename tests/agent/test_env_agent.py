"""The env_agent loop: gym-style environments answer the model turn by turn, with per-turn rewards."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from agent_helpers import ScriptedEngine, prompt_batch, rollout_config

from rlvr.agent import AgentLoopManager, register_environment
from rlvr.agent.chat import render_prompt_ids
from rlvr.agent.env_agent import ENVIRONMENTS, RetryEnvironment
from rlvr.utils.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def gsm8k_rows(questions: list[str], answers: list[str]) -> dict[str, np.ndarray]:
    def column(values):
        array = np.empty(len(values), dtype=object)
        array[:] = values
        return array

    return {"data_source": column(["openai/gsm8k"] * len(questions)),
            "raw_prompt": column([[{"role": "user", "content": q}] for q in questions]),
            "reward_model": column([{"ground_truth": a} for a in answers]),
            "extra_info": column([{} for _ in questions])}


def env_manager(tok, env_name: str, env_kwargs: dict | None = None, prompt_length: int = 64, **multi_turn):
    cfg = rollout_config(200, prompt_length, env_name=env_name, env_kwargs=env_kwargs or {}, max_assistant_turns=3,
                         **multi_turn)
    cfg.agent.default_agent_loop = "env_agent"
    return AgentLoopManager(cfg, tok)


def test_retry_environment_gives_feedback_and_per_turn_rewards(tok):
    eos = tok.eos_token_id
    questions = ["What is 40+2?", "What is 1+1?", "What is 3+3?"]
    prompts = [render_prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    wrong, right = enc(tok, "#### 41") + [eos], enc(tok, "#### 42") + [eos]
    scripts = {tuple(prompts[0]): [wrong, right], tuple(prompts[1]): [enc(tok, "#### 2") + [eos]],
               tuple(prompts[2]): [enc(tok, "#### 5") + [eos]] * 3}
    engine = ScriptedEngine(tok, scripts)
    loops = env_manager(tok, "retry", {"correct_reward": 1.0, "wrong_reward": -0.25})
    out = loops.generate_sequences(engine, prompt_batch(tok, prompts, gsm8k_rows(questions, ["42", "2", "6"])))
    mask, scores = out.batch["response_mask"], out.batch["turn_scores"]
    feedback = enc(tok, "\n<|im_start|>user\nThat is not correct. Try again.<|im_end|>\n<|im_start|>assistant\n")
    assert out.batch["responses"][0, : len(wrong) + len(feedback) + len(right)].tolist() == wrong + feedback + right
    assert mask[0, : len(wrong) + len(feedback) + len(right)].tolist() == \
        [1] * len(wrong) + [0] * len(feedback) + [1] * len(right)
    assert scores[0, len(wrong) - 1] == -0.25 and scores[0, len(wrong) + len(feedback) + len(right) - 1] == 1.0
    assert float(scores[0].sum()) == 0.75 and float(scores[1].sum()) == 1.0
    assert float(scores[2].sum()) == pytest.approx(-0.75)  # three wrong turns, then the turn limit
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 1, 3]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/stop/answered"] == pytest.approx(2 / 3) and metrics["agent/stop/turn_limit"] == pytest.approx(1 / 3)
    assert metrics["agent/env/correct"] == pytest.approx(2 / 3)
    assert [rows for rows, _, _ in engine.calls] == [3, 2, 1]


class _Rephrase:
    """Starts with a rephrased task; finishes after one turn."""

    def reset(self, row):
        return "Please answer: " + row["raw_prompt"][-1]["content"]

    def step(self, text):
        return "", 0.5, True, {"length": len(text)}


class _Broken:
    def reset(self, row):
        return None

    def step(self, text):
        raise ValueError("bad env")


_RELEASE = threading.Event()


class _Hangs:
    def reset(self, row):
        _RELEASE.wait(30)
        return None

    def step(self, text):
        return "", 0.0, True, {}


@pytest.fixture(autouse=True, scope="module")
def _test_environments():
    """The environments of these tests, registered only while they run (the registry's built-in
    names are checked against a table elsewhere)."""
    names = {"rephrase_test": _Rephrase, "broken_test": _Broken, "hangs_test": _Hangs}
    for name, cls in names.items():
        register_environment(name)(cls)
    yield
    for name in names:
        del ENVIRONMENTS[name]


def test_reset_can_replace_the_first_observation(tok):
    eos = tok.eos_token_id
    questions = ["What is 1+1?"]
    original = render_prompt_ids(tok, [{"role": "user", "content": questions[0]}])
    rephrased = render_prompt_ids(tok, [{"role": "user", "content": "Please answer: " + questions[0]}])
    engine = ScriptedEngine(tok, {tuple(rephrased): [enc(tok, "2") + [eos]]})
    out = env_manager(tok, "rephrase_test").generate_sequences(
        engine, prompt_batch(tok, [original], gsm8k_rows(questions, ["2"])))
    prompt = out.batch["prompts"][0][out.batch["attention_mask"][0, : out.batch["prompts"].shape[1]].bool()]
    assert prompt.tolist() == rephrased
    assert out.batch["turn_scores"][0, 1] == 0.5  # the final reward on the last sampled token
    assert out.meta_info["metrics"]["agent/env/length"] == 1.0


def test_a_first_observation_longer_than_the_prompt_window_fails_naming_the_environment(tok):
    original = render_prompt_ids(tok, [{"role": "user", "content": "What is 1+1?"}])
    engine = ScriptedEngine(tok, {tuple(original): [enc(tok, "2") + [tok.eos_token_id]]})
    loops = env_manager(tok, "rephrase_test", prompt_length=len(original) + 5)  # "Please answer: " is 15 tokens
    with pytest.raises(ValueError, match=rf"environment 'rephrase_test' made the prompt of sample 0 "
                                         rf"{len(original) + 15} tokens long .* rollout.prompt_length={len(original) + 5}"):
        loops.generate_sequences(engine, prompt_batch(tok, [original], gsm8k_rows(["What is 1+1?"], ["2"])))
    assert engine.calls == []  # nothing reached the engine


def test_long_environment_replies_are_cut_and_counted(tok):
    eos = tok.eos_token_id
    questions = ["What is 40+2?", "What is 1+1?"]
    prompts = [render_prompt_ids(tok, [{"role": "user", "content": q}]) for q in questions]
    scripts = {tuple(prompts[0]): [enc(tok, "#### 41") + [eos], enc(tok, "#### 42") + [eos]],
               tuple(prompts[1]): [enc(tok, "#### 2") + [eos]]}
    engine = ScriptedEngine(tok, scripts)
    loops = env_manager(tok, "retry", {"feedback": "wrong " * 10}, max_tool_response_tokens=8)
    out = loops.generate_sequences(engine, prompt_batch(tok, prompts, gsm8k_rows(questions, ["42", "2"])))
    metrics = out.meta_info["metrics"]
    assert metrics["agent/env_responses_truncated"] == 0.5  # sample 0 got one cut reply, sample 1 none
    width = out.batch["responses"].shape[1]
    text = tok.decode(out.batch["responses"][0][out.batch["attention_mask"][0, -width:].bool()])
    assert "<|im_start|>user\nwrong wr ...(truncated)<|im_end|>" in text


def test_a_failing_or_hung_environment_fails_loudly_naming_it(tok):
    prompts = [render_prompt_ids(tok, [{"role": "user", "content": "q"}])]
    engine = ScriptedEngine(tok, {tuple(prompts[0]): [enc(tok, "x") + [tok.eos_token_id]]})
    rows = gsm8k_rows(["q"], ["1"])
    with pytest.raises(RuntimeError, match="environment 'broken_test' step for sample 0 raised ValueError"):
        env_manager(tok, "broken_test").generate_sequences(engine, prompt_batch(tok, prompts, rows))
    loops = env_manager(tok, "hangs_test", tool_timeout_s=0.3)
    with pytest.raises(RuntimeError, match="environment 'hangs_test' reset for sample 0 timed out"):
        loops.generate_sequences(engine, prompt_batch(tok, prompts, rows))
    _RELEASE.set()


def test_retry_environment_scores_with_the_row_scorer():
    env = RetryEnvironment(feedback="no", correct_reward=2.0, wrong_reward=-1.0)
    assert env.reset({"data_source": "openai/gsm8k", "reward_model": {"ground_truth": "7"},
                      "raw_prompt": [{"role": "user", "content": "q?"}]}) == "q?"
    assert env.step("#### 6") == ("no", -1.0, False, {"correct": 0.0})
    assert env.step("#### 7") == ("", 2.0, True, {"correct": 1.0})


def test_env_agent_needs_an_environment(tok):
    cfg = rollout_config()
    cfg.agent.default_agent_loop = "env_agent"
    with pytest.raises(ValueError, match="multi_turn.env_name"):
        AgentLoopManager(cfg, tok)
