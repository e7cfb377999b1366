"""What ``actor.use_torch_compile`` costs and buys on the tiny CPU workload.

The actor of the ``tiny`` workload (``benchmarks/workload.py``: Llama, hidden 64, 2 layers,
vocabulary 49152) computes the log-probs of 64 sequences (20 prompt + 64 response tokens) and runs
one PPO update on them, eager and compiled (``torch.compile`` of the micro-batch forward, as
``use_torch_compile=true`` does). The first compiled calls include the compilation; then the two
actors alternate (so a machine shared with other jobs slows both alike) and the medians of wall and
process CPU seconds are printed, with the largest log-prob difference.

    python -m benchmarks.bench_torch_compile --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from benchmarks.workload import WORKLOADS, model_config
from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RlvrConfig
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.actor.dp_actor import DataParallelPPOActor


def _batch(rows: int, prompt: int, response: int, vocab: int, seed: int) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen)
    mask = torch.ones_like(ids)
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": compute_position_ids(mask),
               "responses": ids[:, prompt:], "response_mask": torch.ones(rows, response),
               "advantages": torch.randn(rows, 1, generator=gen).expand(rows, response).contiguous()}
    return DataProto.from_dict(tensors=tensors, meta_info={"temperature": 1.0})


def _actor(model, compiled: bool, rows: int) -> DataParallelPPOActor:
    cfg = OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist([
        f"actor_rollout_ref.actor.ppo_mini_batch_size={rows}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    return DataParallelPPOActor(cfg.actor_rollout_ref.actor, model, optimizer, mini_batch_size=rows,
                                log_prob_micro_batch_size=rows, world_size=1, device="cpu", compile_forward=compiled)


def _timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3, help="measured calls of each kind after the first")
    parser.add_argument("--rows", type=int, default=64)
    args = parser.parse_args(argv)
    work = WORKLOADS["tiny"]
    config = model_config(work, 49152, 0, 1, 2)
    torch.manual_seed(0)
    eager_model = AutoModelForCausalLM.from_config(config)
    compiled_model = AutoModelForCausalLM.from_config(config)
    compiled_model.load_state_dict(eager_model.state_dict())
    actors = {"eager": _actor(eager_model, False, args.rows), "compiled": _actor(compiled_model, True, args.rows)}
    data = _batch(args.rows, 20, work.response_len, 49152, seed=1)
    results = {name: {"log_prob": [], "update": []} for name in actors}
    first = {}
    log_probs = {}
    for rep in range(args.reps + 1):
        for name, actor in actors.items():
            wall, cpu, (lp, _) = _timed(lambda: actor.compute_log_prob(data))
            log_probs[name] = lp
            batch = data.union(DataProto.from_dict(tensors={"old_log_probs": lp.detach()}))
            uwall, ucpu, _ = _timed(lambda: actor.update_policy(batch))
            if rep == 0:
                first[name] = (wall, cpu, uwall, ucpu)
            else:
                results[name]["log_prob"].append((wall, cpu))
                results[name]["update"].append((uwall, ucpu))
    for name in actors:
        w, c, uw, uc = first[name]
        print(f"{name:9s} first call: log-prob {w:.2f} s wall / {c:.2f} s CPU, update {uw:.2f} s / {uc:.2f} s")
        for kind, rows in results[name].items():
            print(f"{name:9s} {kind:8s} median of {len(rows)}: {statistics.median(r[0] for r in rows):.3f} s wall, "
                  f"{statistics.median(r[1] for r in rows):.3f} s CPU")
    print(f"compiled fallback: {'yes (eager)' if actors['compiled']._compiled is None else 'no'}; "
          f"last log-probs |diff| max {(log_probs['eager'] - log_probs['compiled']).abs().max():.2e}")


if __name__ == "__main__":
    main()
