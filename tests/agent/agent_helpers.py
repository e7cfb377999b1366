"""Helpers of the agent-loop tests: a scripted rollout engine, rollout configs, a tools file, scripted
tools, and a tiny model trained to call the calculator with the checks its rollouts must pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import json
import threading
import time

import torch
from omegaconf import OmegaConf

from rlvr.agent import AgentLoopManager
from rlvr.agent.chat import ChatTurns, render_prompt_ids
from rlvr.agent.tools import BaseTool, ToolResponse, function_schema
from rlvr.utils.torch_functional import left_pad
from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.testing import forward_log_probs, tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids

VLLM_SIZE = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 256}
"""Tiny-model sizes with head size 64: vLLM's CPU attention kernels take no smaller heads."""


def eos_prone_tiny_model(**model_kwargs: Any):
    """The tiny random model and tokenizer, made to end a turn after a few tokens (1 to about 30): the
    output embedding of EOS (tied to its input embedding) points along a typical final hidden state.
    ``model_kwargs`` go to :func:`tiny_causal_lm` (default: hidden size 64, 2 layers, seed 3)."""
    model, tokenizer = tiny_causal_lm(**{"hidden_size": 64, "num_hidden_layers": 2, "seed": 3, **model_kwargs})
    with torch.no_grad():
        hidden = model.model(tokenizer(["say 1 2 3", "what is 4"], return_tensors="pt", padding=True)["input_ids"])
        direction = hidden.last_hidden_state.mean(dim=(0, 1))
        model.lm_head.weight[tokenizer.eos_token_id] = 2.0 * direction / direction.norm()
    return model, tokenizer


TINY_TOOL_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>'
AFTER_CALL = " Let me check."
"""What :func:`tool_calling_tiny_model` writes after its call when no stop string ends the turn."""


