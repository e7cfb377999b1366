"""The tool_agent loop with scripted model turns and scripted tools: ids, masks, log-probs, limits,
malformed calls, failing and hung tools, tool rewards, batching over the running samples."""

from __future__ import annotations

import time

import pytest
import torch
from agent_helpers import (CountingTool, ScriptedEngine, SleepyTool, fake_log_prob, prompt_batch, rollout_config,
                           write_tools_file)

from rlvr.agent import AgentLoopManager
from rlvr.agent.chat import ChatTurns, render_prompt_ids
from rlvr.utils.testing import tiny_tokenizer

HELPERS = "agent_helpers"
CALCULATOR = "rlvr.agent.tools.calculator.CalculatorTool"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def call(name: str, arguments: str = "{}") -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def prompt(tok, question: str) -> list[int]:
    return render_prompt_ids(tok, [{"role": "user", "content": question}])


def manager(tok, tmp_path, *tools: str, configs=None, response_length=200, prompt_length=64, **multi_turn):
    path = write_tools_file(tmp_path / "tools.yaml", *(tools or (CALCULATOR,)), configs=configs)
    cfg = rollout_config(response_length, prompt_length, tool_config_path=str(path), **multi_turn)
    cfg.agent.default_agent_loop = "tool_agent"
    return AgentLoopManager(cfg, tok)


def text_of(tok, out, row: int) -> str:
    """Every real response token of ``row`` decoded (special tokens shown)."""
    width = out.batch["responses"].shape[1]
    return tok.decode(out.batch["responses"][row][out.batch["attention_mask"][row, -width:].bool()])


def run(tok, tmp_path, scripts, *tools, non_tensors=None, configs=None, **kwargs):
    loops = manager(tok, tmp_path, *tools, configs=configs, **kwargs)
    engine = ScriptedEngine(tok, {tuple(p): turns for p, turns in scripts})
    out = loops.generate_sequences(engine, prompt_batch(tok, [p for p, _ in scripts], non_tensors))
    return out, engine


def test_response_is_sampled_ids_plus_inserted_ids_with_masks_and_log_probs(tok, tmp_path):
    eos = tok.eos_token_id
    p1, p2 = prompt(tok, "What is 12*3?"), prompt(tok, "Say 4.")
    first = enc(tok, call("calculator", '{"expression": "12*3"}'))
    answer = enc(tok, "36") + [eos]
    out, engine = run(tok, tmp_path, [(p1, [first + enc(tok, " more text"), answer]), (p2, [enc(tok, "4") + [eos]])])
    inserted = ChatTurns(tok, [eos]).after_turn([{"role": "tool", "content": "36"}], last_token=first[-1])
    assert tok.decode(inserted) == "<|im_end|>\n<|im_start|>tool\n36<|im_end|>\n<|im_start|>assistant\n"
    expected = first + inserted + answer  # the rest of the first turn after the stop string is never sampled
    batch = out.batch
    n = len(expected)
    assert batch["responses"][0, :n].tolist() == expected
    assert batch["responses"][0, n:].eq(tok.pad_token_id).all()
    assert batch["response_mask"][0, :n].tolist() == [1] * len(first) + [0] * len(inserted) + [1] * len(answer)
    assert batch["attention_mask"][0, -200:].tolist() == [1] * n + [0] * (200 - n)
    sampled_lp = [fake_log_prob(t) for t in first] + [0.0] * len(inserted) + [fake_log_prob(t) for t in answer]
    torch.testing.assert_close(batch["rollout_log_probs"][0, :n], torch.tensor(sampled_lp))
    assert batch["rollout_log_probs"][0, n:].abs().sum() == 0
    assert batch["response_mask"][1].tolist() == [1, 1] + [0] * 198
    full = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    assert full == p1 + expected
    positions = batch["position_ids"][0][batch["attention_mask"][0].bool()]
    assert positions.tolist() == list(range(len(full)))
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 1]
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [1, 0]
    # one engine call per round with every running sample: both, then only the one that called a tool
    assert [(rows, stop) for rows, _, stop in engine.calls] == [(2, ["</tool_call>"]), (1, ["</tool_call>"])]
    assert engine.calls[1][1] == 200 - len(first) - len(inserted)
    metrics = out.meta_info["metrics"]
    assert metrics["agent/num_turns/mean"] == 1.5 and metrics["agent/tool_calls"] == 0.5
    assert metrics["agent/stop/answered"] == 1.0 and metrics["agent/tool_errors"] == 0.0
    # every counter is reported every step, also those that counted nothing (stable metric keys)
    assert metrics["agent/tool_timeouts"] == 0.0 and metrics["agent/malformed_tool_calls"] == 0.0
    assert metrics["agent/tool_responses_truncated"] == 0.0
    assert metrics["agent/observation_tokens"] == pytest.approx(len(inserted) / 2)
    assert out.meta_info["rollout_log_probs_exact"] is True


