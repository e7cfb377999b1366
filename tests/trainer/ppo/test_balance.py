"""trainer.balance_batch (rlvr.trainer.ppo.balance): rows move only within their global mini-batch,
the ranks' token counts even out, a prompt's group stays whole where it can."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.trainer.ppo.balance import UpdateLayout, balance_batch, balanced_order, update_layouts


def _rank_tokens(lens, order, dp):
    chunk = len(order) // dp
    return [sum(lens[row] for row in order[r * chunk:(r + 1) * chunk]) for r in range(dp)]


def _mini_sets(layout: UpdateLayout, order):
    """Rows of each global mini-batch when the batch is in ``order``."""
    _, minis = layout.cells(len(order))
    return [sorted(order[p] for p in np.flatnonzero(minis == k)) for k in range(int(minis.max()) + 1)]


def test_cells_follow_the_dispatch_chunks_and_the_update_blocks():
    rank, mini = UpdateLayout(dp_size=2, mini_batch_rows=2).cells(8)
    assert rank.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert mini.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]  # global mini-batch 0 = rows 0, 1, 4, 5
    with pytest.raises(ValueError, match="7 rows does not split over 2"):
        UpdateLayout(2, 2).cells(7)


def test_one_mini_batch_is_split_evenly():
    lens = [10, 10, 1, 1]  # rank 0 gets 20 tokens, rank 1 gets 2
    order, kept = balanced_order(lens, [UpdateLayout(2, 2)])
    assert kept and sorted(order) == [0, 1, 2, 3]
    assert _rank_tokens(lens, order, 2) == [11, 11]


def test_rows_stay_in_their_mini_batch():
    # rank 0 holds rows 0 (mini 0) and 1 (mini 1), rank 1 rows 2 (mini 0) and 3 (mini 1)
    lens = [10, 10, 1, 1]
    order, _ = balanced_order(lens, [UpdateLayout(2, 1)])
    # mini 0 = rows {0, 2}: the 10 goes to rank 0 (ties: lowest rank); mini 1 = rows {1, 3}: the 10 goes
    # to rank 1, which has fewer tokens so far
    assert order == [0, 3, 2, 1]
    assert _rank_tokens(lens, order, 2) == [11, 11]
    assert _mini_sets(UpdateLayout(2, 1), order) == _mini_sets(UpdateLayout(2, 1), [0, 1, 2, 3])


def test_groups_stay_whole_and_contiguous():
    lens = [10, 10, 10, 10, 1, 1, 1, 1]
    uids = ["a", "a", "b", "b", "c", "c", "d", "d"]  # n = 2; each rank takes 4 rows in one mini-batch
    order, kept = balanced_order(lens, [UpdateLayout(2, 4)], uids)
    assert kept
    assert _rank_tokens(lens, order, 2) == [22, 22]
    per_rank = [[uids[row] for row in order[:4]], [uids[row] for row in order[4:]]]
    for ranks_uids in per_rank:  # two whole groups per rank, each group's rows next to each other
        assert ranks_uids[0] == ranks_uids[1] and ranks_uids[2] == ranks_uids[3] and ranks_uids[1] != ranks_uids[2]


def test_groups_that_span_mini_batches_move_row_by_row():
    lens = [10, 10, 10, 10, 1, 1, 1, 1]
    uids = ["a", "a", "a", "a", "b", "b", "b", "b"]  # n = 4, but each rank takes 2 rows per mini-batch
    order, kept = balanced_order(lens, [UpdateLayout(2, 2)], uids)
    assert not kept
    assert _rank_tokens(lens, order, 2) == [22, 22]
    assert _mini_sets(UpdateLayout(2, 2), order) == _mini_sets(UpdateLayout(2, 2), list(range(8)))


def test_a_critic_on_another_layout_keeps_its_mini_batches_too():
    actor, critic = UpdateLayout(2, 4), UpdateLayout(1, 4)  # critic: one rank, mini-batches of 4 rows
    lens = [9, 8, 7, 6, 1, 2, 3, 4]
    order, _ = balanced_order(lens, [actor, critic])
    assert _mini_sets(actor, order) == _mini_sets(actor, list(range(8)))
    assert _mini_sets(critic, order) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # the critic's mini-batches lie on one actor rank each: nothing may move between the actor's ranks
    assert _rank_tokens(lens, order, 2) == [30, 10]


def test_unequal_shares_of_a_class_are_filled_largest_first():
    # critic: one rank, mini-batches of 3 rows {0,1,2} {3,4,5} {6,7}; actor: rank 0 rows 0-3, rank 1 rows 4-7,
    # so the class {3, 4, 5} has one position on actor rank 0 and two on rank 1
    actor, critic = UpdateLayout(2, 4), UpdateLayout(1, 3)
    lens = [5, 5, 5, 8, 1, 1, 1, 1]  # rank 0: 23 tokens, rank 1: 4
    order, _ = balanced_order(lens, [actor, critic])
    # running totals [15, 0] after {0,1,2}: row 3 (8) -> rank 1, row 4 -> rank 1 (9 < 15), row 5 -> rank 0
    assert order == [0, 1, 2, 5, 3, 4, 6, 7]
    assert _rank_tokens(lens, order, 2) == [16, 11]
    assert _mini_sets(critic, order) == _mini_sets(critic, list(range(8)))


def test_a_batch_that_is_balanced_already_is_left_as_it_came():
    assert balanced_order([5, 4, 4, 5], [UpdateLayout(2, 2)]) == ([0, 1, 2, 3], True)


def test_random_batches_balance_and_keep_every_mini_batch():
    rng = random.Random(3)
    for _ in range(30):
        dp, mini_rows, minis = rng.choice([2, 4]), rng.choice([2, 4, 8]), rng.choice([1, 2, 3])
        rows = dp * mini_rows * minis
        lens = [rng.randint(20, 60) for _ in range(rows)]
        layout = UpdateLayout(dp, mini_rows)
        order, _ = balanced_order(lens, [layout])
        assert sorted(order) == list(range(rows))
        assert _mini_sets(layout, order) == _mini_sets(layout, list(range(rows)))
        before, after = _rank_tokens(lens, list(range(rows)), dp), _rank_tokens(lens, order, dp)
        assert max(after) <= max(before)
        assert max(after) - min(after) <= max(lens) * minis  # at most one row's worth per mini-batch


def test_balance_batch_reorders_every_field_and_reports_the_token_counts():
    mask = torch.tensor([[1] * 10, [1] * 10, [1] + [0] * 9, [1] + [0] * 9])
    batch = DataProto.from_dict(tensors={"attention_mask": mask, "row": torch.arange(4)},
                                non_tensors={"uid": np.array(["a", "b", "c", "d"], dtype=object)})
    metrics = balance_batch(batch, [UpdateLayout(2, 2)], keep_groups=True)
    order = batch.batch["row"].tolist()
    assert sorted(order) == [0, 1, 2, 3]
    assert batch.non_tensor_batch["uid"].tolist() == [["a", "b", "c", "d"][row] for row in order]
    assert batch.batch["attention_mask"].sum(-1).tolist() == [[10, 10, 1, 1][row] for row in order]
    assert metrics == {"global_seqlen/min": 2.0, "global_seqlen/max": 20.0, "global_seqlen/minmax_diff": 18.0,
                       "global_seqlen/balanced_min": 11.0, "global_seqlen/balanced_max": 11.0,
                       "global_seqlen/mean": 11.0, "global_seqlen/groups_kept": 1.0}


def test_layouts_from_the_config():
    cfg = OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist([
        "trainer.backend=ray", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "critic.ppo_mini_batch_size=2"]))
    assert update_layouts(cfg, use_critic=False) == [UpdateLayout(2, 8)]
    assert update_layouts(cfg, use_critic=True) == [UpdateLayout(2, 8), UpdateLayout(2, 4)]
    assert cfg.trainer.balance_batch is True  # verl's default
