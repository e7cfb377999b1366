"""Write a small mixed-domain RLVR dataset: math, IFEval-style instructions and code, generated
procedurally (no download), one ``data_source`` per domain (``math``, ``ifeval``, ``code``).

Each domain is scored by its own reward worker group in the ``rlvr_mixed`` preset
(``reward.routes.math=math_rule``, ``ifeval=ifeval``, ``code=code_sandbox``):

- ``math``: "What is a + b?" with the answer asked for in ``\\boxed{}``; ground truth the sum.
- ``ifeval``: a short writing task with one IFEval instruction (no commas, all lowercase, or at
  most N words); ground truth IFEval's ``{"instruction_id_list", "kwargs"}`` as a JSON string.
- ``code``: "write ``f(x)`` that returns ..." in a ```` ```python ```` block; ground truth
  assert-style tests (``{"asserts": [...]}`` as a JSON string).

Train and test sets are drawn from separate seeds and interleave the domains::

    python -m rlvr.data_prep.mixed --out data/mixed
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from rlvr.trainer.data import write_rows

TOPICS = ("the sea", "a mountain", "autumn", "a library", "coffee", "the moon", "a bicycle", "rain", "music", "bread")
CODE_TASKS: tuple[tuple[str, Callable[[int, int], int]], ...] = (
    ("returns x doubled", lambda x, k: 2 * x),
    ("returns x squared", lambda x, k: x * x),
    ("returns x plus {k}", lambda x, k: x + k),
    ("returns the remainder of x divided by {k}", lambda x, k: x % k),
)
"""Code tasks: the description (``{k}`` filled with a random 2-9) and the expected ``f(x)``."""


def _row(data_source: str, ability: str, question: str, ground_truth: str, split: str, index: int) -> dict:
    return {"data_source": data_source, "prompt": [{"role": "user", "content": question}], "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": ground_truth},
            "extra_info": {"split": split, "index": index}}


def math_row(rng: random.Random, split: str, index: int) -> dict:
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    question = f"What is {a} + {b}? Put the final answer in \\boxed{{}}."
    return _row("math", "math", question, str(a + b), split, index)


def ifeval_row(rng: random.Random, split: str, index: int) -> dict:
    topic = rng.choice(TOPICS)
    kind = rng.randrange(3)
    if kind == 0:
        question, ids, kwargs = f"Describe {topic} in one sentence without using any commas.", ["punctuation:no_comma"], [{}]
    elif kind == 1:
        question, ids, kwargs = (f"Write a short note about {topic} in English, all in lowercase letters.",
                                 ["change_case:english_lowercase"], [{}])
    else:
        words = rng.randint(5, 15)
        question = f"Describe {topic} in fewer than {words} words."
        ids, kwargs = ["length_constraints:number_words"], [{"num_words": words, "relation": "less than"}]
    return _row("ifeval", "instruction_following", question,
                json.dumps({"instruction_id_list": ids, "kwargs": kwargs}), split, index)


def code_row(rng: random.Random, split: str, index: int) -> dict:
    description, expected = rng.choice(CODE_TASKS)
    k = rng.randint(2, 9)
    question = (f"Write a Python function f(x) that {description.format(k=k)}. "
                "Answer with the code in a ```python block.")
    asserts = [f"assert f({x}) == {expected(x, k)}" for x in rng.sample(range(-20, 40), 3)]
    return _row("code", "code", question, json.dumps({"asserts": asserts}), split, index)


DOMAINS = (math_row, ifeval_row, code_row)


def make_rows(size: int, seed: int, split: str) -> list[dict]:
    """``size`` rows, the domains in turn (math, ifeval, code, math, ...)."""
    rng = random.Random(seed)
    return [DOMAINS[i % len(DOMAINS)](rng, split, i) for i in range(size)]


def build(out_dir: str | Path, train_size: int, test_size: int, seed: int, fmt: str = "jsonl") -> tuple[Path, Path]:
    """Write ``train.<fmt>`` and ``test.<fmt>`` to ``out_dir``; returns their paths."""
    out_dir = Path(out_dir)
    paths = out_dir / f"train.{fmt}", out_dir / f"test.{fmt}"
    write_rows(make_rows(train_size, seed, "train"), paths[0])
    write_rows(make_rows(test_size, seed + 1, "test"), paths[1])
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=600, help="training prompts (the domains in turn)")
    parser.add_argument("--test-size", type=int, default=60, help="held-out prompts")
    parser.add_argument("--seed", type=int, default=0, help="seed of the training set (the test set uses seed + 1)")
    parser.add_argument("--format", default="jsonl", choices=("jsonl", "parquet"), help="output format")
    args = parser.parse_args(argv)
    train, test = build(args.out, args.train_size, args.test_size, args.seed, args.format)
    print(f"wrote {train} and {test}")


if __name__ == "__main__":
    main()
