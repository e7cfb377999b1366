"""Write Geometry3K (Lu et al. 2021, "Inter-GPS", arXiv:2105.04165; the hub dataset
``hiyouga/geometry3k``) as RL data with images, in verl's format.

Each record holds a diagram (``images``: one image), a question (``problem``, which starts with the
``<image>`` placeholder; one is added when it does not) and the answer. Rows get the instruction
verl's geo3k example uses (reason, then put the final answer in ``\\boxed{}``), ``data_source``
``hiyouga/geometry3k`` (scored by the ``math`` scorer: the last ``\\boxed{}`` against the answer with
math-verify) and the diagram as PNG bytes (``{"bytes": ...}``), so the parquet files hold everything::

    python -m rlvr.data_prep.geo3k --out data/geo3k                 # from the hub (needs `datasets`)
    python -m rlvr.data_prep.geo3k --local-dir geometry3k --out data/geo3k   # a downloaded copy

A downloaded copy is the dataset's folder of parquet files (``<split>-*.parquet`` anywhere below it).
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rlvr.trainer.data import read_rows, write_rows
from rlvr.utils.images import load_image
from rlvr.utils.multimodal import IMAGE_PLACEHOLDER

__all__ = ["DATA_SOURCE", "INSTRUCTION", "to_rows", "main"]

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then provide the final "
               "answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST BE "
               "put in \\boxed{}.")


def _png(image: Any) -> dict[str, bytes]:
    buffer = io.BytesIO()
    load_image(image).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue()}


def to_rows(records: Iterable[dict[str, Any]], split: str) -> list[dict[str, Any]]:
    """RL rows from Geometry3K records (``images``, ``problem``, ``answer``)."""
    rows = []
    for i, record in enumerate(records):
        problem = str(record["problem"])
        if IMAGE_PLACEHOLDER not in problem:
            problem = IMAGE_PLACEHOLDER + problem
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": f"{problem} {INSTRUCTION}"}],
            "images": [_png(image) for image in record["images"]],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(record["answer"])},
            "extra_info": {"split": split, "index": i, "answer": str(record["answer"]), "question": record["problem"]},
        })
    return rows


def _local(local_dir: Path, split: str) -> list[dict[str, Any]]:
    files = sorted(local_dir.rglob(f"{split}-*.parquet"))
    if not files:
        raise SystemExit(f"no {split}-*.parquet file under {local_dir}")
    return [row for path in files for row in read_rows(path)]


def _hub(split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ImportError as err:
        raise SystemExit("loading Geometry3K from the hub needs `pip install datasets`; or pass --local-dir") from err
    return list(datasets.load_dataset(DATA_SOURCE, split=split))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local-dir", default=None, help="a downloaded copy of the dataset (default: the hub)")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--max-samples", type=int, default=None, help="keep the first N rows of each split")
    args = parser.parse_args(argv)
    for split in ("train", "test"):
        records = _local(Path(args.local_dir), split) if args.local_dir else _hub(split)
        rows = to_rows(records[:args.max_samples] if args.max_samples else records, split)
        write_rows(rows, Path(args.out) / f"{split}.parquet")
        print(f"wrote {len(rows)} rows to {Path(args.out) / f'{split}.parquet'}")


if __name__ == "__main__":
    main()
