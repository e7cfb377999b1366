"""RL datasets (parquet / JSONL in the common format), collation, seeded resumable ordering."""

from rlvr.trainer.data.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset, read_rows, write_rows
from rlvr.trainer.data.sampler import SeededRandomSampler, StatefulBatchIterator, create_rl_sampler

__all__ = [
    "RLHFDataset",
    "SeededRandomSampler",
    "StatefulBatchIterator",
    "collate_fn",
    "create_rl_dataset",
    "create_rl_sampler",
    "read_rows",
    "write_rows",
]
