"""Predict the speed of synchronous and asynchronous RL training from measured stage times.

A step trains on ``prompts x n`` samples. Generation is decode-bound: a rollout worker decodes all
its running samples together, one token each per decode step, and a decode step takes
``t_step(b) = step_s + token_s * b`` for ``b`` running samples (the weights are read once per step,
every running sample adds its work). A sample of ``L`` response tokens needs ``L`` steps; with a
static batch (``sync``, ``one_step``) a batch of samples takes as many steps as its longest sample
(the long tail), with partial rollouts (``bounded``) a worker keeps its batch full and finished
samples are replaced at once, so no step runs with empty seats. Training takes ``train_token_s`` per
response token on one training worker (``T`` workers share it), plus ``train_fixed_s`` per step;
pushing the new weights takes ``push_s``.

- ``sync``: every worker generates, then every worker trains (colocated): ``R + T`` workers do both.
- ``one_step``: ``R`` workers generate batch k+1 while ``T`` workers train batch k; a step takes
  ``max(generation on R, training on T + push)``.
- ``bounded`` (partial rollouts, ``max_staleness`` S): generation streams; a step takes ``max(generation
  on R at full occupancy, training on T + push, longest sample / (S + 1))``: a sample must finish
  within S + 1 steps of its start, or it would be dropped (or the rollout would wait for it).

Response lengths come from a distribution: a list of measured lengths (sampled with replacement,
seeded) or a lognormal.

On the 2-core CPU a "worker" is a core: the synchronous trainer runs both phases on both cores (two
threads), the asynchronous ones one phase per core. :func:`predict_from_stages` predicts their speed
from stage times measured by synchronous runs alone, with two threads and with one (the benchmark's
calibration), which ``benchmarks/bench_async.py`` then checks against the asynchronous runs.
:func:`predict_lent_run` does the same batch by batch for a whole run, also with the idle cores lent
(a side that waits gives its core to the other): with two threads a stage is only
``one_thread / two_threads`` faster (1.2-1.6 on the CPU), and a stage on one core runs slower still
while the other core computes (``corun``, :func:`corun_factor`; 1.14 measured in the lent runs), which
caps what overlap plus lending gains: :func:`overlap_ceiling` gives the most it can, for perfectly
balanced sides.
``python -m benchmarks.async_simulator --scale`` shows, for 8, 64 and 512 GPUs of a fixed global
batch, where the synchronous trainer stops scaling: the longest sample's decode steps do not shrink
with more GPUs.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["Workload", "sample_lengths", "generation_s", "step_s", "predict", "scaling_table", "predict_from_stages",
           "run_two_sides_s", "thread_factors", "predict_lent_run", "corun_factor", "overlap_ceiling"]

MODES = ("sync", "one_step", "bounded")


@dataclass
class Workload:
    """Stage times of one training job (seconds) and its shape.

    Attributes:
        prompts, n: samples per step ``prompts * n``.
        lengths: response lengths to draw from (measured), or empty for a lognormal.
        median_len, sigma: the lognormal's median and log-std when ``lengths`` is empty.
        max_len: responses are cut at this many tokens.
        step_s, token_s: a decode step takes ``step_s + token_s * running samples`` on one worker.
        prefill_s: per sample, once (prompt processing).
        train_token_s, train_fixed_s: training time per response token on one worker, and per step.
        push_s: weight push from the trainer to the rollout workers (asynchronous modes).
        seats: most samples a rollout worker decodes together (its batch / KV-cache capacity).
        max_staleness: the bound of the ``bounded`` mode.
    """

    prompts: int = 8
    n: int = 8
    lengths: list[int] = field(default_factory=list)
    median_len: float = 256.0
    sigma: float = 0.6
    max_len: int = 2048
    step_s: float = 0.02
    token_s: float = 0.0
    prefill_s: float = 0.0
    train_token_s: float = 1e-4
    train_fixed_s: float = 0.0
    push_s: float = 0.0
    seats: int = 512
    max_staleness: int = 4


def sample_lengths(work: Workload, count: int, rng: random.Random) -> list[int]:
    """``count`` response lengths: drawn from the measured ones, else from the lognormal (cut at ``max_len``)."""
    if work.lengths:
        return [rng.choice(work.lengths) for _ in range(count)]
    return [max(1, min(work.max_len, round(rng.lognormvariate(math.log(work.median_len), work.sigma))))
            for _ in range(count)]


def _static_batch_s(work: Workload, lengths: list[int]) -> float:
    """Decode a static batch: every step runs while any sample is unfinished (finished ones idle)."""
    ordered = sorted(lengths)
    total, done, previous = 0.0, 0, 0
    for i, length in enumerate(ordered):  # between two finishing lengths, len(ordered) - i samples run
        total += (length - previous) * (work.step_s + work.token_s * (len(ordered) - i))
        previous = length
        done += 1
    return total + work.prefill_s * len(lengths)


def generation_s(work: Workload, lengths: list[int], workers: int, streaming: bool) -> float:
    """Time for ``workers`` rollout workers to generate samples of ``lengths``.

    Static batches: the samples are dealt round-robin over the workers (each worker's batches of at
    most ``seats`` run one after another) and the slowest worker sets the time. Streaming with
    partial rollouts: every worker keeps ``min(seats, samples / workers)`` seats busy, so the time is
    the total decode work at full occupancy.
    """
    if streaming:
        occupancy = max(1, min(work.seats, math.ceil(len(lengths) / workers)))
        steps = sum(lengths) / (workers * occupancy)
        return steps * (work.step_s + work.token_s * occupancy) + work.prefill_s * len(lengths) / workers
    shares = [lengths[w::workers] for w in range(workers)]
    return max(sum(_static_batch_s(work, share[i:i + work.seats]) for i in range(0, len(share), work.seats))
               for share in shares if share)


def training_s(work: Workload, lengths: list[int], workers: int) -> float:
    return sum(lengths) * work.train_token_s / workers + work.train_fixed_s


def step_s(work: Workload, mode: str, rollout_workers: int, train_workers: int, rng: random.Random) -> float:
    """One step's time in ``mode`` (``sync`` colocates: every worker generates, then trains)."""
    lengths = sample_lengths(work, work.prompts * work.n, rng)
    if mode == "sync":
        everyone = rollout_workers + train_workers
        return generation_s(work, lengths, everyone, streaming=False) + training_s(work, lengths, everyone)
    train = training_s(work, lengths, train_workers) + work.push_s
    if mode == "one_step":
        return max(generation_s(work, lengths, rollout_workers, streaming=False), train)
    occupancy = max(1, min(work.seats, math.ceil(len(lengths) / rollout_workers)))
    longest = max(lengths) * (work.step_s + work.token_s * occupancy)
    return max(generation_s(work, lengths, rollout_workers, streaming=True), train,
               longest / (work.max_staleness + 1))


