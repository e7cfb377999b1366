"""The RL prompt dataset: rows in the common format, tokenised with the chat template.

A row (parquet or JSONL) holds::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": "..."}],      # chat messages
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, ...},
     "agent_name": "tool_agent",                          # optional: the row's agent loop
     "images": ["img/0001.png"]}                          # optional: one per <image> in the prompt

With a multimodal processor, rows with images are rendered and tokenised by the processor
(:mod:`rlvr.trainer.data.vision`; the image forms accepted are in :mod:`rlvr.utils.images`).

Every prompt is rendered with the tokenizer's chat template and left-padded to one fixed length
(the longest kept prompt of the file, at most ``data.max_prompt_length``), so that batches drawn at
different steps have the same prompt width and can be concatenated.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from rlvr.trainer.data.vision import ImagePrompts
from rlvr.utils.errors import ConfigError, DataError
from rlvr.utils.torch_functional import compute_position_ids

logger = logging.getLogger(__name__)


def _read_jsonl(path: Path) -> list[tuple[str, Any]]:
    """``(location, row)`` for every non-blank line; a line that is not JSON names file and line."""
    rows = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {number}: not valid JSON ({err.msg} at column {err.colno}); "
                                "every line of a .jsonl file must be one JSON object") from None
    return rows


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise DataError(f"{path}: not a readable parquet file ({err}); rewrite it, e.g. with "
                        "rlvr.trainer.data.write_rows") from None
    return [(f"row {i}", row) for i, row in enumerate(table.to_pylist())]


def read_located_rows(path: str | Path) -> list[tuple[str, Any]]:
    """``(location, row)`` pairs of a ``.parquet`` or ``.jsonl`` file; the location (``"line 7"`` of a
    JSONL file, counted from 1; ``"row 6"`` of a parquet file, counted from 0) is for messages."""
    path = Path(path)
    return _read_parquet(path) if path.suffix == ".parquet" else _read_jsonl(path)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` file as dicts."""
    return [row for _, row in read_located_rows(path)]


def row_tag(row: dict[str, Any]) -> Any:
    """A row's domain tag (what ``reward.route_key=tag`` routes on): its ``tag`` column, else its
    data source (None for a prompts-only row without one)."""
    return row["tag"] if "tag" in row else row.get("data_source")


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


def _is_messages(prompt: Any) -> bool:
    return (isinstance(prompt, list) and bool(prompt)
            and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in prompt))


def row_problem(row: Any, prompt_key: str, chat_template: bool, prompts_only: bool = False) -> str | None:
    """What makes ``row`` unusable (naming the field), or None. A row needs the prompt under
    ``prompt_key`` (chat messages; a plain string too without the chat template), a ``data_source``
    string and a ``reward_model`` dict with a ``ground_truth`` that is not None (not with
    ``prompts_only``: rows to generate for, not to score)."""
    if not isinstance(row, dict):
        return f"is not an object with fields but a {type(row).__name__}"
    if prompt_key not in row:
        return f"has no {prompt_key!r} field (the prompt; data.prompt_key names the field to read)"
    prompt = row[prompt_key]
    if not (_is_messages(prompt) or (not chat_template and isinstance(prompt, str) and prompt)):
        return (f"field {prompt_key!r} must be a non-empty list of chat messages "
                f"[{{'role': ..., 'content': ...}}]{'' if chat_template else ' or a string'}, got {prompt!r:.80}")
    if prompts_only:
        return None
    if not isinstance(row.get("data_source"), str):
        return "has no 'data_source' string field (it selects the reward scorer)"
    reward_model = row.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        return ("has no 'reward_model.ground_truth' field (the reference answer the reward compares against; "
                "a parquet file stores a missing one as null)")
    return None


