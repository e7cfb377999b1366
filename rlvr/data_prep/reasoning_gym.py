"""Write a reasoning-gym task as RL data: a train set and a fixed held-out test set.

Each row: ``data_source = "reasoning_gym/<task>"``, ``prompt`` = chat messages (an optional system
message, optional worked examples as earlier user/assistant turns, then ``question + instruction``),
``reward_model.ground_truth`` = the task's answer, and ``extra_info`` with the question and the
generator's metadata (the task's own checker scores the answer, see
:mod:`rlvr.reward.scorers.reasoning_gym`: the last non-empty line of the response must be the
answer). The held-out set is a plain sample of the task's distinct questions (so its difficulty is
the task's); training items whose question is in the held-out set, or is a worked example, are
dropped, so the held-out set is really held out. (Dropping test items that occur in the train set
instead would skew the test set to the rarer, harder questions: the few one-digit sums all occur in
2000 training items.) Worked examples come from a third seed and are the same for every row.

An operand range (``--operands LO HI``) keeps only the questions whose every number lies in it; the
generator is drawn from lazily until enough questions pass. (The held-out set is made of distinct
questions because with a few hundred possible questions a plain sample would count some twice.)

The default recipe ``addition`` is the main job's data: two-number addition with operands 1-20 (the
reference task of a plain PyTorch GRPO loop, from ``basic_arithmetic``), one worked example
``"14 + 9 = 23\\n23"``-style, 2000 train and 100 held-out prompts::

    python -m rlvr.data_prep.reasoning_gym --out data/arith
    python -m rlvr.data_prep.reasoning_gym --task chain_sum --config '{"max_digits": 3}' --out data/chain
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlvr.trainer.data import write_rows

ADDITION = {"min_terms": 2, "max_terms": 2, "min_digits": 2, "max_digits": 2, "operators": ["+"],
            "allow_parentheses": False, "allow_negation": False}
"""``basic_arithmetic`` config of the main job: two-number addition, each operand drawn uniformly from
0-100 (``randint(0, 10**2)``); :data:`ADDITION_OPERANDS` then narrows it."""

ADDITION_OPERANDS = (1, 20)
"""Operand range of the main job: the reference task of a plain PyTorch GRPO loop (which
went from 40% to 95% on it). 400 distinct problems, uniform; the untrained model gets about half of
them right greedily with the worked example. (With operands 0-100 it starts near 30% and gained
23-36 points in four 15-minute runs, mostly in the first 20 steps: too hard for a 135M model to
learn in that time.)"""


@dataclass
class PromptStyle:
    """How a question becomes chat messages."""

    instruction: str = field(default="", metadata={"help": "text appended to each question"})
    system: str | None = field(default=None, metadata={"help": "system message (None = the chat template's default)"})
    fewshot: int = field(default=0, metadata={"help": "worked examples given as earlier chat turns"})


ADDITION_STYLE = PromptStyle(instruction="Write the calculation, then just the number on the last line.",
                             system="You are a careful calculator.", fewshot=1)
"""The main job's prompt: the 135M model adds far better when it writes ``a + b = c`` first, and
the checker reads the last line, so the worked example shows ``a + b = c`` then ``c``."""


def _plain(value: Any) -> Any:
    """JSON-safe copy (tuples become lists)."""
    return json.loads(json.dumps(value))


MAX_DRAWS_PER_ITEM = 1000
"""With an operand range, at most this many generator draws per wanted question before giving up."""


def numbers_in(entry: dict) -> list[int]:
    """The unsigned integers of the entry's ``metadata["expression"]`` (else of its question)."""
    return [int(text) for text in re.findall(r"\d+", entry["metadata"].get("expression", entry["question"]))]


def _entries(task: str, size: int, seed: int, config: dict[str, Any],
             operands: tuple[int, int] | None = None) -> list[dict]:
    """``size`` entries of ``task`` from generator seed ``seed``; with ``operands = (lo, hi)`` only
    those whose numbers all lie in ``[lo, hi]`` (drawn lazily, at most ``MAX_DRAWS_PER_ITEM * size``)."""
    import reasoning_gym

    if operands is None:
        return list(reasoning_gym.create_dataset(task, size=size, seed=seed, **config))
    lo, hi = operands
    draws = MAX_DRAWS_PER_ITEM * max(size, 1)
    pool = reasoning_gym.create_dataset(task, size=draws, seed=seed, **config)
    kept = (entry for entry in pool if all(lo <= number <= hi for number in numbers_in(entry)))
    entries = list(itertools.islice(kept, size))
    if len(entries) < size:
        raise ValueError(f"only {len(entries)} of {draws} {task} questions have all numbers in [{lo}, {hi}] "
                         f"(wanted {size}); widen --operands or set the task's digit range to match")
    return entries


def _distinct(entries: list[dict]) -> list[dict]:
    """``entries`` without repeated questions (first occurrence kept, order kept)."""
    seen: set[str] = set()
    return [entry for entry in entries if not (entry["question"] in seen or seen.add(entry["question"]))]


