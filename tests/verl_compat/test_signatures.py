"""The positional order of every public function and method of the runtime (protocol and single
controller) is verl 0.9's, so a positional verl-style call means the same thing in rlvr.

Each expected list is the leading parameters of verl 0.9's signature, in verl's order; rlvr may add
parameters after them (keyword-only where verl takes ``**kwargs``).
"""

from __future__ import annotations

import inspect

import pytest

import rlvr.protocol as protocol
import rlvr.single_controller.base.decorator as decorator
from rlvr.protocol import DataProto, DataProtoFuture
from rlvr.single_controller.base import ClassWithInitArgs, ResourcePool, WorkerGroup
from rlvr.single_controller.local import LocalResourcePool, LocalWorkerGroup
from rlvr.single_controller.ray import base as ray_base

VERL_ORDER = [
    (DataProto, ["batch", "non_tensor_batch", "meta_info"]),
    (protocol.DataProtoItem, ["batch", "non_tensor_batch", "meta_info"]),
    (DataProto.from_dict, ["tensors", "non_tensors", "meta_info", "num_batch_dims", "auto_padding"]),
    (DataProto.from_single_dict, ["data", "meta_info", "auto_padding"]),
    (DataProto.from_tensordict, ["tensor_dict", "meta_info", "num_batch_dims"]),
    (DataProto.select, ["self", "batch_keys", "non_tensor_batch_keys", "meta_info_keys", "deepcopy"]),
    (DataProto.select_idxs, ["self", "idxs"]),
    (DataProto.slice, ["self", "start", "end", "step"]),
    (DataProto.pop, ["self", "batch_keys", "non_tensor_batch_keys", "meta_info_keys"]),
    (DataProto.rename, ["self", "old_keys", "new_keys"]),
    (DataProto.union, ["self", "other"]),
    (DataProto.make_iterator, ["self", "mini_batch_size", "epochs", "seed", "dataloader_kwargs"]),
    (DataProto.padding, ["self", "padding_size", "padding_candidate"]),
    (DataProto.chunk, ["self", "chunks"]),
    (DataProto.split, ["self", "split_size"]),
    (DataProto.concat, ["data"]),
    (DataProto.reorder, ["self", "indices"]),
    (DataProto.repeat, ["self", "repeat_times", "interleave"]),
    (DataProto.unfold_column_chunks, ["self", "n_split", "split_keys"]),
    (DataProto.sample_level_repeat, ["self", "repeat_times"]),
    (DataProto.to, ["self", "device"]),
    (DataProto.save_to_disk, ["self", "filepath"]),
    (DataProto.load_from_disk, ["filepath"]),
    (DataProto.print_size, ["self", "prefix"]),
    (protocol.pad_dataproto_to_divisor, ["data", "size_divisor"]),
    (protocol.unpad_dataproto, ["data", "pad_size"]),
    (protocol.union_tensor_dict, ["tensor_dict1", "tensor_dict2"]),
    (protocol.union_numpy_dict, ["tensor_dict1", "tensor_dict2"]),
    (protocol.list_of_dict_to_dict_of_list, ["list_of_dict"]),
    (protocol.fold_batch_dim, ["data", "new_batch_size"]),
    (protocol.unfold_batch_dim, ["data", "batch_dims"]),
    (protocol.collate_fn, ["x"]),
    (DataProtoFuture, ["collect_fn", "futures", "dispatch_fn"]),
    (DataProtoFuture.concat, ["data"]),
    (DataProtoFuture.chunk, ["self", "chunks"]),
    (decorator.register, ["dispatch_mode", "execute_mode", "blocking", "materialize_futures"]),
    (decorator.register_dispatch_mode, ["dispatch_mode_name", "dispatch_fn", "collect_fn"]),
    (decorator.update_dispatch_mode, ["dispatch_mode", "dispatch_fn", "collect_fn"]),
    (decorator.get_predefined_dispatch_fn, ["dispatch_mode"]),
    (decorator.dispatch_one_to_all, ["worker_group"]),
    (decorator.dispatch_all_to_all, ["worker_group"]),
    (decorator.collect_all_to_all, ["worker_group", "output"]),
    (decorator.dispatch_dp_compute, ["worker_group"]),
    (decorator.collect_dp_compute, ["worker_group", "output"]),
    (decorator.dispatch_dp_compute_data_proto, ["worker_group"]),
    (decorator.dispatch_dp_compute_data_proto_with_func, ["worker_group"]),
    (decorator.collect_dp_compute_data_proto, ["worker_group", "output"]),
    (ResourcePool, ["process_on_nodes", "max_colocate_count"]),
    (ClassWithInitArgs, ["cls"]),
    (ray_base.RayClassWithInitArgs, ["cls"]),
    (ray_base.RayResourcePool, ["process_on_nodes", "use_gpu", "name_prefix", "max_colocate_count", "detached",
                                "accelerator_type"]),
    (ray_base.RayWorkerGroup, ["resource_pool", "ray_cls_with_init", "bin_pack", "name_prefix", "detached"]),
    (LocalResourcePool, ["process_on_nodes", "use_gpu", "name_prefix", "max_colocate_count", "detached",
                         "accelerator_type"]),
    (LocalWorkerGroup, ["resource_pool", "ray_cls_with_init", "bin_pack", "name_prefix", "detached"]),
    (WorkerGroup.spawn, ["self", "prefix_set"]),
    (WorkerGroup.execute_all_sync, ["self", "method_name"]),
    (WorkerGroup.execute_all_async, ["self", "method_name"]),
    (WorkerGroup.execute_rank_zero_sync, ["self", "method_name"]),
    (WorkerGroup.execute_rank_zero_async, ["self", "method_name"]),
    (ray_base.create_colocated_worker_cls, ["class_dict"]),
    (ray_base.create_colocated_worker_raw_cls, ["class_dict"]),
]


def _positional(fn) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


@pytest.mark.parametrize(("fn", "expected"), VERL_ORDER, ids=[getattr(f, "__qualname__", str(f)) for f, _ in VERL_ORDER])
def test_positional_order_matches_verl(fn, expected):
    assert _positional(fn)[: len(expected)] == expected


def test_dataproto_methods_of_verl_exist():
    for name in ("check_consistency", "is_padding_enabled", "to_tensordict", "from_tensordict", "print_size"):
        assert callable(getattr(DataProto, name))
