"""Write a reasoning-gym task as RL data: a train set and a fixed held-out test set.

Each row: ``data_source = "reasoning_gym/<task>"``, ``prompt = [{"role": "user", "content":
question + instruction}]``, ``reward_model.ground_truth`` = the task's answer, and
``extra_info`` with the question and the generator's metadata (the task's own checker scores the
answer, see :mod:`rlvr.utils.reward_score.reasoning_gym`). Test items whose question also occurs
in the train set are dropped, so the held-out set is really held out.

Example: the main job's data (the defaults: ``basic_arithmetic`` with :data:`ADDITION`, two-number
addition with operands 0-99, 2000 train and 100 held-out prompts)::

    python -m rlvr.data_prep.reasoning_gym --out data/arith
    python -m rlvr.data_prep.reasoning_gym --task chain_sum --config '{"max_digits": 3}' --out data/chain
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlvr.trainer.data import write_rows

DEFAULT_INSTRUCTION = "Answer with just the number, no words."
ADDITION = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "operators": ["+"],
            "allow_parentheses": False, "allow_negation": False}
"""The main job's task config: two-number addition, operands of one or two digits (0-99)."""


def _plain(value: Any) -> Any:
    """JSON-safe copy (tuples become lists)."""
    return json.loads(json.dumps(value))


def make_rows(task: str, size: int, seed: int, config: dict[str, Any], instruction: str, split: str) -> list[dict]:
    """``size`` rows of ``task`` generated with ``seed`` and the task's ``config`` overrides."""
    import reasoning_gym

    dataset = reasoning_gym.create_dataset(task, size=size, seed=seed, **config)
    rows = []
    for index, entry in enumerate(dataset):
        content = f"{entry['question']} {instruction}".strip()
        rows.append({
            "data_source": f"reasoning_gym/{task}",
            "prompt": [{"role": "user", "content": content}],
            "ability": "reasoning",
            "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
            "extra_info": {"split": split, "index": index, "question": entry["question"],
                           "metadata": _plain(entry["metadata"])},
        })
    return rows


def build(task: str, out_dir: str | Path, train_size: int, test_size: int, seed: int, config: dict[str, Any],
          instruction: str = DEFAULT_INSTRUCTION, fmt: str = "jsonl") -> tuple[Path, Path]:
    """Write ``<out_dir>/train.<fmt>`` and ``<out_dir>/test.<fmt>``; returns their paths."""
    train = make_rows(task, train_size, seed, config, instruction, "train")
    seen = {row["extra_info"]["question"] for row in train}
    candidates = make_rows(task, 4 * test_size, seed + 1_000_003, config, instruction, "test")
    test = [row for row in candidates if row["extra_info"]["question"] not in seen][:test_size]
    if len(test) < test_size:
        raise ValueError(f"only {len(test)} test questions of {task} differ from the train set; "
                         "lower --test-size or --train-size, or widen the task config")
    out_dir = Path(out_dir)
    paths = out_dir / f"train.{fmt}", out_dir / f"test.{fmt}"
    write_rows(train, paths[0])
    write_rows(test, paths[1])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", default="basic_arithmetic", help="reasoning-gym task name")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=2000, help="training prompts")
    parser.add_argument("--test-size", type=int, default=100, help="held-out prompts")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (the test set uses another)")
    parser.add_argument("--config", default=None,
                        help="JSON dict of the task's config fields (default: two-number addition for "
                             "basic_arithmetic, the task's defaults otherwise)")
    parser.add_argument("--instruction", default=DEFAULT_INSTRUCTION, help="text appended to each question")
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="output format")
    args = parser.parse_args(argv)
    if args.config is not None:
        config = json.loads(args.config)
    else:
        config = ADDITION if args.task == "basic_arithmetic" else {}
    train, test = build(args.task, args.out, args.train_size, args.test_size, args.seed, config,
                        args.instruction, args.format)
    print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()
