"""Turn-by-turn generation through the rollout-engine protocol, batched over every running sample.

One round: every trajectory that is still running becomes a row of one engine call (its prompt and
response so far, left-padded) with ``meta_info["response_length"]`` = the most tokens any of them
may still add and ``meta_info["stop"]`` = the loop's stop strings. The sampled ids and their
log-probs are appended as they are. A row whose turn ended (EOS, a stop string) is handed to the
loop's *responder* (tools, an environment), whose reply decides: the trajectory is done, or the
reply's messages are inserted (ids from :class:`~rlvr.agent.chat.ChatTurns`, mask 0; a reply's
images join the trajectory's image inputs) and the row runs again in the next round. A row cut
short only because the round's window was full continues its turn in the next round without an
insertion.

Limits: ``multi_turn.max_assistant_turns`` model turns, ``rollout.response_length`` response tokens
over all turns (sampled and inserted), and, applied by the loops, ``multi_turn.max_tool_response_tokens``
per inserted observation. Each round's prompt plus new tokens stays within ``rollout.prompt_length +
rollout.response_length`` (what a static KV cache holds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase, ProcessorMixin

from rlvr.agent.chat import ChatTurns
from rlvr.agent.trajectory import Trajectory, TrajectoryBatch
from rlvr.protocol import DataProto
from rlvr.workers.rollout.base import RolloutEngine

__all__ = ["Reply", "Responder", "TurnLimits", "TurnDriver", "ENGINE_META_KEYS"]

ENGINE_META_KEYS = ("rollout_log_prob_temperature", "rollout_log_probs_exact", "rollout_weights_version")
"""Engine output ``meta_info`` keys passed on to the agent loop's output."""


@dataclass
class Reply:
    """The answer to one finished model turn.

    Attributes:
        messages: chat messages to insert before the next model turn (ignored when ``done``).
        reward: reward for this turn, put on its last sampled token.
        done: the trajectory ends here (the model answered, the environment is finished).
        images: images (``PIL.Image``) of the messages, one per ``<image>`` in their contents, in
            order (a vision-language model only).
    """

    messages: list[dict[str, str]] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    images: list[Any] = field(default_factory=list)


Responder = Callable[[list[int], list[Trajectory], list[str], list[bool]], list[Reply]]
"""``respond(rows, trajectories, turn_texts, may_continue) -> one Reply per row``: ``rows`` are the
batch indices, ``turn_texts`` the decoded text of each finished turn, ``may_continue[i]`` False when
the turn limit is reached (a reply that is not ``done`` then ends the trajectory as ``turn_limit``)."""


@dataclass(frozen=True)
class TurnLimits:
    """Limits of a multi-turn rollout (see the module docstring); a turn limit of None is no limit."""

    response_length: int
    prompt_length: int
    max_assistant_turns: int | None
    max_user_turns: int | None = None

    @classmethod
    def of(cls, rollout_config: Any) -> TurnLimits:
        """The limits of the ``actor_rollout_ref.rollout`` section (lengths and ``multi_turn``)."""
        settings = rollout_config.multi_turn
        return cls(int(rollout_config.response_length), int(rollout_config.prompt_length),
                   settings.max_assistant_turns, settings.max_user_turns)

    def may_continue(self, item: Trajectory) -> bool:
        """Whether another model turn may follow the trajectory's last one (both turn limits)."""
        return ((self.max_assistant_turns is None or item.assistant_turns < self.max_assistant_turns)
                and (self.max_user_turns is None or item.counts.get("user_turns", 0) < self.max_user_turns))


