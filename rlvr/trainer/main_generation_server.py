"""Offline generation: ``n`` responses to every prompt of a parquet file (verl's
``verl.trainer.main_generation_server``)::

    python -m rlvr.trainer.main_generation_server actor_rollout_ref.model.path=runs/sft/hf_model \\
        data.train_files=test.parquet data.prompt_key=prompt data.output_path=generated.parquet \\
        actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.temperature=1.0 \\
        actor_rollout_ref.rollout.response_length=256 trainer.n_gpus_per_node=1

The keys are the run config's (verl's ``ppo_trainer`` keys, plus ``data.output_path``). The rows of
``data.train_files`` (only the prompt column is needed: chat messages, rendered with the chat
template and, for a vision-language model, their images) go to the rollout workers of
``trainer.backend`` (``actor_rollout_ref.rollout.name``: ``hf`` or ``vllm``, their agent loop:
single turn, tools, environments) with the rollout's sampling settings (``n``, ``temperature``,
``top_p``, ``top_k``, ``do_sample``; ``temperature=0`` is greedy and needs ``n=1``), in batches of
``data.train_batch_size`` prompts. The output is the input rows, in order, with a ``responses``
column: the ``n`` decoded responses of each row (special tokens left out), the file that
``rlvr.trainer.main_eval`` scores. A prompt over ``data.max_prompt_length`` tokens is an error
naming the row (``data.truncation=left|right`` cuts it instead); no row is dropped.

``actor_rollout_ref.rollout.response_length`` (verl's key for the generation length) sets
``data.max_response_length``, from which rlvr derives the rollout's.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from rlvr.trainer.config import load_config
from rlvr.utils.errors import ConfigError, DataError, WorkerError

__all__ = ["check_generation_config", "generate", "main"]

logger = logging.getLogger(__name__)

_LENGTH_KEYS = {"actor_rollout_ref.rollout.response_length": "data.max_response_length",
                "actor_rollout_ref.rollout.prompt_length": "data.max_prompt_length"}


def check_generation_config(cfg: DictConfig) -> None:
    """What generation needs: input files, an output parquet path, a sample count, a layout.

    Raises:
        ConfigError: naming the key.
    """
    from rlvr.trainer.config.validate import world_size

    d, rollout, t = cfg.data, cfg.actor_rollout_ref.rollout, cfg.trainer
    files = [] if d.train_files is None else [d.train_files] if isinstance(d.train_files, str) else list(d.train_files)
    if not files:
        raise ConfigError("data.train_files", "no prompts given: set it to the parquet (or JSONL) file to generate for")
    for path in files:
        if not Path(path).is_file():
            raise ConfigError("data.train_files", f"{path!r} does not exist")
    if d.output_path is None or Path(d.output_path).suffix != ".parquet":
        raise ConfigError("data.output_path", f"{d.output_path!r}: set it to the .parquet file to write")
    if rollout.n < 1:
        raise ConfigError("actor_rollout_ref.rollout.n", "must be >= 1")
    if (rollout.temperature <= 0 or not rollout.do_sample) and rollout.n != 1:
        raise ConfigError("actor_rollout_ref.rollout.n", f"greedy decoding (temperature={rollout.temperature}, "
                          f"do_sample={rollout.do_sample}) gives {rollout.n} identical responses; set n=1 or sample")
    if d.train_batch_size < 1:
        raise ConfigError("data.train_batch_size", "must be >= 1 (prompts per generation call)")
    if t.backend not in ("local", "ray") or (t.backend == "local" and world_size(cfg) != 1):
        raise ConfigError("trainer.backend", "use local (one worker in this process) or ray (nnodes x n_gpus_per_node)")


def _rollout_group(cfg: DictConfig):
    """The rollout workers (``ActorRolloutRefWorker(role="rollout")``) of ``trainer.backend``."""
    import torch

    from rlvr.single_controller import ClassWithInitArgs
    from rlvr.single_controller.backend import start_worker_group
    from rlvr.trainer.config.validate import world_size
    from rlvr.workers.engine_workers import ActorRolloutRefWorker

    t = cfg.trainer
    use_gpu = t.device == "cuda" or (t.device == "auto" and torch.cuda.is_available())
    if t.backend == "ray":
        import ray

        from rlvr.single_controller import init_ray

        if not ray.is_initialized():
            init_ray(num_cpus=None if use_gpu else world_size(cfg))
    nodes = [1] if t.backend == "local" else [t.n_gpus_per_node] * t.nnodes
    group = start_worker_group(t.backend, nodes, use_gpu, ClassWithInitArgs(ActorRolloutRefWorker, cfg, "rollout"),
                               t.call_timeout_s, "generation")
    group.init_model()
    return group


def _generate_batch(group, items: list[dict], n: int, tokenizer) -> list[list[str]]:
    """The ``n`` decoded responses of each prompt of ``items`` (dataset items)."""
    from rlvr.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
    from rlvr.trainer.data import collate_fn

    batch = DataProto.from_single_dict(collate_fn(items)).repeat(n, interleave=True)
    batch.meta_info = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                       "validate": False, "global_steps": 0}
    padded, pad = pad_dataproto_to_divisor(batch, group.world_size)
    output = unpad_dataproto(group.generate_sequences(padded), pad)
    responses = output.batch["responses"]
    valid = output.batch["attention_mask"][:, -responses.shape[1]:].bool()  # sampled and inserted tokens
    texts = [tokenizer.decode(row[keep], skip_special_tokens=True) for row, keep in zip(responses, valid)]
    return [texts[i * n:(i + 1) * n] for i in range(len(items))]


def generate(cfg: DictConfig) -> Path:
    """Generate for every row of ``data.train_files`` and write ``data.output_path``; returns it."""
    from rlvr.trainer.data import write_rows
    from rlvr.trainer.data.rl_dataset import RLHFDataset
    from rlvr.utils.tokenizer import hf_processor, hf_tokenizer

    check_generation_config(cfg)
    if cfg.trainer.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the workers pick a GPU whenever one is visible
    model = cfg.actor_rollout_ref.model
    tokenizer = hf_tokenizer(model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code)
    processor = hf_processor(model.path, trust_remote_code=model.trust_remote_code)
    data = OmegaConf.merge(cfg.data, {"filter_overlong_prompts": False})  # every row is answered, in order
    files = [cfg.data.train_files] if isinstance(cfg.data.train_files, str) else list(cfg.data.train_files)
    dataset = RLHFDataset(files, tokenizer, data, processor=processor, prompts_only=True)
    group = _rollout_group(cfg)
    size, n = cfg.data.train_batch_size, cfg.actor_rollout_ref.rollout.n
    try:
        responses: list[list[str]] = []
        for start in range(0, len(dataset), size):
            items = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
            responses += _generate_batch(group, items, n, tokenizer)
            logger.info("generated for %d of %d prompts", len(responses), len(dataset))
    finally:
        group.shutdown()
    rows = [{**row, "responses": answers} for row, answers in zip(dataset.rows, responses)]
    write_rows(rows, cfg.data.output_path)
    logger.info("wrote %d rows x %d responses to %s", len(rows), n, cfg.data.output_path)
    return Path(cfg.data.output_path)


def _with_lengths(overrides: Sequence[str]) -> list[str]:
    """verl's rollout length keys also set rlvr's data length keys (which the rollout's derive from)."""
    out = list(overrides)
    for item in overrides:
        key, _, value = item.lstrip("+").partition("=")
        if key in _LENGTH_KEYS:
            out.append(f"{_LENGTH_KEYS[key]}={value}")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns 0, 2 for a config or data error, 1 when a worker failed."""
    parser = argparse.ArgumentParser(prog="python -m rlvr.trainer.main_generation_server",
                                     description="Generate n responses per prompt of a parquet file.")
    parser.add_argument("--preset", default=None, help="a preset name or YAML file applied before the overrides")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        generate(load_config(args.preset, _with_lengths(args.overrides)))
    except (ConfigError, DataError) as err:
        print(f"rlvr main_generation_server: {err}", file=sys.stderr)
        return 2
    except WorkerError as err:
        print(f"rlvr main_generation_server: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
