"""Offline evaluation: score a file of generated responses per data source (verl's
``verl.trainer.main_eval``)::

    python -m rlvr.trainer.main_eval data.path=generated.parquet \\
        custom_reward_function.path=my_reward.py custom_reward_function.name=compute_score

verl 0.9.1's ``evaluation.yaml`` keys (:mod:`rlvr.trainer.config.eval_schema`). Every response of a
row (``data.response_key``, a list, as ``main_generation_server`` writes it) is scored against the
row's ``reward_model.ground_truth`` by the user's function (``custom_reward_function``) or, without
one, by rlvr's scorer registered for the row's data source (``data.data_source_key``), each in a
helper process under ``scoring.timeout_s`` (``ray_kwargs.ray_init.num_cpus`` of them). A row's score
is the mean over its responses; ``test_score/<data source>`` is the mean over that source's rows, as
verl prints it. A response the scorer declines (None) is left out of its row's mean. A malformed row
is an error naming the file, the row and the field; a scorer that fails, the row and the response.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from rlvr.trainer.config.eval_schema import EvalConfig
from rlvr.trainer.config.structured import load_structured_config
from rlvr.utils.errors import ConfigError, DataError, RewardError

__all__ = ["load_eval_config", "read_scored_rows", "evaluate", "main"]

logger = logging.getLogger(__name__)


def load_eval_config(overrides: Sequence[str] = (), config_file: str | Path | None = None) -> DictConfig:
    """The evaluation config (verl's ``evaluation.yaml`` keys, Hydra's override grammar), checked.

    Raises:
        ConfigError: an unknown key, a wrong value, a missing input file, a Ray timeline.
    """
    cfg = load_structured_config(EvalConfig, overrides, config_file, tool="offline evaluation",
                                 base_names=("evaluation",))
    if cfg.data.path is None or not Path(cfg.data.path).is_file():
        raise ConfigError("data.path", f"{cfg.data.path!r}: set it to the parquet (or JSONL) file of generated responses")
    if cfg.ray_kwargs.timeline_json_file is not None:
        raise ConfigError("ray_kwargs.timeline_json_file", "rlvr scores in a process pool, not on Ray, so there is no "
                          "Ray timeline; remove the key")
    num_cpus = cfg.ray_kwargs.ray_init.num_cpus
    if num_cpus is not None and num_cpus < 1:
        raise ConfigError("ray_kwargs.ray_init.num_cpus", "must be >= 1 (or null for this machine's cores)")
    if cfg.scoring.timeout_s <= 0:
        raise ConfigError("scoring.timeout_s", "must be > 0 seconds")
    return cfg


def read_scored_rows(cfg: DictConfig) -> list[tuple[str, str, list[str], Any, dict]]:
    """``(where, data source, responses, ground truth, extra_info)`` of every row of ``data.path``.

    Raises:
        DataError: a row without a list of response strings, a data source string or a
            ``reward_model`` dict with a ground truth, naming the file, the row and the field.
    """
    from rlvr.trainer.data.rl_dataset import read_located_rows

    d = cfg.data
    out = []
    for where, row in read_located_rows(d.path):
        where = f"{d.path}, {where}"
        responses, source, reward = row.get(d.response_key), row.get(d.data_source_key), row.get(d.reward_model_key)
        if not isinstance(responses, list) or not responses or not all(isinstance(r, str) for r in responses):
            raise DataError(f"{where}: field {d.response_key!r} must be a non-empty list of response strings (what "
                            f"main_generation_server writes), got {responses!r:.80}")
        if not isinstance(source, str):
            raise DataError(f"{where}: field {d.data_source_key!r} must be the data source string, got {source!r:.80}")
        if not isinstance(reward, dict) or reward.get("ground_truth") is None:
            raise DataError(f"{where}: field {d.reward_model_key!r} must be a dict with a ground_truth, got {reward!r:.80}")
        out.append((where, source, responses, reward["ground_truth"], dict(row.get("extra_info") or {})))
    return out


def _score_all(cfg: DictConfig, rows: list) -> list[list[float | None]]:
    """Every response's score (None where the scorer declined), row by row, in helper processes."""
    from rlvr.reward.managers.base import normalize_score
    from rlvr.reward.scorers import default_compute_score
    from rlvr.reward.scorers.process_pool import TimeoutProcessPool
    from rlvr.reward.scorers.registry import call_scorer_tagged
    from rlvr.trainer.ppo.reward import get_custom_reward_fn

    compute_score = get_custom_reward_fn(cfg) or default_compute_score
    tasks, owners = [], []
    for i, (_, source, responses, truth, extra) in enumerate(rows):
        for j, response in enumerate(responses):
            tasks.append((compute_score, {"data_source": source, "solution_str": response, "ground_truth": truth,
                                          "extra_info": extra}))
            owners.append((i, j))
    workers = min(cfg.ray_kwargs.ray_init.num_cpus or os.cpu_count() or 1, len(tasks))
    pool = TimeoutProcessPool(num_workers=workers, timeout_s=cfg.scoring.timeout_s)
    try:
        results = pool.run(call_scorer_tagged, tasks)
    finally:
        pool.close()
    scores: list[list[float | None]] = [[None] * len(row[2]) for row in rows]
    for (i, j), result in zip(owners, results):
        where, source = rows[i][0], rows[i][1]
        if result.status != "ok" or result.value[0] != "ok":
            why = result.error if result.status != "ok" else result.value[1]
            raise RewardError(f"{where}: scoring response {j} (data source {source!r}) failed "
                              f"({result.status if result.status != 'ok' else result.value[0]}): {why}")
        scores[i][j] = normalize_score(result.value[1], j, source)[0]
    return scores


