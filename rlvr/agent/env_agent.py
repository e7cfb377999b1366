"""Gym-style environments and the ``env_agent`` loop: multi-turn interaction without tools.

An environment is made per trajectory (``multi_turn.env_name`` from the registry, with
``multi_turn.env_kwargs``) and answers the model turn by turn::

    observation = env.reset(row)                           # row: the sample's non-tensor fields
    observation, reward, done, info = env.step(turn_text)  # after every model turn

``reset`` returns the task the model sees first: the content of the prompt's last user message
(returning that content unchanged, or None, keeps the prompt's ids; anything else re-renders the
prompt from the row's ``raw_prompt``, which must still fit ``rollout.prompt_length`` tokens, else
the rollout fails naming the environment). After each model turn ``step`` gets the turn's text; unless
``done``, its observation is inserted as a ``user`` message (cut to
``multi_turn.max_tool_response_tokens`` tokens) and the model answers again, up to
``multi_turn.max_assistant_turns`` turns. Each ``reward`` is put on the last sampled token of the
turn it answers (``turn_scores``), so per-turn rewards and a final reward both reach the trainer,
which adds them to the reward manager's scores. Numeric ``info`` values become ``agent/env/<key>``
metrics; ``agent/env_responses_truncated`` counts the observations that were cut. Environment calls
run concurrently for all samples, bounded by ``multi_turn.tool_timeout_s``; an environment that
raises or hangs fails the rollout with a message naming it and the sample.

An observation may show images to a vision-language model: ``{"text": "Look again: <image>",
"images": [image]}`` (one ``<image>`` where each image goes, or none: the images then come before
the text; an image in any form a data row may hold it, see :mod:`rlvr.utils.images`). The images are
processed by the model's processor and join the conversation's ``multi_modal_inputs``, so the model
sees them in the next turn and in training; images after the token limit's cut are dropped with
the text.

Built in: ``retry`` - checks each answer with the row's reward scorer and says "try again" until
it is right (:class:`RetryEnvironment`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rlvr.agent.chat import render_prompt_ids
from rlvr.agent.loop import expand_samples, register_agent_loop
from rlvr.agent.metrics import trajectory_metrics
from rlvr.agent.multi_turn import Reply, TurnDriver, TurnLimits
from rlvr.agent.tool_agent import truncate_text
from rlvr.agent.tools.executor import run_with_timeout
from rlvr.agent.trajectory import Trajectory
from rlvr.protocol import DataProto
from rlvr.utils.images import load_image
from rlvr.utils.multimodal import IMAGE_PLACEHOLDER
from rlvr.utils.registry import Registry
from rlvr.utils.torch_functional import compute_position_ids, left_pad
from rlvr.workers.rollout.base import RolloutEngine, tokenizer_ids

__all__ = ["Environment", "ENVIRONMENTS", "register_environment", "get_environment", "RetryEnvironment",
           "EnvAgentLoop", "observation_parts"]


class Environment(Protocol):
    """A text environment, one instance per trajectory (see the module docstring)."""

    def reset(self, row: dict[str, Any]) -> str | None:
        """Start an episode for the sample ``row``; returns the first observation (the task)."""
        ...

    def step(self, text: str) -> tuple[str | dict[str, Any], float, bool, dict[str, Any]]:
        """React to one model turn: ``(observation, reward, done, info)``; the observation is a string
        or ``{"text": ..., "images": [...]}``."""
        ...


EnvironmentFactory = Callable[..., Environment]
ENVIRONMENTS: Registry[EnvironmentFactory] = Registry("environment")


def register_environment(name: str) -> Callable[[EnvironmentFactory], EnvironmentFactory]:
    """Decorator registering an environment class (built with ``multi_turn.env_kwargs``) under ``name``."""
    return ENVIRONMENTS.register(name)


def get_environment(name: str) -> EnvironmentFactory:
    """The environment registered under ``name``; an unknown name raises ``KeyError`` listing the valid ones."""
    return ENVIRONMENTS.get(name)


def last_user_content(row: dict[str, Any]) -> str | None:
    """Content of the last user message of the row's ``raw_prompt`` (None without one)."""
    users = [m for m in row.get("raw_prompt") or [] if m.get("role") == "user"]
    return str(users[-1]["content"]) if users else None


