"""Ray helpers at verl's path ``verl.utils.ray_utils``."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import ray

from rlvr.utils.errors import ProtocolError

__all__ = ["parallel_put"]

MAX_PUT_THREADS = 16


def parallel_put(data_list: list[Any], max_workers: int | None = None) -> list[ray.ObjectRef]:
    """``ray.put`` every item from a thread pool (``max_workers`` threads, default up to 16): large
    items serialise at once instead of one after another. Returns the refs in the items' order.

    Raises:
        ProtocolError: an empty list (also an ``AssertionError``, as verl asserts).
    """
    if len(data_list) == 0:
        raise ProtocolError("parallel_put needs at least one item; data_list is empty")
    with ThreadPoolExecutor(max_workers=max_workers or min(len(data_list), MAX_PUT_THREADS)) as pool:
        return list(pool.map(ray.put, data_list))
