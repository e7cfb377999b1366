"""Write GSM8K (Cobbe et al. 2021, arXiv:2110.14168) as RL data.

Source: a local folder with ``train.jsonl`` / ``test.jsonl`` in the openai/grade-school-math
format (``{"question", "answer"}``, the answer ending in ``#### <number>``), or the hub dataset
``openai/gsm8k`` through the optional ``datasets`` package.

    python -m rlvr.data_prep.gsm8k --local-dir ../shared/data/gsm8k --out data/gsm8k
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

from rlvr.trainer.data import write_rows

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def extract_solution(answer: str) -> str:
    """The number after ``####`` with thousands separators removed."""
    if "####" not in answer:
        raise ValueError(f"GSM8K answer without '####': {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def to_rows(records: Iterable[dict], split: str) -> list[dict]:
    """RL rows from GSM8K records."""
    return [{
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{rec['question']} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": extract_solution(rec["answer"])},
        "extra_info": {"split": split, "index": i, "question": rec["question"], "answer": rec["answer"]},
    } for i, rec in enumerate(records)]


def _local(local_dir: Path, split: str) -> list[dict]:
    with (local_dir / f"{split}.jsonl").open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _hub(split: str) -> list[dict]:
    try:
        import datasets
    except ImportError as err:
        raise SystemExit("loading GSM8K from the hub needs `pip install datasets`; or pass --local-dir") from err
    return list(datasets.load_dataset("openai/gsm8k", "main", split=split))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--local-dir", default=None, help="folder with train.jsonl/test.jsonl (default: the hub)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--format", default="parquet", choices=("jsonl", "parquet"), help="output format")
    parser.add_argument("--max-samples", type=int, default=None, help="keep the first N rows of each split")
    args = parser.parse_args(argv)
    for split in ("train", "test"):
        records = _local(Path(args.local_dir), split) if args.local_dir else _hub(split)
        rows = to_rows(records[:args.max_samples] if args.max_samples else records, split)
        path = Path(args.out) / f"{split}.{args.format}"
        write_rows(rows, path)
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
