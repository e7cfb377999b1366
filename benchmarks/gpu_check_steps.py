"""The steps of the GPU checks (``benchmarks/gpu_checks.py`` runs them): what each one runs, in the
order of their value, and the one line of the summary each result gives.

The default GPU call runs issue #47's checks, the most valuable first, so that whatever the budget
cuts is the least missed:

1. ``decode_profile`` (47.1): the decode step under ``torch.profiler`` on the 256 x 256 batch: ms per
   step, kernel launches, host syncs, the top kernels, the ratio to the weights-plus-KV read floor
   (``benchmarks/profile_decode.py``);
2. ``trl`` (47.1): rlvr against TRL on the 135M workload, the rollout's bf16 log-probs reused as the
   old ones (``algorithm.rollout_correction.bypass_mode``; ``benchmarks/bench_grpo_vs_trl.py``);
3. ``weight_push`` (47.3): the actor's weights to a rollout process on the same GPU through CUDA IPC
   (``benchmarks/bench_weight_push.py``);
4. ``trl_1_5b`` (47.2): rlvr against TRL on a random-init model of Qwen2.5-1.5B's shape: step and
   stages, peak memory, the update's model FLOPs utilisation, decode against its floor;
5. ``make_model`` and ``async`` (47.3): the main job synchronous, ``one_step`` and ``bounded`` on the one
   GPU with the IPC push (``benchmarks/bench_async.py``);
6. ``gpu_tests`` (47.4 and earlier): ``pytest tests/gpu`` (Megatron's files apart): the MoE step with and
   without routing replay, the reward-model score, a distillation step, an SFT step, and the earlier
   fast-path, fp8 and packing tests.

The checks of issue #29 (``logprobs``, ``main_job``, ``hybrid_memory``, ``fp8_rollout``, ``fp8_train``,
``megatron``) ran on 2026-11-27; they run when named in ``--steps``. The CPU rehearsal runs every step
on tiny models except ``async`` (its command is checked by a test of its own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["STEPS", "TRAINER_KEYS", "Context", "Step", "summary_note"]

REPO = Path(__file__).resolve().parent.parent
SMALL = ["--prompts", "2", "--samples", "2", "--response-len", "6"]
"""The rehearsal's batch: 2 prompts x 2 samples x 6 tokens."""
LARGE_SIZE = {True: "qwen2.5-1.5b", False: "tiny-qwen2"}
"""The realistic size of check 47.2 on the GPU, and its tiny stand-in of the same architecture on CPU."""
BYPASS = ("--bypass-steps", "2")
"""After the measured steps, 2 more rlvr steps with the rollout's log-probs as the old ones
(``algorithm.rollout_correction.bypass_mode``): the step with and without the old-log-prob pass."""
ASYNC_STEPS = 6
"""Steps of each schedule in the ``async`` step on the GPU (12 did not fit its time limit on 2026-11-27;
6 fit the second device call of a session, see docs/PERFORMANCE.md "GPU checks")."""


@dataclass
class Context:
    """What the steps' commands are built from."""

    device: str
    size: str
    out: Path
    work: Path
    bench: Path
    simulate: bool

    @property
    def gpu(self) -> bool:
        return self.device == "cuda"

    @property
    def model_dir(self) -> Path:
        return self.work / "model"

    @property
    def tokenizer(self) -> str:
        return str(self.bench / "tokenizer")


@dataclass(frozen=True)
class Step:
    """One check: its name, group (the issue and check number), time limit on GPU / CPU, and what it
    runs: ``command(ctx, result_json)`` gives a module run as ``python -m`` with its arguments, or a
    string saying why there is nothing to run (the step is then recorded as skipped)."""

    name: str
    group: str
    timeout_s: tuple[int, int]
    command: Callable[[Context, Path], list[str] | str]
    by_default: bool = True
    """False: on the GPU, runs only when named in ``--steps`` (done before, or too long for the call)."""
    rehearsed: bool = True
    """False: the CPU rehearsal leaves it out unless named (a test checks its command instead)."""
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables of the step's process."""


def _small(ctx: Context) -> list[str]:
    return [] if ctx.gpu else SMALL


