"""Image inputs travel in DataProto like any other field: split, concat, reorder, repeat, union,
pickling (what Ray does) and the data-parallel dispatch to ranks and back."""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import pytest
import torch
from mm_helpers import image_batch

from rlvr.protocol import DataProto
from rlvr.single_controller.base.dispatch import collect_dp_compute_data_proto, dispatch_dp_compute_data_proto
from rlvr.utils.dataproto_ops import deep_equal
from rlvr.utils.errors import ProtocolError
from rlvr.utils.multimodal import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS, MultiModalRows, multi_modal_rows


@dataclass
class Group:
    world_size: int


def pixels(data: DataProto, row: int) -> torch.Tensor:
    return data.non_tensor_batch[MULTI_MODAL_INPUTS][row]["pixel_values"]


@pytest.fixture(scope="module")
def batch(vl_dirs, image_data) -> DataProto:
    return image_batch(vl_dirs["qwen2_vl"], image_data)


def test_split_concat_reorder_and_repeat_keep_each_rows_images(batch):
    parts = batch.chunk(2)
    assert [pixels(p, 0).shape[0] for p in parts] == [16, 16]  # rows 0 and 2: 56x56 images
    assert [pixels(p, 1).shape[0] for p in parts] == [24, 24]  # rows 1 and 3: 84x56
    joined = DataProto.concat(parts)
    assert deep_equal(joined.non_tensor_batch[MULTI_MODAL_INPUTS], batch.non_tensor_batch[MULTI_MODAL_INPUTS])
    repeated = batch.repeat(2, interleave=True)
    assert torch.equal(pixels(repeated, 2), pixels(batch, 1)) and torch.equal(pixels(repeated, 3), pixels(batch, 1))
    reordered = batch.select_idxs([3, 0])
    assert torch.equal(pixels(reordered, 0), pixels(batch, 3))
    assert reordered.non_tensor_batch[MULTI_MODAL_DATA][1]["image"][0] == batch.non_tensor_batch[MULTI_MODAL_DATA][0]["image"][0]


def test_pickling_and_the_dp_dispatch_round_trip(batch):
    copy = pickle.loads(pickle.dumps(batch))
    assert deep_equal(copy.non_tensor_batch[MULTI_MODAL_INPUTS], batch.non_tensor_batch[MULTI_MODAL_INPUTS])
    args, _ = dispatch_dp_compute_data_proto(Group(2), batch)
    ranks = args[0]
    assert [len(r) for r in ranks] == [2, 2]
    assert torch.equal(pixels(ranks[1], 1), pixels(batch, 3))
    back = collect_dp_compute_data_proto(Group(2), [pickle.loads(pickle.dumps(r)) for r in ranks])
    assert deep_equal(back.non_tensor_batch[MULTI_MODAL_INPUTS], batch.non_tensor_batch[MULTI_MODAL_INPUTS])


def test_union_compares_the_image_tensors(batch):
    same = batch.select(non_tensor_batch_keys=[MULTI_MODAL_INPUTS], deepcopy=True)
    batch.select().union(same)  # equal values: no conflict
    other = batch.select(non_tensor_batch_keys=[MULTI_MODAL_INPUTS], deepcopy=True)
    other.non_tensor_batch[MULTI_MODAL_INPUTS][1]["pixel_values"] += 1.0
    with pytest.raises(ProtocolError, match="non-tensor key 'multi_modal_inputs'"):
        batch.select().union(other)


def test_multi_modal_rows_index_move_and_merge_like_the_batch(batch):
    rows = multi_modal_rows(batch.non_tensor_batch)
    assert rows.shape == (4,) and rows.has_images
    picked = rows[torch.tensor([3, 1])]
    merged = picked.merged()
    assert merged["pixel_values"].shape == (48, 1176)
    assert merged["image_grid_thw"].tolist() == [[1, 4, 6], [1, 4, 6]]
    assert torch.equal(rows[1:3].to("cpu").merged()["pixel_values"], torch.cat([pixels(batch, 1), pixels(batch, 2)]))
    mixed = MultiModalRows([{}, rows.rows[0], None])
    assert mixed.merged()["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert MultiModalRows([{}, None]).merged() == {} and multi_modal_rows({"x": batch.non_tensor_batch["index"]}) is None
    with pytest.raises(ValueError, match="different image inputs"):
        MultiModalRows([rows.rows[0], {"pixel_values": torch.zeros(1)}]).merged()
