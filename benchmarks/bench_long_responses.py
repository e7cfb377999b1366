"""Benchmark: long responses on the embedded SmolLM2-135M (CPU by default, a GPU when asked).

Two measurements, each variant in a fresh process (its own peak memory):

1. ``compare`` (default): one training step (the old log-prob pass, then one PPO update) of the
   same batch, responses drawn uniformly from ``--min-len``..``--max-len`` tokens after 32-64-token
   prompts, side by side in three layouts of the actor:

   - ``padded``: the default path (micro-batches of ``--micro`` rows, padded to their longest row);
   - ``packed``: ``use_remove_padding`` (the same micro-batches, packed into one row each);
   - ``packed+budget``: packed, and micro-batches by token budget (``use_dynamic_bsz``,
     ``--token-budget`` tokens per micro-batch, balanced by Karmarkar-Karp).

   Printed: the step time, the log-prob pass's time and real tokens per second, the update's
   time, the peak resident memory (GPU: peak allocated) and the number of micro-batches.

2. ``--longest``: the longest response that trains (one update of one sequence) within
   ``--budget-gb`` of memory for the whole machine, for the padded path on one rank against
   packing + Ulysses sequence parallelism (``--sp`` ranks in processes on this machine, gloo) +
   gradient checkpointing. Lengths double from ``--start-len`` until the step no longer fits (or
   ``--max-search-len``); each length reports the sum of the ranks' peak memory, the largest rank's
   peak and the step time. SmolLM2-135M has 9 attention heads and 3 key/value heads, so its
   sequence-parallel sizes are 3 and 9 (2 does not split 9 heads).

3. ``--attention``: the attention of a packed row alone (SmolLM2's 9 query / 3 key-value heads of
   64, ``--rows`` sequences of the drawn lengths), forward and backward, three ways: one SDPA call
   per sequence (what rlvr runs on CPU), one SDPA call over the packed row with a block-diagonal
   causal mask (what transformers' SDPA path builds for packed position ids), and flex attention
   with a document mask (compiled; torch 2.13 has no flex-attention backward on CPU).

    python -m benchmarks.bench_long_responses                                 # compare, CPU
    python -m benchmarks.bench_long_responses --rows 16 --micro 4 --no-checkpointing
    python -m benchmarks.bench_long_responses --longest --budget-gb 24 --sp 3
    python -m benchmarks.bench_long_responses --attention --rows 8
    python -m benchmarks.bench_long_responses --json results.json             # also write the results

``--machine-note`` text and the load average (``os.getloadavg``) before and after are recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "padded": {"use_remove_padding": False, "use_dynamic_bsz": False},
    "packed": {"use_remove_padding": True, "use_dynamic_bsz": False},
    "packed+budget": {"use_remove_padding": True, "use_dynamic_bsz": True},
}


def response_lengths(rows: int, min_len: int, max_len: int, seed: int) -> list[int]:
    """Response lengths drawn uniformly from ``min_len..max_len`` (seeded)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(min_len, max_len + 1, (rows,), generator=gen).tolist()


def make_batch(lengths: list[int], vocab: int, seed: int, prompt_range: tuple[int, int] = (32, 64)) -> dict:
    """A rollout-shaped batch: prompts of ``prompt_range`` tokens left-padded, responses of ``lengths``
    right-padded, random token ids, advantages +-1 per sequence."""
    gen = torch.Generator().manual_seed(seed)
    rows, width_p, width_r = len(lengths), prompt_range[1], max(lengths)
    prompts = torch.randint(prompt_range[0], prompt_range[1] + 1, (rows,), generator=gen)
    mask = torch.zeros(rows, width_p + width_r, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts.tolist(), lengths)):
        mask[i, width_p - p : width_p + r] = 1
    ids = torch.randint(10, vocab, mask.shape, generator=gen) * mask
    response_mask = mask[:, width_p:]
    sign = torch.randint(0, 2, (rows, 1), generator=gen).float() * 2 - 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, width_p:], "response_mask": response_mask, "advantages": sign * response_mask}


