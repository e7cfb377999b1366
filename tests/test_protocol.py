"""Tests of rlvr.protocol.DataProto with hand-computed expectations."""

import io
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlvr.protocol import DataProto, DataProtoItem, pad_dataproto_to_divisor, unpad_dataproto


def make(n: int = 4, meta: dict | None = None) -> DataProto:
    """Rows i = 0..n-1: ``x[i] = [2i, 2i+1]``, ``y[i] = i / 10``, ``uid[i] = f"u{i}"``."""
    return DataProto.from_dict(
        tensors={"x": torch.arange(2 * n).view(n, 2), "y": torch.arange(n, dtype=torch.float32) / 10},
        non_tensors={"uid": [f"u{i}" for i in range(n)], "rm": [{"ground_truth": str(i)} for i in range(n)]},
        meta_info=meta or {"temperature": 1.0},
    )


def rows(data: DataProto) -> list[int]:
    """Row ids recovered from ``x`` (row i holds ``[2i, 2i+1]``)."""
    return (data.batch["x"][:, 0] // 2).tolist()


# ----------------------------------------------------------------------------- construction
def test_from_dict_and_lists_become_object_arrays():
    data = make(3)
    assert len(data) == 3
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["rm"][2] == {"ground_truth": "2"}
    assert data.meta_info == {"temperature": 1.0}


def test_nested_lists_stay_one_dim():
    msgs = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    data = DataProto.from_dict(non_tensors={"raw_prompt": msgs})
    assert data.non_tensor_batch["raw_prompt"].shape == (2,)
    assert data.non_tensor_batch["raw_prompt"][1] == [{"role": "user", "content": "b"}]
    assert len(data) == 2


def test_from_single_dict_splits_by_type():
    data = DataProto.from_single_dict(
        {"ids": torch.zeros(2, 3), "uid": np.array(["a", "b"], dtype=object), "tag": ["p", "q"]}, meta_info={"k": 1}
    )
    assert list(data.batch.keys()) == ["ids"]
    assert sorted(data.non_tensor_batch) == ["tag", "uid"]
    assert data.meta_info == {"k": 1}


def test_tensor_size_mismatch_names_key_and_sizes():
    with pytest.raises(ValueError, match=r"'b' has 3 rows.*'a' has 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2, 4), "b": torch.zeros(3, 4)})


def test_non_tensor_size_mismatch_names_key():
    with pytest.raises(ValueError, match=r"non_tensor_batch\['uid'\] has 3 entries.*2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2)}, non_tensors={"uid": ["x", "y", "z"]})


def test_wrong_types_rejected_at_construction():
    with pytest.raises(TypeError, match="non_tensor_batch\\['t'\\] is a torch.Tensor"):
        DataProto(non_tensor_batch={"t": torch.zeros(2)})
    with pytest.raises(TypeError, match="must be a numpy array or a list"):
        DataProto(non_tensor_batch={"s": "abc"})
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        DataProto.from_dict(tensors={"a": [1, 2]})
    with pytest.raises(ValueError, match="one batch dim"):
        DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3]))


def test_empty_dataproto():
    assert len(DataProto()) == 0
    assert len(DataProto.from_dict()) == 0


