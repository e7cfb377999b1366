"""What the tests of the two weight handles share (shared memory, CUDA IPC): a policy's weights of
every dtype, an engine that records what it loads, and the check that the weight inbox reads a
handle at once when idle and copies it out while a generation runs."""

from __future__ import annotations

import threading

import torch

from rlvr.workers.rollout.partial import WeightInbox


def weights(scale: float) -> dict[str, torch.Tensor]:
    """Odd sizes and every dtype a policy holds (the offsets must stay aligned), an empty tensor and a scalar."""
    generator = torch.Generator().manual_seed(0)
    return {"embed.weight": scale * torch.randn(7, 5, generator=generator),
            "norm.weight": (scale * torch.randn(3, generator=generator)).to(torch.bfloat16),
            "steps": torch.tensor(11, dtype=torch.int64), "empty": torch.empty(0, 4),
            "head.bias": (scale * torch.randn(9, generator=generator)).to(torch.float16)}


class RecordingEngine:
    """Records the first parameter of every load (the inbox's engine)."""

    def __init__(self) -> None:
        self.loaded, self.weights_version = [], 0

    def wake_up(self) -> None:
        pass

    def sleep(self) -> None:
        pass

    def update_weights(self, weights, version: int) -> None:
        self.loaded.append((version, weights["embed.weight"].clone()))
        self.weights_version = version


def check_inbox_reads_idle_and_copies_out_while_generating(writer) -> None:
    """``writer`` (``pack(weights) -> handle``): a handle delivered during a generation is copied out
    before the trainer's next push overwrites its memory, and loaded when the generation ends; one
    delivered while idle is read at once."""
    engine = RecordingEngine()
    inbox = WeightInbox(engine, partial_rollout=False)
    inside, release = threading.Event(), threading.Event()

    def generate():
        with inbox.generation(validate=False):
            inside.set()
            release.wait(10)

    thread = threading.Thread(target=generate)
    thread.start()
    inside.wait(10)
    assert inbox.deliver(writer.pack(weights(1.0)), version=1) == {}  # generating: copied out, waits
    writer.pack(weights(5.0))  # the trainer's next push overwrites the memory
    release.set()
    thread.join(10)
    assert [v for v, _ in engine.loaded] == [1] and torch.equal(engine.loaded[0][1], weights(1.0)["embed.weight"])
    inbox.deliver(writer.pack(weights(2.0)), version=2)  # idle: read at once
    assert engine.loaded[-1][0] == 2 and torch.equal(engine.loaded[-1][1], weights(2.0)["embed.weight"])
