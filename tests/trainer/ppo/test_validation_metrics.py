"""verl's validation statistics (mean@N, std@N, bootstrap best/worst/maj@k), rlvr's pass@k and the
val-core / val-aux names: hand-computed values and a plain-loop reference that draws verl's bootstrap
indices (``RandomState(seed).choice`` per prompt, variable and k)."""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter

import numpy as np
import pytest

from rlvr.trainer.ppo.metric_utils import (
    bootstrap_metric,
    calc_maj_val,
    compute_validation_metrics,
    flatten_validation_metrics,
    pass_at_k,
    process_pass_at_k_metrics,
    process_validation_metrics,
)


def _reference(sources, uids, infos, seed=42):
    """process_validation_metrics as plain loops: per prompt mean / population std, and for each k the
    max / min / majority answer of 1000 draws of k indices with replacement."""
    groups: dict = {}
    for i, (source, uid) in enumerate(zip(sources, uids)):
        for var, values in infos.items():
            groups.setdefault(source, {}).setdefault(uid, {}).setdefault(var, []).append(values[i])
    per: dict = {}
    for source, by_uid in groups.items():
        for by_var in by_uid.values():
            preds = by_var.get("pred")
            for var, raw in by_var.items():
                values = [v for v in raw if v is not None]
                if not values or isinstance(values[0], str):
                    continue
                n = len(values)
                m = {f"mean@{n}": sum(values) / n}
                if n > 1:
                    m[f"std@{n}"] = statistics.pstdev(values)
                    ks = [2 ** e for e in range(1, 10) if 2 ** e < n] + [n]
                    for k in ks:
                        draws = np.random.RandomState(seed).choice(n, size=(1000, k), replace=True)
                        best = [max(values[j] for j in row) for row in draws]
                        worst = [min(values[j] for j in row) for row in draws]
                        m[f"best@{k}/mean"], m[f"best@{k}/std"] = np.mean(best), np.std(best)
                        m[f"worst@{k}/mean"], m[f"worst@{k}/std"] = np.mean(worst), np.std(worst)
                        if preds is not None and len(preds) == n:
                            maj = []
                            for row in draws:
                                votes = [preds[j] for j in row]
                                top = max(Counter(votes).values())
                                winner = next(v for v in votes if votes.count(v) == top)
                                maj.append(values[row[votes.index(winner)]])
                            m[f"maj@{k}/mean"], m[f"maj@{k}/std"] = np.mean(maj), np.std(maj)
                for name, value in m.items():
                    per.setdefault(source, {}).setdefault(var, {}).setdefault(name, []).append(value)
    return {s: {v: {n: float(np.mean(x)) for n, x in ms.items()} for v, ms in bv.items()} for s, bv in per.items()}


def _random_case(seed):
    rng = random.Random(seed)
    sources, uids, infos = [], [], {"reward": [], "acc": [], "pred": []}
    for prompt in range(rng.randint(1, 5)):
        n, source = rng.choice([1, 2, 3, 5, 8]), rng.choice(["gsm8k", "math"])
        for _ in range(n):
            sources.append(source)
            uids.append(f"p{prompt}")
            infos["acc"].append(float(rng.random() < 0.4))
            infos["reward"].append(rng.choice([0.0, 1.0, -1.0, 0.25]))
            infos["pred"].append(rng.choice("ABC"))
    return sources, uids, infos


@pytest.mark.parametrize("seed", range(8))
def test_process_validation_metrics_equals_the_loop_reference(seed):
    sources, uids, infos = _random_case(seed)
    got = process_validation_metrics(sources, uids, infos, seed=seed + 1)
    want = _reference(sources, uids, infos, seed=seed + 1)
    assert got.keys() == want.keys()
    for source in want:
        assert got[source].keys() == want[source].keys()
        for var in want[source]:
            assert got[source][var].keys() == want[source][var].keys()
            for name, value in want[source][var].items():
                assert got[source][var][name] == pytest.approx(value, rel=1e-12, abs=1e-12), (source, var, name)


def test_mean_and_std_by_hand_and_the_global_rng_is_left_alone():
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    result = process_validation_metrics(["s"] * 4 + ["t"] * 2, ["a"] * 4 + ["b"] * 2,
                                        {"acc": [1.0, 0.0, 0.0, 1.0, 1.0, 1.0], "pred": ["x"] * 6})
    assert np.array_equal(np.random.get_state()[1], before)  # verl reseeds numpy's global RNG; rlvr does not
    assert result["s"]["acc"]["mean@4"] == 0.5 and result["s"]["acc"]["std@4"] == 0.5
    # every draw of b's two values is (1, 1): best = worst = maj = 1, std 0
    t = result["t"]["acc"]
    assert (t["best@2/mean"], t["best@2/std"], t["worst@2/mean"], t["maj@2/mean"], t["maj@2/std"]) == (1, 0, 1, 1, 0)
    assert "pred" not in result["s"]  # answers, not a metric


