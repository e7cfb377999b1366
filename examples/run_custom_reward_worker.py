"""Score a few responses with ``CustomRewardWorker`` on a worker group (Ray by default).

    python examples/run_custom_reward_worker.py                    # 2 Ray workers on CPU
    python examples/run_custom_reward_worker.py --backend local    # in this process (breakpoints work)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from custom_reward_worker import (  # noqa: E402
    CustomRewardWorker,
    ModelArgs,
    WorkerConfig,
    default_tokenizer_provider,
)

from rlvr.protocol import DataProto  # noqa: E402
from rlvr.single_controller import (  # noqa: E402
    RayClassWithInitArgs,
    get_resource_pool_cls,
    get_worker_group_cls,
    init_ray,
)
from rlvr.single_controller.base.worker_group import WorkerGroup  # noqa: E402

EXAMPLES = [  # (response, ground truth)
    ("The answer is \\boxed{4}", "4"),
    ("I think it is \\boxed{5}", "4"),
    ("4 4 4 4 4", "4"),
    ("\\boxed{12}.", "12"),
    ("no idea", "3"),
]


def make_batch(tokenizer_name: str = "tiny") -> DataProto:
    """``responses [5, R]`` right-padded with the pad id, and ``ground_truth [5]``."""
    tokenizer = default_tokenizer_provider(ModelArgs(tokenizer_name))
    tokenizer.padding_side = "right"
    encoded = tokenizer([r for r, _ in EXAMPLES], return_tensors="pt", padding=True, add_special_tokens=False)
    return DataProto.from_dict(
        tensors={"responses": encoded["input_ids"]},
        non_tensors={"ground_truth": np.array([g for _, g in EXAMPLES], dtype=object)},
    )


def start_group(backend: str, num_workers: int, tokenizer_name: str) -> WorkerGroup:
    """A worker group of ``CustomRewardWorker`` (``initialize`` already called)."""
    if backend == "ray":
        init_ray()
    pool = get_resource_pool_cls(backend)(process_on_nodes=[num_workers], use_gpu=False, name_prefix="reward")
    worker = RayClassWithInitArgs(CustomRewardWorker, worker_config=WorkerConfig(ModelArgs(tokenizer_name)))
    group = get_worker_group_cls(backend)(pool, worker, name_prefix="custom_reward", call_timeout_s=120)
    group.initialize(pipeline_config=None)
    return group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="ray", choices=["ray", "local"])
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--tokenizer", default="tiny", help="'tiny' or a model alias / hub id / folder")
    args = parser.parse_args()
    num_workers = args.num_workers if args.backend == "ray" else 1
    group = start_group(args.backend, num_workers, args.tokenizer)
    output = group.compute_rewards(make_batch(args.tokenizer))
    for (response, truth), score in zip(EXAMPLES, output.batch["scores"].tolist()):
        print(f"{score:+.3f}  ground truth {truth!r:5}  response {response!r}")


if __name__ == "__main__":
    main()
