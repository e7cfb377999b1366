"""GPU tests: every test here needs CUDA and is skipped without it (CI has no GPU).

A test module that sets ``CPU_REHEARSABLE = True`` takes its device from the ``gpu_device`` fixture
and its dtype from ``gpu_dtype``, so that it can be proven on a CPU before GPU time is spent:
with ``RLVR_GPU_TESTS_DEVICE=cpu`` its ``gpu`` tests run on the CPU (fp32) instead of being skipped,
e.g. ``RLVR_GPU_TESTS_DEVICE=cpu pytest -m gpu tests/gpu/test_roles_cuda.py``. The other modules
need CUDA kernels and stay skipped without a CUDA device, whatever the variable says.
"""

from __future__ import annotations

import os

import pytest
import torch

DEVICE_ENV = "RLVR_GPU_TESTS_DEVICE"
"""Device of the ``CPU_REHEARSABLE`` modules' tests: ``cuda`` (unset: the default) or ``cpu``."""
DTYPE_ENV = "RLVR_GPU_TESTS_DTYPE"
"""Their dtype: ``bfloat16`` or ``float32`` (unset: bfloat16 on CUDA, as the roles run there; float32 on CPU)."""
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}


def _rehearsed(item: pytest.Item) -> bool:
    """The item belongs to a ``CPU_REHEARSABLE`` module and ``RLVR_GPU_TESTS_DEVICE`` names a device."""
    module = getattr(item, "module", None)
    return bool(os.environ.get(DEVICE_ENV)) and bool(getattr(module, "CPU_REHEARSABLE", False))


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available() and not _rehearsed(item):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def gpu_device() -> str:
    """``"cuda"``, or the value of ``RLVR_GPU_TESTS_DEVICE`` when set (``"cpu"``: the CPU rehearsal).

    The workers pick their device themselves (CUDA whenever one is visible), so a CPU device on a
    machine with a visible GPU is refused rather than silently tested on the GPU."""
    device = os.environ.get(DEVICE_ENV) or "cuda"
    if device not in ("cuda", "cpu"):
        raise pytest.UsageError(f"{DEVICE_ENV}={device!r}: use cuda or cpu")
    if device == "cpu" and torch.cuda.is_available():
        raise pytest.UsageError(f"{DEVICE_ENV}=cpu but a CUDA device is visible, which rlvr's workers would take: "
                                "hide it (CUDA_VISIBLE_DEVICES=) or unset the variable")
    return device


@pytest.fixture(scope="session")
def gpu_dtype(gpu_device) -> torch.dtype:
    """The dtype the roles compute in: ``RLVR_GPU_TESTS_DTYPE`` when set, else bfloat16 on CUDA
    (as the roles run there in practice) and float32 on CPU."""
    name = os.environ.get(DTYPE_ENV)
    if name is None:
        return torch.bfloat16 if gpu_device == "cuda" else torch.float32
    if name not in _DTYPES:
        raise pytest.UsageError(f"{DTYPE_ENV}={name!r}: use one of {', '.join(_DTYPES)}")
    return _DTYPES[name]