def _job_overrides(ctx: Context) -> list[str]:
    """The main job on the bundle: the random-init model of ``make_model``, the bundled data, the
    answer check of ``gpu_reward.py``, this device (the rehearsal: fewer prompts per step)."""
    data = ctx.bench / "arith"
    overrides = [
        f"actor_rollout_ref.model.path={ctx.model_dir}", f"data.train_files={data / 'train.jsonl'}",
        f"data.val_files={data / 'test.jsonl'}",
        f"custom_reward_function.path={REPO / 'benchmarks' / 'gpu_reward.py'}",
        "custom_reward_function.name=compute_score", f"trainer.device={ctx.device}",
        "actor_rollout_ref.actor.optim.warmup_steps=0", "trainer.call_timeout_s=300",
    ]
    if not ctx.gpu:  # the tiny rehearsal: fewer held-out prompts and prompts per step
        overrides += ["data.train_batch_size=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                      "data.val_max_samples=4"]
    return overrides


def _main_job(ctx: Context, result: Path, steps: int, *extra: str) -> list[str]:
    overrides = [
        *_job_overrides(ctx), f"trainer.total_training_steps={steps}", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.report=false", "trainer.export_hf=false", "trainer.progress_bar=false",
        "trainer.max_time_s=null", f"trainer.default_local_dir={ctx.work / result.stem}",
        f"trainer.experiment_name={result.stem}",
    ]
    return ["rlvr.trainer.main_ppo", "--preset", "main_job", *overrides, *extra]


def _decode_profile(ctx: Context, result: Path) -> list[str]:
    compile_ = ["--compile"] if ctx.gpu else ["--no-compile"]
    return ["benchmarks.profile_decode", "--size", ctx.size, "--device", ctx.device, "--tokenizer", ctx.tokenizer,
            *compile_, "--json", str(result), *_small(ctx)]


def _trl(ctx: Context, result: Path, size: str, *extra: str) -> list[str]:
    return ["benchmarks.bench_grpo_vs_trl", "--size", size, "--device", ctx.device, "--steps", "2", "--warmup", "1",
            "--tokenizer", ctx.tokenizer, "--json", str(result), *extra, *_small(ctx)]


def _weight_push(ctx: Context, result: Path) -> list[str]:
    return ["benchmarks.bench_weight_push", "--size", ctx.size, "--device", ctx.device,
            "--repeats", "5" if ctx.gpu else "2", "--json", str(result)]


def _make_model(ctx: Context, result: Path) -> list[str]:
    return ["benchmarks.gpu_steps", "make-model", "--size", ctx.size, "--tokenizer", ctx.tokenizer,
            "--out", str(ctx.model_dir)]


def _async(ctx: Context, result: Path) -> list[str]:
    """The main job synchronous, ``one_step`` and ``bounded`` (the rollout in a child process on the
    same GPU, weights pushed through CUDA IPC), one after the other (``benchmarks/bench_async.py``)."""
    steps = ASYNC_STEPS if ctx.gpu else 2
    validation = ["data.val_max_samples=64"] if ctx.gpu else []
    return ["benchmarks.bench_async", "--steps", str(steps), "--seeds", "1", "--test-freq", str(steps),
            "--tool-steps", "0", "--calibration-steps", "0", "--no-ablation", "--out", str(ctx.work / result.stem),
            "--json", str(result), "--override", *_job_overrides(ctx), *validation]


def _pytest(files: list[str], result: Path, *extra: str) -> list[str]:
    return ["pytest", "-q", "-p", "no:cacheprovider", *files, f"--junitxml={result.with_suffix('.xml')}",
            "-o", "addopts=", "-m", "gpu", *extra]


def _gpu_tests(ctx: Context, result: Path) -> list[str]:
    return _pytest(["tests/gpu"], result, "--ignore-glob=*megatron*")


def _megatron(ctx: Context, result: Path) -> list[str] | str:
    tests = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests" / "gpu").glob("*megatron*.py"))
    if not tests:
        return "no Megatron test in tests/gpu yet"
    return _pytest(tests, result)


def _logprobs(ctx: Context, result: Path) -> list[str]:
    return ["benchmarks.gpu_steps", "logprobs", "--size", ctx.size, "--device", ctx.device, "--tokenizer",
            ctx.tokenizer, "--json", str(result), *_small(ctx)]


def _hybrid(ctx: Context, result: Path) -> list[str]:
    return ["benchmarks.bench_hybrid_memory", "--size", ctx.size, "--device", ctx.device, "--settings",
            "none,optimizer,both", "--steps", "1", "--warmup", "1", "--tokenizer", ctx.tokenizer,
            "--json", str(result), *_small(ctx)]


def _fp8(ctx: Context, result: Path) -> list[str]:
    extra = ["--compile"] if ctx.gpu else [*SMALL, "--repeats", "1"]
    return ["benchmarks.bench_fp8_rollout", "--size", ctx.size, "--device", ctx.device, "--tokenizer",
            ctx.tokenizer, "--json", str(result), *extra]


def _fp8_train(ctx: Context, result: Path) -> list[str]:
    return _main_job(ctx, result, 2, "actor_rollout_ref.rollout.quantization=fp8",
                     "algorithm.rollout_correction.rollout_is=token")


STEPS = (
    Step("decode_profile", "47.1 decode", (120, 300), _decode_profile),
    Step("trl", "47.1 decode", (180, 400), lambda ctx, result: _trl(ctx, result, ctx.size, *BYPASS)),
    Step("weight_push", "47.3 IPC push", (60, 120), _weight_push),
    Step("trl_1_5b", "47.2 1.5B", (300, 400), lambda ctx, result: _trl(ctx, result, LARGE_SIZE[ctx.gpu], *BYPASS),
         env=(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),)),
    Step("make_model", "47.3 IPC push", (60, 120), _make_model),
    Step("async", "47.3 IPC push", (220, 400), _async, rehearsed=False),
    Step("gpu_tests", "47.4 roles", (150, 300), _gpu_tests),
    Step("logprobs", "29.1 correctness", (90, 300), _logprobs, by_default=False),
    Step("main_job", "29.1 correctness", (150, 300), lambda ctx, result: _main_job(ctx, result, 1), by_default=False),
    Step("hybrid_memory", "29.3 hybrid memory", (150, 300), _hybrid, by_default=False),
    Step("fp8_rollout", "29.4 fp8 rollout", (150, 300), _fp8, by_default=False),
    Step("fp8_train", "29.4 fp8 rollout", (120, 300), _fp8_train, by_default=False),
    Step("megatron", "29.5 megatron", (120, 300), _megatron, by_default=False),
)