class RLHFDataset(Dataset):
    """Prompts for RL training, tokenised once at construction.

    Args:
        data_files: one path or a list of ``.parquet`` / ``.jsonl`` files.
        tokenizer: a Hugging Face tokenizer with a pad token.
        config: the ``data`` config section (``prompt_key``, ``max_prompt_length``,
            ``filter_overlong_prompts`` and ``filter_overlong_prompts_workers``, ``truncation``,
            ``apply_chat_template`` and ``apply_chat_template_kwargs``, ``mm_processor_kwargs``,
            ``return_raw_chat``, ``video_key``, ``audio_key``).
        processor: the model's multimodal processor, or None (text only). With one, rows with
            images (``data.image_key``) go through it, image tokens counted in the prompt length.
        max_samples: keep only N rows (None, or -1 as in verl = all): the first N, or with
            ``sample_seed`` a random subset of N (in file order).
        sample_seed: seed of the random subset (None: the first N rows).
        prompts_only: rows need only the prompt (offline generation): ``data_source`` and
            ``reward_model`` may be absent (None and ``{}`` in the items).

    Each item is a dict with ``input_ids``, ``attention_mask``, ``position_ids`` (``[prompt_len]``,
    left-padded) and the non-tensor fields ``raw_prompt``, ``data_source``, ``tag`` (the row's
    ``tag`` column, else its data source), ``ability``, ``reward_model``, ``extra_info``, ``index``,
    ``agent_name`` (None when the row has none); with a processor also ``multi_modal_inputs`` and
    ``multi_modal_data`` (``{}`` for a row without images; see :mod:`rlvr.utils.multimodal`).
    ``raw_prompt`` is left out with ``data.return_raw_chat=false``.

    Raises:
        DataError: an unreadable file, a malformed row, a missing field or an unreadable image
            (naming the file, the row and the field), an over-long prompt when neither filtering
            nor truncation is configured (or truncation would cut into an image), a row with videos or
            audio, or no prompt left after filtering.
    """

    def __init__(self, data_files: str | Sequence[str], tokenizer: Any, config: Any, processor: Any = None,
                 max_samples: int | None = None, sample_seed: int | None = None, prompts_only: bool = False) -> None:
        files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        located = _subset([(Path(path).parent, f"{path}, {where}", row) for path in files
                           for where, row in read_located_rows(path)], max_samples, sample_seed)
        self.tokenizer = tokenizer
        self.config = config
        self.processor = processor
        self.prompt_key = config.prompt_key
        self.images = None if processor is None else ImagePrompts(processor, config.image_key,
                                                                  config.apply_chat_template,
                                                                  dict(config.mm_processor_kwargs))
        self.rows: list[dict[str, Any]] = []
        self.prompt_ids: list[list[int]] = []
        self.sources: list[tuple[Path, str]] = []  # (folder of the data file, "file, line N") per row
        overlong = []
        for _, where, row in located:
            problem = row_problem(row, self.prompt_key, config.apply_chat_template, prompts_only) \
                or self._media_problem(row)
            if problem is not None:
                raise DataError(f"{where} {problem}")
        text_ids = self._tokenize_texts(located)
        for base_dir, where, row in located:
            with_images = self.images is not None and self.images.has_images(row)
            if with_images:
                ids = self.images.encode(row, self.prompt_key, base_dir, where)[0]
            else:
                ids = text_ids[where]
            if len(ids) > config.max_prompt_length:
                if config.filter_overlong_prompts:
                    overlong.append(len(ids))
                    continue
                kept = self._truncate(ids, where)
                if with_images:
                    self.images.check_truncation(ids, kept, where, config.max_prompt_length)
                ids = kept
            self.rows.append(row)
            self.prompt_ids.append(ids)
            self.sources.append((base_dir, where))
        self.num_filtered = len(overlong)
        if overlong:
            logger.warning("dropped %d of %d prompts longer than data.max_prompt_length=%d tokens "
                           "(data.filter_overlong_prompts=True) from %s", len(overlong), len(located),
                           config.max_prompt_length, files)
        if not self.rows:
            reason = (f"all {len(located)} prompts are longer than data.max_prompt_length="
                      f"{config.max_prompt_length} tokens (the shortest has {min(overlong)}); raise the limit"
                      if overlong else "the files have no rows")
            raise DataError(f"no prompts left in {files}: {reason}")
        self.prompt_length = max(len(ids) for ids in self.prompt_ids)

    def _media_problem(self, row: dict[str, Any]) -> str | None:
        """A row with videos or audio: rlvr trains on text and images only."""
        for key, kind in ((self.config.video_key, "videos"), (self.config.audio_key, "audio")):
            if row.get(key) is not None and len(row[key]) > 0:
                return (f"has {kind} in field {key!r}; rlvr trains on text and images only: remove them from the "
                        "data (or point data.video_key / data.audio_key at a field that holds none)")
        return None

    def _tokenize_texts(self, located: list[tuple[Path, str, Any]]) -> dict[str, list[int]]:
        """Prompt ids of the text rows (by location), in ``data.filter_overlong_prompts_workers``
        processes when that is > 1 (the same ids)."""
        with_images = self.images is not None
        prompts = {where: row[self.prompt_key] for _, where, row in located
                   if not (with_images and self.images.has_images(row))}
        workers = int(self.config.filter_overlong_prompts_workers)
        if workers <= 1 or len(prompts) < 2:
            return {where: self._tokenize(prompt) for where, prompt in prompts.items()}
        settings = (self.tokenizer, bool(self.config.apply_chat_template), dict(self.config.apply_chat_template_kwargs))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            ids = pool.map(_tokenize_prompt, [settings] * len(prompts), prompts.values(),
                           chunksize=max(1, len(prompts) // workers))
            return dict(zip(prompts, ids))

    def _tokenize(self, prompt: Any) -> list[int]:
        return tokenize_prompt(self.tokenizer, prompt, self.config.apply_chat_template,
                               dict(self.config.apply_chat_template_kwargs))

    def _truncate(self, ids: list[int], where: str) -> list[int]:
        limit = self.config.max_prompt_length
        if self.config.truncation == "left":
            return ids[-limit:]
        if self.config.truncation == "right":
            return ids[:limit]
        raise DataError(f"{where}: the prompt has {len(ids)} tokens > data.max_prompt_length={limit}; set "
                        "data.filter_overlong_prompts=True (drop such prompts), data.truncation=left|right, "
                        "or raise the limit")

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
            **({"raw_prompt": list(row[self.prompt_key])} if self.config.return_raw_chat else {}),
            "data_source": row.get("data_source"),  # every row has one, but for prompts_only
            "tag": row_tag(row),
            "ability": row.get("ability", "unknown"),
            "reward_model": dict(row.get("reward_model") or {}),
            "extra_info": dict(row.get("extra_info") or {}),
            "index": index,
            "agent_name": row.get("agent_name"),  # the row's agent loop (None: rollout.agent.default_agent_loop)
            **self._image_fields(row, index),
        }

    def _image_fields(self, row: dict[str, Any], index: int) -> dict[str, Any]:
        """``multi_modal_inputs`` / ``multi_modal_data`` of a row (with a processor only): the images
        are read and processed again here rather than held for the whole dataset."""
        if self.images is None:
            return {}
        if not self.images.has_images(row):
            return self.images.item_fields({}, [])
        base_dir, where = self.sources[index]
        _, inputs, images = self.images.encode(row, self.prompt_key, base_dir, where)
        return self.images.item_fields(inputs, images)


def tokenize_prompt(tokenizer: Any, prompt: Any, chat_template: bool, template_kwargs: dict[str, Any]) -> list[int]:
    """Ids of one prompt: rendered with the tokenizer's chat template (with ``template_kwargs``,
    ``data.apply_chat_template_kwargs``) or its message contents joined with newlines."""
    if chat_template:
        text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False,
                                             **template_kwargs)
    else:
        text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _tokenize_prompt(settings: tuple[Any, bool, dict[str, Any]], prompt: Any) -> list[int]:
    """:func:`tokenize_prompt` in a pool process (``settings``: tokenizer, chat template, kwargs)."""
    return tokenize_prompt(settings[0], prompt, settings[1], settings[2])