class TurnDriver:
    """Runs the rounds of a multi-turn rollout (see the module docstring).

    Args:
        tokenizer: decodes finished turns for the responder and renders inserted messages.
        limits: the rollout's limits.
        eos_ids: ids that end a model turn.
        pad_id: padding id of the engine inputs and the output.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, limits: TurnLimits, eos_ids: Sequence[int],
                 pad_id: int, processor: ProcessorMixin | None = None) -> None:
        self.tokenizer = tokenizer
        self.limits = limits
        self.eos_ids = {int(i) for i in eos_ids}
        self.pad_id = int(pad_id)
        self.chat = ChatTurns(tokenizer, sorted(self.eos_ids), processor)

    def run(self, engine: RolloutEngine, prompts: DataProto, respond: Responder, stop: list[str]
            ) -> tuple[TrajectoryBatch, dict]:
        """Generate until every trajectory is done (one row per sample: expand ``meta_info["n"]``
        first); returns them and the engine's output ``meta_info`` (log-prob temperature and exactness).

        Raises:
            ValueError: a prompt is longer than ``limits.prompt_length`` (the engine's context window
                holds ``prompt_length + response_length`` tokens).
        """
        batch = TrajectoryBatch(prompts, self.pad_id)
        meta = dict(prompts.meta_info)
        longest = max(range(len(batch.items)), key=lambda i: len(batch.items[i].prompt_ids))
        if len(batch.items[longest].prompt_ids) > self.limits.prompt_length:
            raise ValueError(f"the prompt of sample {longest} has {len(batch.items[longest].prompt_ids)} tokens, more "
                             f"than rollout.prompt_length={self.limits.prompt_length} (data.max_prompt_length)")
        max_context = self.limits.prompt_length + self.limits.response_length
        engine_meta: dict = {}
        while rows := batch.running():
            budget = max(self.limits.response_length - len(batch.items[i].response_ids) for i in rows)
            length = min(budget, max_context - batch.context_width(rows))
            call_meta = {**meta, "response_length": length, "stop": list(stop)}
            output = engine.generate_sequences(batch.context_batch(rows, call_meta))
            engine_meta = {key: output.meta_info[key] for key in ENGINE_META_KEYS if key in output.meta_info}
            finished = self._append(batch, rows, output, length, stop)
            if finished:
                self._respond(batch, finished, respond)
        return batch, engine_meta

    def _append(self, batch: TrajectoryBatch, rows: list[int], output: DataProto, length: int,
                stop: list[str]) -> list[int]:
        """Append each row's sampled ids (at most what its budget allows: the round asked for the
        largest budget of all rows); returns the rows whose turn ended."""
        counts = output.batch["response_mask"].sum(-1).tolist()
        finished = []
        for j, i in enumerate(rows):
            item, n = batch.items[i], int(counts[j])
            keep = min(n, self.limits.response_length - len(item.response_ids))
            if item.turn_start == len(item.response_ids):  # a new model turn (not a continued one)
                item.assistant_turns += 1
            ids = output.batch["responses"][j, :keep].tolist()
            item.add_sampled(ids, output.batch["rollout_log_probs"][j, :keep].tolist(),
                             output.batch["response_versions"][j, :keep].tolist())
            if keep == n and (n < length or ids[-1] in self.eos_ids or self._ends_with_stop(ids, stop)):
                finished.append(i)
            elif len(item.response_ids) >= self.limits.response_length:
                item.stop_reason = "response_budget"
        return finished

    def _ends_with_stop(self, ids: list[int], stop: list[str]) -> bool:
        if not stop:
            return False
        tail = self.tokenizer.decode(ids[-(max(len(s) for s in stop) + 2):], skip_special_tokens=False)
        return any(s in tail for s in stop)

    def _respond(self, batch: TrajectoryBatch, rows: list[int], respond: Responder) -> None:
        """Ask the responder about the finished turns; end the trajectories or insert the replies."""
        items = [batch.items[i] for i in rows]
        texts = self.tokenizer.batch_decode([item.turn_ids() for item in items], skip_special_tokens=True)
        may_continue = [self.limits.may_continue(item) for item in items]
        replies = respond(rows, items, texts, may_continue)
        for item, reply, more in zip(items, replies, may_continue):
            item.reward_last_token(reply.reward)
            if reply.done:
                item.stop_reason = "answered"
            elif not more:
                item.stop_reason = "turn_limit"
            else:
                inserted, image_inputs = self._inserted(reply, item.response_ids[-1])
                if len(item.response_ids) + len(inserted) >= self.limits.response_length:
                    item.stop_reason = "response_budget"  # no room left for the model to answer
                else:
                    item.add_inserted(inserted)
                    item.add_images(image_inputs, reply.images)
                    item.count("observation_tokens", len(inserted))
                    item.count("user_turns")

    def _inserted(self, reply: Reply, last_token: int) -> tuple[list[int], dict]:
        """Ids of a reply's messages after the turn ending in ``last_token``, and their images' inputs."""
        if not reply.images:
            return self.chat.after_turn(reply.messages, last_token=last_token), {}
        return self.chat.after_turn_with_images(reply.messages, reply.images, last_token=last_token)
