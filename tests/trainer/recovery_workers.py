"""Workers of the recovery tests: a stateless scorer with the reward function that calls its group
(a stateless group restarts alone), and a worker whose ranks fail the way a collective fails when
a peer dies."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.single_controller import Dispatch, Worker, register


class TokenScoreWorker(Worker):
    """Scores each response by the share of its tokens with an even id (deterministic, no state)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def score(self, data: DataProto) -> DataProto:
        """``scores [batch]``: even-id tokens / valid tokens of each response."""
        mask = data.batch["response_mask"].float()
        even = (data.batch["responses"] % 2 == 0).float() * mask
        return DataProto.from_dict(tensors={"scores": even.sum(-1) / mask.sum(-1).clamp(min=1)})


class ShareOfEvenTokens:
    """A reward function whose scores come from a worker group of ``TokenScoreWorker`` (set ``group``)."""

    group: Any = None

    def __call__(self, data: DataProto, return_dict: bool = False) -> dict[str, Any]:
        scores = self.group.score(data).batch["scores"]
        mask = data.batch["response_mask"]
        reward = torch.zeros(mask.shape, dtype=torch.float32)
        last = (mask.sum(-1) - 1).clamp(min=0)
        reward[torch.arange(len(scores)), last] = scores
        return {"reward_tensor": reward, "reward_extra_info": {"acc": (scores > 0.5).float().tolist()}}


class CollectivePeer(Worker):
    """Rank 0 fails at once (as a collective fails when its peer goes away), rank 1 dies a second later."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_then_die(self) -> None:
        if self.rank == 0:
            raise RuntimeError("Connection closed by peer")
        time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGKILL)


class SignalOnCall:
    """A reward function that sends ``signals`` to this process during its ``call``-th call, then
    scores like ``reward_fn`` (a stop signal in the middle of a step)."""

    def __init__(self, reward_fn: Any, call: int, signals: tuple[int, ...]) -> None:
        self.reward_fn, self.call, self.signals, self.calls = reward_fn, call, signals, 0

    def __call__(self, data: DataProto, return_dict: bool = False) -> Any:
        self.calls += 1
        if self.calls == self.call:
            for signum in self.signals:
                os.kill(os.getpid(), signum)
                time.sleep(0.1)  # the handler runs between bytecodes of this thread
        return self.reward_fn(data, return_dict=return_dict)


class RaiseWhilePeerHangs(Worker):
    """Rank 1 raises at once; rank 0 never returns (a peer left waiting in a collective)."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def raise_while_peer_hangs(self) -> None:
        if self.rank == 1:
            raise RuntimeError("gloo: the collective failed on this rank")
        time.sleep(3600)