def predict(work: Workload, rollout_workers: int, train_workers: int, steps: int = 50, seed: int = 0
            ) -> dict[str, float]:
    """Mean step seconds of each mode over ``steps`` simulated steps (the same lengths per mode),
    steps per hour and the speedup over ``sync``."""
    out = {}
    for mode in MODES:
        rng = random.Random(seed)
        mean = sum(step_s(work, mode, rollout_workers, train_workers, rng) for _ in range(steps)) / steps
        out[f"{mode}/step_s"] = mean
        out[f"{mode}/steps_per_hour"] = 3600.0 / mean
    for mode in MODES:
        out[f"{mode}/speedup"] = out["sync/step_s"] / out[f"{mode}/step_s"]
    return out


def scaling_table(work: Workload, gpus: list[int], shares: tuple[float, ...] = (0.25, 0.375, 0.5, 0.625, 0.75),
                  steps: int = 5, seed: int = 0) -> list[dict]:
    """For each GPU count with the same global batch: the synchronous step, the asynchronous modes
    at their best split of the GPUs into rollout and training (among ``shares`` of rollout GPUs),
    and the share of the synchronous generation spent on decode steps that run for the longest
    samples while finished ones wait (1 - generation at full occupancy / static generation)."""
    rows = []
    for total in gpus:
        best: dict[str, float] = {}
        for share in shares:
            rollout = max(1, min(total - 1, round(total * share)))
            prediction = predict(work, rollout, total - rollout, steps=steps, seed=seed)
            for mode in ("one_step", "bounded"):
                if prediction[f"{mode}/step_s"] < best.get(f"{mode}/step_s", math.inf):
                    best.update({f"{mode}/step_s": prediction[f"{mode}/step_s"],
                                 f"{mode}/speedup": prediction[f"{mode}/speedup"], f"{mode}/rollout_gpus": rollout})
        rng = random.Random(seed)
        lengths = sample_lengths(work, work.prompts * work.n, rng)
        static = generation_s(work, lengths, total, streaming=False)
        rows.append({"gpus": total, "sync/step_s": prediction["sync/step_s"], **best,
                     "sync/generation_s": static,
                     "sync/tail_share": 1.0 - generation_s(work, lengths, total, streaming=True) / static})
    return rows