def test_missing_sessions_count_as_wrong_only_where_acc_is_reported():
    result = process_validation_metrics(["m", "m", "r"], ["p1", "p1", "q"],
                                        {"reward": [0.2, 0.8, 1.0], "acc": [1.0, 0.0, None]},
                                        expected_acc_counts={("m", "p1"): 4, ("m", "p2"): 2, ("r", "q"): 3})
    # p1: 1 correct of 4 expected (mean@4 = 0.25); p2 never ran: 0 of 2 (mean@2 = 0); a metric name is
    # averaged over the prompts that have it
    assert result["m"]["acc"]["mean@4"] == 0.25 and result["m"]["acc"]["mean@2"] == 0.0
    assert result["m"]["acc_success_only"]["mean@2"] == 0.5
    assert result["m"]["reward"]["mean@2"] == 0.5
    assert "acc" not in result["r"] and "acc_success_only" not in result["r"]


def test_pass_at_k_is_unbiased_where_bootstrap_best_reads_low():
    assert pass_at_k(4, 1, 4) == 1.0  # all four samples drawn: the correct one is among them
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    for n, c, k in [(10, 3, 4), (16, 1, 8), (7, 2, 7)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    infos = {"acc": [1.0, 0.0, 0.0, 0.0], "reward": [0.3, 0.0, 0.0, 0.0]}
    passes = process_pass_at_k_metrics(["s"] * 4, ["u"] * 4, infos)
    assert passes == {"s": {"acc": {"pass@2": 0.5, "pass@4": 1.0}}}  # reward is not 0/1: no pass@k
    best = process_validation_metrics(["s"] * 4, ["u"] * 4, infos)["s"]["acc"]["best@4/mean"]
    assert best == pytest.approx(1 - 0.75 ** 4, abs=0.03)  # ~0.68: the bootstrap's draws with replacement


def test_val_core_holds_the_core_variable_at_the_largest_n():
    flat = flatten_validation_metrics({"src": {"acc": {"mean@4": 0.5, "std@4": 0.1, "best@2/mean": 0.6,
                                                       "best@4/mean": 0.7, "best@4/std": 0.1, "maj@4/mean": 0.5,
                                                       "worst@4/mean": 0.2, "pass@4": 0.9, "pass@2": 0.7},
                                               "reward": {"mean@4": 0.3}},
                                       "other": {"reward": {"mean@1": 0.2}}})
    core = {k for k in flat if k.startswith("val-core/")}
    assert core == {"val-core/src/acc/mean@4", "val-core/src/acc/best@4/mean", "val-core/src/acc/best@4/std",
                    "val-core/src/acc/maj@4/mean", "val-core/src/acc/pass@4", "val-core/other/reward/mean@1"}
    assert flat["val-aux/src/reward/mean@4"] == 0.3 and flat["val-aux/src/acc/pass@2"] == 0.7
    full = compute_validation_metrics(["s"] * 4, ["u"] * 4, {"reward": [1, 0, 0, 0], "acc": [1, 0, 0, 0]},
                                      sample_turns=[1, 3, 2, 2])
    assert full["val-core/s/acc/pass@4"] == 1.0 and full["val-aux/s/reward/pass@4"] == 1.0
    assert (full["val-aux/num_turns/min"], full["val-aux/num_turns/max"], full["val-aux/num_turns/mean"]) == (1, 3, 2)


def test_bootstrap_metric_and_majority_vote():
    data = [3.0, 1.0, 4.0, 1.0, 5.0]
    [(mean_of_means, _), (mean_of_max, std_of_max)] = bootstrap_metric(data, 2, [np.mean, np.max], n_bootstrap=50, seed=3)
    draws = np.random.RandomState(3).choice(5, size=(50, 2), replace=True)
    maxes = [max(data[i] for i in row) for row in draws]
    assert mean_of_max == pytest.approx(np.mean(maxes)) and std_of_max == pytest.approx(np.std(maxes))
    assert mean_of_means == pytest.approx(np.mean([np.mean([data[i] for i in row]) for row in draws]))
    with pytest.raises(ValueError, match="empty"):
        bootstrap_metric([], 1, [np.mean])
    votes = [{"pred": "B", "val": 0.1}, {"pred": "A", "val": 0.9}, {"pred": "A", "val": 0.7}, {"pred": "B", "val": 0.2}]
    assert calc_maj_val(votes, "pred", "val") == 0.1  # a tie: the answer seen first wins, with its first value
    assert calc_maj_val(votes[1:], "pred", "val") == 0.9


def test_mismatched_lengths_are_named():
    with pytest.raises(ValueError, match=r"infos_dict\['acc'\] has 1 values for 2 samples"):
        process_validation_metrics(["a", "a"], ["u", "u"], {"acc": [1.0]})
