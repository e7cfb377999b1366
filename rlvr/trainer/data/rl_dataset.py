"""The RL prompt dataset: rows in the common format, tokenised with the chat template.

A row (parquet or JSONL) holds::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],      # chat messages
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...},
     "agent_name": "tool_agent"}                          # optional: the row's agent loop

Every prompt is rendered with the tokenizer's chat template and left-padded to one fixed length
(the longest kept prompt of the file, at most ``data.max_prompt_length``), so that batches drawn at
different steps have the same prompt width and can be concatenated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlvr.utils.torch_functional import compute_position_ids

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("data_source", "reward_model")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` file as dicts."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_rows(rows: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Write rows to ``.parquet`` or ``.jsonl`` (by suffix), creating the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), path)
        return
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")


class RLHFDataset(Dataset):
    """Prompts for RL training, tokenised once at construction.

    Args:
        data_files: one path or a list of ``.parquet`` / ``.jsonl`` files.
        tokenizer: a Hugging Face tokenizer with a pad token.
        config: the ``data`` config section (``prompt_key``, ``max_prompt_length``,
            ``filter_overlong_prompts``, ``truncation``, ``apply_chat_template``, ``val_max_samples``).
        processor: multimodal processor (unused for text-only data; kept for verl's signature).
        max_samples: keep only the first N rows (None = all).

    Each item is a dict with ``input_ids``, ``attention_mask``, ``position_ids`` (``[prompt_len]``,
    left-padded) and the non-tensor fields ``raw_prompt``, ``data_source``, ``ability``,
    ``reward_model``, ``extra_info``, ``index``, ``agent_name`` (None when the row has none).
    """

    def __init__(self, data_files: str | Sequence[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int | None = None) -> None:
        files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        rows = [row for path in files for row in read_rows(path)]
        if max_samples is not None:
            rows = rows[:max_samples]
        self.tokenizer = tokenizer
        self.config = config
        self.processor = processor
        self.prompt_key = config.prompt_key
        self.rows: list[dict[str, Any]] = []
        self.prompt_ids: list[list[int]] = []
        dropped = 0
        for row in rows:
            self._check_row(row, files)
            ids = self._tokenize(row[self.prompt_key])
            if len(ids) > config.max_prompt_length:
                if config.filter_overlong_prompts:
                    dropped += 1
                    continue
                ids = self._truncate(ids)
            self.rows.append(row)
            self.prompt_ids.append(ids)
        if dropped:
            logger.warning("dropped %d of %d prompts longer than data.max_prompt_length=%d tokens",
                           dropped, len(rows), config.max_prompt_length)
        self.num_filtered = dropped
        if not self.rows:
            raise ValueError(f"no prompts left in {files} (after dropping {dropped} over-long ones); "
                             "raise data.max_prompt_length or check the files")
        self.prompt_length = max(len(ids) for ids in self.prompt_ids)

    def _check_row(self, row: dict[str, Any], files: list) -> None:
        missing = [key for key in (self.prompt_key, *REQUIRED_COLUMNS) if key not in row]
        if missing:
            raise ValueError(f"a row of {files} lacks the column(s) {missing}; every row needs "
                             f"{self.prompt_key!r}, 'data_source' and 'reward_model' (see rlvr.trainer.data)")

    def _tokenize(self, prompt: Any) -> list[int]:
        if self.config.apply_chat_template:
            text = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
        else:
            text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _truncate(self, ids: list[int]) -> list[int]:
        limit = self.config.max_prompt_length
        if self.config.truncation == "left":
            return ids[-limit:]
        if self.config.truncation == "right":
            return ids[:limit]
        raise ValueError(f"a prompt has {len(ids)} tokens > data.max_prompt_length={limit}; set "
                         "data.filter_overlong_prompts=True, data.truncation=left|right, or raise the limit")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row, ids = self.rows[index], self.prompt_ids[index]
        pad = self.prompt_length - len(ids)
        input_ids = torch.tensor([self.tokenizer.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.tensor([0] * pad + [1] * len(ids), dtype=torch.long)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": compute_position_ids(attention_mask.unsqueeze(0))[0],
            "raw_prompt": list(row[self.prompt_key]),
            "data_source": row["data_source"],
            "ability": row.get("ability", "unknown"),
            "reward_model": dict(row["reward_model"]),
            "extra_info": dict(row.get("extra_info") or {}),
            "index": index,
            "agent_name": row.get("agent_name"),  # the row's agent loop (None: rollout.agent.default_agent_loop)
        }


def collate_fn(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Stack tensors to ``[batch, ...]``; other fields become numpy object arrays of length ``batch``."""
    out: dict[str, Any] = {}
    for key in items[0]:
        values = [item[key] for item in items]
        if isinstance(values[0], torch.Tensor):
            out[key] = torch.stack(values)
        else:
            array = np.empty(len(values), dtype=object)
            array[:] = values
            out[key] = array
    return out


def create_rl_dataset(data_files: Any, data_config: Any, tokenizer: Any, processor: Any = None,
                      max_samples: int | None = None) -> RLHFDataset:
    """The dataset for ``data.train_files`` or ``data.val_files`` (verl's factory name)."""
    files = [str(f) for f in data_files] if not isinstance(data_files, (str, Path)) else str(data_files)
    return RLHFDataset(files, tokenizer, data_config, processor=processor, max_samples=max_samples)
