"""What every backend's merger shares: verl's command line and config, the Hugging Face output (LoRA
merged or saved as an adapter, a value model as a token-classification model, the tokenizer or the
processor), the comparison with a reference folder (``test``) and the upload.

A backend says only how to read the full state dict of a checkpoint folder (:meth:`BaseModelMerger.load_state`):
:mod:`rlvr.model_merger.fsdp` reads ``model.pt``, :mod:`rlvr.model_merger.megatron` joins the
tensor/pipeline-parallel shards. The weights keep the dtype they were trained in (verl casts to
bfloat16), so the merged model computes the same logits as the model in training.
"""

from __future__ import annotations

import argparse
import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer, GenerationConfig, PretrainedConfig

from rlvr.trainer.checkpoint import manifest_problem
from rlvr.utils.errors import RlvrError
from rlvr.utils.model import auto_model_class
from rlvr.utils.processor import load_processor
from rlvr.workers.checkpoint import HF_FILES_DIR, LORA_META_FILE, lora_scale, merge_lora_state, save_hf_folder

__all__ = ["ModelMergerConfig", "MergeError", "BaseModelMerger", "parse_args", "generate_config_from_args",
           "LORA_MODES", "ADAPTER_DIR"]

logger = logging.getLogger(__name__)

LORA_MODES = ("merged", "adapter")
"""``--lora``: fold the adapters into the weights, or write the base model and a peft adapter folder."""
ADAPTER_DIR = "lora_adapter"
"""Folder of the peft adapter inside ``target_dir`` with ``--lora adapter`` (verl's name)."""
_VALUE_PREFIX, _VALUE_HEAD = "backbone.", "value_head."


class MergeError(RlvrError):
    """A checkpoint that cannot be merged (missing, incomplete, corrupted, of another format); the
    message names the folder and the file."""


@dataclass
class ModelMergerConfig:
    """One merge or test (verl's fields; ``lora`` is rlvr's).

    Attributes:
        operation: ``merge`` (write a Hugging Face folder) or ``test`` (compare with ``test_hf_dir``).
        backend: ``fsdp`` or ``megatron``: the strategy that wrote the checkpoint.
        target_dir: where the merged model goes.
        hf_upload_path: a Hugging Face Hub repository to upload the merged folder to (None: no upload).
        private: create that repository private.
        test_hf_dir: the reference Hugging Face folder of ``test``.
        tie_word_embedding: the model ties its LM head to the embedding (checked against its config).
        trust_remote_code: allow model code from the checkpoint's config folder.
        is_value_model: the checkpoint is a critic: written as a token-classification model with one label.
        local_dir: the worker's checkpoint folder (``.../global_step_<k>/actor``).
        hf_model_config_path: the folder with the model's config and tokenizer (None:
            ``<local_dir>/huggingface``).
        use_cpu_initialization: accepted for verl's command lines; rlvr's merger always builds on CPU.
        lora: ``merged`` or ``adapter`` (see :data:`LORA_MODES`).
    """

    operation: str
    backend: str
    target_dir: Optional[str] = "tmp"
    hf_upload_path: Optional[str] = None
    private: bool = False
    test_hf_dir: Optional[str] = None
    tie_word_embedding: bool = False
    trust_remote_code: bool = False
    is_value_model: bool = False
    local_dir: Optional[str] = None
    hf_model_config_path: Optional[str] = None
    hf_upload: bool = field(init=False)
    use_cpu_initialization: bool = False
    lora: str = "merged"

    def __post_init__(self) -> None:
        self.hf_upload = self.operation == "merge" and bool(self.hf_upload_path)
        if self.operation == "test":
            self.target_dir, self.hf_upload_path, self.private = None, None, False


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """verl's command line: ``merge`` / ``test`` with ``--backend``, ``--local_dir``, ...; plus
    rlvr's ``--lora`` and ``--hf_model_config_path``."""
    parser = argparse.ArgumentParser(prog="python -m rlvr.model_merger",
                                     description="Turn an rlvr checkpoint into a Hugging Face model folder.")
    sub = parser.add_subparsers(dest="operation", required=True, help="merge or test")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--backend", required=True, choices=["fsdp", "megatron"],
                        help="the strategy that wrote the checkpoint")
    common.add_argument("--local_dir", required=True, help="the worker's checkpoint folder, e.g. "
                        "<run dir>/checkpoints/global_step_10/actor")
    common.add_argument("--tie-word-embedding", action="store_true",
                        help="the model ties its LM head to the embedding (checked against the saved config)")
    common.add_argument("--trust-remote-code", action="store_true", help="allow model code from the config folder")
    common.add_argument("--is-value-model", action="store_true",
                        help="a critic checkpoint: written as a token-classification model with one label")
    common.add_argument("--use_cpu_initialization", action="store_true",
                        help="accepted for verl's command lines: rlvr's merger always builds the model on CPU")
    common.add_argument("--hf_model_config_path", default=None,
                        help="folder with the model's config and tokenizer (default <local_dir>/huggingface; give "
                             "the run's starting model for a checkpoint without that folder)")
    common.add_argument("--lora", default="merged", choices=LORA_MODES,
                        help="a LoRA checkpoint: fold the adapters into the weights (merged), or write the base "
                             "model and a peft adapter in <target_dir>/lora_adapter (adapter, verl's layout)")
    merge = sub.add_parser("merge", parents=[common], help="write a Hugging Face model folder")
    merge.add_argument("--target_dir", default="tmp", help="where the merged model goes")
    merge.add_argument("--hf_upload_path", default=None, help="upload the merged folder to this Hub repository")
    merge.add_argument("--private", action="store_true", help="create the Hub repository private")
    test = sub.add_parser("test", parents=[common], help="compare the checkpoint's weights with a Hugging Face folder")
    test.add_argument("--test_hf_dir", required=True, help="the reference Hugging Face folder")
    return parser.parse_args(argv)