def worked_answer(entry: dict) -> str:
    """``"<expression> = <answer>\\n<answer>"`` when the metadata has the expression, else the answer."""
    expression = entry["metadata"].get("expression")
    return f"{expression} = {entry['answer']}\n{entry['answer']}" if expression else str(entry["answer"])


def _messages(question: str, style: PromptStyle, shots: list[dict]) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": style.system}] if style.system else []
    for shot in shots:
        messages += [{"role": "user", "content": f"{shot['question']} {style.instruction}".strip()},
                     {"role": "assistant", "content": worked_answer(shot)}]
    return messages + [{"role": "user", "content": f"{question} {style.instruction}".strip()}]


def make_rows(task: str, entries: list[dict], style: PromptStyle, shots: list[dict], split: str) -> list[dict]:
    """RL rows for reasoning-gym ``entries`` of ``task``."""
    return [{
        "data_source": f"reasoning_gym/{task}",
        "prompt": _messages(entry["question"], style, shots),
        "ability": "reasoning",
        "reward_model": {"style": "rule", "ground_truth": str(entry["answer"])},
        "extra_info": {"split": split, "index": index, "question": entry["question"],
                       "metadata": _plain(entry["metadata"])},
    } for index, entry in enumerate(entries)]


def split_entries(task: str, train_size: int, test_size: int, seed: int, config: dict[str, Any], fewshot: int = 0,
                  operands: tuple[int, int] | None = None) -> tuple[list[dict], list[dict], list[dict]]:
    """``(worked examples, train entries, held-out entries)`` of ``task``: held-out questions are
    distinct, and no training question is a held-out question or a worked example (see the module
    docstring for why the held-out set is drawn first).

    Raises:
        ValueError: the task has too few distinct questions for the sizes asked.
    """
    shots = _entries(task, fewshot, seed + 2_000_003, config, operands) if fewshot else []
    shot_questions = {shot["question"] for shot in shots}
    test_entries = [e for e in _distinct(_entries(task, 2 * test_size, seed + 1_000_003, config, operands))
                    if e["question"] not in shot_questions][:test_size]
    held_out = {entry["question"] for entry in test_entries} | shot_questions
    train_entries = [e for e in _entries(task, 4 * train_size, seed, config, operands)
                     if e["question"] not in held_out][:train_size]
    if len(test_entries) < test_size or len(train_entries) < train_size:
        raise ValueError(f"{task} gave {len(test_entries)} held-out and {len(train_entries)} training questions "
                         f"apart from the held-out ones (asked: {test_size} and {train_size}); lower --test-size "
                         "or --train-size, or widen the task config")
    return shots, train_entries, test_entries


def build(task: str, out_dir: str | Path, train_size: int, test_size: int, seed: int, config: dict[str, Any],
          style: PromptStyle | None = None, fmt: str = "jsonl",
          operands: tuple[int, int] | None = None) -> tuple[Path, Path]:
    """Write ``<out_dir>/train.<fmt>`` and ``<out_dir>/test.<fmt>``; returns their paths.

    ``operands = (lo, hi)`` keeps only questions whose numbers all lie in ``[lo, hi]``.
    """
    style = style or PromptStyle()
    shots, train_entries, test_entries = split_entries(task, train_size, test_size, seed, config, style.fewshot,
                                                       operands)
    out_dir = Path(out_dir)
    paths = out_dir / f"train.{fmt}", out_dir / f"test.{fmt}"
    write_rows(make_rows(task, train_entries, style, shots, "train"), paths[0])
    write_rows(make_rows(task, test_entries, style, shots, "test"), paths[1])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--task", default=None,
                        help="reasoning-gym task name (default: the 'addition' recipe of the main job)")
    parser.add_argument("--config", default="{}", help="JSON dict of the task's config fields (with --task)")
    parser.add_argument("--instruction", default="", help="text appended to each question (with --task)")
    parser.add_argument("--system", default=None, help="system message (with --task)")
    parser.add_argument("--fewshot", type=int, default=0, help="worked examples as chat turns (with --task)")
    parser.add_argument("--operands", type=int, nargs=2, default=None, metavar=("LO", "HI"),
                        help="keep only questions whose (unsigned integer) numbers all lie in [LO, HI] "
                             f"(default: {ADDITION_OPERANDS[0]} {ADDITION_OPERANDS[1]} for the addition recipe, "
                             "none with --task)")
    parser.add_argument("--train-size", type=int, default=2000, help="training prompts")
    parser.add_argument("--test-size", type=int, default=100, help="held-out prompts")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (test set and examples use others)")
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="output format")
    args = parser.parse_args(argv)
    if args.task is None:
        task, config, style, operands = "basic_arithmetic", ADDITION, ADDITION_STYLE, ADDITION_OPERANDS
    else:
        task, config = args.task, json.loads(args.config)
        style = PromptStyle(instruction=args.instruction, system=args.system, fewshot=args.fewshot)
        operands = None
    operands = tuple(args.operands) if args.operands else operands
    train, test = build(task, args.out, args.train_size, args.test_size, args.seed, config, style, args.format,
                        operands)
    print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()
