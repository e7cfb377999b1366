"""Helpers of the asynchronous-training tests: settings of each schedule, a reward function that
records what every trained batch carries (per-token versions, the policy version, the prompts),
and the comparison of two runs' metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from rlvr.protocol import DataProto
from rlvr.trainer.async_schedule.versions import sample_staleness
from rlvr.trainer.main_ppo import build_role_worker_mapping
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.trainer.ppo.utils import Role
from rlvr.utils.fault_injection import Fault, with_faults

APART = {"actor_rollout_ref.hybrid_engine": False}
MODES = {
    "one_step": {**APART, "async_training.mode": "one_step"},
    "bounded_wait_partial": {**APART, "async_training.mode": "bounded", "async_training.max_staleness": 2,
                             "async_training.partial_rollout": True},
    "bounded_drop_partial": {**APART, "async_training.mode": "bounded", "async_training.max_staleness": 1,
                             "async_training.staleness_policy": "drop", "async_training.partial_rollout": True},
}
BOUNDS = {"one_step": 1, "bounded_wait_partial": 2, "bounded_drop_partial": 1}
LONGER = {"data.max_response_length": 32, "actor_rollout_ref.rollout.ignore_eos": True}
"""Responses of 32 tokens: generations long enough for weight updates to land in the middle of them."""
SLOW_DECODE = {"actor_rollout_ref.rollout.name": "hf_slow_decode",
               "trainer.user_modules": f"['{Path(__file__).with_name('slow_decode_engine.py')}']"}
"""The rollout engine of ``slow_decode_engine.py``: generations slower than a training step, so every
weight push lands inside one (a partial rollout's rows then mix versions whatever the machine's speed)."""


def comparable(rows: list[dict]) -> list[dict]:
    """Metrics without wall-clock measurements and without the async schedule's own."""
    skip = ("timing", "perf/", "async/", "trainer/restarts", "rollout/weights_version")
    return [{k: v for k, v in row.items() if not k.startswith(skip) and "memory" not in k} for row in rows]


class VersionRecorder:
    """The training reward function of a run that also records each trained batch: its policy
    version, per-token versions and mask, rollout log-probs and the prompts' dataset indices."""

    def __init__(self, cfg, tokenizer) -> None:
        self.inner = load_reward_manager(cfg, tokenizer, num_examine=0)
        self.batches: list[dict[str, Any]] = []

    def __call__(self, data: DataProto, return_dict: bool = False) -> Any:
        self.batches.append({"policy_version": data.meta_info["policy_version"],
                             "versions": data.batch["response_versions"].clone(),
                             "mask": data.batch["response_mask"].clone(),
                             "index": [int(info["index"]) for info in data.non_tensor_batch["extra_info"]]})
        return self.inner(data, return_dict=return_dict)

    def staleness(self) -> list[list[int]]:
        """Each recorded batch's sample staleness, from its per-token versions."""
        return [sample_staleness(b["versions"], b["mask"], b["policy_version"]).tolist() for b in self.batches]

    def mixed_rows(self) -> list[torch.Tensor]:
        """The version rows (sampled tokens only) of samples whose tokens come from several versions."""
        rows = []
        for b in self.batches:
            for versions, mask in zip(b["versions"], b["mask"].bool()):
                sampled = versions[mask]
                if sampled.numel() and sampled.min() != sampled.max():
                    rows.append(sampled)
        return rows


def faulty_rollout(cfg, *faults: Fault) -> dict[Role, type]:
    """The role mapping of ``cfg`` whose rollout workers fire ``faults``."""
    mapping, _ = build_role_worker_mapping(cfg)
    mapping[Role.Rollout] = with_faults(mapping[Role.Rollout], faults)
    return mapping


TRAIN_SCRIPT = '''
"""A training run for the kill-and-resume tests: the config from argv, every trained batch's
step, policy version and prompt indices appended to a JSONL log."""
import json, sys
sys.path.insert(0, {tests!r})
from trainer_helpers import tiny_config
from pathlib import Path
from rlvr.trainer.main_ppo import run_ppo
from rlvr.trainer.ppo.reward import load_reward_manager
from rlvr.utils.tokenizer import hf_tokenizer

args = json.loads(sys.argv[1])
cfg = tiny_config(Path(args["model"]), {{k: Path(v) for k, v in args["data"].items()}}, Path(args["run"]), **args["extra"])
inner = load_reward_manager(cfg, hf_tokenizer(args["model"]), num_examine=0)
trainer = None

def reward_fn(data, return_dict=False):
    with open(args["log"], "a") as log:
        log.write(json.dumps({{"policy_version": data.meta_info["policy_version"],
                              "index": [int(i["index"]) for i in data.non_tensor_batch["extra_info"]]}}) + "\\n")
    return inner(data, return_dict=return_dict)

run_ppo(cfg, reward_fn=reward_fn)
'''


def write_train_script(path: Path) -> Path:
    """The script of :data:`TRAIN_SCRIPT` at ``path`` (it imports the trainer tests' helpers)."""
    path.write_text(TRAIN_SCRIPT.format(tests=str(Path(__file__).parent)))
    return path


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