PROXIMAL_SHARE = 1.0 / 3.0
"""The proximal log-probs' forward pass as a share of the synchronous training time (a forward is
about a third of a forward plus backward; measured on the main job: 2.9 s against 10.8 s)."""


def predict_from_stages(two_threads: dict[str, float], one_thread: dict[str, float], push_s: float,
                        proximal: bool = True) -> dict[str, float]:
    """Step seconds and speedups on a 2-core CPU from synchronous stage times.

    Args:
        two_threads: ``{"gen_s", "train_s"}`` per step of the synchronous trainer on both cores
            (``train_s``: everything but generation).
        one_thread: the same with one thread (what each side of an asynchronous run gets), over the
            same steps (the step time changes along a run).
        push_s: a weight push to the rollout process.
        proximal: the asynchronous trainer computes the proximal log-probs in a pass of their own
            (decoupled PPO with several optimizer steps per batch, or ``prox_log_prob_from_update=false``):
            a forward pass the synchronous one skips (it reuses the rollout's log-probs),
            ``PROXIMAL_SHARE`` of the one-thread training time. With one step per batch the update's
            forward gives them (False).

    Returns:
        ``<mode>/step_s`` and ``<mode>/speedup``: sync is ``gen + train`` on two threads; one_step and
        bounded overlap generation on one core with training (the proximal forward and the push
        included) on the other. With one rollout worker and static batches on the CPU, bounded gains
        nothing over one_step here.
    """
    sync = two_threads["gen_s"] + two_threads["train_s"]
    trainer_side = one_thread["train_s"] * (1.0 + (PROXIMAL_SHARE if proximal else 0.0)) + push_s
    overlapped = max(one_thread["gen_s"], trainer_side)
    out = {"sync/step_s": sync, "one_step/step_s": overlapped, "bounded/step_s": overlapped}
    for mode in MODES:
        out[f"{mode}/speedup"] = sync / out[f"{mode}/step_s"]
    return out