@register_environment("retry")
class RetryEnvironment:
    """"Wrong, try again": each answer is checked with the reward scorer of the row's data source.

    Args:
        feedback: the observation after a wrong answer.
        correct_reward: reward of the turn that gets it right.
        wrong_reward: reward of each wrong turn (a small penalty makes the model get it right sooner).

    The episode ends at the first answer whose score reaches 1 (or whose ``acc`` is 1).
    """

    def __init__(self, feedback: str = "That is not correct. Try again.", correct_reward: float = 0.0,
                 wrong_reward: float = -0.1) -> None:
        self.feedback, self.correct_reward, self.wrong_reward = feedback, float(correct_reward), float(wrong_reward)
        self.row: dict[str, Any] = {}

    def reset(self, row: dict[str, Any]) -> str | None:
        self.row = row
        return last_user_content(row)

    def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
        from rlvr.reward.scorers import default_compute_score

        result = default_compute_score(self.row["data_source"], text, self.row["reward_model"]["ground_truth"],
                                       dict(self.row.get("extra_info") or {}))
        score = result.get("acc", result["score"]) if isinstance(result, dict) else (result or 0.0)
        correct = float(score) >= 1.0
        reward = self.correct_reward if correct else self.wrong_reward
        return ("" if correct else self.feedback), reward, correct, {"correct": float(correct)}


ENV_COUNTERS = ("env_reward", "env_responses_truncated", "observation_tokens")
"""The counters the environment loop reports every step (see the module docstring)."""


def observation_parts(observation: Any) -> tuple[str, list[Any]]:
    """``(text, images)`` of an observation: a string, or ``{"text": ..., "images": [...]}`` whose text
    holds one ``<image>`` per image (none: the images are put before the text). The images are read
    with :func:`rlvr.utils.images.load_image`.

    Raises:
        ValueError: a dict without ``text``, or a text with another number of ``<image>`` than images.
    """
    if not isinstance(observation, dict):
        return str(observation), []
    if "text" not in observation:
        raise ValueError(f"an observation dict needs a 'text' entry (and 'images'), got the keys {sorted(observation)}")
    text, entries = str(observation["text"]), list(observation.get("images") or [])
    if entries and IMAGE_PLACEHOLDER not in text:
        text = IMAGE_PLACEHOLDER * len(entries) + text
    if text.count(IMAGE_PLACEHOLDER) != len(entries):
        raise ValueError(f"an observation's text has {text.count(IMAGE_PLACEHOLDER)} {IMAGE_PLACEHOLDER} "
                         f"placeholder(s) for {len(entries)} image(s); put one where each image goes")
    return text, [load_image(entry) for entry in entries]


def _rows(prompts: DataProto) -> list[dict[str, Any]]:
    """Each row's non-tensor fields as a dict."""
    return [{key: value[i] for key, value in prompts.non_tensor_batch.items()} for i in range(len(prompts))]


