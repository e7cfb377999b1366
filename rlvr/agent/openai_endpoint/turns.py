"""Model turns for the endpoint's sessions: concurrent requests batched into engine calls.

Agents run in many threads at once, and the in-process engines are not thread-safe, so every
request's turn goes through one :class:`TurnBatcher`: its thread takes every turn waiting, groups
them by stop strings, and runs one engine call per group (one row per session, left-padded; the
call's ``response_length`` is the largest any of them may use, and each row keeps at most its own
limit, as :class:`~rlvr.agent.multi_turn.TurnDriver` does). A server engine spreads the rows over
its replicas, each session to its own replica.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from rlvr.agent.trajectory import left_pad
from rlvr.protocol import DataProto
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout.base import SESSION_KEY, RolloutEngine

__all__ = ["TurnRequest", "TurnResult", "TurnBatcher", "ENGINE_META_KEYS"]

ENGINE_META_KEYS = ("rollout_log_prob_temperature", "rollout_log_probs_exact", "rollout_weights_version")


@dataclass(frozen=True)
class TurnRequest:
    """One model turn: the context ids, the most new tokens, the stop strings, the session."""

    context: list[int]
    max_tokens: int
    stop: tuple[str, ...]
    session_id: str


@dataclass(frozen=True)
class TurnResult:
    """The sampled ids of one turn (at most its ``max_tokens``), their log-probs and weight versions."""

    ids: list[int]
    log_probs: list[float]
    versions: list[int]


class TurnBatcher:
    """Batches turns into engine calls on one thread (see the module docstring).

    Args:
        engine: the rollout engine.
        meta_info: the ``meta_info`` of every engine call (sampling settings, EOS and pad ids).
        pad_id: padding id of the engine inputs.
    """

    def __init__(self, engine: RolloutEngine, meta_info: dict, pad_id: int) -> None:
        self.engine, self.meta_info, self.pad_id = engine, dict(meta_info), pad_id
        self.engine_meta: dict = {}
        self.error: BaseException | None = None
        """The first exception of an engine call (the loop raises it after the agents ran: an engine
        failure, such as a stale replica, must stop the step, not become an agent's error)."""
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="rlvr-endpoint-turns", daemon=True)
        self._thread.start()

    def submit(self, request: TurnRequest) -> Future:
        """Queue a turn; the future gives its :class:`TurnResult` (or the engine's exception)."""
        future: Future = Future()
        self._queue.put((request, future))
        return future

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            waiting = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                waiting.append(item)
            groups: dict[tuple[str, ...], list] = {}
            for request, future in waiting:
                groups.setdefault(request.stop, []).append((request, future))
            for stop, group in groups.items():
                self._run(list(stop), group)

    def _run(self, stop: list[str], group: list) -> None:
        requests = [request for request, _ in group]
        try:
            results = self._generate(requests, stop)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting request threads
            self.error = self.error or err
            for _, future in group:
                future.set_exception(err)
            return
        for (_, future), result in zip(group, results):
            future.set_result(result)

    def _generate(self, requests: list[TurnRequest], stop: list[str]) -> list[TurnResult]:
        length = max(r.max_tokens for r in requests)
        ids, mask = left_pad([r.context for r in requests], max(len(r.context) for r in requests), self.pad_id)
        batch = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": mask, "position_ids": compute_position_ids(mask)},
            non_tensors={SESSION_KEY: np.array([r.session_id for r in requests], dtype=object)},
            meta_info={**self.meta_info, "response_length": length, "stop": stop})
        output = self.engine.generate_sequences(batch)
        self.engine_meta = {key: output.meta_info[key] for key in ENGINE_META_KEYS if key in output.meta_info}
        counts = output.batch["response_mask"].sum(-1).tolist()
        versions = output.batch["response_versions"] if "response_versions" in output.batch.keys() else None
        results = []
        for row, request in enumerate(requests):
            keep = min(int(counts[row]), request.max_tokens)
            sampled = output.batch["responses"][row, :keep].tolist()
            row_versions = versions[row, :keep].tolist() if versions is not None else \
                [int(self.engine_meta.get("rollout_weights_version", -1))] * keep
            results.append(TurnResult(sampled, output.batch["rollout_log_probs"][row, :keep].tolist(), row_versions))
        return results