def tool_calling_tiny_model(questions: int = 16, lr: float = 1e-2, **model_kwargs: Any):
    """The tiny random model and tokenizer, trained (Adam at ``lr`` decaying to 0 over 300 steps; it
    stops at a loss of 1e-3, after about 150 steps, 10-20 s on one CPU thread) to answer "what is <i>
    + 1" (``i < questions``, the ``gsm8k_like_data`` questions) by calling the calculator: first
    ``TINY_TOOL_CALL + AFTER_CALL`` and EOS, then, after the tool's reply, "#### 2" and EOS. At
    temperature 1 it writes the exact call in most samples (14 of 16 in a trial), so a rollout really
    calls the tool. ``model_kwargs`` go to :func:`tiny_causal_lm` (the wider ``VLLM_SIZE`` model
    needs ``lr=5e-3``)."""
    model, tokenizer = tiny_causal_lm(**{"hidden_size": 64, "num_hidden_layers": 2, "seed": 3, **model_kwargs})

    def length(messages: list[dict[str, str]], prompt: bool = False) -> int:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=prompt)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    rows, targets = [], []
    for i in range(questions):
        conversation = [{"role": "user", "content": f"what is {i} + 1"},
                        {"role": "assistant", "content": TINY_TOOL_CALL + AFTER_CALL},
                        {"role": "tool", "content": "2"}, {"role": "assistant", "content": "#### 2"}]
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        target = [-100] * len(ids)
        for turn in (1, 3):  # the assistant turns and their <|im_end|>, not the "\n" after it
            start, end = length(conversation[:turn], prompt=True), length(conversation[: turn + 1]) - 1
            target[start:end] = ids[start:end]
        rows.append(ids)
        targets.append(target)
    input_ids, mask = left_pad(rows, max(len(r) for r in rows), tokenizer.pad_token_id)
    labels, _ = left_pad(targets, input_ids.shape[1], -100)
    steps = 300
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 - step / steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model trains many times faster on one thread than on contended cores
    try:
        for step in range(steps):
            loss = model(input_ids=input_ids, attention_mask=mask, position_ids=compute_position_ids(mask),
                         labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            if loss.item() < 1e-3:
                break
    finally:
        torch.set_num_threads(threads)
    assert loss.item() < 1e-3, f"the tiny model did not learn its tool call (loss {loss.item():.4f})"
    return model.eval(), tokenizer


def tool_calling_rollout(engine, tokenizer, tools_path: Path, questions: int = 8):
    """A ``tool_agent`` rollout of :func:`tool_calling_tiny_model` on ``engine`` (built with
    :func:`tool_calling_rollout_config`): ``questions`` of its questions, sampled at temperature 1."""
    cfg = tool_calling_rollout_config(tools_path)
    ids = [render_prompt_ids(tokenizer, [{"role": "user", "content": f"what is {i} + 1"}]) for i in range(questions)]
    return AgentLoopManager(cfg, tokenizer).generate_sequences(engine, prompt_batch(tokenizer, ids, do_sample=True))


def tool_calling_rollout_config(tools_path: Path):
    """The rollout section of :func:`tool_calling_rollout`: 128 response tokens, 2 model turns, the calculator."""
    cfg = rollout_config(128, 32, tool_config_path=str(tools_path), max_assistant_turns=2)
    cfg.agent.default_agent_loop = "tool_agent"
    cfg.temperature = 1.0
    return cfg


def check_tool_calling_rollout(model, tokenizer, out, atol: float) -> None:
    """What a :func:`tool_calling_rollout` must look like on any engine: some sample's first turn is
    exactly the sampled call, ended by the ``</tool_call>`` stop string (not by EOS, and before
    ``AFTER_CALL``), with mask 1; then the calculator's reply as the chat template's ids, mask 0 and
    no log-probs; then the model's next turn, mask 1. Every sampled token's rollout log-prob equals
    an fp32 forward of the assembled sequence (within ``atol``), so no id was re-tokenised or shifted."""
    call = tokenizer(TINY_TOOL_CALL, add_special_tokens=False)["input_ids"]
    inserted = ChatTurns(tokenizer, [tokenizer.eos_token_id]).after_turn([{"role": "tool", "content": "2"}],
                                                                         last_token=call[-1])
    assert tokenizer.decode(inserted) == "<|im_end|>\n<|im_start|>tool\n2<|im_end|>\n<|im_start|>assistant\n"
    responses, mask, log_probs = (out.batch[key] for key in ("responses", "response_mask", "rollout_log_probs"))
    width = responses.shape[1]
    real = out.batch["attention_mask"][:, -width:]
    assert ((mask == 1) <= (real == 1)).all()  # sampled tokens are real tokens
    called = [row for row in range(len(out)) if responses[row, : len(call)].tolist() == call
              and mask[row, : len(call) + 1].tolist() == [1] * len(call) + [0]]
    assert called, "no sample's first turn is the call, ended right after </tool_call>"
    for row in called:
        span = slice(len(call), len(call) + len(inserted))
        assert responses[row, span].tolist() == inserted and mask[row, span].sum() == 0 and real[row, span].all()
        assert mask[row, len(call) + len(inserted)] == 1  # the model's next turn
        assert log_probs[row, span].abs().sum() == 0
    assert out.non_tensor_batch["num_tool_calls"][called[0]] == 1
    sampled = mask.bool()
    assert (log_probs[sampled] < 0).all() and log_probs[~sampled].abs().sum() == 0
    with torch.no_grad():
        reference = forward_log_probs(model, out.batch, temperature=1.0)
    torch.testing.assert_close(log_probs[sampled], reference[sampled], rtol=0, atol=atol)


def fake_log_prob(token: int) -> float:
    """The log-prob the scripted engine reports for a sampled ``token`` (checkable afterwards)."""
    return -((token % 97) + 1) / 100.0


class ScriptedEngine:
    """A rollout engine that "samples" scripted ids: one script per prompt (keyed by the prompt's
    ids), one list of ids per model turn. Follows the engine protocol, ``meta_info["response_length"]``
    and ``meta_info["stop"]`` included: a turn is cut after the token that completes a stop string
    (the rest of that turn is dropped) or after ``response_length`` ids (the rest comes next call).

    Attributes:
        calls: ``(rows, response_length, stop)`` of every call, in order.
        widths: the prompt width (``input_ids.shape[1]``) of every call, in order.
    """

    def __init__(self, tokenizer, scripts: dict[tuple[int, ...], list[list[int]]], response_length: int = 64) -> None:
        self.tokenizer = tokenizer
        self.response_length = response_length
        self.turns = {key: [list(turn) for turn in turns] for key, turns in scripts.items()}
        self.pending: dict[tuple[int, ...], list[int]] = {}
        self.calls: list[tuple[int, int, list[str]]] = []
        self.widths: list[int] = []
        self.weights_version = 0

    def _script_of(self, context: list[int]) -> tuple[int, ...]:
        keys = [key for key in self.turns if tuple(context[: len(key)]) == key]
        assert len(keys) == 1, f"no single script for context {context[:20]}..."
        return keys[0]

    def _emit(self, key: tuple[int, ...], length: int, stop: list[str]) -> list[int]:
        if not self.pending.get(key):
            self.pending[key] = self.turns[key].pop(0)
        pending, out = self.pending[key], []
        while pending and len(out) < length:
            out.append(pending.pop(0))
            if stop and any(s in self.tokenizer.decode(out) for s in stop):
                pending.clear()
        return out

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        length, stop = int(meta.get("response_length", self.response_length)), list(meta.get("stop", []))
        self.calls.append((len(prompts), length, stop))
        self.widths.append(int(prompts.batch["input_ids"].shape[1]))
        pad = self.tokenizer.pad_token_id
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        responses = torch.full((len(prompts), length), pad, dtype=torch.long)
        response_mask = torch.zeros(len(prompts), length, dtype=torch.long)
        log_probs = torch.zeros(len(prompts), length)
        for row in range(len(prompts)):
            out = self._emit(self._script_of(ids[row][mask[row].bool()].tolist()), length, stop)
            responses[row, : len(out)] = torch.tensor(out)
            response_mask[row, : len(out)] = 1
            log_probs[row, : len(out)] = torch.tensor([fake_log_prob(t) for t in out])
        attention = torch.cat([mask, response_mask], dim=1)
        tensors = {"prompts": ids, "responses": responses, "input_ids": torch.cat([ids, responses], dim=1),
                   "attention_mask": attention, "position_ids": compute_position_ids(attention),
                   "response_mask": response_mask, "rollout_log_probs": log_probs,
                   "response_versions": torch.where(response_mask.bool(), self.weights_version, -1)}
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(prompts.non_tensor_batch),
                                   meta_info={"rollout_log_prob_temperature": 1.0, "rollout_log_probs_exact": True,
                                              "rollout_weights_version": self.weights_version})