TRAINER_KEYS = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/update_actor", "timing_s/update_weights",
                "actor/reused_rollout_log_probs", "training/rollout_log_probs_diff_max",
                "training/rollout_log_probs_diff_mean", "training/rollout_probs_diff_max", "rollout_corr/kl",
                "rollout_corr/k3_kl", "rollout_corr/rollout_is_mean", "rollout_corr/rollout_is_ratio_fraction_high",
                "rollout_corr/rollout_is_eff_sample_size", "critic/score/mean", "actor/pg_loss", "actor/grad_norm",
                "train/skipped_step")
"""The trainer metrics a main-job step's record keeps."""


def _trl_note(result: dict) -> str:
    """Step times and their ratio, the step in bypass mode, the update's MFU on each side."""
    note = (f"rlvr {result['rlvr']['median_s']:.2f} s, TRL {result['trl']['median_s']:.2f} s, "
            f"ratio {result['ratio_rlvr_over_trl']:.3f}")
    if "rlvr_bypass" in result:
        note += f"; bypass {result['rlvr_bypass']['median_s']:.2f} s"
    mfu = {side: result[side].get("update_mfu") for side in ("rlvr", "trl")}
    if all(value is not None for value in mfu.values()):
        note += f"; update MFU rlvr {mfu['rlvr']:.1%}, TRL {mfu['trl']:.1%}"
    if "decode" in result:
        note += f"; decode {result['decode']['decode_over_floor']:.1f}x its floor"
    return note


def summary_note(record: dict) -> str:
    """The headline numbers of a step's record (its skip reason when it has none)."""
    result = record.get("result") or {}
    step = record["step"]
    if step in ("trl", "trl_1_5b") and "ratio_rlvr_over_trl" in result:
        return _trl_note(result)
    if step == "decode_profile" and "ms_per_step" in result:
        syncs = result.get("syncs", {}).get("per_step")
        return (f"{result['ms_per_step']:.2f} ms/step, {result['decode_over_floor']:.1f}x the read floor, "
                f"{result['rows']} rows" + (f", {syncs:.2f} syncs/step" if syncs is not None else ""))
    if step == "weight_push" and "median_confirm_s" in result:
        return (f"{result['path']}: blocking {result['median_blocking_s']:.4f} s, confirmed "
                f"{result['median_confirm_s']:.4f} s, {result['bytes'] / 1e6:.0f} MB, "
                f"bit-identical {result['all_bit_identical']}")
    if step == "fp8_rollout" and "fp8_speedup" in result:
        return (f"fp8 speed-up {result['fp8_speedup']:.2f}x, |dlogp| vs actor max "
                f"{result['log_prob_gap']['fp8_vs_actor_same_dtype']['max']:.3g}")
    if step == "hybrid_memory" and "settings" in result:
        return "; ".join(f"{name}: gen {s['stage_peak_gib'].get('gen', float('nan')):.2f} GiB, update "
                         f"{s['stage_peak_gib'].get('update_actor', float('nan')):.2f} GiB, "
                         f"{s.get('offload_cost_s_per_step', 0.0):+.2f} s/step"
                         for name, s in result["settings"].items())
    if step in ("main_job", "fp8_train") and result.get("steps"):
        last = result["steps"][-1]
        return ", ".join(f"{k.split('/')[-1]} {last[k]:.3g}" for k in
                         ("timing_s/step", "training/rollout_log_probs_diff_max", "rollout_corr/rollout_is_mean")
                         if k in last)
    if step == "async" and "main_job" in result:
        return "; ".join(f"{mode} {row['steps_per_hour']:.0f} steps/h ({row['speedup']:.2f}x)"
                         for mode, row in result["main_job"]["table"].items())
    if "tests" in result:
        return f"{result['tests']} tests, {result['failures'] + result['errors']} failed, {result['skipped']} skipped"
    if step == "logprobs" and "float32" in result:
        return f"fp32 max {result['float32']['max']:.3g}, bf16 max {result['bfloat16']['max']:.3g}"
    return record.get("reason", "")