class NewWeightsEveryCall(ScriptedEngine):
    """A scripted engine whose weights version goes up by one after every call (a trainer pushing
    new weights between the rounds of a multi-turn rollout)."""

    def generate_sequences(self, prompts):
        out = super().generate_sequences(prompts)
        self.weights_version += 1
        return out


def test_each_turn_keeps_the_version_of_the_weights_that_sampled_it(tok, tmp_path):
    eos = tok.eos_token_id
    p1 = prompt(tok, "What is 12*3?")
    first, answer = enc(tok, call("calculator", '{"expression": "12*3"}')), enc(tok, "36") + [eos]
    loops = manager(tok, tmp_path, CALCULATOR)
    engine = NewWeightsEveryCall(tok, {tuple(p1): [first, answer]})
    batch = loops.generate_sequences(engine, prompt_batch(tok, [p1])).batch
    inserted = ChatTurns(tok, [eos]).after_turn([{"role": "tool", "content": "36"}], last_token=first[-1])
    expected = [0] * len(first) + [-1] * len(inserted) + [1] * len(answer)
    n = len(expected)
    assert batch["response_versions"][0, :n].tolist() == expected
    assert batch["response_versions"][0, n:].eq(-1).all()


def test_without_stopping_after_the_call_the_turn_runs_to_eos(tok, tmp_path):
    eos = tok.eos_token_id
    p = prompt(tok, "q")
    first = enc(tok, call("calculator", '{"expression": "1+1"}') + " thinking") + [eos]
    out, engine = run(tok, tmp_path, [(p, [first, enc(tok, "2") + [eos]])], stop_after_tool_call=False)
    inserted = ChatTurns(tok, [eos]).after_turn([{"role": "tool", "content": "2"}], last_token=eos)
    assert tok.decode(inserted).startswith("\n<|im_start|>tool\n2")  # the model's own EOS closed the turn
    assert out.batch["responses"][0, : len(first) + len(inserted)].tolist() == first + inserted
    assert engine.calls[0][2] == []


def test_malformed_calls_unknown_tools_and_bad_arguments_become_error_messages(tok, tmp_path):
    eos = tok.eos_token_id
    prompts = [prompt(tok, f"q{i}") for i in range(3)]
    scripts = [
        (prompts[0], [enc(tok, '<tool_call>{"name": calculator}</tool_call>'), enc(tok, "ok") + [eos]]),
        (prompts[1], [enc(tok, call("nope")), enc(tok, "ok") + [eos]]),
        (prompts[2], [enc(tok, call("calculator", '{"expression": "1/0"}')), enc(tok, "ok") + [eos]]),
    ]
    out, _ = run(tok, tmp_path, scripts, response_length=400)
    texts = [text_of(tok, out, i) for i in range(3)]
    assert "<|im_start|>tool\nError: the tool call is not valid JSON" in texts[0]
    assert "Error: unknown tool 'nope'; available tools: calculator" in texts[1]
    assert "Error: division by zero" in texts[2]
    assert all(t.endswith("ok<|im_end|>") for t in texts)  # the model got to answer after the error
    metrics = out.meta_info["metrics"]
    assert metrics["agent/malformed_tool_calls"] == pytest.approx(1 / 3)
    assert metrics["agent/tool_errors"] == 1.0 and metrics["agent/tool_calls"] == 1.0
    assert metrics["agent/stop/answered"] == 1.0


