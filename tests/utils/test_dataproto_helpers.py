"""The helpers behind DataProto: equality, chunk sizes, reshaping errors, padding settings,
``DynamicEnum`` and the futures (hand-computed expectations)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

from rlvr.protocol import DataProto, DataProtoConfig, DataProtoFuture, auto_padding, fold_batch_dim, unfold_batch_dim
from rlvr.utils.dataproto_ops import chunk_sizes, deep_equal, values_equal
from rlvr.utils.errors import ProtocolError, ProtocolKeyError, ProtocolTypeError
from rlvr.utils.futures import WorkerFuture
from rlvr.utils.py_functional import DynamicEnum, _enum_member


def rows(n: int) -> DataProto:
    return DataProto.from_dict(tensors={"a": torch.arange(n)}, non_tensors={"t": [f"r{i}" for i in range(n)]})


# ----------------------------------------------------------------------------- equality
def test_deep_equal_is_type_strict_and_nan_equal():
    assert deep_equal(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    assert not deep_equal(np.array([1, 2]), np.array([1.0, 2.0]))  # dtypes differ
    assert not deep_equal(np.array([1, 2]), np.array([[1, 2]]))  # shapes differ
    assert not deep_equal(1, 1.0) and deep_equal(float("nan"), float("nan"))
    assert deep_equal(np.array(["a", None], dtype=object), np.array(["a", None], dtype=object))
    assert not deep_equal(np.array(["a"], dtype=object), np.array([np.str_("a")], dtype=object))
    ring = np.array([None], dtype=object)
    ring[0] = ring
    other = np.array([None], dtype=object)
    other[0] = other
    assert deep_equal(ring, other) and not deep_equal(ring, np.array([None], dtype=object))
    assert deep_equal(torch.tensor([1, 2]), torch.tensor([1, 2])) and not deep_equal(torch.tensor([1]), torch.tensor([2]))


def test_values_equal_follows_python_equality():
    assert values_equal(1, 1.0) and values_equal({"a": [1]}, {"a": [1]})
    assert values_equal(np.array([1, 2]), np.array([1.0, 2.0])) and not values_equal(np.array([1]), np.array([2]))
    assert not values_equal(torch.tensor([1]), [1])


@pytest.mark.parametrize(("length", "chunks", "sizes"), [
    (8, 4, [2, 2, 2, 2]), (10, 4, [3, 3, 3, 1]), (9, 4, [3, 3, 3, 0]), (1, 3, [1, 0, 0]), (0, 2, [0, 0]),
])
def test_chunk_sizes(length, chunks, sizes):
    assert chunk_sizes(length, chunks) == sizes and sum(sizes) == length


# ----------------------------------------------------------------------------- reshaping errors
def test_reshaping_rejects_bad_arguments():
    with pytest.raises(ProtocolError, match="cannot fold 5 rows into 2 groups"):
        fold_batch_dim(rows(5), 2)
    folded = fold_batch_dim(rows(6), 3)
    assert folded.batch["a"].tolist() == [[0, 1], [2, 3], [4, 5]] and folded.non_tensor_batch["t"].shape == (3, 2)
    assert unfold_batch_dim(folded).batch["a"].tolist() == list(range(6))
    odd = DataProto(batch=TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2]),
                    non_tensor_batch={"t": np.zeros((2, 2), dtype=object)})
    with pytest.raises(ProtocolError, match="leading shapes"):
        unfold_batch_dim(odd)
    with pytest.raises(ProtocolKeyError, match=r"no key\(s\) \['nope'\]"):
        rows(2).unfold_column_chunks(2, split_keys=["nope"])
    with pytest.raises(ProtocolError, match="cannot split key 'a' of shape \\[2, 3\\] into 2"):
        DataProto.from_dict(tensors={"a": torch.zeros(2, 3)}).unfold_column_chunks(2, split_keys=["a"])
    with pytest.raises(ProtocolError, match="one count >= 0 per row"):
        rows(3).sample_level_repeat([1, 2])
    with pytest.raises(ProtocolTypeError, match="repeat_times must be a list"):
        rows(3).sample_level_repeat(2)
    with pytest.raises(ProtocolError, match="padding_candidate"):
        rows(3).padding(1, padding_candidate="middle")
    with pytest.raises(ProtocolError, match="cannot add 1 padding rows to a DataProto of length 0"):
        DataProto().padding(1)


def test_tensordict_conversion_errors():
    clash = DataProto.from_dict(tensors={"a": torch.zeros(2)}, meta_info={"a": 1})
    with pytest.raises(ProtocolKeyError, match="key 'a' is in both batch and meta_info"):
        clash.to_tensordict()
    with pytest.raises(ProtocolTypeError, match="needs a TensorDict"):
        DataProto.from_tensordict({"a": torch.zeros(2)})
    with pytest.raises(ProtocolError, match="one batch dim"):
        DataProto.from_tensordict(TensorDict({"a": torch.zeros(2)}, batch_size=[2]), num_batch_dims=2)
    td = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    td["flag"] = NonTensorData(True, batch_size=[2])
    assert DataProto.from_tensordict(td, meta_info={"step": 1}).meta_info == {"step": 1, "flag": True}


# ----------------------------------------------------------------------------- padding settings
def test_auto_padding_settings(monkeypatch):
    assert not DataProtoConfig.auto_padding and DataProtoConfig.dispatch_padding
    monkeypatch.setenv("RLVR_AUTO_PADDING", "1")
    assert DataProtoConfig.auto_padding and rows(3).is_padding_enabled()
    monkeypatch.delenv("RLVR_AUTO_PADDING")
    with auto_padding():
        with auto_padding(False):
            assert not DataProtoConfig.auto_padding
        assert DataProtoConfig.auto_padding
    assert not DataProtoConfig.auto_padding
    with pytest.raises(TypeError, match="must be a bool"):
        DataProtoConfig.auto_padding = "yes"
    with pytest.raises(TypeError, match="must be a bool"):
        DataProtoConfig.dispatch_padding = 1
    assert DataProto.from_dict(tensors={"a": torch.zeros(2)}, auto_padding=True).meta_info == {
        DataProtoConfig.auto_padding_key: True
    }


# ----------------------------------------------------------------------------- DynamicEnum
class Colour(DynamicEnum):
    pass


def test_dynamic_enum_members():
    red = Colour.register("red")
    assert red is Colour.RED is Colour["red"] is Colour.from_name("Red") and red.value == 0
    blue = Colour.register("BLUE")
    assert blue.value == 1 and list(Colour) == [red, blue] and len(Colour) == 2 and "blue" in Colour
    assert repr(blue) == "<Colour.BLUE: 1>" and Colour.from_name("green") is None
    with pytest.raises(ValueError, match="Colour.RED is already registered"):
        Colour.register("red")
    assert pickle.loads(pickle.dumps(red)) is red
    assert Colour.remove("blue") is blue and "BLUE" not in Colour and not hasattr(Colour, "BLUE")
    with pytest.raises(KeyError, match="no member 'BLUE'"):
        Colour.remove("blue")
    with pytest.raises(KeyError, match="no member 'BLUE'"):
        Colour["blue"]
    revived = _enum_member(Colour, "BLUE")  # unpickling a member this process never registered
    assert revived is Colour.BLUE and revived.value == 2
    for name in Colour.names():
        Colour.remove(name)


# ----------------------------------------------------------------------------- futures
class _FakeGroup:
    """Stands in for a worker group: ``_wait`` returns the handles as the outputs."""

    name = "fake"
    waits = 0

    def _wait(self, handles, ranks, method, timeout_s):
        self.waits += 1
        return list(handles)


def test_data_proto_future_of_parts_chunks_and_composes():
    parts = [rows(2), rows(4)[2:]]
    future = DataProtoFuture.concat(parts)
    assert future.get().batch["a"].tolist() == [0, 1, 2, 3]
    halves = future.chunk(2)
    assert [h.get().batch["a"].tolist() for h in halves] == [[0, 1], [2, 3]]
    quarters = halves[1].chunk(2)  # a chunk of a chunk selects inside the parent's part
    assert [q.get().batch["a"].tolist() for q in quarters] == [[2], [3]]
    with pytest.raises(ProtocolTypeError, match="future 0 resolved to a int"):
        DataProtoFuture.concat([1]).get()
    with pytest.raises(ProtocolTypeError, match="resolved to a list"):
        DataProtoFuture(collect_fn=list, futures=[rows(1)]).get()


def test_worker_future_waits_once_and_stays_on_the_driver():
    group = _FakeGroup()
    future = WorkerFuture(group, "m", [0, 1], [rows(2), rows(2)], DataProto.concat, 5.0)
    assert future == future.handles and len(future) == 2
    wrapped = DataProtoFuture(collect_fn=future.finish, futures=future)
    assert [c.get().batch["a"].tolist() for c in wrapped.chunk(2)] == [[0, 1], [0, 1]]
    assert future.get().batch["a"].tolist() == [0, 1, 0, 1] and group.waits == 1
    assert copy.deepcopy(future) is future
    with pytest.raises(TypeError, match="cannot be sent to another process"):
        pickle.dumps(future)