# ----------------------------------------------------------------------------- indexing
def test_int_index_returns_item():
    item = make(4)[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["x"].tolist() == [4, 5]
    assert item.batch["y"].item() == pytest.approx(0.2)
    assert item.non_tensor_batch == {"uid": "u2", "rm": {"ground_truth": "2"}}
    assert make(4)[-1].non_tensor_batch["uid"] == "u3"
    with pytest.raises(IndexError, match="out of range"):
        make(4)[4]


def test_slice_list_array_tensor_and_mask_indexing():
    data = make(5)
    assert rows(data[1:4]) == [1, 2, 3]
    assert data[1:4].non_tensor_batch["uid"].tolist() == ["u1", "u2", "u3"]
    assert rows(data[::2]) == [0, 2, 4]
    assert rows(data[[4, 0]]) == [4, 0]
    assert rows(data[np.array([3, 3])]) == [3, 3]
    assert rows(data[torch.tensor([1, 2])]) == [1, 2]
    mask = torch.tensor([True, False, True, False, True])
    picked = data[mask]
    assert rows(picked) == [0, 2, 4]
    assert picked.non_tensor_batch["uid"].tolist() == ["u0", "u2", "u4"]
    assert rows(data[np.array([False, True, False, False, False])]) == [1]
    assert len(data[[]]) == 0 and data[[]].non_tensor_batch["uid"].tolist() == []
    with pytest.raises(IndexError, match="boolean mask"):
        data[torch.tensor([True, False])]
    with pytest.raises(IndexError, match="ints or bools"):
        data[np.array([0.5])]


def test_iteration_yields_items():
    assert [item.non_tensor_batch["uid"] for item in make(3)] == ["u0", "u1", "u2"]


# ----------------------------------------------------------------------------- keys
def test_select_shares_and_deepcopy_copies():
    data = make(3)
    sub = data.select(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=[])
    assert list(sub.batch.keys()) == ["x"] and list(sub.non_tensor_batch) == ["uid"] and sub.meta_info == {}
    sub.batch["x"][0, 0] = 100
    assert data.batch["x"][0, 0].item() == 100
    deep = data.select(batch_keys=["x"], deepcopy=True)
    deep.batch["x"][0, 0] = -1
    assert data.batch["x"][0, 0].item() == 100
    assert sorted(deep.non_tensor_batch) == ["rm", "uid"]
    with pytest.raises(KeyError, match=r"no key\(s\) \['nope'\]; available: \['x', 'y'\]"):
        data.select(batch_keys=["nope"])


def test_pop_removes_keys():
    data = make(3, meta={"temperature": 0.5, "eos_token_id": 7})
    popped = data.pop(batch_keys=["y"], non_tensor_batch_keys=["rm"], meta_info_keys=["eos_token_id"])
    assert list(popped.batch.keys()) == ["y"] and list(popped.non_tensor_batch) == ["rm"]
    assert popped.meta_info == {"eos_token_id": 7}
    assert list(data.batch.keys()) == ["x"] and list(data.non_tensor_batch) == ["uid"]
    assert data.meta_info == {"temperature": 0.5}
    assert len(data.pop()) == 0
    with pytest.raises(KeyError, match="'y'"):
        data.pop(batch_keys=["y"])


def test_union_adds_keys_and_accepts_equal_duplicates():
    data = make(3)
    other = DataProto.from_dict(
        tensors={"x": torch.arange(6).view(3, 2), "z": torch.ones(3)},
        non_tensors={"uid": ["u0", "u1", "u2"], "extra": [1, 2, 3]},
        meta_info={"temperature": 1.0, "global_steps": 5},
    )
    out = data.union(other)
    assert out is data
    assert sorted(data.batch.keys()) == ["x", "y", "z"]
    assert sorted(data.non_tensor_batch) == ["extra", "rm", "uid"]
    assert data.meta_info == {"temperature": 1.0, "global_steps": 5}


def test_union_conflicts_raise():
    with pytest.raises(ValueError, match="key 'x' exists in both batches with different values"):
        make(3).union(DataProto.from_dict(tensors={"x": torch.zeros(3, 2, dtype=torch.long)}))
    with pytest.raises(ValueError, match="non-tensor key 'uid'"):
        make(3).union(DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]}))
    with pytest.raises(ValueError, match="lengths 3 and 2"):
        make(3).union(make(2))
    with pytest.raises(ValueError, match=r"meta_info\['temperature'\] differs"):
        make(3).union(DataProto.from_dict(tensors={"q": torch.zeros(3)}, meta_info={"temperature": 0.7}))


def test_union_into_tensorless_dataproto():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b"]})
    data.union(DataProto.from_dict(tensors={"r": torch.tensor([1.0, 2.0])}))
    assert data.batch["r"].tolist() == [1.0, 2.0]


# ----------------------------------------------------------------------------- chunk / split / concat
def test_chunk_concat_round_trip():
    data = make(6)
    parts = data.chunk(3)
    assert [rows(p) for p in parts] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch["uid"].tolist() for p in parts] == [["u0", "u1"], ["u2", "u3"], ["u4", "u5"]]
    back = DataProto.concat(parts)
    assert torch.equal(back.batch["x"], data.batch["x"]) and torch.equal(back.batch["y"], data.batch["y"])
    assert back.non_tensor_batch["uid"].tolist() == data.non_tensor_batch["uid"].tolist()
    assert back.meta_info == {"temperature": 1.0}


def test_chunk_not_divisible_says_to_pad():
    with pytest.raises(ValueError, match="pad_dataproto_to_divisor"):
        make(5).chunk(2)


def test_split_last_part_shorter():
    assert [rows(p) for p in make(5).split(2)] == [[0, 1], [2, 3], [4]]


def test_concat_merges_metrics():
    parts = make(4).chunk(2)
    parts[0].meta_info["metrics"] = {"loss": 1.0, "kl": [0.1, 0.2]}
    parts[1].meta_info["metrics"] = {"loss": 3.0, "acc": 0.5}
    merged = DataProto.concat(parts).meta_info
    assert merged["metrics"] == {"loss": [1.0, 3.0], "kl": [0.1, 0.2], "acc": [0.5]}
    assert merged["temperature"] == 1.0