def rollout_config(response_length: int = 64, prompt_length: int = 64, **multi_turn: Any):
    """The ``rollout`` section as a DictConfig with the given lengths and ``multi_turn`` settings."""
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.response_length, cfg.prompt_length = response_length, prompt_length
    for key, value in multi_turn.items():
        cfg.multi_turn[key] = value
    return cfg


def prompt_batch(tokenizer, prompt_ids: list[list[int]], non_tensors: dict | None = None, **meta) -> DataProto:
    """Left-padded prompts as an engine input."""
    ids, mask = left_pad(prompt_ids, max(len(p) for p in prompt_ids), tokenizer.pad_token_id)
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": compute_position_ids(mask)}
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors or {}, meta_info=meta)


def write_tools_file(path: Path, *entries: str, configs: dict[str, str] | None = None) -> Path:
    """A tools YAML file with the given class names (``configs``: class name -> YAML flow mapping)."""
    configs = configs or {}
    lines = ["tools:"] + [f"  - class_name: {name}\n    config: {configs.get(name, '{}')}" for name in entries]
    path.write_text("\n".join(lines) + "\n")
    return path


class EchoTool(BaseTool):
    """``c(text)``: returns its config's ``reply`` (default: the ``text`` argument)."""

    @classmethod
    def default_schema(cls):
        return function_schema("c", "echo", {"text": {"type": "string"}}, [])

    def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(str(self.config.get("reply", parameters.get("text", "2")))), 0.0, {}


class SleepyTool(BaseTool):
    """``sleep()``: sleeps ``config["seconds"]`` before answering (a hung tool when long). Records
    its life cycle in ``events``: ``(create | execute-start | execute-end | release, instance id)``."""

    events: list[tuple[str, str]] = []

    @classmethod
    def default_schema(cls):
        return function_schema("sleep", "sleeps", {}, [])

    def create(self, instance_id=None, **kwargs):
        instance = super().create(instance_id)
        SleepyTool.events.append(("create", instance))
        return instance

    def execute(self, instance_id, parameters, **kwargs):
        SleepyTool.events.append(("execute-start", instance_id))
        time.sleep(float(self.config.get("seconds", 30)))
        SleepyTool.events.append(("execute-end", instance_id))
        return ToolResponse("woke up"), 0.0, {}

    def release(self, instance_id, **kwargs):
        SleepyTool.events.append(("release", instance_id))