def evaluate(cfg: DictConfig) -> dict[str, float]:
    """``test_score/<data source>``: the mean over the source's rows of each row's mean score
    (verl's metric); printed, and written to ``data.output_path`` when set."""
    rows = read_scored_rows(cfg)
    by_source: dict[str, list[float]] = defaultdict(list)
    declined = 0
    for (_, source, *_rest), scores in zip(rows, _score_all(cfg, rows)):
        kept = [s for s in scores if s is not None]
        declined += len(scores) - len(kept)
        if kept:
            by_source[source].append(sum(kept) / len(kept))
    if declined:
        logger.warning("%d responses were declined by their scorer (None) and left out of the means", declined)
    metrics = {f"test_score/{source}": sum(means) / len(means) for source, means in sorted(by_source.items())}
    print(metrics)
    if cfg.data.output_path is not None:
        Path(cfg.data.output_path).write_text(json.dumps(metrics, indent=1) + "\n", encoding="utf-8")
    return metrics


def main(argv: Sequence[str] | None = None) -> int:
    """The command; returns 0, 2 for a config or data error, 1 when scoring failed."""
    parser = argparse.ArgumentParser(prog="python -m rlvr.trainer.main_eval",
                                     description="Score generated responses per data source.")
    parser.add_argument("--config-path", default=None, help="folder of a YAML config composed on the defaults")
    parser.add_argument("--config-name", default=None, help="that YAML's name (without .yaml)")
    parser.add_argument("--help-config", action="store_true", help="print every config key with its help and exit")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (Hydra's grammar)")
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.help_config:
        from rlvr.trainer.config import help_config

        sys.stdout.write(help_config(EvalConfig))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config_file = (Path(args.config_path or ".") / f"{args.config_name.removesuffix('.yaml')}.yaml"
                   if args.config_name else None)
    try:
        evaluate(load_eval_config(args.overrides, config_file))
    except (ConfigError, DataError) as err:
        print(f"rlvr main_eval: {err}", file=sys.stderr)
        return 2
    except RewardError as err:
        print(f"rlvr main_eval: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
