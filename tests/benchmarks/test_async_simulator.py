"""The asynchronous-training simulator against hand-computed step times."""

from __future__ import annotations

import random

import pytest

from benchmarks.async_simulator import (
    LARGE,
    Workload,
    generation_s,
    predict,
    predict_from_stages,
    corun_factor,
    overlap_ceiling,
    predict_lent_run,
    run_two_sides_s,
    scaling_table,
    thread_factors,
)


def test_a_static_batch_decodes_until_its_longest_sample_and_streaming_keeps_seats_full():
    work = Workload(step_s=1.0, token_s=0.5)
    # lengths 1 and 3: one step with 2 samples (1 + 2 * 0.5), then two steps with 1 sample (1.5 each)
    assert generation_s(work, [1, 3], workers=1, streaming=False) == pytest.approx(2.0 + 2 * 1.5)
    # streaming: 4 tokens at 2 seats = 2 steps of 2 samples
    assert generation_s(work, [1, 3], workers=1, streaming=True) == pytest.approx(2 * 2.0)
    # two workers, one sample each: the slower one (3 steps of 1.5)
    assert generation_s(work, [1, 3], workers=2, streaming=False) == pytest.approx(3 * 1.5)
    # seats: 3 samples with 2 seats run as two batches one after the other
    seated = Workload(step_s=1.0, token_s=0.0, seats=2)
    assert generation_s(seated, [2, 2, 2], workers=1, streaming=False) == pytest.approx(2.0 + 2.0)


def test_overlap_takes_the_longer_stage_instead_of_their_sum():
    # constant lengths of 10 tokens, 4 samples: generation of 10 steps, training 4 x 10 x 0.1 s
    work = Workload(prompts=2, n=2, lengths=[10], step_s=0.5, token_s=0.0, train_token_s=0.1, push_s=1.0,
                    max_staleness=1)
    out = predict(work, rollout_workers=1, train_workers=1, steps=3)
    assert out["sync/step_s"] == pytest.approx(10 * 0.5 + 40 * 0.1 / 2)  # both workers: generate, then train
    assert out["one_step/step_s"] == pytest.approx(max(10 * 0.5, 40 * 0.1 + 1.0))
    # streaming at full occupancy: 40 tokens / 4 seats = 10 steps; the longest sample (5 s) over 2 steps: 2.5 s
    assert out["bounded/step_s"] == pytest.approx(max(10 * 0.5, 5.0, 5.0 / 2))
    assert out["one_step/speedup"] == pytest.approx(7.0 / 5.0)


def test_the_bound_limits_how_far_streaming_hides_a_long_tail():
    work = Workload(prompts=4, n=1, lengths=[100], step_s=1.0, token_s=0.0, train_token_s=0.0, max_staleness=0)
    assert predict(work, 4, 4, steps=2)["bounded/step_s"] == pytest.approx(100.0)  # S = 0: wait for the longest
    work.max_staleness = 3
    assert predict(work, 4, 4, steps=2)["bounded/step_s"] == pytest.approx(100.0)  # 4 samples, 4 workers: 100 steps


def test_predict_from_stages_overlaps_one_core_each():
    two, one = {"gen_s": 6.0, "train_s": 5.0}, {"gen_s": 9.0, "train_s": 6.0}
    out = predict_from_stages(two, one, push_s=0.5, proximal=False)
    assert out["sync/step_s"] == 11.0 and out["one_step/step_s"] == 9.0  # generation is the longer side
    assert out["one_step/speedup"] == pytest.approx(11.0 / 9.0)
    # with the proximal forward (a third of the training): 6 + 2 + 0.5 on the trainer's side, under 9
    assert predict_from_stages(two, one, push_s=0.5)["one_step/step_s"] == pytest.approx(9.0)
    slower = {"gen_s": 9.0, "train_s": 7.5}  # 7.5 + 2.5 + 0.5: now the trainer's side is the step
    assert predict_from_stages(two, slower, push_s=0.5)["one_step/step_s"] == pytest.approx(10.5)
    assert predict_from_stages(two, slower, push_s=0.5, proximal=False)["one_step/step_s"] == pytest.approx(9.0)


