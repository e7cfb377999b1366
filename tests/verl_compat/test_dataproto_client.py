"""A verl 0.9 user's DataProto code, with only the import renamed, gives the numbers verl documents.

Expected values are worked out by hand from verl's documented behaviour; errors are caught with
the exception types verl raises (``AssertionError``, ``KeyError``, ``TypeError``, ``ValueError``).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlvr import DataProto
from rlvr.protocol import (
    DataProtoConfig,
    DataProtoItem,
    auto_padding,
    collate_fn,
    fold_batch_dim,
    list_of_dict_to_dict_of_list,
    pad_dataproto_to_divisor,
    unfold_batch_dim,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def prompts() -> DataProto:
    """4 prompts: ``input_ids [4, 3]`` (row i = 10i..10i+2), ``uid`` p0..p3, a data source each."""
    return DataProto.from_dict(
        tensors={"input_ids": torch.arange(4).repeat_interleave(3).view(4, 3) * 10 + torch.arange(3)},
        non_tensors={"uid": np.array([f"p{i}" for i in range(4)], dtype=object),
                     "data_source": np.array(["gsm8k", "math", "gsm8k", "math"], dtype=object)},
        meta_info={"temperature": 1.0},
    )


def test_grpo_style_repeat_union_and_group_fold():
    batch = prompts().repeat(repeat_times=3, interleave=True)  # n = 3 samples per prompt
    assert len(batch) == 12
    assert batch.non_tensor_batch["uid"].tolist() == [f"p{i}" for i in range(4) for _ in range(3)]
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0])
    rollout = DataProto.from_dict(tensors={"scores": scores}, meta_info={"temperature": 1.0})
    batch = batch.union(rollout)
    assert sorted(batch.batch.keys()) == ["input_ids", "scores"]

    groups = fold_batch_dim(batch, new_batch_size=4)  # [4 prompts, 3 samples]
    assert groups.batch["scores"].shape == (4, 3) and groups.batch["input_ids"].shape == (4, 3, 3)
    assert groups.non_tensor_batch["uid"].shape == (4, 3)
    mean = groups.batch["scores"].mean(dim=1)
    torch.testing.assert_close(mean, torch.tensor([2 / 3, 0.0, 1.0, 1 / 3]))
    back = unfold_batch_dim(groups, batch_dims=2)
    assert torch.equal(back.batch["scores"], scores) and back.meta_info == {"temperature": 1.0}
    assert back.non_tensor_batch["uid"].tolist() == batch.non_tensor_batch["uid"].tolist()


def test_concat_merges_worker_metrics_and_rejects_conflicts():
    parts = prompts().chunk(2)
    parts[0].meta_info["metrics"] = [{"loss": 0.5, "acc": 0.9}]  # list of dicts, as workers send it
    parts[1].meta_info["metrics"] = {"loss": 0.7, "acc": 0.8}  # a single dict
    merged = DataProto.concat(parts)
    assert merged.meta_info == {"temperature": 1.0, "metrics": {"loss": [0.5, 0.7], "acc": [0.9, 0.8]}}
    assert merged.non_tensor_batch["uid"].tolist() == ["p0", "p1", "p2", "p3"]
    other = prompts().chunk(2)
    other[1].meta_info["temperature"] = 0.6
    with pytest.raises(AssertionError, match="Conflicting values for meta_info key 'temperature'"):
        DataProto.concat(other)
    with pytest.raises(KeyError):  # torch.cat of TensorDicts with other keys raises KeyError in verl
        DataProto.concat([prompts(), prompts().select(batch_keys=[]).union(DataProto.from_dict({"x": torch.ones(4)}))])


def test_union_rules():
    obs = torch.randn(4, 2)
    td1 = TensorDict({"obs": obs, "act": torch.zeros(4)}, batch_size=[4])
    union_tensor_dict(td1, TensorDict({"obs": obs, "rew": torch.ones(4)}, batch_size=[4]))
    assert sorted(td1.keys()) == ["act", "obs", "rew"]
    with pytest.raises(AssertionError):
        union_tensor_dict(td1, TensorDict({"obs": obs + 1}, batch_size=[4]))
    with pytest.raises(AssertionError):
        union_tensor_dict(td1, TensorDict({"obs": obs[:2]}, batch_size=[2]))
    nan = {"v": np.array([1.0, np.nan, 3.0])}
    union_numpy_dict(nan, {"v": np.array([1.0, np.nan, 3.0])})  # NaN in the same place: equal
    with pytest.raises(AssertionError):
        union_numpy_dict(nan, {"v": np.array([np.nan, 1.0, 3.0])})
    with pytest.raises(AssertionError):  # same numbers, other dtype: not the same object
        union_numpy_dict({"v": np.array([1, 2])}, {"v": np.array([1.0, 2.0])})
    objects = np.array([np.array([1, 2]), "text", None], dtype=object)
    union_numpy_dict({"o": objects}, {"o": objects.copy()})
    with pytest.raises(AssertionError):
        union_numpy_dict({"o": objects}, {"o": np.array([np.array([1, 3]), "text", None], dtype=object)})
    with pytest.raises(AssertionError):  # meta_info keys must agree
        prompts().union(DataProto.from_dict({"x": torch.ones(4)}, meta_info={"temperature": 0.5}))


def test_chunk_needs_equal_parts_unless_auto_padding():
    data = DataProto.from_dict({"a": torch.arange(10)})
    with pytest.raises(AssertionError):
        data.chunk(4)
    padded = DataProto.from_dict({"a": torch.arange(10)}, auto_padding=True)
    assert padded.is_padding_enabled()
    assert [p.batch["a"].tolist() for p in padded.chunk(4)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    with auto_padding():
        assert DataProtoConfig.auto_padding and data.is_padding_enabled()
        assert [len(p) for p in data.chunk(4)] == [3, 3, 3, 1]
    assert not DataProtoConfig.auto_padding
    data.padding(2)  # verl's default candidate: the last row
    assert data.batch["a"].tolist() == [*range(10), 9, 9]
    data.padding(1, padding_candidate="first")
    assert data.batch["a"].tolist()[-1] == 0 and len(data) == 13


def test_pad_and_unpad_to_divisor():
    data = DataProto.from_dict({"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])}, {"labels": np.array(list("abc"), dtype=object)})
    padded, pad_size = pad_dataproto_to_divisor(data, size_divisor=7)
    assert pad_size == 4 and padded.non_tensor_batch["labels"].tolist() == list("abcabca")
    assert padded.batch["obs"][3:].tolist() == [[1, 2], [3, 4], [5, 6], [1, 2]]
    assert unpad_dataproto(padded, pad_size=pad_size).non_tensor_batch["labels"].tolist() == list("abc")


def test_key_operations_raise_verl_types():
    data = prompts()
    with pytest.raises(AssertionError):  # verl asserts the key exists
        data.pop(batch_keys=["missing"])
    with pytest.raises(KeyError):  # TensorDict.select raises KeyError in verl
        data.select(batch_keys=["missing"])
    with pytest.raises(AssertionError):  # one batch dim only
        DataProto.from_dict(tensors={"obs": torch.zeros(4, 3)}, num_batch_dims=2)
    with pytest.raises(TypeError):
        data[1.5]
    popped = data.pop(batch_keys=["input_ids"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["input_ids"] and popped.meta_info == {"temperature": 1.0}
    assert data.batch.keys() == set() and data.meta_info == {}
    renamed = prompts().rename(old_keys="input_ids", new_keys="ids")
    assert list(renamed.batch.keys()) == ["ids"]
    with pytest.raises(ValueError):
        prompts().rename(old_keys=["input_ids"], new_keys=["a", "b"])
    with pytest.raises(TypeError):
        prompts().rename(old_keys=("input_ids",), new_keys=("ids",))


def test_sample_level_repeat_and_unfold_column_chunks():
    data = DataProto.from_dict({"obs": torch.tensor([[1, 2], [3, 4], [5, 6]])}, {"labels": np.array(list("abc"), dtype=object)})
    for counts in ([3, 1, 2], (3, 1, 2), np.array([3, 1, 2]), torch.tensor([3, 1, 2])):
        out = data.sample_level_repeat(repeat_times=counts)
        assert out.batch["obs"][:, 0].tolist() == [1, 1, 1, 3, 5, 5]
        assert out.non_tensor_batch["labels"].tolist() == list("aaabcc")
    wide = DataProto.from_dict(
        {"obs1": torch.arange(1, 13).view(3, 4), "obs2": torch.tensor([[1, 2], [5, 6], [9, 10]])},
        {"labels": np.array([["a1", "a2"], ["b1", "b2"], ["c1", "c2"]], dtype=object)},
        meta_info={"name": "abc"},
    )
    out = wide.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert out.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    assert out.batch["obs2"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert out.non_tensor_batch["labels"].tolist() == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]
    assert out.meta_info == {"name": "abc"}


def test_make_iterator_is_seeded_and_keeps_meta_info():
    data = DataProto.from_dict({"obs": torch.arange(8)}, {"tag": np.array(list("abcdefgh"), dtype=object)},
                               meta_info={"step": 3})
    in_order = [b.batch["obs"].tolist() for b in data.make_iterator(mini_batch_size=4, epochs=2)]
    assert in_order == [[0, 1, 2, 3], [4, 5, 6, 7]] * 2
    shuffled = [b for b in data.make_iterator(4, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    again = [b for b in data.make_iterator(4, 1, seed=7, dataloader_kwargs={"shuffle": True})]
    assert [b.batch["obs"].tolist() for b in shuffled] == [b.batch["obs"].tolist() for b in again]
    assert sorted(sum((b.batch["obs"].tolist() for b in shuffled), [])) == list(range(8))
    first = shuffled[0]
    assert first.non_tensor_batch["tag"].tolist() == ["abcdefgh"[i] for i in first.batch["obs"].tolist()]
    assert first.meta_info == {"step": 3}
    with pytest.raises(AssertionError):
        data.make_iterator(mini_batch_size=3, epochs=1)


def test_tensordict_round_trip_with_nested_values():
    data = DataProto.from_dict(
        tensors={"obs": torch.tensor([1, 2, 3])},
        non_tensors={"turn_scores": [[], [0.5, 0.8], [0.9]], "info": [{"acc": 1.0}, {"acc": 0.0}, {"acc": 1.0}],
                     "labels": ["a", "b", "c"]},
        meta_info={"global_steps": 42},
    )
    td = data.to_tensordict()
    assert torch.equal(td["obs"], torch.tensor([1, 2, 3])) and td["labels"] == ["a", "b", "c"]
    assert list(td["turn_scores"][1]) == [0.5, 0.8] and dict(td["info"][0]) == {"acc": 1.0}
    assert td["global_steps"] == 42
    back = DataProto.from_tensordict(td)
    assert back.non_tensor_batch["turn_scores"].tolist() == [[], [0.5, 0.8], [0.9]]
    assert back.non_tensor_batch["info"].tolist() == [{"acc": 1.0}, {"acc": 0.0}, {"acc": 1.0}]
    assert back.meta_info == {"global_steps": 42} and torch.equal(back.batch["obs"], data.batch["obs"])


def test_indexing_items_collate_and_persistence(tmp_path):
    data = prompts()
    item = data[2]
    assert isinstance(item, DataProtoItem) and item.non_tensor_batch["uid"] == "p2"
    assert item.batch["input_ids"].tolist() == [20, 21, 22]
    assert data[[3, 1]].non_tensor_batch["uid"].tolist() == ["p3", "p1"]
    assert data[np.array([True, False, True, False])].non_tensor_batch["uid"].tolist() == ["p0", "p2"]
    assert data[torch.tensor([0, 0])].batch["input_ids"][:, 0].tolist() == [0, 0]
    assert data[1:3].non_tensor_batch["uid"].tolist() == ["p1", "p2"]
    stacked = collate_fn([data[0], data[3]])
    assert stacked.batch["input_ids"].tolist() == [[0, 1, 2], [30, 31, 32]]
    assert list_of_dict_to_dict_of_list([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    data.save_to_disk(tmp_path / "batch.pkl")
    loaded = DataProto.load_from_disk(tmp_path / "batch.pkl")
    assert torch.equal(loaded.batch["input_ids"], data.batch["input_ids"]) and loaded.meta_info == data.meta_info
    assert pickle.loads(pickle.dumps(data)).non_tensor_batch["uid"].tolist() == ["p0", "p1", "p2", "p3"]
    assert len(DataProto(batch=None, non_tensor_batch=None, meta_info={"info": 1})) == 0


def test_subclasses_keep_their_class():
    class MyProto(DataProto):
        pass

    data = MyProto.from_single_dict({"x": torch.arange(4), "tag": np.array(list("abcd"), dtype=object)})
    assert type(data) is MyProto
    assert all(type(d) is MyProto for d in (data[1:], data[[0, 1]], data.select(batch_keys=["x"]), data.repeat(2),
                                            DataProto.concat(data.chunk(2)), fold_batch_dim(data, 2)))


def test_unfold_column_chunks_on_a_column_of_lists():
    """verl's test passes the labels as a plain list of lists; rlvr keeps that as one column of
    lists (``[3]``, D9), which ``unfold_column_chunks`` cuts like verl's ``[3, 2]`` array: the
    result compares equal to verl's expected rows. 1-D tensor keys are repeated."""
    data = DataProto.from_dict(
        {"obs1": torch.arange(1, 13).view(3, 4), "score": torch.tensor([0.5, 1.5, 2.5])},
        {"labels": [["a1", "a2"], ["b1", "b2"], ["c1", "c2"]]}, meta_info={"name": "abc"},
    )
    assert data.non_tensor_batch["labels"].shape == (3,)
    out = data.unfold_column_chunks(2, split_keys=["obs1", "labels"])
    assert (out.non_tensor_batch["labels"] == [["a1"], ["a2"], ["b1"], ["b2"], ["c1"], ["c2"]]).all()
    assert out.batch["score"].tolist() == [0.5, 0.5, 1.5, 1.5, 2.5, 2.5]
    assert out.batch["obs1"].tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10], [11, 12]]
    uneven = DataProto.from_dict({"x": torch.zeros(2)}, {"labels": [["a1", "a2"], ["b1"]]})
    with pytest.raises(AssertionError, match="cannot split key 'labels' of shape \\[2\\] into 2 column chunks"):
        uneven.unfold_column_chunks(2, split_keys=["labels"])
    with pytest.raises(AssertionError, match="cannot split key 'score' of shape \\[3\\]"):
        data.unfold_column_chunks(2, split_keys=["score"])  # a 1-D tensor has no columns to cut


