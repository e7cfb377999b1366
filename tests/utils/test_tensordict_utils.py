"""TensorDict batches (verl's ``tensordict_utils``) and the tensor / TensorDict serialisers of
``rlvr.protocol``, checked against values written out by hand."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlvr.protocol import deserialize_single_tensor, deserialize_tensordict, serialize_single_tensor, serialize_tensordict
from rlvr.utils import tensordict_utils as tu


def _rows(nested: torch.Tensor) -> list[list]:
    return [row.tolist() for row in nested.unbind()]


def _batch() -> TensorDict:
    ids = torch.nested.as_nested_tensor([torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([4, 5, 6]),
                                         torch.tensor([7])], layout=torch.jagged)
    return tu.get_tensordict({"ids": ids, "x": torch.arange(4.0), "turns": [[], [0.5], [0.1, 0.2], [1.0]]},
                             {"temperature": 0.7})


def test_rows_and_batch_level_values():
    td = _batch()
    assert td.batch_size == torch.Size([4]) and td["ids"].offsets().tolist() == [0, 2, 3, 6, 7]
    assert tu.get(td, "turns") == [[], [0.5], [0.1, 0.2], [1.0]] and tu.get(td, "temperature") == 0.7
    assert tu.get(td, "missing", "d") == "d" and tu.get_non_tensor_data(td, "temperature", None) == 0.7
    with pytest.raises(AssertionError, match="x has 3 rows, the other values 2"):
        tu.get_tensordict({"y": torch.zeros(2), "x": torch.zeros(3)})
    with pytest.raises(AssertionError, match="convert them to numpy"):
        tu.get_tensordict({"imgs": [torch.zeros(2)]})
    tu.assign_non_tensor(td, step=3, tags=["a", "b", "c", "d"])
    assert tu.get(td, "step") == 3 and tu.get(td, "tags") == ["a", "b", "c", "d"]


def test_select_chunk_concat_pad():
    td = _batch()
    picked = tu.index_select_tensor_dict(td, [2, 0])
    assert _rows(picked["ids"]) == [[4, 5, 6], [1, 2]] and tu.get(picked, "turns") == [[0.1, 0.2], []]
    assert tu.get(picked, "temperature") == 0.7 and tu.index_select_tensor_dict(None, [0]) is None
    first, second = tu.chunk_tensordict(td, 2)
    assert _rows(second["ids"]) == [[4, 5, 6], [7]] and second["x"].tolist() == [2.0, 3.0]
    joined = tu.concat_tensordict([first, second])
    tu.assert_tensordict_eq(joined, td)
    other = tu.get_tensordict({"ids": torch.nested.as_nested_tensor([torch.tensor([9])], layout=torch.jagged),
                               "x": torch.tensor([9.0]), "turns": [[9.0]]}, {"temperature": 1.5})
    assert tu.get(tu.concat_tensordict([td, other]), "temperature") == 0.7  # the first one's batch-level value
    padded, pad = tu.pad_to_divisor(tu.index_select_tensor_dict(td, [0, 1, 2]), 4)
    assert pad == 1 and padded["x"].tolist() == [0.0, 1.0, 2.0, 0.0] and len(tu.unpad(padded, pad)) == 3
    with pytest.raises(AssertionError, match="cannot cut 4 rows into 3"):
        tu.chunk_tensordict(td, 3)


def test_3d_nested_rows_keep_their_ragged_dimension():
    rows = [torch.arange(n).expand(3, n) for n in (2, 4, 1)]  # M-RoPE position ids [3, L_i]
    nested = tu.nested_tensor_from_tensor_list(rows, ragged_idx=2)
    td = tu.get_tensordict({"position_ids": nested})
    picked = tu.index_select_tensor_dict(td, [1, 2])["position_ids"]
    assert picked._ragged_idx == 2 and [r.tolist() for r in tu._rows(picked)] == [rows[1].tolist(), rows[2].tolist()]
    assert [r.shape for r in tu._rows(tu.concat_nested_tensors([picked, picked]))] == [(3, 4), (3, 1)] * 2


def test_union_keys_pop_iterate_contiguous():
    td = _batch()
    extra = tu.get_tensordict({"x": torch.arange(4.0), "y": torch.ones(4)})
    assert "y" in tu.union_tensor_dict(td, extra).keys()
    with pytest.raises(AssertionError, match="x in tensor_dict1 and tensor_dict2 are not the same object"):
        tu.union_tensor_dict(td, tu.get_tensordict({"x": torch.zeros(4)}))
    assert set(tu.get_keys(td, ["x", "temperature"]).keys()) == {"x", "temperature"}
    with pytest.raises(KeyError, match="nope not in tensordict"):
        tu.get_keys(td, ["nope"])
    popped = tu.pop_keys(td, ["y"])
    assert "y" not in td.keys() and popped["y"].tolist() == [1.0] * 4 and tu.pop(td, "nope", 5) == 5
    batches = list(tu.make_iterator(tu.get_tensordict({"x": torch.arange(6)}), mini_batch_size=2, epochs=2))
    assert [b["x"].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]] * 2
    strided = tu.get_tensordict({"a": torch.arange(8.0).reshape(4, 2)[:, :1]}, {"k": 1})
    assert not strided["a"].is_contiguous() and tu.contiguous(strided)["a"].is_contiguous()
    assert tu.get(tu.contiguous(strided), "k") == 1
    rows = tu.list_of_dict_to_tensordict([{"a": torch.zeros(2), "b": torch.zeros(1), "c": "u"},
                                          {"a": torch.ones(2), "b": torch.ones(3), "c": "v"}])
    assert rows["a"].shape == (2, 2) and rows["b"].is_nested and tu.get(rows, "c") == ["u", "v"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float8_e4m3fn])
def test_tensor_serialisation_round_trip(dtype):
    tensor = (torch.arange(12) % 3).reshape(3, 4).to(dtype)
    encoded = serialize_single_tensor(tensor)
    assert encoded[0] == str(dtype).removeprefix("torch.") and encoded[1] == (3, 4)
    assert encoded[2].dtype == np.uint8 and encoded[2].size == tensor.numel() * tensor.element_size()
    decoded = deserialize_single_tensor(pickle.loads(pickle.dumps(encoded)))
    assert decoded.dtype == dtype and torch.equal(decoded.view(torch.uint8), tensor.view(torch.uint8))


def test_tensordict_serialisation_round_trip():
    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    td = TensorDict({"x": torch.randn(2, 5), "ids": nested}, batch_size=[2], device="cpu")
    size, device, items = serialize_tensordict(td)
    assert size == (2,) and device == "cpu" and items["ids"][0] == "jagged" and len(items["ids"][1]) == 2
    back = deserialize_tensordict(pickle.loads(pickle.dumps((size, device, items))))
    assert torch.equal(back["x"], td["x"]) and back["ids"].layout == torch.jagged
    assert all(torch.equal(a, b) for a, b in zip(back["ids"].unbind(), nested.unbind()))
    with pytest.raises(ValueError, match="has 3 parts"):
        deserialize_tensordict(((1,), None, {"bad": ("a",)}))
    with pytest.raises(AssertionError, match="not a torch dtype"):
        deserialize_single_tensor(("tensor", (1,), np.zeros(4, np.uint8)))
