"""rlvr: reinforcement-learning post-training for LLMs with a single controller on Ray.

``from rlvr import DataProto`` works as ``from verl import DataProto`` does. ``DataProto`` is
imported on first use, so ``import rlvr`` (and the ``rlvr`` command's config check) does not load
torch.
"""

__version__ = "0.1.0"

__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    if name == "DataProto":
        from rlvr.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