def _config(spec: dict):
    from omegaconf import OmegaConf

    from rlvr.trainer.config.schema import RlvrConfig

    micro, budget = spec["micro"], spec["token_budget"]
    overrides = [
        f"actor_rollout_ref.model.use_remove_padding={spec['use_remove_padding']}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={spec['checkpointing']}",
        f"actor_rollout_ref.model.dtype={spec['dtype']}",
        f"actor_rollout_ref.actor.use_dynamic_bsz={spec['use_dynamic_bsz']}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
        f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={spec['sp']}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
    ]
    return OmegaConf.merge(OmegaConf.structured(RlvrConfig), OmegaConf.from_dotlist(overrides))


def _peak_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    from benchmarks.workload import peak_rss_bytes

    return peak_rss_bytes()


def run_step(spec: dict, rank: int = 0, world_size: int = 1) -> dict:
    """Build the actor as the worker does and time one step on this rank's rows."""
    from rlvr.protocol import DataProto
    from rlvr.workers.actor.dp_actor import DataParallelPPOActor
    from rlvr.workers.fsdp import shard_module
    from rlvr.workers.models import build_causal_lm
    from rlvr.workers.optimizer import build_optimizer

    device = torch.device(spec["device"])
    cfg = _config(spec).actor_rollout_ref
    module = build_causal_lm(cfg.model, trainable=True).to(device)
    module = shard_module(module, world_size, device.type, True)
    lengths = spec["lengths"]
    batch = make_batch(lengths, module.config.vocab_size, spec["seed"])
    per = len(lengths) // world_size
    batch = {key: value[rank * per : (rank + 1) * per] for key, value in batch.items()}
    actor = DataParallelPPOActor(
        cfg.actor, module, build_optimizer(module, cfg.actor.optim), mini_batch_size=per,
        log_prob_micro_batch_size=spec["micro"], world_size=world_size, device=device,
        log_prob_use_dynamic_bsz=spec["use_dynamic_bsz"], log_prob_max_token_len=spec["token_budget"],
        use_remove_padding=spec["use_remove_padding"], sp_size=spec["sp"])
    data = DataProto.from_dict(tensors=batch, meta_info={"temperature": 1.0})
    start, cpu = time.perf_counter(), time.process_time()
    log_probs, _ = actor.compute_log_prob(data)
    log_prob_s, log_prob_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    data.batch["old_log_probs"] = log_probs
    start, cpu = time.perf_counter(), time.process_time()
    metrics = actor.update_policy(data)
    update_s, update_cpu_s = time.perf_counter() - start, time.process_time() - cpu
    tokens = int(batch["attention_mask"].sum())
    result = {"log_prob_s": log_prob_s, "update_s": update_s, "step_s": log_prob_s + update_s, "tokens": tokens,
              "step_cpu_s": log_prob_cpu_s + update_cpu_s, "log_prob_cpu_s": log_prob_cpu_s,
              "log_prob_tokens_per_s": tokens / log_prob_s, "peak_bytes": _peak_memory(device),
              "grad_norm": metrics["actor/grad_norm"][0]}
    if world_size == 1:
        result["micro_batches"] = len(actor._micro_batches(batch, spec["micro"], spec["use_dynamic_bsz"],
                                                           spec["token_budget"]))
    return result


def _rank_main(rank: int, world_size: int, port: int, spec: dict, out_dir: str) -> None:
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(spec["threads"])
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    result = run_step(spec, rank, world_size)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def child(spec: dict) -> dict:
    """One variant (in a process of its own); with ``sp > 1`` as ``sp`` gloo ranks."""
    if spec["sp"] == 1:
        torch.set_num_threads(spec["threads"])
        return run_step(spec)
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_rank_main, args=(spec["sp"], port, spec, out), nprocs=spec["sp"], start_method="spawn")
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(spec["sp"])]
    total = {key: sum(r[key] for r in ranks) for key in ("tokens", "peak_bytes", "step_cpu_s", "log_prob_cpu_s")}
    slowest = {key: max(r[key] for r in ranks) for key in ("step_s", "log_prob_s", "update_s")}
    return {**ranks[0], **total, **slowest, "log_prob_tokens_per_s": total["tokens"] / slowest["log_prob_s"],
            "rank_peak_bytes": max(r["peak_bytes"] for r in ranks)}


