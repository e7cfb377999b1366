"""The prompt source of an asynchronous run: with prompts in flight, buffered, dropped and requeued,
a checkpoint taken at any point and restored trains every prompt of an epoch exactly once."""

from __future__ import annotations

import torch

from rlvr.trainer.async_schedule.prompts import PromptSource
from rlvr.trainer.data import StatefulBatchIterator
from rlvr.trainer.data.sampler import SeededRandomSampler

SIZE, BATCH = 24, 4


def collate(items: list[dict]) -> dict:
    return {"input_ids": torch.tensor([[item["index"]] for item in items]),
            "index": [item["index"] for item in items]}


def source() -> PromptSource:
    dataset = [{"index": i} for i in range(SIZE)]
    return PromptSource(StatefulBatchIterator(dataset, BATCH, SeededRandomSampler(dataset, seed=3), collate))


def indices(batch) -> list[int]:
    return [int(i) for i in batch.non_tensor_batch["index"]]


def test_rows_get_uids_and_requeued_prompts_come_first():
    prompts = source()
    first = prompts.take(3)
    assert list(first.non_tensor_batch["uid"]) == ["p0", "p1", "p2"]
    second = prompts.take(2)  # the last row of the first data batch, then a new batch
    assert list(second.non_tensor_batch["uid"]) == ["p3", "p4"]
    prompts.requeue(["p1"])
    again = prompts.take(1)
    assert list(again.non_tensor_batch["uid"]) == ["p1"] and indices(again) == [indices(first)[1]]


class Run:
    """A simulated asynchronous run: before each step the rollout fills the buffer to two generated
    batches (drawn ahead), the trainer takes the oldest one and trains it, or all of it but its first
    group, which is dropped (its prompt generated again later)."""

    def __init__(self, prompts: PromptSource) -> None:
        self.prompts, self.buffer, self.trained = prompts, [], []

    def step(self, drop: bool = False) -> None:
        while len(self.buffer) < 2:
            batch = self.prompts.take(BATCH)
            uids = list(batch.non_tensor_batch["uid"])
            self.prompts.generated(uids, [0] * len(uids))
            self.buffer.append(batch)
        taken = self.buffer.pop(0)
        uids, rows = list(taken.non_tensor_batch["uid"]), indices(taken)
        if drop:
            self.prompts.requeue(uids[:1])
            uids, rows = uids[1:], rows[1:]
        self.prompts.trained(uids)
        self.trained += rows


def test_a_restored_run_trains_every_prompt_drawn_before_the_checkpoint_exactly_once():
    """Prompts in flight, buffered, dropped and requeued at the checkpoint: the run restored from it
    generates those first, and with what was trained before the checkpoint every drawn prompt is
    trained exactly once."""
    first = Run(source())
    for k in range(3):
        first.step(drop=(k == 1))
    first.prompts.take(2)  # in flight at the checkpoint
    state = first.prompts.state_dict()
    unfinished = [int(row.non_tensor_batch["index"][0]) for row, _ in state["unfinished"]]
    drawn = first.trained + unfinished
    # a buffered batch (the requeued prompt and three new ones), two in flight, three left of their data batch
    assert len(first.trained) == 11 and len(unfinished) == 4 + 2 + 3
    assert len(drawn) == len(set(drawn)) == 20

    restored = Run(source())
    restored.prompts.load_state_dict(state)
    for _ in range(3):
        restored.step()
    epoch = first.trained + restored.trained
    assert len(epoch) == len(set(epoch)) == SIZE - 1  # 11 + 3 x 4 of the one epoch, none twice
    assert set(unfinished) <= set(restored.trained)
    assert restored.trained[:len(unfinished)] == unfinished  # generated again first, in order