def generate_config_from_args(args: argparse.Namespace) -> ModelMergerConfig:
    """The :class:`ModelMergerConfig` of parsed arguments (verl's function name)."""
    common = dict(operation=args.operation, backend=args.backend, tie_word_embedding=args.tie_word_embedding,
                  trust_remote_code=args.trust_remote_code, is_value_model=args.is_value_model,
                  local_dir=args.local_dir, hf_model_config_path=args.hf_model_config_path,
                  use_cpu_initialization=args.use_cpu_initialization, lora=args.lora)
    if args.operation == "merge":
        return ModelMergerConfig(**common, target_dir=args.target_dir, hf_upload_path=args.hf_upload_path,
                                 private=args.private)
    return ModelMergerConfig(**common, test_hf_dir=args.test_hf_dir)


def _resolve_local_dir(local_dir: str | None) -> Path:
    """The worker folder: ``local_dir``, or its ``actor/`` when given a ``global_step_<k>`` folder."""
    if not local_dir:
        raise MergeError("--local_dir is required: the worker's checkpoint folder, e.g. "
                         "<run dir>/checkpoints/global_step_10/actor")
    path = Path(local_dir)
    if not path.is_dir():
        raise MergeError(f"checkpoint folder {path} does not exist; give the worker's folder of a checkpoint, "
                         "e.g. <run dir>/checkpoints/global_step_10/actor")
    holds_weights = (path / "model.pt").is_file() or any(path.glob("megatron_tp*_pp*.pt"))
    if (path / "actor").is_dir() and not holds_weights:
        logger.warning("%s is a whole checkpoint; merging its actor folder %s", path, path / "actor")
        return path / "actor"
    return path


