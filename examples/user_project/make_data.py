"""Write the guess-my-number data: ``python make_data.py [--out data] [--train 64] [--val 16]``.

Rows in rlvr's (verl's) common RL format. Half of them run the ``env_agent`` loop (the
environment says higher / lower), half the ``tool_agent`` loop (the model may call ``compare``).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HIGH = 8


def row(secret: int, loop: str, index: int) -> dict:
    if loop == "tool_agent":
        question = (f"I am thinking of a number from 1 to {HIGH}. You may call the compare tool with a guess "
                    "to hear whether it is too small or too big. End with your answer as one number.")
        extra = {"index": index, "tools_kwargs": {"compare": {"create_kwargs": {"secret": secret}}}}
    else:
        question = f"I am thinking of a number from 1 to {HIGH}. Guess it: answer with one number."
        extra = {"index": index}
    return {"data_source": "guess_number", "prompt": [{"role": "user", "content": question}],
            "ability": "guessing", "reward_model": {"style": "rule", "ground_truth": str(secret)},
            "extra_info": extra, "agent_name": loop}


def write(path: Path, size: int, seed: int) -> None:
    rng = random.Random(seed)
    rows = [row(rng.randint(1, HIGH), "env_agent" if i % 2 == 0 else "tool_agent", i) for i in range(size)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data")
    parser.add_argument("--train", type=int, default=64)
    parser.add_argument("--val", type=int, default=16)
    args = parser.parse_args()
    write(Path(args.out) / "train.jsonl", args.train, seed=0)
    write(Path(args.out) / "val.jsonl", args.val, seed=1)


if __name__ == "__main__":
    main()
