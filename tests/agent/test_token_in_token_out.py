"""Token-in, token-out with the embedded model's (SmolLM2's ChatML) chat template: a multi-turn
training sequence is the prompt, the sampled ids and the inserted ids - nothing the model wrote is
decoded and encoded again - and it reads exactly as the chat template renders the conversation,
separators between turns included."""

from __future__ import annotations

import json

import pytest
from agent_helpers import ScriptedEngine, prompt_batch, rollout_config, write_tools_file

from rlvr.agent import AgentLoopManager
from rlvr.agent.chat import render_prompt_ids
from rlvr.utils.model import DEFAULT_MODEL, load_tokenizer

SYSTEM = "You can call a calculator."
QUESTION = "What is 312 * 745?"
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "312 * 745"}}\n</tool_call>'
RESULT = "232440"
PROMPT_MARK = "-- rollout starts --"


@pytest.fixture(scope="module")
def smol():
    return load_tokenizer(DEFAULT_MODEL)


class RecordingTokenizer:
    """The tokenizer, recording every text it is asked to encode."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.encoded: list[str] = []

    def __call__(self, text, *args, **kwargs):
        self.encoded.append(text)
        return self.inner(text, *args, **kwargs)

    def encode(self, text, *args, **kwargs):
        self.encoded.append(text)
        return self.inner.encode(text, *args, **kwargs)

    def apply_chat_template(self, conversation, *args, **kwargs):
        assert kwargs.get("tokenize") is False, "the chat template must not tokenise a conversation with model text"
        return self.inner.apply_chat_template(conversation, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def run_tool_agent(tokenizer, tmp_path, turns: list[list[int]], response_length: int = 96):
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    prompt = render_prompt_ids(tokenizer, messages)
    tokenizer(PROMPT_MARK)  # what is encoded after this mark is the rollout's doing
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    cfg = rollout_config(response_length, len(prompt), tool_config_path=str(tools))
    cfg.agent.default_agent_loop = "tool_agent"
    loops = AgentLoopManager(cfg, tokenizer)
    engine = ScriptedEngine(tokenizer, {tuple(prompt): turns}, response_length)
    out = loops.generate_sequences(engine, prompt_batch(tokenizer, [prompt]))
    real = out.batch["attention_mask"][0].bool()
    return messages, prompt, out, out.batch["input_ids"][0][real].tolist()


@pytest.mark.parametrize("call_ends_with_eos", [True, False], ids=["model-closes-turn", "stopped-at-call"])
def test_sequence_reads_as_the_chat_template_renders_the_conversation(smol, tmp_path, call_ends_with_eos):
    eos = smol.eos_token_id
    call_ids = smol(CALL, add_special_tokens=False)["input_ids"] + ([eos] if call_ends_with_eos else [])
    answer_ids = smol(RESULT, add_special_tokens=False)["input_ids"] + [eos]
    messages, prompt, out, ids = run_tool_agent(smol, tmp_path, [call_ids, answer_ids])
    conversation = [*messages, {"role": "assistant", "content": CALL}, {"role": "tool", "content": RESULT},
                    {"role": "assistant", "content": RESULT}]
    rendered = smol.apply_chat_template(conversation, tokenize=False)
    # the template ends the last turn with "<|im_end|>\n"; the rollout ends at the model's <|im_end|>
    assert smol.decode(ids) + "\n" == rendered
    assert ids + smol("\n", add_special_tokens=False)["input_ids"] == smol(rendered, add_special_tokens=False)["input_ids"]
    separator = smol.convert_tokens_to_ids("Ċ")  # "\n", the token between <|im_end|> and <|im_start|>
    im_end, im_start = smol.convert_tokens_to_ids("<|im_end|>"), smol.convert_tokens_to_ids("<|im_start|>")
    for i in range(len(ids) - 1):
        if ids[i] == im_end:
            assert ids[i + 1] == separator and ids[i + 2] == im_start, "a turn separator was lost"


def test_sampled_ids_are_kept_even_when_they_are_not_the_canonical_tokenisation(smol, tmp_path):
    eos = smol.eos_token_id
    recording = RecordingTokenizer(smol)
    # the model spells the call one character at a time: the same text as the canonical ids, other ids
    odd_call = [smol.convert_tokens_to_ids(char) for token in smol.tokenize(CALL) for char in token]
    canonical = smol(CALL, add_special_tokens=False)["input_ids"]
    assert smol.decode(odd_call) == CALL and len(odd_call) > len(canonical) and smol.unk_token_id not in odd_call
    answer = smol(RESULT, add_special_tokens=False)["input_ids"] + [eos]
    _, prompt, out, ids = run_tool_agent(recording, tmp_path, [odd_call, answer], response_length=160)
    rollout_texts = recording.encoded[recording.encoded.index(PROMPT_MARK) + 1:]
    mask = out.batch["response_mask"][0]
    response = ids[len(prompt):]
    assert response[: len(odd_call)] == odd_call  # exactly the sampled ids, not a re-encoding of their text
    assert response[-len(answer):] == answer
    assert mask[: len(odd_call)].tolist() == [1] * len(odd_call)
    inserted = response[len(odd_call): -len(answer)]
    assert smol.decode(inserted) == f"<|im_end|>\n<|im_start|>tool\n{RESULT}<|im_end|>\n<|im_start|>assistant\n"
    assert mask[len(odd_call): len(response) - len(answer)].tolist() == [0] * len(inserted)
    # nothing the model wrote was encoded again: only the tool's result and the template's text were
    model_text = [CALL, json.dumps({"expression": "312 * 745"})[1:-1], "312 * 745"]
    for text in rollout_texts:
        assert not any(part in str(text) for part in model_text), f"model text re-encoded: {text!r}"
    assert any(RESULT in str(text) for text in rollout_texts)
