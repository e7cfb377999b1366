"""Micro-batch splitting (rlvr.workers.batching)."""

import itertools

import pytest
import torch

from rlvr.workers.batching import (
    balanced_partitions,
    micro_batch_indices,
    packed_token_budget_partitions,
    token_budget_partitions,
)


def test_token_budget_packs_longest_first_within_budget():
    # lengths 5, 3, 8, 2, 4 with budget 10: [8] (2x8 > 10), [5, 4] (2x5 = 10), [3, 2] (2x3 = 6, 3x3 > 10 no 3rd row)
    parts = token_budget_partitions([5, 3, 8, 2, 4], max_token_len=10)
    assert parts == [[2], [0, 4], [1, 3]]


def test_token_budget_row_longer_than_budget_gets_its_own_micro_batch():
    assert token_budget_partitions([20, 1, 1], max_token_len=4) == [[0], [1, 2]]


def test_token_budget_splits_biggest_until_min_parts():
    parts = token_budget_partitions([2, 2, 2, 2], max_token_len=100, min_parts=3)
    assert sorted(len(p) for p in parts) == [1, 1, 2]
    assert sorted(i for p in parts for i in p) == [0, 1, 2, 3]


def test_token_budget_rejects_more_parts_than_rows():
    with pytest.raises(ValueError, match="cannot make 3 micro-batches out of 2 rows"):
        token_budget_partitions([1, 1], max_token_len=10, min_parts=3)


def test_micro_batch_indices_by_count():
    assert micro_batch_indices(torch.tensor([3, 3, 3, 3, 3]), 2, False, 0, 1) == [[0, 1], [2, 3], [4]]



def test_balanced_partitions_by_hand():
    # differencing: 9|8 -> spread 9, 7 ... ; the best split of 9, 8, 7, 3, 2, 1 into 3 parts is 10 each
    assert balanced_partitions([9, 8, 7, 3, 2, 1], 3) == [[0, 5], [1, 4], [2, 3]]
    assert balanced_partitions([10, 1, 1, 1, 1], 2) == [[0], [1, 2, 3, 4]]
    assert balanced_partitions([4, 4], 2) == [[0], [1]]
    with pytest.raises(ValueError, match="cannot split 2 items into 3 non-empty parts"):
        balanced_partitions([1, 1], 3)
    with pytest.raises(ValueError, match="cannot split 5 items into 2 parts of equal size"):
        balanced_partitions([1] * 5, 2, equal_size=True)


def _best_spread(costs: list[int], k: int) -> int:
    """Smallest (largest - smallest part) over every assignment of the items to k non-empty parts."""
    best = None
    for labels in itertools.product(range(k), repeat=len(costs)):
        if len(set(labels)) < k:
            continue
        sums = [sum(c for c, label in zip(costs, labels) if label == part) for part in range(k)]
        best = max(sums) - min(sums) if best is None else min(best, max(sums) - min(sums))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_balanced_partitions_cover_every_item_and_come_close_to_the_best_split(seed):
    gen = torch.Generator().manual_seed(seed)
    costs = torch.randint(1, 50, (8,), generator=gen).tolist()
    for k in (2, 3):
        parts = balanced_partitions(costs, k)
        assert sorted(i for p in parts for i in p) == list(range(8)) and all(parts)
        sums = [sum(costs[i] for i in p) for p in parts]
        assert max(sums) - min(sums) <= max(_best_spread(costs, k), max(costs) // 2)
        equal = balanced_partitions(costs, 2, equal_size=True)
        assert [len(p) for p in equal] == [4, 4]
        assert sorted(i for p in equal for i in p) == list(range(8))


def test_packed_token_budget_makes_the_fewest_balanced_micro_batches():
    lens = torch.tensor([9, 8, 7, 3, 2, 1])  # 30 tokens, budget 10: 3 micro-batches of exactly 10
    parts = micro_batch_indices(lens, 0, True, 10, 1, packed=True)
    assert parts == [[0, 5], [1, 4], [2, 3]]
    # a row longer than the budget gets a micro-batch of its own; the rest keep within the budget
    parts = micro_batch_indices(torch.tensor([25, 4, 4, 4, 3]), 0, True, 8, 1, packed=True)
    assert parts == [[0], [1, 3], [2, 4]]  # 25 | 4 + 4 | 4 + 3
    # a rank that needs fewer micro-batches than another makes as many (balanced) as the most
    assert packed_token_budget_partitions([9, 8, 7, 3, 2, 1], 10, min_parts=4) == [[0], [1], [2], [3, 4, 5]]
    # padded cost for the same rows: rows x longest, so more micro-batches
    assert len(micro_batch_indices(lens, 0, True, 10, 1)) == 4