@register_agent_loop("env_agent")
class EnvAgentLoop:
    """Multi-turn rollouts against an environment (see the module docstring).

    Args:
        rollout_config: the ``actor_rollout_ref.rollout`` section (``multi_turn`` settings, lengths).
        tokenizer: the policy's tokenizer.
        processor: the model's multimodal processor (observations with images), None for a text model.

    Raises:
        ValueError: ``multi_turn.env_name`` is not set; KeyError: it is not registered.
    """

    def __init__(self, rollout_config: Any, tokenizer: PreTrainedTokenizerBase,
                 processor: ProcessorMixin | None = None) -> None:
        settings = rollout_config.multi_turn
        if not settings.env_name:
            raise ValueError("the env_agent loop needs actor_rollout_ref.rollout.multi_turn.env_name "
                             f"(one of: {', '.join(ENVIRONMENTS.names())})")
        self.settings = settings
        self.factory = get_environment(settings.env_name)
        self.tokenizer = tokenizer
        eos_ids, self.pad_id = tokenizer_ids(tokenizer)
        limits = TurnLimits.of(rollout_config)
        self.driver = TurnDriver(tokenizer, limits, eos_ids, self.pad_id, processor)

    def _call_all(self, functions: list[Callable[[], Any]], rows: list[int], what: str) -> list[Any]:
        """Run environment calls concurrently within the time limit; a failure raises naming the sample."""
        outcomes = run_with_timeout(functions, float(self.settings.tool_timeout_s), "env")
        for row, outcome in zip(rows, outcomes):
            if outcome.status != "ok":
                cause = "timed out" if outcome.status == "timeout" else f"raised {outcome.error!r}"
                raise RuntimeError(f"environment {self.settings.env_name!r} {what} for sample {row} {cause} "
                                   f"(limit multi_turn.tool_timeout_s={self.settings.tool_timeout_s:g} s)")
        return [outcome.value for outcome in outcomes]

    def generate_sequences(self, engine: RolloutEngine, prompts: DataProto) -> DataProto:
        prompts = expand_samples(prompts)
        rows = _rows(prompts)
        envs = [self.factory(**dict(self.settings.env_kwargs)) for _ in rows]
        indices = list(range(len(rows)))
        firsts = self._call_all([lambda e=e, r=r: e.reset(r) for e, r in zip(envs, rows)], indices, "reset")
        prompts = self._with_first_observations(prompts, rows, firsts)

        def respond(batch_rows: list[int], items: list[Trajectory], texts: list[str], may_continue: list[bool]
                    ) -> list[Reply]:
            results = self._call_all([lambda e=envs[r], t=t: e.step(t) for r, t in zip(batch_rows, texts)],
                                     batch_rows, "step")
            replies = []
            for item, (observation, reward, done, info) in zip(items, results):
                item.count("env_reward", float(reward))
                for key, value in info.items():
                    if isinstance(value, (int, float)):
                        item.count(f"env/{key}", float(value))
                content, images = observation_parts(observation)
                content, truncated = truncate_text(self.tokenizer, content, int(self.settings.max_tool_response_tokens),
                                                   str(self.settings.tool_response_truncate_side))
                item.count("env_responses_truncated", float(truncated))
                images = images[:content.count(IMAGE_PLACEHOLDER)]  # those cut off with the text are dropped
                replies.append(Reply([{"role": "user", "content": content}], float(reward), bool(done), images))
            return replies

        batch, engine_meta = self.driver.run(engine, prompts, respond, [])
        meta = {**engine_meta, "metrics": trajectory_metrics(batch, ENV_COUNTERS)}
        return batch.to_output(prompts, self.driver.limits.response_length, meta)

    def _with_first_observations(self, prompts: DataProto, rows: list[dict[str, Any]], firsts: list[Any]) -> DataProto:
        """``prompts`` with the prompt of every row whose first observation is new re-rendered.

        Raises:
            ValueError: a re-rendered prompt is longer than ``rollout.prompt_length`` (what the
                engine's context window holds besides the response).
        """
        changed = [i for i, (row, first) in enumerate(zip(rows, firsts))
                   if first is not None and str(first) != last_user_content(row)]
        if not changed:
            return prompts
        ids = [row[mask.bool()].tolist() for row, mask in zip(prompts.batch["input_ids"], prompts.batch["attention_mask"])]
        for i in changed:
            messages = list(rows[i].get("raw_prompt") or [])
            if not messages or messages[-1].get("role") != "user":
                raise ValueError(f"environment {self.settings.env_name!r} gave sample {i} a new first observation, "
                                 "but the row has no raw_prompt ending with a user message to put it in")
            ids[i] = render_prompt_ids(self.tokenizer, [*messages[:-1], {"role": "user", "content": str(firsts[i])}])
            if len(ids[i]) > self.driver.limits.prompt_length:
                raise ValueError(f"environment {self.settings.env_name!r} made the prompt of sample {i} "
                                 f"{len(ids[i])} tokens long with its first observation, more than "
                                 f"rollout.prompt_length={self.driver.limits.prompt_length} "
                                 "(data.max_prompt_length); shorten what reset returns or raise data.max_prompt_length")
        input_ids, mask = left_pad(ids, max(len(row) for row in ids), self.pad_id)
        tensors = {"input_ids": input_ids, "attention_mask": mask, "position_ids": compute_position_ids(mask)}
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(prompts.non_tensor_batch),
                                   meta_info=dict(prompts.meta_info))