def run_child(spec: dict, timeout_s: float) -> dict:
    """Run :func:`child` in a fresh interpreter; ``{"error": ...}`` when it fails or runs out of time."""
    cmd = [sys.executable, "-m", "benchmarks.bench_long_responses", "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout_s:.0f} s"}
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1] if proc.stderr else ''}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _spec(args, variant: dict, lengths: list[int], sp: int = 1, checkpointing: bool | None = None) -> dict:
    return {**variant, "lengths": lengths, "micro": args.micro, "token_budget": args.token_budget, "sp": sp,
            "checkpointing": args.checkpointing if checkpointing is None else checkpointing, "seed": args.seed,
            "device": args.device, "dtype": args.dtype, "threads": args.threads if sp == 1 else 1}


def compare(args) -> list[dict]:
    lengths = response_lengths(args.rows, args.min_len, args.max_len, args.seed)
    print(f"responses: {args.rows} of {min(lengths)}..{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}); "
          f"micro-batches of {args.micro} rows or {args.token_budget} tokens; checkpointing={args.checkpointing}",
          flush=True)
    rows = []
    for name, variant in VARIANTS.items():
        result = run_child(_spec(args, variant, lengths), args.timeout_s)
        rows.append({"variant": name, **result})
        if "error" in result:
            print(f"{name:14s} {result['error']}")
            continue
        print(f"{name:14s} step {result['step_s']:7.1f} s ({result['step_cpu_s']:7.1f} CPU s) | log-prob pass "
              f"{result['log_prob_s']:6.1f} s ({result['log_prob_tokens_per_s']:6.0f} tokens/s) | update "
              f"{result['update_s']:7.1f} s | peak {result['peak_bytes'] / 2**30:5.2f} GiB | "
              f"{result['micro_batches']} micro-batches", flush=True)
    base = rows[0]
    for row in rows[1:]:
        if "error" not in row and "error" not in base:
            print(f"{row['variant']} against padded: step {base['step_s'] / row['step_s']:.2f}x faster "
                  f"({base['step_cpu_s'] / row['step_cpu_s']:.2f}x less CPU time), log-prob pass "
                  f"{row['log_prob_tokens_per_s'] / base['log_prob_tokens_per_s']:.2f}x the tokens/s "
                  f"({base['log_prob_cpu_s'] / row['log_prob_cpu_s']:.2f}x less CPU time)", flush=True)
    return rows