def run_two_sides_s(gens: list[tuple[float, float]], updates: list[tuple[float, float]], max_staleness: int,
                    lend: bool, corun: float = 1.0) -> float:
    """Seconds until the last update of a run whose rollout and trainer each hold one core.

    Batch ``j`` trains in step ``j`` (0-based) and must be generated by weights at most
    ``max_staleness`` updates older: its generation starts once ``j - max_staleness`` updates are
    done (and the previous generation is), its update once the previous update is done and the batch
    is generated. Batch 0 is ready at the start (the benchmark's runs generate it during the
    validation before training). While both sides compute, a stage takes ``corun`` times its one-core
    time (two processes on the two cores slow each other down); a side alone runs at its one-core
    speed, or with ``lend`` at its two-core speed (``lend_idle_cores``).

    Args:
        gens, updates: per batch, ``(seconds on one core, seconds on two cores)`` of its generation
            and of its update (the weight push included); ``gens[0]`` is not used.
        max_staleness: 1 is ``one_step``; more lets the rollout run further ahead (``bounded``).
        corun: the slowdown of a stage on one core while the other core computes (1: none).
    """
    if corun < 1.0:
        raise ValueError(f"corun is a slowdown, at least 1, got {corun}")
    if len(gens) != len(updates) or not updates:
        raise ValueError(f"need one generation per update, and at least one: got {len(gens)} and {len(updates)}")
    if max_staleness < 1:
        raise ValueError(f"max_staleness must be at least 1 for the two sides to overlap, got {max_staleness}")
    steps = len(updates)
    # batches generated, updates done; never stalls: with updated == generated the next batch is admitted
    now, generated, updated = 0.0, 1, 0
    rollout = trainer = None  # the stage each side runs: [one-core s, two-core s, share done]
    while updated < steps:
        if rollout is None and generated < steps and updated >= generated - max_staleness:
            rollout = [*gens[generated], 0.0]
        if trainer is None and updated < generated:
            trainer = [*updates[updated], 0.0]
        busy = [stage for stage in (rollout, trainer) if stage is not None]
        seconds = [stage[0] * corun if len(busy) == 2 else stage[1 if lend else 0] for stage in busy]
        left = [(1.0 - stage[2]) * s for stage, s in zip(busy, seconds)]
        dt = min(left)
        for stage, s in zip(busy, seconds):
            stage[2] = 1.0 if s <= 0.0 else min(1.0, stage[2] + dt / s)
        now += dt
        if rollout is not None and rollout[2] >= 1.0 - 1e-12:
            rollout, generated = None, generated + 1
        if trainer is not None and trainer[2] >= 1.0 - 1e-12:
            trainer, updated = None, updated + 1
    return now


def thread_factors(two_threads: list[tuple[float, float]], one_thread: list[tuple[float, float]]
                   ) -> tuple[float, float]:
    """How much slower generation and the rest of a step run on one thread than on two: the ratios
    of their sums over the steps both runs have (``(gen_s, rest_s)`` per step, same seed)."""
    steps = min(len(two_threads), len(one_thread))
    if steps == 0:
        raise ValueError("thread_factors needs at least one step of each run")
    sums = [sum(run[i][k] for i in range(steps)) for run in (two_threads, one_thread) for k in (0, 1)]
    two_gen, two_rest, one_gen, one_rest = sums
    if two_gen <= 0.0 or two_rest <= 0.0:
        raise ValueError(f"the two-thread run's stages must take time, got generation {two_gen} s, rest {two_rest} s")
    return one_gen / two_gen, one_rest / two_rest


def predict_lent_run(sync_steps: list[tuple[float, float]], gen_factor: float, rest_factor: float,
                     push_s: float, bounded_staleness: int = 2, corun: float = 1.0) -> dict[str, float]:
    """Steps per hour of the asynchronous schedules on a 2-core CPU, with and without lent cores,
    simulated batch by batch (:func:`run_two_sides_s`) from a synchronous run on two cores.

    A batch's generation and its update (the rest of its step, then the weight push) take their
    two-thread times from the synchronous run, and ``gen_factor`` and ``rest_factor`` times those on
    one core (:func:`thread_factors`). ``one_step`` is a staleness of 1, ``bounded_lend`` of
    ``bounded_staleness`` (the benchmark's ``max_staleness=2``; its partial rollouts are not
    modelled), both with the idle cores lent. While both sides compute, each takes ``corun`` times its
    one-core time (:func:`corun_factor`). Nothing else is charged (no variance in a stage's speed, no
    cost of switching threads; the synchronous run's samples): an estimate of what the schedules can
    do on these cores.

    Args:
        sync_steps: ``(gen_s, rest_s)`` of every step of the synchronous run (two threads).
        corun: the slowdown of one core's stage while the other core computes too (1: none).

    Returns:
        ``sync``, ``one_step``, ``one_step_lend`` and ``bounded_lend``: ``/steps_per_hour`` and
        ``/speedup`` (over sync).
    """
    if not sync_steps:
        raise ValueError("predict_lent_run needs at least one synchronous step")
    gens = [(gen * gen_factor, gen) for gen, _ in sync_steps]
    updates = [(rest * rest_factor + push_s, rest + push_s) for _, rest in sync_steps]
    totals = {"sync": sum(gen + rest for gen, rest in sync_steps),
              "one_step": run_two_sides_s(gens, updates, 1, lend=False, corun=corun),
              "one_step_lend": run_two_sides_s(gens, updates, 1, lend=True, corun=corun),
              "bounded_lend": run_two_sides_s(gens, updates, bounded_staleness, lend=True, corun=corun)}
    out = {}
    for mode, total in totals.items():
        out[f"{mode}/steps_per_hour"] = 3600.0 * len(sync_steps) / total
        out[f"{mode}/speedup"] = totals["sync"] / total
    return out