def _subset(located: list, max_samples: int | None, seed: int | None) -> list:
    """``max_samples`` rows (None or < 0: all): the first ones, or a seeded random choice kept in order."""
    if max_samples is None or max_samples < 0 or max_samples >= len(located):
        return located
    if seed is None:
        return located[:max_samples]
    chosen = np.random.default_rng(seed).choice(len(located), size=max_samples, replace=False)
    return [located[i] for i in sorted(chosen.tolist())]


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


def create_rl_dataset(data_paths: Any, data_config: Any, tokenizer: Any, processor: Any = None, is_train: bool = True,
                      max_samples: int | None = None) -> Dataset:
    """The dataset for ``data.train_files`` or ``data.val_files`` (verl's factory, name and order).

    ``data.custom_cls`` (``path`` a ``.py`` file or a module, ``name`` the class) replaces
    :class:`RLHFDataset` with a dataset class of the user's, called as verl calls it:
    ``cls(data_files=..., tokenizer=..., processor=..., config=data_config, max_samples=...)``.
    ``max_samples`` (None: ``data.train_max_samples`` for training, all rows for validation) keeps a
    random subset seeded by ``data.seed`` for training, the first rows for validation.

    Raises:
        ConfigError: ``data.custom_cls`` does not load or is not a ``torch.utils.data.Dataset``.
    """
    files = [str(f) for f in data_paths] if not isinstance(data_paths, (str, Path)) else str(data_paths)
    if is_train and max_samples is None:
        max_samples = data_config.train_max_samples
    custom = data_config.custom_cls
    if custom.path is not None:
        from rlvr.utils.user_code import UserCodeError, load_object

        try:
            cls = load_object(f"{custom.path}:{custom.name}")
        except UserCodeError as err:
            raise ConfigError("data.custom_cls", str(err)) from None
        if not (isinstance(cls, type) and issubclass(cls, Dataset)):
            raise ConfigError("data.custom_cls", f"{custom.path}:{custom.name} is not a torch.utils.data.Dataset class")
        return cls(data_files=files, tokenizer=tokenizer, processor=processor, config=data_config,
                   max_samples=max_samples)
    return RLHFDataset(files, tokenizer, data_config, processor=processor, max_samples=max_samples,
                       sample_seed=int(data_config.seed) if is_train and data_config.seed is not None else None)
