"""Ray backend of the single controller."""

from rlvr.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    init_ray,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "init_ray",
]
