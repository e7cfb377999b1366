"""Seeded data order and a batch iterator whose position can be saved and restored.

The order of epoch ``e`` is a permutation drawn from ``torch.Generator().manual_seed(seed + e)``, so
it depends only on the seed and the epoch; :class:`StatefulBatchIterator` records ``(epoch, batches
consumed in that epoch)`` and resumes exactly there after a checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from rlvr.utils.errors import DataError


class SeededRandomSampler(Sampler[int]):
    """A random permutation per epoch, determined by ``seed`` and the epoch number.

    Args:
        data_source: the dataset (only its length is used).
        seed: base seed of the permutations.
        shuffle: False gives the identity order every epoch.
    """

    def __init__(self, data_source: Sized, seed: int, shuffle: bool = True) -> None:
        self.num_samples = len(data_source)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of ``epoch``."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.shuffle:
            return iter(range(self.num_samples))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(torch.randperm(self.num_samples, generator=generator).tolist())

    def __len__(self) -> int:
        return self.num_samples


def create_rl_sampler(data_config: Any, dataset: Sized) -> SeededRandomSampler:
    """The training sampler for ``data.shuffle`` / ``data.seed``."""
    return SeededRandomSampler(dataset, seed=data_config.seed, shuffle=data_config.shuffle)


class StatefulBatchIterator:
    """Endless iterator over batches of a dataset, epoch after epoch, with a resumable position.

    Args:
        dataset: indexable dataset.
        batch_size: items per batch; the last incomplete batch of an epoch is dropped.
        sampler: gives the item order; ``set_epoch(e)`` is called on it when it has one.
        collate_fn: turns a list of items into a batch.

    Raises:
        DataError: the dataset has fewer items than one batch.
    """

    def __init__(self, dataset: Any, batch_size: int, sampler: Sampler, collate_fn: Callable[[list], Any]) -> None:
        if len(sampler) < batch_size:
            raise DataError(f"the training set has {len(sampler)} prompts, fewer than one batch of "
                             f"data.train_batch_size={batch_size}; lower the batch size or add data")
        self.dataset = dataset
        self.batch_size = batch_size
        self.sampler = sampler
        self.collate_fn = collate_fn
        self.epoch = 0
        self.batches_in_epoch = 0
        self._order: list[int] | None = None

    def __len__(self) -> int:
        """Batches per epoch."""
        return len(self.sampler) // self.batch_size

    def _epoch_order(self) -> list[int]:
        if self._order is None:
            set_epoch = getattr(self.sampler, "set_epoch", None)  # a user sampler may have no epochs
            if set_epoch is not None:
                set_epoch(self.epoch)
            self._order = list(self.sampler)
        return self._order

    def __iter__(self) -> StatefulBatchIterator:
        return self

    def __next__(self) -> Any:
        if self.batches_in_epoch >= len(self):
            self.epoch += 1
            self.batches_in_epoch = 0
            self._order = None
        start = self.batches_in_epoch * self.batch_size
        indices = self._epoch_order()[start:start + self.batch_size]
        self.batches_in_epoch += 1
        return self.collate_fn([self.dataset[i] for i in indices])

    def state_dict(self) -> dict[str, int]:
        """The position: the epoch and how many of its batches were consumed."""
        return {"epoch": self.epoch, "batches_in_epoch": self.batches_in_epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a position saved by :meth:`state_dict`."""
        self.epoch = int(state["epoch"])
        self.batches_in_epoch = int(state["batches_in_epoch"])
        self._order = None