def test_union_conflicts_raise_with_verls_words():
    """A key held by both sides with different values raises an ``AssertionError`` whose message
    contains verl's sentence, for tensors and for numpy columns (also through ``DataProto.union``)."""
    arr = np.arange(24, dtype=np.int32).reshape((2, 3, 4))
    union_numpy_dict({"nd_array": arr}, {"nd_array": arr.copy()})
    with pytest.raises(AssertionError, match="`nd_array` in tensor_dict1 and tensor_dict2 are not the same object."):
        union_numpy_dict({"nd_array": arr}, {"nd_array": arr + 1})
    obs = torch.randn(4, 2)
    with pytest.raises(AssertionError, match="obs in tensor_dict1 and tensor_dict2 are not the same object"):
        union_tensor_dict(TensorDict({"obs": obs}, batch_size=[4]), TensorDict({"obs": obs + 1}, batch_size=[4]))
    left = DataProto.from_dict({"a": torch.zeros(2)}, {"uid": np.array([{"k": 1}, {"k": 2}], dtype=object)})
    right = DataProto.from_dict({"b": torch.ones(2)}, {"uid": np.array([{"k": 1}, {"k": 3}], dtype=object)})
    with pytest.raises(AssertionError, match="`uid` in tensor_dict1 and tensor_dict2 are not the same object."):
        left.union(right)
    same = DataProto.from_dict({"b": torch.ones(2)}, {"uid": np.array([{"k": 1}, {"k": 2}], dtype=object)})
    assert sorted(left.union(same).batch.keys()) == ["a", "b"]