class BaseModelMerger(ABC):
    """Merge one checkpoint folder into a Hugging Face model (see the module docstring).

    Args:
        config: the merge.
    """

    def __init__(self, config: ModelMergerConfig) -> None:
        self.config = config
        if config.use_cpu_initialization:
            logger.warning("--use_cpu_initialization: rlvr's merger always builds the model on CPU; nothing to change")
        if config.lora not in LORA_MODES:
            raise MergeError(f"--lora must be one of {LORA_MODES}, got {config.lora!r}")
        self.local_dir = _resolve_local_dir(config.local_dir)
        problem = manifest_problem(self.local_dir.parent, self.local_dir.name)
        if problem is not None:
            raise MergeError(f"checkpoint {self.local_dir.parent} does not match its manifest: {problem}; take "
                             "another checkpoint (a whole one has every file the manifest lists)")
        self.hf_model_config_path = Path(config.hf_model_config_path or self.local_dir / HF_FILES_DIR)
        self.model_config = self._load_config()

    def _load_config(self) -> PretrainedConfig:
        path = self.hf_model_config_path
        if not (path / "config.json").is_file():
            raise MergeError(f"{path / 'config.json'} is missing: the checkpoint {self.local_dir} carries no model "
                             f"config (checkpoints written before rlvr saved {HF_FILES_DIR}/); pass "
                             "--hf_model_config_path <the model the run started from>")
        config = AutoConfig.from_pretrained(path, trust_remote_code=self.config.trust_remote_code)
        if self.config.is_value_model:  # rlvr's critic: one value per token
            config.num_labels = 1
        return config

    @abstractmethod
    def load_state(self) -> dict[str, torch.Tensor]:
        """The checkpoint's full state dict: HF names (peft's with LoRA adapters; a critic's
        ``backbone.*`` and ``value_head.*``)."""

    # ------------------------------------------------------------------ the output state
    def _lora_meta(self) -> dict[str, Any]:
        path = self.local_dir / LORA_META_FILE
        if not path.is_file():
            raise MergeError(f"{self.local_dir} holds LoRA adapters but no {LORA_META_FILE}, so their scale "
                             "(lora_alpha / r) is unknown; the checkpoint was written before rlvr saved it")
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except ValueError as err:
            raise MergeError(f"{path} is not valid JSON ({err}); the checkpoint is damaged") from None

    def _model_class(self) -> type:
        if self.config.is_value_model:
            return AutoModelForTokenClassification
        return auto_model_class(self.model_config.model_type)

    def output_state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """``(state of the Hugging Face model, peft adapter state or None)``: LoRA folded in
        (``--lora merged``) or split off (``--lora adapter``), a critic renamed to the token-classification
        model's names, a tied LM head filled from the embedding."""
        state = self.load_state()
        head: dict[str, torch.Tensor] = {}
        if self.config.is_value_model:
            head = {f"score.{k.removeprefix(_VALUE_HEAD)}": v for k, v in state.items() if k.startswith(_VALUE_HEAD)}
            outside = sorted(k for k in state if not k.startswith((_VALUE_PREFIX, _VALUE_HEAD)))
            if not head or outside:
                raise MergeError(f"{self.local_dir} is not a critic checkpoint (--is-value-model): it has "
                                 f"{'no value_head' if not head else f'weights {outside[:3]}'}")
            state = {k.removeprefix(_VALUE_PREFIX): v for k, v in state.items() if k.startswith(_VALUE_PREFIX)}
        adapter = None
        if any(".lora_" in key for key in state):
            meta = self._lora_meta()
            if self.config.lora == "adapter":
                if self.config.is_value_model:
                    raise MergeError("--lora adapter writes a causal LM's adapter; a value model's adapters are "
                                     "merged (leave --lora at merged)")
                adapter = _adapter_state(state, meta["adapter_name"])
                state = _base_state(state)
            else:
                state = merge_lora_state(state, lora_scale(meta), meta["adapter_name"])
        if self.config.is_value_model:
            prefix = AutoModelForTokenClassification._model_mapping[type(self.model_config)].base_model_prefix
            state = {**{f"{prefix}.{k}": v for k, v in state.items()}, **head}
        self._check_tied(state)
        return state, adapter

    def _check_tied(self, state: dict[str, torch.Tensor]) -> None:
        tied = bool(getattr(self.model_config.get_text_config(), "tie_word_embeddings", False))
        if self.config.tie_word_embedding and not tied:
            raise MergeError(f"--tie-word-embedding was given, but the config in {self.hf_model_config_path} has "
                             "tie_word_embeddings=false: the checkpoint holds an LM head of its own; drop the flag")
        if tied and not self.config.is_value_model and "lm_head.weight" not in state:  # Megatron shards hold it once
            state["lm_head.weight"] = state["model.embed_tokens.weight"]

    # ------------------------------------------------------------------ merge, test, upload
    def merge_and_save(self) -> None:
        """``merge``: write the Hugging Face folder (and upload it); ``test``: compare with ``test_hf_dir``."""
        state, adapter = self.output_state()
        if self.config.operation == "test":
            self._compare(state)
            return
        target = Path(self.config.target_dir)
        _check_target(target)
        processor = load_processor(self.hf_model_config_path, trust_remote_code=self.config.trust_remote_code)
        tokenizer = None if processor is not None else self._tokenizer()
        save_hf_folder(target, self.model_config, self._generation_config(), state, tokenizer, processor,
                       self._model_class())
        if adapter is not None:
            _save_adapter(adapter, self._lora_meta(), target / ADAPTER_DIR)
        logger.info("merged %s into %s", self.local_dir, target)
        if self.config.hf_upload:
            self.upload_to_huggingface()

    def _tokenizer(self):
        if not any(self.hf_model_config_path.glob("tokenizer*")):
            return None
        return AutoTokenizer.from_pretrained(self.hf_model_config_path, trust_remote_code=self.config.trust_remote_code)

    def _generation_config(self) -> GenerationConfig | None:
        if self.config.is_value_model or not (self.hf_model_config_path / "generation_config.json").is_file():
            return None
        return GenerationConfig.from_pretrained(self.hf_model_config_path)

    def _compare(self, state: dict[str, torch.Tensor]) -> None:
        """Every tensor of the reference folder's model equals the checkpoint's (same names, shapes,
        dtypes and values, exactly); raises :class:`MergeError` naming the first difference."""
        reference = self._model_class().from_pretrained(self.config.test_hf_dir,
                                                        trust_remote_code=self.config.trust_remote_code).state_dict()
        if reference.keys() != state.keys():
            missing, extra = sorted(reference.keys() - state.keys()), sorted(state.keys() - reference.keys())
            raise MergeError(f"{self.local_dir} and {self.config.test_hf_dir} hold different tensors: missing "
                             f"{missing[:4]}, extra {extra[:4]}")
        for name, expected in reference.items():
            got = state[name]
            if got.shape != expected.shape or got.dtype != expected.dtype or not torch.equal(got, expected):
                raise MergeError(f"{name} differs between {self.local_dir} ({tuple(got.shape)}, {got.dtype}) and "
                                 f"{self.config.test_hf_dir} ({tuple(expected.shape)}, {expected.dtype})")
        logger.info("%s: all %d tensors equal those of %s", self.local_dir, len(reference), self.config.test_hf_dir)

    def upload_to_huggingface(self) -> None:
        """Create the Hub repository ``hf_upload_path`` (private with ``private``) and upload ``target_dir``."""
        from huggingface_hub import HfApi

        api = HfApi()
        try:
            api.create_repo(repo_id=self.config.hf_upload_path, private=self.config.private, exist_ok=True)
            api.upload_folder(folder_path=self.config.target_dir, repo_id=self.config.hf_upload_path,
                              repo_type="model")
        except Exception as err:  # the hub client raises HTTP, connection and auth errors of several types
            raise MergeError(f"uploading {self.config.target_dir} to {self.config.hf_upload_path} failed "
                             f"({type(err).__name__}: {err}); the merged folder is on disk, upload it again "
                             "with `huggingface-cli upload`") from err

    def cleanup(self) -> None:
        """Nothing to clean: the merger writes only ``target_dir`` (verl's method)."""