class FailingTool(BaseTool):
    """``fail()``: raises."""

    @classmethod
    def default_schema(cls):
        return function_schema("fail", "fails", {}, [])

    def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("disk on fire")


class CountingTool(BaseTool):
    """``count()``: counts calls per trajectory; step reward 0.5 per call, final reward = the count,
    metrics ``{"count": the count, "note": a string}``. Records the life cycle (``created``,
    ``released``, ``create_kwargs``) across all instances."""

    created: list[str] = []
    released: list[str] = []
    create_kwargs: list[dict] = []

    def __init__(self, config=None, tool_schema=None):
        super().__init__(config, tool_schema)
        self.calls: dict[str, int] = {}
        self.lock = threading.Lock()

    @classmethod
    def default_schema(cls):
        return function_schema("count", "counts", {}, [])

    def create(self, instance_id=None, **kwargs):
        instance = super().create(instance_id)
        with self.lock:
            CountingTool.created.append(instance)
            CountingTool.create_kwargs.append(dict(kwargs))
        return instance

    def execute(self, instance_id, parameters, **kwargs):
        self.calls[instance_id] = self.calls.get(instance_id, 0) + 1
        return ToolResponse(str(self.calls[instance_id])), 0.5, {"count": self.calls[instance_id], "note": "n/a"}

    def calc_reward(self, instance_id, **kwargs):
        return float(self.calls[instance_id])

    def release(self, instance_id, **kwargs):
        with self.lock:
            CountingTool.released.append(instance_id)


def agent_overrides(model_dir: Path, data: dict[str, Path], run_dir: Path, **extra: Any) -> list[str]:
    """Command-line overrides of a 2-step GRPO run of the tiny model with the ``env_agent`` loop and
    the ``retry`` environment (``wrong`` feedback, -0.5 per wrong turn, at most 3 turns); ``extra``
    replaces or adds keys."""
    base = {
        "actor_rollout_ref.model.path": str(model_dir),
        "data.train_files": str(data["train"]), "data.val_files": str(data["val"]),
        "data.max_prompt_length": 32, "data.max_response_length": 48, "data.train_batch_size": 2,
        "actor_rollout_ref.rollout.n": 2, "actor_rollout_ref.actor.ppo_mini_batch_size": 2,
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4, "actor_rollout_ref.actor.optim.lr": 1e-3,
        "actor_rollout_ref.rollout.agent.default_agent_loop": "env_agent",
        "actor_rollout_ref.rollout.multi_turn.env_name": "retry",
        "actor_rollout_ref.rollout.multi_turn.env_kwargs": "{feedback: wrong, wrong_reward: -0.5}",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": 3,
        "actor_rollout_ref.rollout.val_kwargs.do_sample": True, "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
        "reward_model.num_examine": 0, "trainer.backend": "local", "trainer.device": "cpu",
        "trainer.n_gpus_per_node": 1, "trainer.total_training_steps": 2, "trainer.val_before_train": True,
        "trainer.default_local_dir": str(run_dir), "trainer.progress_bar": False, "trainer.logger": "[console,jsonl]",
        "trainer.seed": 7, "trainer.export_hf": False, "trainer.call_timeout_s": 300,
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


CALCULATOR_SCHEMA = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression and return its value.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


def calculator_agent(client, row: dict) -> str:
    """An agent written with the plain ``openai`` client (the ``openai_agent`` loop's
    ``run(client, row)``): it asks the model, runs every calculator call it makes, sends the results
    back, and returns the model's final text."""
    from rlvr.agent.tools.calculator import evaluate_expression

    messages = [dict(m) for m in row["raw_prompt"]]
    for _ in range(4):
        reply = client.chat.completions.create(model="rlvr-policy", messages=messages, tools=[CALCULATOR_SCHEMA])
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            expression = json.loads(call.function.arguments)["expression"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": evaluate_expression(expression)})
    return ""


def failing_agent(client, row: dict) -> str:
    """An agent that asks the model once and then raises (the loop counts it and keeps the turn)."""
    client.chat.completions.create(model="rlvr-policy", messages=list(row["raw_prompt"]))
    raise RuntimeError("the agent broke")
