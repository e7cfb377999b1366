"""Benchmark: the actor's old-log-prob pass and PPO update with strategy=megatron against FSDP2.

On the embedded SmolLM2-135M-Instruct, a batch shaped like the main job's (64 sequences: prompts of
60-80 tokens, left-padded, and 20 response tokens), each backend in a fresh process on the local
backend (megatron: the driver's worker starts the other tensor-parallel ranks). Prints, per backend,
the model start-up, ``compute_log_prob`` and ``update_actor`` seconds (median of ``--repeats``) and
the load average before and after, as a Markdown table.

    python -m benchmarks.bench_megatron [--tp 1 3] [--repeats 3] [--threads 1] [--micro-batch 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _batch(seed: int = 0):
    import torch

    from rlvr.protocol import DataProto
    from rlvr.utils.torch_functional import compute_position_ids

    g = torch.Generator().manual_seed(seed)
    rows, prompt, response = 64, 80, 20
    ids = torch.randint(100, 40000, (rows, prompt + response), generator=g)
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, : prompt - int(torch.randint(60, 81, (1,), generator=g))] = 0
        mask[row, prompt + int(torch.randint(8, 21, (1,), generator=g)):] = 0
    response_mask = mask[:, prompt:].clone()
    tensors = {"input_ids": ids * mask, "attention_mask": mask, "position_ids": compute_position_ids(mask),
               "responses": (ids * mask)[:, prompt:], "response_mask": response_mask,
               "advantages": torch.randn(rows, 1, generator=g) * response_mask}
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def _child(strategy: str, tp: int, repeats: int, threads: int, micro: int) -> dict[str, float]:
    from rlvr.single_controller import ClassWithInitArgs, LocalResourcePool, LocalWorkerGroup
    from rlvr.trainer.config import load_config

    overrides = [f"trainer.num_threads={threads}", "trainer.device=cpu", "trainer.backend=local",
                 "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                 f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
                 "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16", "data.train_batch_size=8",
                 "actor_rollout_ref.actor.optim.total_training_steps=50",
                 f"actor_rollout_ref.actor.strategy={strategy}",
                 f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={tp}"]
    config = load_config("main_job", overrides)
    if strategy == "megatron":
        from rlvr.workers.megatron.workers import MegatronActorRolloutRefWorker as cls
    else:
        from rlvr.workers.engine_workers import ActorRolloutRefWorker as cls
    start = time.perf_counter()
    group = LocalWorkerGroup(LocalResourcePool(), ClassWithInitArgs(cls, config, "actor"))
    group.init_model()
    out = {"start-up": time.perf_counter() - start}
    batch = _batch()
    log_prob, update = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        old = group.compute_log_prob(batch).batch["old_log_probs"]
        log_prob.append(time.perf_counter() - start)
        batch.batch["old_log_probs"] = old
        start = time.perf_counter()
        group.update_actor(batch)
        update.append(time.perf_counter() - start)
    out.update({"compute_log_prob": statistics.median(log_prob), "update_actor": statistics.median(update)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 3], help="megatron tensor-parallel sizes to time")
    parser.add_argument("--repeats", type=int, default=3, help="passes per backend (the median is reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (trainer.num_threads)")
    parser.add_argument("--micro-batch", type=int, default=4, help="ppo_micro_batch_size_per_gpu")
    parser.add_argument("--child", nargs=2, metavar=("STRATEGY", "TP"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _child(args.child[0], int(args.child[1]), args.repeats, args.threads, args.micro_batch)
        print("RESULT " + json.dumps(result), flush=True)
        return
    print("| backend | start-up s | compute_log_prob s | update_actor s | load average before / after |\n"
          "|---|---|---|---|---|")
    for strategy, tp in [("fsdp2", 1), *(("megatron", tp) for tp in args.tp)]:
        before = os.getloadavg()[0]
        run = subprocess.run([sys.executable, "-m", "benchmarks.bench_megatron", "--child", strategy, str(tp),
                              "--repeats", str(args.repeats), "--threads", str(args.threads),
                              "--micro-batch", str(args.micro_batch)], cwd=REPO, capture_output=True, text=True)
        lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
        if run.returncode or not lines:
            sys.exit(f"{strategy} tp={tp} failed:\n{run.stderr[-3000:]}")
        r = json.loads(lines[-1].removeprefix("RESULT "))
        name = "fsdp2 (one process)" if strategy == "fsdp2" else f"megatron TP={tp} ({tp} processes)"
        print(f"| {name} | {r['start-up']:.1f} | {r['compute_log_prob']:.1f} | {r['update_actor']:.1f} | "
              f"{before:.1f} / {os.getloadavg()[0]:.1f} |", flush=True)


if __name__ == "__main__":
    main()