def test_concat_rejects_disagreeing_meta_keys_and_dtypes():
    a, b = make(2), make(2)
    b.meta_info["temperature"] = 0.5
    with pytest.raises(ValueError, match="Conflicting values for meta_info key 'temperature'.*1.0 vs 0.5"):
        DataProto.concat([a, b])
    c = make(2)
    c.batch["y"] = c.batch["y"].double()
    with pytest.raises(ValueError, match="tensor 'y' is torch.float64 in part 1"):
        DataProto.concat([make(2), c])
    with pytest.raises(KeyError, match="non-tensor keys"):
        DataProto.concat([make(2), make(2).select(non_tensor_batch_keys=["uid"])])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


def test_pad_and_unpad():
    data = make(5)
    padded, pad_size = pad_dataproto_to_divisor(data, 4)
    assert pad_size == 3 and len(padded) == 8
    assert rows(padded) == [0, 1, 2, 3, 4, 0, 1, 2]
    assert padded.non_tensor_batch["uid"].tolist()[5:] == ["u0", "u1", "u2"]
    outputs = DataProto.concat(padded.chunk(4))
    restored = unpad_dataproto(outputs, pad_size)
    assert rows(restored) == [0, 1, 2, 3, 4]
    same, zero = pad_dataproto_to_divisor(data, 5)
    assert zero == 0 and same is data
    assert unpad_dataproto(data, 0) is data


def test_pad_wraps_when_more_padding_than_rows():
    padded, pad_size = pad_dataproto_to_divisor(make(2), 7)
    assert pad_size == 5 and rows(padded) == [0, 1, 0, 1, 0, 1, 0]


# ----------------------------------------------------------------------------- repeat / reorder / to
def test_repeat_interleave_and_tile():
    data = make(2)
    inter = data.repeat(3, interleave=True)
    assert rows(inter) == [0, 0, 0, 1, 1, 1]
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1", "u1"]
    tiled = data.repeat(2, interleave=False)
    assert rows(tiled) == [0, 1, 0, 1]
    assert tiled.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1"]
    assert rows(data.repeat()) == [0, 0, 1, 1]


def test_reorder_in_place():
    data = make(4)
    data.reorder(torch.tensor([2, 0, 3, 1]))
    assert rows(data) == [2, 0, 3, 1]
    assert data.non_tensor_batch["uid"].tolist() == ["u2", "u0", "u3", "u1"]
    with pytest.raises(ValueError, match="needs 4 indices"):
        data.reorder([0, 1])


def test_to_device_returns_self():
    data = make(2)
    assert data.to("cpu") is data and data.batch.device == torch.device("cpu")


# ----------------------------------------------------------------------------- persistence
def assert_same(a: DataProto, b: DataProto) -> None:
    assert sorted(a.batch.keys()) == sorted(b.batch.keys())
    for key in a.batch.keys():
        assert torch.equal(a.batch[key], b.batch[key])
    assert {k: v.tolist() for k, v in a.non_tensor_batch.items()} == {
        k: v.tolist() for k, v in b.non_tensor_batch.items()
    }
    assert a.meta_info == b.meta_info


def test_pickle_and_torch_save_round_trip():
    data = make(4, meta={"metrics": {"loss": [1.0]}, "temperature": 0.7})
    assert_same(pickle.loads(pickle.dumps(data)), data)
    buffer = io.BytesIO()
    torch.save(data, buffer)
    buffer.seek(0)
    assert_same(torch.load(buffer, weights_only=False), data)


def test_pickled_chunk_ships_only_its_rows():
    big = DataProto.from_dict(tensors={"x": torch.zeros(1000, 256)})
    full = len(pickle.dumps(big))
    part = len(pickle.dumps(big.chunk(10)[3]))
    assert part < full / 5
    assert len(pickle.loads(pickle.dumps(big.chunk(10)[3]))) == 100


def test_save_and_load_from_disk(tmp_path):
    data = make(3)
    path = tmp_path / "sub" / "batch.pkl"
    data.save_to_disk(path)
    assert_same(DataProto.load_from_disk(path), data)
    assert [p.name for p in path.parent.iterdir()] == ["batch.pkl"]
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(TypeError, match="not a DataProto"):
        DataProto.load_from_disk(tmp_path / "other.pkl")


def test_repr_and_print_size(capsys):
    data = make(2)
    text = repr(data)
    assert text.startswith("DataProto(len=2, {x: [2, 2] int64, y: [2] float32, uid: np[2] object")
    assert data.size_bytes()[0] == 2 * 2 * 8 + 2 * 4
    data.print_size(prefix="rollout ")
    assert "rollout DataProto size: tensors 0.000 MB" in capsys.readouterr().out


def test_cloudpickle_as_ray_serialises_it():
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    part = make(4, meta={"temperature": 0.7}).chunk(2)[1]
    back = cloudpickle.loads(cloudpickle.dumps(part))
    assert_same(back, part)
    assert rows(back) == [2, 3]