def test_a_hung_tool_and_a_failing_tool_are_bounded_and_reported(tok, tmp_path):
    eos = tok.eos_token_id
    prompts = [prompt(tok, "a"), prompt(tok, "b")]
    scripts = [(prompts[0], [enc(tok, call("sleep")), enc(tok, "x") + [eos]]),
               (prompts[1], [enc(tok, call("fail")), enc(tok, "y") + [eos]])]
    start = time.perf_counter()
    out, _ = run(tok, tmp_path, scripts, f"{HELPERS}.SleepyTool", f"{HELPERS}.FailingTool", tool_timeout_s=0.5)
    assert time.perf_counter() - start < 5.0
    texts = [text_of(tok, out, i) for i in range(2)]
    assert "Error: the tool did not answer within 0.5 s" in texts[0]
    assert "Error: the tool failed: RuntimeError: disk on fire" in texts[1]
    metrics = out.meta_info["metrics"]
    assert metrics["agent/tool_timeouts"] == 0.5 and metrics["agent/tool_errors"] == 1.0
    assert metrics["agent/tool_time_s"] >= 0.5


def test_turn_limit_stops_without_running_the_last_call(tok, tmp_path):
    CountingTool.created.clear()
    p = prompt(tok, "loop")
    turns = [enc(tok, call("count"))] * 5
    out, engine = run(tok, tmp_path, [(p, turns)], f"{HELPERS}.CountingTool", max_assistant_turns=3,
                      response_length=300)
    assert out.non_tensor_batch["num_turns"].tolist() == [3]
    assert out.meta_info["metrics"]["agent/stop/turn_limit"] == 1.0
    assert len(engine.calls) == 3
    text = text_of(tok, out, 0)
    assert text.count("<|im_start|>tool\n") == 2  # the third turn's call was not run
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [2] and len(CountingTool.created) == 1
    assert out.batch["response_mask"][0][out.batch["attention_mask"][0, -300:].bool()][-1] == 1  # ends on a model token


def test_response_budget_counts_every_turn_and_never_overflows(tok, tmp_path):
    p = prompt(tok, "long")
    turns = [enc(tok, call("calculator", '{"expression": "1+1"}'))] * 10
    out, engine = run(tok, tmp_path, [(p, turns)], response_length=150)
    used = int(out.batch["attention_mask"][0, -150:].sum())
    assert used <= 150 and out.batch["responses"].shape == (1, 150)
    assert out.meta_info["metrics"]["agent/stop/response_budget"] == 1.0
    assert all(length <= 150 for _, length, _ in engine.calls)


def test_long_tool_output_is_cut_to_the_token_limit(tok, tmp_path):
    eos = tok.eos_token_id
    p = prompt(tok, "echo")
    scripts = [(p, [enc(tok, call("c", '{"text": "' + "z" * 60 + '"}')), enc(tok, "done") + [eos]])]
    out, _ = run(tok, tmp_path, scripts, f"{HELPERS}.EchoTool", max_tool_response_tokens=10)
    text = text_of(tok, out, 0)
    assert "<|im_start|>tool\n" + "z" * 10 + " ...(truncated)<|im_end|>" in text
    assert out.meta_info["metrics"]["agent/tool_responses_truncated"] == 1.0


def test_tool_rewards_and_life_cycle(tok, tmp_path):
    CountingTool.created.clear(), CountingTool.released.clear(), CountingTool.create_kwargs.clear()
    eos = tok.eos_token_id
    prompts = [prompt(tok, "one"), prompt(tok, "two")]
    scripts = [(prompts[0], [enc(tok, call("count")), enc(tok, call("count")), enc(tok, "fin") + [eos]]),
               (prompts[1], [enc(tok, "none") + [eos]])]
    extra = [{"tools_kwargs": {"count": {"create_kwargs": {"seed": 3}}}}, {}]
    out, _ = run(tok, tmp_path, scripts, f"{HELPERS}.CountingTool",
                 non_tensors={"extra_info": __import__("numpy").array(extra, dtype=object)})
    assert len(CountingTool.created) == 1 and CountingTool.released == CountingTool.created
    assert CountingTool.create_kwargs == [{"seed": 3}]
    scores = out.batch["turn_scores"][0]
    mask = out.batch["response_mask"][0]
    ends = [i for i in range(len(mask) - 1) if mask[i] == 1 and mask[i + 1] == 0]
    last = int(mask.nonzero().max())
    assert scores[ends[0]] == 0.5 and scores[ends[1]] == 0.5  # step rewards at the end of each calling turn
    assert scores[last] == 2.0  # calc_reward: two calls
    assert float(scores.sum()) == 3.0 and out.batch["turn_scores"][1].abs().sum() == 0
    metrics = out.meta_info["metrics"]
    assert metrics["agent/tool/count/count"] == 1.5  # execute's metrics, mean over the calls (1 and 2)
    assert "agent/tool/count/note" not in metrics  # not a number
    assert not any(key.startswith("agent/tool/calculator") for key in metrics)