def test_the_side_that_waits_lends_its_core_to_the_other():
    # batch 1 generates (6 s on one core) while batch 0 trains (8.5 s on one core, 5.5 s on two);
    # then the trainer has done 6 / 8.5 of its update and does the rest on both cores; the last
    # update (2 s, 1 s on two cores) runs alone
    gens, updates = [(0.0, 0.0), (6.0, 5.0)], [(8.5, 5.5), (2.0, 1.0)]
    lent = run_two_sides_s(gens, updates, max_staleness=1, lend=True)
    assert lent == pytest.approx(6.0 + (1.0 - 6.0 / 8.5) * 5.5 + 1.0)
    assert run_two_sides_s(gens, updates, max_staleness=1, lend=False) == pytest.approx(8.5 + 2.0)
    # the rollout is the long side: after the 4 s update it generates on both cores (4 s on two)
    assert run_two_sides_s([(0.0, 0.0), (10.0, 8.0)], [(4.0, 3.0), (0.0, 0.0)], 1, lend=True) == pytest.approx(
        4.0 + 0.6 * 8.0)


def test_two_sides_that_compute_together_slow_each_other_down():
    # corun 1.2: batch 1 generates in 7.2 s beside update 0 (10.2 s), which has done 7.2 / 10.2 of
    # its work by then; lent, the rest runs on both cores (5.5 s whole), unlent on one alone (8.5 s)
    gens, updates = [(0.0, 0.0), (6.0, 5.0)], [(8.5, 5.5), (2.0, 1.0)]
    assert run_two_sides_s(gens, updates, 1, lend=True, corun=1.2) == pytest.approx(
        7.2 + (1.0 - 7.2 / 10.2) * 5.5 + 1.0)
    assert run_two_sides_s(gens, updates, 1, lend=False, corun=1.2) == pytest.approx(
        7.2 + (1.0 - 7.2 / 10.2) * 8.5 + 2.0)
    with pytest.raises(ValueError, match="at least 1"):
        run_two_sides_s(gens, updates, 1, lend=True, corun=0.9)
    # predict_lent_run hands it on: the lent prediction of the test below, with the overlap 1.2x slower
    out = predict_lent_run([(4.0, 6.0), (2.0, 2.0)], gen_factor=1.25, rest_factor=1.5, push_s=0.0, corun=1.2)
    assert out["one_step_lend/speedup"] == pytest.approx(14.0 / (3.0 + (1.0 - 3.0 / 10.8) * 6.0 + 2.0))


def test_corun_factor_is_the_ratio_of_sums_of_the_same_stages():
    assert corun_factor([8.0, 6.0], [9.0, 7.1]) == pytest.approx(16.1 / 14.0)
    with pytest.raises(ValueError, match="the same stages"):
        corun_factor([8.0], [9.0, 7.0])
    with pytest.raises(ValueError, match="the same stages"):
        corun_factor([], [])
    with pytest.raises(ValueError, match="must take time"):
        corun_factor([0.0], [1.0])


def test_the_overlap_ceiling_is_what_a_perfectly_balanced_run_reaches():
    # the main job's factors on the 2-core CPU: two threads 1.41x and 1.40x faster, together 1.13x slower
    assert overlap_ceiling(1.41, 1.40, 1.13) == pytest.approx((1 / 1.41 + 1 / 1.40) / 1.13)
    assert overlap_ceiling(2.0, 2.0) == pytest.approx(1.0)  # perfect thread scaling: nothing to gain
    # generation 4 s and the rest 6 s on two threads, 1.5x and 1.0x on one: both sides take 6 s on one
    # core, 7.2 s together; 1000 steps of the simulator approach (1 / 1.5 + 1) / 1.2
    steps = 1000
    gens, updates = [(6.0, 4.0)] * steps, [(6.0, 6.0)] * steps
    speedup = 10.0 * steps / run_two_sides_s(gens, updates, 1, lend=True, corun=1.2)
    assert speedup == pytest.approx(overlap_ceiling(1.5, 1.0, 1.2), rel=1e-3)
    with pytest.raises(ValueError, match="positive"):
        overlap_ceiling(0.0, 1.0)


