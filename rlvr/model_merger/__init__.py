"""Turn a training checkpoint into a Hugging Face model folder (verl's ``verl.model_merger``)::

    python -m rlvr.model_merger merge --backend fsdp \\
        --local_dir runs/rlvr/run/checkpoints/global_step_10/actor --target_dir merged

The output loads with ``from_pretrained`` and as ``actor_rollout_ref.model.path``; see
``docs/model_merger.md``.
"""

from rlvr.model_merger.base import (ADAPTER_DIR, LORA_MODES, BaseModelMerger, MergeError, ModelMergerConfig,
                                    generate_config_from_args, parse_args)

__all__ = ["ADAPTER_DIR", "LORA_MODES", "BaseModelMerger", "MergeError", "ModelMergerConfig", "generate_config_from_args",
           "parse_args", "get_merger", "main"]


def get_merger(config: ModelMergerConfig) -> BaseModelMerger:
    """The merger of ``config.backend`` (``fsdp`` or ``megatron``)."""
    if config.backend == "fsdp":
        from rlvr.model_merger.fsdp import FSDPModelMerger

        return FSDPModelMerger(config)
    if config.backend == "megatron":
        from rlvr.model_merger.megatron import MegatronModelMerger

        return MegatronModelMerger(config)
    raise MergeError(f"--backend must be fsdp or megatron, got {config.backend!r}")


def main(argv: list[str] | None = None) -> int:
    """The command; returns 0, or 1 after printing why a checkpoint could not be merged."""
    import logging
    import sys

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    config = generate_config_from_args(parse_args(argv))
    try:
        merger = get_merger(config)
        merger.merge_and_save()
        merger.cleanup()
    except MergeError as err:
        print(f"rlvr.model_merger: {err}", file=sys.stderr)
        return 1
    return 0