def longest(args) -> list[dict]:
    setups = [("padded, 1 rank", VARIANTS["padded"], 1, False),
              (f"packed + SP={args.sp} + checkpointing", VARIANTS["packed+budget"], args.sp, True)]
    rows = []
    for name, variant, sp, checkpointing in setups:
        length, best = args.start_len, None
        while length <= args.max_search_len:
            spec = _spec(args, variant, [length] * sp, sp, checkpointing)
            spec["token_budget"] = -(-(length + 64) // sp)  # one sequence per micro-batch, split over the group
            result = run_child(spec, args.timeout_s)
            fits = "error" not in result and result["peak_bytes"] <= args.budget_gb * 2**30
            rows.append({"setup": name, "response_len": length, "fits": fits, **result})
            peak = f"{result['peak_bytes'] / 2**30:.2f} GiB" if "peak_bytes" in result else result.get("error")
            rank_peak = (f", largest rank {result['rank_peak_bytes'] / 2**30:.2f} GiB"
                         if "rank_peak_bytes" in result else "")
            step = f", step {result['step_s']:.1f} s" if "step_s" in result else ""
            print(f"{name:34s} response {length:7d}: {peak}{rank_peak}{step} -> {'fits' if fits else 'does not fit'}",
                  flush=True)
            if not fits:
                break
            best = length
            length *= 2
        print(f"{name}: longest response that trained within {args.budget_gb} GiB: {best}")
        fitted = [(r["response_len"], r["peak_bytes"]) for r in rows if r["setup"] == name and r["fits"]]
        if len(fitted) >= 2 and args.extrapolate_gb:
            (len_a, peak_a), (len_b, peak_b) = fitted[-2:]
            per_token = (peak_b - peak_a) / (len_b - len_a)
            reach = len_b + (args.extrapolate_gb * 2**30 - peak_b) / per_token
            rows.append({"setup": name, "bytes_per_token": per_token, "extrapolated_gb": args.extrapolate_gb,
                         "extrapolated_len": int(reach)})
            print(f"{name}: {per_token / 1024:.0f} KiB more per response token between {len_a} and {len_b} tokens; "
                  f"at that rate {args.extrapolate_gb} GiB holds a response of about {int(reach)} tokens "
                  "(extrapolated, not measured)", flush=True)
    return rows


def attention(args) -> list[dict]:
    """Forward + backward of the attention of one packed row, three ways (module docstring)."""
    import torch.nn.functional as F

    from rlvr.workers.packed_attention import segment_sdpa

    torch.set_num_threads(args.threads)
    lengths = response_lengths(args.rows, args.min_len, args.max_len, args.seed)
    total = sum(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    gen = torch.Generator().manual_seed(args.seed)
    q, k, v = (torch.randn(1, heads, total, 64, generator=gen, requires_grad=True) for heads in (9, 3, 3))
    segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))

    def block_mask_sdpa():
        mask = (segment[:, None] == segment[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)

    def flex():
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        block = create_block_mask(lambda b, h, i, j: (segment[i] == segment[j]) & (i >= j), None, None, total, total,
                                  device="cpu")
        return torch.compile(flex_attention)(q, k, v, block_mask=block, enable_gqa=True).transpose(1, 2)

    ways = {"per-sequence SDPA": lambda: segment_sdpa(q, k, v, cu, None),
            "SDPA, block-diagonal mask": block_mask_sdpa, "flex attention": flex}
    reference, rows = None, []
    print(f"attention of {total} packed tokens ({args.rows} sequences of {min(lengths)}..{max(lengths)})", flush=True)
    for name, run in ways.items():
        try:
            times = []
            for _ in range(2):
                q.grad = k.grad = v.grad = None
                start = time.perf_counter()
                out = run()
                out.sum().backward()
                times.append(time.perf_counter() - start)
        except Exception as err:  # flex attention has no CPU backward in torch 2.13: report what it says
            rows.append({"way": name, "error": f"{type(err).__name__}: {str(err).splitlines()[0]}"})
            print(f"{name:28s} {rows[-1]['error']}", flush=True)
            continue
        reference = out.detach() if reference is None else reference
        diff = float((out.detach() - reference).abs().max())
        rows.append({"way": name, "forward_backward_s": min(times), "max_diff": diff})
        print(f"{name:28s} forward+backward {min(times):6.2f} s (best of 2), max difference to the first "
              f"{rows[-1]['max_diff']:.1e}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--longest", action="store_true", help="search the longest trainable response")
    parser.add_argument("--attention", action="store_true", help="time the packed attention kernels alone")
    parser.add_argument("--rows", type=int, default=16, help="responses in the batch (compare)")
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=2048)
    parser.add_argument("--micro", type=int, default=4, help="rows per micro-batch (padded, packed)")
    parser.add_argument("--token-budget", type=int, default=4096, help="tokens per micro-batch (packed+budget)")
    parser.add_argument("--checkpointing", action=argparse.BooleanOptionalAction, default=True,
                        help="gradient checkpointing in compare (the padded fp32 step of 4 x 2K tokens without it "
                             "needs about 10 GB)")
    parser.add_argument("--sp", type=int, default=3, help="sequence-parallel ranks (--longest)")
    parser.add_argument("--budget-gb", type=float, default=24.0, help="memory of the machine (--longest)")
    parser.add_argument("--extrapolate-gb", type=float, default=None,
                        help="also extrapolate the longest response for this much memory from the last two lengths")
    parser.add_argument("--start-len", type=int, default=1024)
    parser.add_argument("--max-search-len", type=int, default=65536)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CPU threads of one process")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=7200.0, help="time limit of one variant")
    parser.add_argument("--machine-note", default="", help="free text recorded with the results")
    parser.add_argument("--json", help="write the results to this file")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    rows = longest(args) if args.longest else attention(args) if args.attention else compare(args)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if args.json:
        record = {"date": time.strftime("%Y-%m-%d %H:%M"), "args": vars(args), "load_before": load_before,
                  "load_after": load_after, "torch": torch.__version__, "results": rows}
        tmp = Path(f"{args.json}.tmp")
        tmp.write_text(json.dumps(record, indent=1))
        tmp.rename(args.json)


if __name__ == "__main__":
    main()