def corun_factor(alone_s: list[float], together_s: list[float]) -> float:
    """How much slower a stage runs on one core while the other core computes too than on one core
    alone: the ratio of the sums of ``together_s`` and ``alone_s`` (the same stages, e.g. the
    generations of the same steps, one thread each)."""
    if not alone_s or len(alone_s) != len(together_s):
        raise ValueError(f"corun_factor needs the same stages both ways, got {len(alone_s)} and {len(together_s)}")
    if sum(alone_s) <= 0.0:
        raise ValueError(f"the stages alone must take time, got {sum(alone_s)} s")
    return sum(together_s) / sum(alone_s)


def overlap_ceiling(gen_factor: float, rest_factor: float, corun: float = 1.0) -> float:
    """The most that overlapping generation and training on two cores can gain over running each on
    both cores in turn: the speedup when the two sides are perfectly balanced and never wait.

    With the two-thread times ``G`` and ``R`` of a synchronous step, balance means
    ``G * gen_factor = R * rest_factor`` (= the step ``T / corun``), so the speedup
    ``(G + R) / T`` is ``(1 / gen_factor + 1 / rest_factor) / corun``: two cores that each run a
    stage at ``1 / (factor * corun)`` of the two-thread speed. Any imbalance (or a push, or a wait)
    gives less; lending only recovers part of an imbalance.
    """
    if min(gen_factor, rest_factor) <= 0.0 or corun <= 0.0:
        raise ValueError(f"the factors must be positive, got {gen_factor}, {rest_factor}, {corun}")
    return (1.0 / gen_factor + 1.0 / rest_factor) / corun


def _format(rows: list[dict]) -> str:
    lines = ["| GPUs | sync s/step (generation) | one_step s/step, rollout GPUs (x sync) | bounded s/step, rollout "
             "GPUs (x sync) | sync generation spent on the tail |", "|---|---|---|---|---|"]
    for r in rows:
        modes = [f"{r[f'{m}/step_s']:.0f}, {r[f'{m}/rollout_gpus']} ({r[f'{m}/speedup']:.2f}x)"
                 for m in ("one_step", "bounded")]
        lines.append(f"| {r['gpus']} | {r['sync/step_s']:.0f} ({r['sync/generation_s']:.0f}) | {modes[0]} | {modes[1]} | "
                     f"{100 * r['sync/tail_share']:.0f}% |")
    return "\n".join(lines)


LARGE = Workload(prompts=512, n=16, median_len=1024, sigma=0.8, max_len=16384, step_s=0.012, token_s=2e-5,
                 train_token_s=2e-4, train_fixed_s=5.0, push_s=10.0, seats=256)
"""A 7B-class RLVR job, for the scaling table (assumed figures, not measured here): 512 prompts x 16
samples, lognormal response lengths (median 1K tokens, log-std 0.8, cut at 16K). Per GPU: a decode
step of 12 ms (14 GB of bf16 weights read at ~3 TB/s, with overheads) plus 20 us per running sample
(its KV cache), at most 256 samples decoded together; training 2e-4 s per response token (the
forward and backward pass, the old and reference log-prob forwards: ~70 GFLOP per token at ~350
TFLOP/s); a 10 s weight push."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", action="store_true", help="the 8 / 64 / 512 GPU table of the LARGE workload")
    parser.add_argument("--json", type=Path, help="also write the table's rows here")
    args = parser.parse_args()
    if args.scale:
        rows = scaling_table(LARGE, [8, 64, 512])
        print(_format(rows))
        if args.json is not None:
            args.json.write_text(json.dumps({"workload": asdict(LARGE), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