def test_a_call_abandoned_at_its_timeout_keeps_its_instance_until_it_returns(tok, tmp_path):
    SleepyTool.events.clear(), CountingTool.created.clear(), CountingTool.released.clear()
    eos = tok.eos_token_id
    p = prompt(tok, "slow")
    scripts = [(p, [enc(tok, call("sleep") + call("count")), enc(tok, "ok") + [eos]])]
    out, _ = run(tok, tmp_path, scripts, f"{HELPERS}.SleepyTool", f"{HELPERS}.CountingTool", tool_timeout_s=0.3,
                 max_parallel_calls=2, configs={f"{HELPERS}.SleepyTool": "{seconds: 1.5}"})
    assert out.meta_info["metrics"]["agent/tool_timeouts"] == 1.0
    # the rollout is over (its tools closed) while sleep still runs: its instance is not released under it
    assert [event for event, _ in SleepyTool.events] == ["create", "execute-start"]
    deadline = time.monotonic() + 10
    while len(SleepyTool.events) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [event for event, _ in SleepyTool.events] == ["create", "execute-start", "execute-end", "release"]
    assert len({instance for _, instance in SleepyTool.events}) == 1  # one instance, released once, after it ran
    time.sleep(0.2)
    assert CountingTool.created == [] and CountingTool.released == []  # the call queued behind it never started


def test_a_turn_cut_short_by_the_context_window_continues_without_an_insertion(tok, tmp_path):
    eos = tok.eos_token_id
    long_prompt, short_prompt = prompt(tok, "x" * 40), prompt(tok, "y" * 10)
    a_first = enc(tok, "aaaaaaaaaa" + call("c"))
    b_first = enc(tok, call("c"))
    b_answer = enc(tok, "b" * 40) + [eos]
    scripts = [(long_prompt, [a_first, enc(tok, "2") + [eos]]), (short_prompt, [b_first, b_answer])]
    out, engine = run(tok, tmp_path, scripts, f"{HELPERS}.EchoTool", response_length=120,
                      prompt_length=len(long_prompt))
    inserted = len(ChatTurns(tok, [eos]).after_turn([{"role": "tool", "content": "2"}], last_token=b_first[-1]))
    window = 120 - (len(a_first) + inserted)
    assert [c[:2] for c in engine.calls] == [(2, 120), (2, window), (1, 120 - len(b_first) - inserted - window)]
    mask = out.batch["response_mask"][1]
    assert mask.tolist()[: len(b_first) + inserted + len(b_answer)] == \
        [1] * len(b_first) + [0] * inserted + [1] * len(b_answer)
    assert out.batch["responses"][1, len(b_first) + inserted: len(b_first) + inserted + len(b_answer)].tolist() == b_answer
    assert out.non_tensor_batch["num_turns"].tolist() == [2, 2]
    assert len(engine.widths) == 3
    for width, (_, length, _) in zip(engine.widths, engine.calls):  # no round overflows the context window
        assert length >= 1 and width + length <= len(long_prompt) + 120
    assert engine.widths[1] + engine.calls[1][1] == len(long_prompt) + 120  # the cut round fills it exactly


def test_tool_agent_needs_a_tools_file(tok):
    cfg = rollout_config()
    cfg.agent.default_agent_loop = "tool_agent"
    with pytest.raises(ValueError, match="tool_config_path"):
        AgentLoopManager(cfg, tok)


def test_python_tool_runs_in_the_sandbox_through_the_loop(tok, tmp_path):
    eos = tok.eos_token_id
    p = prompt(tok, "py")
    code = '{"code": "print(6 * 7)"}'
    scripts = [(p, [enc(tok, call("python", code)), enc(tok, "42") + [eos]])]
    out, _ = run(tok, tmp_path, scripts, "rlvr.agent.tools.python_interpreter.PythonInterpreterTool", response_length=300)
    assert "<|im_start|>tool\n42\n<|im_end|>" in text_of(tok, out, 0)
    assert out.meta_info["metrics"]["agent/tool_errors"] == 0.0