def test_a_larger_staleness_lets_the_rollout_run_ahead():
    # a long update first, a long generation later (one core = two here: lending changes nothing)
    gens = [(0.0, 0.0), (1.0, 1.0), (4.0, 4.0)]
    updates = [(4.0, 4.0), (1.0, 1.0), (1.0, 1.0)]
    # staleness 1: batch 2 may start only after update 0 (t=4), so update 2 waits for it until t=8
    assert run_two_sides_s(gens, updates, 1, lend=True) == pytest.approx(4.0 + 4.0 + 1.0)
    # staleness 2: batch 2 generates at t=1-5, during update 0
    assert run_two_sides_s(gens, updates, 2, lend=True) == pytest.approx(4.0 + 1.0 + 1.0)
    with pytest.raises(ValueError, match="one generation per update"):
        run_two_sides_s(gens[:2], updates, 1, lend=True)
    with pytest.raises(ValueError, match="max_staleness must be at least 1"):
        run_two_sides_s(gens, updates, 0, lend=True)


def test_thread_factors_are_ratios_of_sums_over_the_common_steps():
    two = [(4.0, 6.0), (2.0, 2.0), (99.0, 99.0)]  # the third step has no one-thread partner
    one = [(5.0, 9.0), (2.5, 3.0)]
    assert thread_factors(two, one) == pytest.approx((7.5 / 6.0, 12.0 / 8.0))
    with pytest.raises(ValueError, match="at least one step"):
        thread_factors([], one)
    with pytest.raises(ValueError, match="must take time"):
        thread_factors([(0.0, 1.0)], one)


def test_a_lent_run_is_predicted_from_the_synchronous_stage_times():
    # two steps: generation 4 and 2 s, the rest 6 and 2 s on two threads; one thread 1.25x and 1.5x.
    # Batch 1 generates (2.5 s) beside update 0 (9 s), which then finishes on both cores
    # ((1 - 2.5 / 9) x 6 s); update 1 runs alone (3 s, or 2 s lent)
    out = predict_lent_run([(4.0, 6.0), (2.0, 2.0)], gen_factor=1.25, rest_factor=1.5, push_s=0.0)
    lent = 2.5 + (1.0 - 2.5 / 9.0) * 6.0 + 2.0
    assert out["sync/steps_per_hour"] == pytest.approx(3600.0 * 2 / 14.0)
    assert out["one_step/speedup"] == pytest.approx(14.0 / (9.0 + 3.0))
    assert out["one_step_lend/speedup"] == pytest.approx(14.0 / lent)
    assert out["one_step_lend/steps_per_hour"] == pytest.approx(3600.0 * 2 / lent)
    assert out["bounded_lend/speedup"] == pytest.approx(14.0 / lent)  # no third batch to run ahead to
    # the push sits on the trainer's side, on one core and on two
    pushed = predict_lent_run([(4.0, 6.0), (2.0, 0.0)], gen_factor=1.25, rest_factor=1.5, push_s=1.0)
    assert pushed["one_step/speedup"] == pytest.approx(12.0 / (10.0 + 1.0))
    assert pushed["one_step_lend/speedup"] == pytest.approx(12.0 / (2.5 + (1.0 - 2.5 / 10.0) * 7.0 + 1.0))
    with pytest.raises(ValueError, match="at least one synchronous step"):
        predict_lent_run([], 1.0, 1.0, 0.0)


def test_lengths_are_drawn_from_the_measured_ones_or_the_lognormal():
    from benchmarks.async_simulator import sample_lengths

    assert set(sample_lengths(Workload(lengths=[3, 5]), 50, random.Random(0))) == {3, 5}
    drawn = sample_lengths(Workload(median_len=100, sigma=0.5, max_len=150), 2000, random.Random(0))
    assert max(drawn) == 150 and 85 < sorted(drawn)[1000] < 115


def test_the_scaling_table_shows_sync_stop_scaling_on_the_tail():
    rows = scaling_table(LARGE, [8, 64, 512])
    sync = [r["sync/step_s"] for r in rows]
    assert sync[0] > sync[1] > sync[2] and sync[1] / sync[2] < 1.5  # 8x the GPUs, far less than 8x faster
    assert all(r["sync/tail_share"] > 0.5 for r in rows)
    assert rows[-1]["bounded/speedup"] > rows[-1]["one_step/speedup"] >= 1.0