def _check_target(target: Path) -> None:
    """Refuse to replace a non-empty folder that is not a model folder (a typo must not delete data)."""
    if target.exists() and (not target.is_dir() or (any(target.iterdir()) and not (target / "config.json").is_file())):
        raise MergeError(f"--target_dir {target} exists and is not a model folder; the merge replaces the target "
                         "folder, so give a new or empty folder (or an earlier merge's)")


def _base_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's weights of a peft state dict, under the plain model's names (adapters left out)."""
    return {key.removeprefix("base_model.model.").replace(".base_layer.", "."): value
            for key, value in state.items() if ".lora_" not in key}


def _adapter_state(state: dict[str, torch.Tensor], adapter: str) -> dict[str, torch.Tensor]:
    """The LoRA tensors under the names of a peft adapter file (the adapter's name left out)."""
    return {key.replace(f".{adapter}.", "."): value.contiguous() for key, value in state.items() if ".lora_" in key}


def _save_adapter(adapter: dict[str, torch.Tensor], meta: dict[str, Any], folder: Path) -> None:
    """A peft adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that
    ``PeftModel.from_pretrained(base, folder)`` loads."""
    from peft import LoraConfig
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    LoraConfig(r=meta["r"], lora_alpha=meta["lora_alpha"], use_rslora=meta.get("use_rslora", False),
               target_modules=meta["target_modules"], task_type=meta.get("task_type")).save_pretrained(folder)
    save_file(adapter, str(folder / "adapter_model.safetensors"))
