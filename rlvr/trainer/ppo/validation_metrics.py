"""Validation metrics over ``n`` samples per prompt, per data source (verl's ``mean@N`` / ``best@N``
/ ``maj@N`` and the ``val-core`` / ``val-aux`` names), and the unbiased pass@k estimator.

For every data source, variable (``reward``, ``acc``, ``pred`` and every other key the reward
function returns) and prompt (``uid``) with ``N`` samples:

- ``mean@N``, ``std@N`` (population std) of the variable;
- ``best@k/mean``, ``best@k/std``, ``worst@k/mean``, ``worst@k/std``: the mean and std over 1000
  bootstrap draws of ``k`` of the ``N`` values (with replacement) of their max / min, for
  ``k = 2, 4, 8, ... < N`` and ``k = N``;
- ``maj@k/mean``, ``maj@k/std`` with a ``pred`` column: the value of the majority answer of each draw;
- ``pass@k`` (rlvr; variables whose values are all 0 or 1): the unbiased estimator of Chen et al.
  2021, "Evaluating Large Language Models Trained on Code" (arXiv:2107.03374), eq. 1:
  ``1 - C(N - c, k) / C(N, k)`` with ``c`` correct samples of ``N``.

then averaged over the prompts of the source. The bootstrap draws are verl's: a
``numpy.random.RandomState(seed)`` drawn once per (prompt, variable, k) with the same seed, so the
numbers equal verl's for the same seed (verl seeds numpy's global generator; rlvr uses its own
``RandomState`` with the same stream and leaves the global one alone).

Why pass@k: bootstrap ``best@k`` draws with replacement, so it reads low — one correct answer of 4
gives ``best@4 = 1 - (3/4)^4 = 0.68`` where pass@4 is 1.0 (all 4 samples were drawn).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from functools import partial
from numbers import Number
from typing import Any

import numpy as np

__all__ = [
    "N_BOOTSTRAP",
    "bootstrap_metric",
    "calc_maj_val",
    "compute_validation_metrics",
    "flatten_validation_metrics",
    "pass_at_k",
    "process_pass_at_k_metrics",
    "process_validation_metrics",
]

N_BOOTSTRAP = 1000
"""Bootstrap draws per (prompt, variable, k), as verl."""


def _bootstrap_indices(n_data: int, subset_size: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """``[n_bootstrap, subset_size]`` indices into ``n_data`` items, drawn with replacement from a
    fresh ``RandomState(seed)`` (the stream ``np.random.seed(seed); np.random.choice(...)`` gives)."""
    if n_data == 0:
        raise ValueError("bootstrap_metric needs at least one data point; got an empty list")
    return np.random.RandomState(seed).choice(n_data, size=(n_bootstrap, subset_size), replace=True)


def bootstrap_metric(data: list[Any], subset_size: int, reduce_fns: list[Callable[[np.ndarray], float]],
                     n_bootstrap: int = 1000, seed: int = 42) -> list[tuple[float, float]]:
    """Mean and std, over ``n_bootstrap`` resamples of ``subset_size`` items of ``data`` (with
    replacement), of each reduce function.

    Args:
        data: the values (any objects the reduce functions take).
        subset_size: items per resample.
        reduce_fns: each maps one resample (a 1-D object array) to a number.
        n_bootstrap: number of resamples.
        seed: seed of the resampling (every function sees the same resamples).

    Returns:
        ``[(mean, std), ...]``, one pair per reduce function (``std`` with ddof 0).

    Raises:
        ValueError: ``data`` is empty.
    """
    items = np.array(data, dtype=object)
    indices = _bootstrap_indices(len(items), subset_size, n_bootstrap, seed)
    results = np.empty((len(reduce_fns), n_bootstrap), dtype=np.float64)
    for fn_idx, reduce_fn in enumerate(reduce_fns):
        for draw, rows in enumerate(indices):
            results[fn_idx, draw] = reduce_fn(items[rows])
    return [(float(np.mean(row)), float(np.std(row))) for row in results]


def calc_maj_val(data: list[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """``val_key`` of the first item whose ``vote_key`` is the most frequent vote (ties: the vote
    seen first wins).

    Args:
        data: items with both keys.
        vote_key: the answer voted on (e.g. ``pred``).
        val_key: the value returned for the winning answer (e.g. ``acc``).
    """
    counts: dict[Any, int] = {}
    first_value: dict[Any, Any] = {}
    for item in data:
        vote = item[vote_key]
        if vote not in counts:
            counts[vote], first_value[vote] = 0, item[val_key]
        counts[vote] += 1
    winner = max(counts, key=counts.get)
    return first_value[winner]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of a prompt with ``c`` correct answers among ``n`` samples (Chen et al. 2021,
    arXiv:2107.03374): ``1 - C(n - c, k) / C(n, k)``, computed as a product to stay exact in floats.

    Raises:
        ValueError: not ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def _subset_sizes(n_resps: int) -> list[int]:
    """``k`` of the best/worst/maj/pass metrics: 2, 4, 8, ... below ``n_resps``, then ``n_resps``."""
    if n_resps <= 1:
        return []
    sizes, k = [], 2
    while k < n_resps:
        sizes.append(k)
        k *= 2
    return sizes + [n_resps]


Grouped = dict[str, dict[str, dict[str, list[Any]]]]
"""data source -> uid -> variable -> per-sample values (sample order)."""


def _group_samples(data_sources: Sequence[str], sample_uids: Sequence[Any], infos_dict: dict[str, Sequence[Any]],
                   expected_acc_counts: dict[tuple[str, str], int] | None) -> Grouped:
    """Values by source, prompt and variable. With ``expected_acc_counts`` ((source, uid) -> samples
    expected), a source that reports ``acc`` gets the missing samples (failed sessions) as ``acc`` 0
    and the observed ones as ``acc_success_only``."""
    n = len(data_sources)
    if len(sample_uids) != n:
        raise ValueError(f"got {n} data sources but {len(sample_uids)} sample uids; give one of each per sample")
    for name, values in infos_dict.items():
        if len(values) < n:
            raise ValueError(f"infos_dict[{name!r}] has {len(values)} values for {n} samples; give one per sample")
    grouped: Grouped = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, source in enumerate(data_sources):
        per_var = grouped[source][sample_uids[i]]
        for name, values in infos_dict.items():
            per_var[name].append(values[i])
    if expected_acc_counts:
        acc_sources = {source for source, by_uid in grouped.items()
                       if any(v is not None for per_var in by_uid.values() for v in per_var.get("acc", []))}
        for (source, uid), expected in expected_acc_counts.items():
            if source not in acc_sources:
                continue
            per_var = grouped[source][uid]
            observed = [v for v in per_var.get("acc", []) if v is not None]
            per_var["acc_success_only"] = observed
            per_var["acc"] = observed + [0.0] * max(expected - len(observed), 0)
    return grouped


def _numeric_values(values: list[Any]) -> list[Any] | None:
    """The non-None values of a variable, or None when it has none or any is not a number (strings
    such as ``pred`` are answers, not metrics)."""
    kept = [v for v in values if v is not None]
    if not kept or not all(isinstance(v, (Number, np.bool_)) for v in kept):
        return None
    return kept


def _prompt_metrics(values: list[Any], preds: list[Any] | None, seed: int) -> dict[str, float]:
    """mean@N, std@N and the bootstrap best/worst/maj metrics of one prompt's values of one variable."""
    n = len(values)
    metrics = {f"mean@{n}": float(np.mean(values))}
    if n <= 1:
        return metrics
    metrics[f"std@{n}"] = float(np.std(values))
    numbers = np.asarray(values, dtype=np.float64)
    with_pred = preds is not None and len(preds) == n and all(p is not None for p in preds)
    votes = [{"val": v, "pred": p} for v, p in zip(values, preds)] if with_pred else None
    for k in _subset_sizes(n):
        draws = numbers[_bootstrap_indices(n, k, N_BOOTSTRAP, seed)]  # [N_BOOTSTRAP, k]
        best, worst = draws.max(axis=1), draws.min(axis=1)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = float(np.mean(best)), float(np.std(best))
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = float(np.mean(worst)), float(np.std(worst))
        if votes is not None:
            [(maj_mean, maj_std)] = bootstrap_metric(votes, k, [partial(calc_maj_val, vote_key="pred", val_key="val")],
                                                     N_BOOTSTRAP, seed)
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = maj_mean, maj_std
    return metrics


def _mean_over_prompts(per_prompt: dict[str, dict[str, list[dict[str, float]]]]) -> dict[str, dict[str, dict[str, float]]]:
    """source -> variable -> [per-prompt metric dicts]  ->  source -> variable -> metric -> mean."""
    result: dict[str, dict[str, dict[str, float]]] = {}
    for source, by_var in per_prompt.items():
        for var, prompt_dicts in by_var.items():
            collected: dict[str, list[float]] = defaultdict(list)
            for metrics in prompt_dicts:
                for name, value in metrics.items():
                    collected[name].append(value)
            result.setdefault(source, {})[var] = {name: float(np.mean(vals)) for name, vals in collected.items()}
    return result


def process_validation_metrics(data_sources: list[str], sample_uids: list[str], infos_dict: dict[str, list[Any]],
                               seed: int = 42, expected_acc_counts: dict[tuple[str, str], int] | None = None,
                               ) -> dict[str, dict[str, dict[str, float]]]:
    """verl's validation statistics (see the module docstring), averaged over the prompts of each source.

    Args:
        data_sources: ``[samples]`` data source of each sample.
        sample_uids: ``[samples]`` prompt id of each sample (the ``N`` samples of a prompt share it).
        infos_dict: variable -> ``[samples]`` values (numbers; None where a sample has none;
            variables of strings, lists or dicts are skipped; ``pred`` gives the majority vote).
        seed: seed of the bootstrap draws.
        expected_acc_counts: (source, uid) -> samples expected; missing ones count as ``acc`` 0 in
            sources that report ``acc`` (``acc_success_only`` keeps the observed ones).

    Returns:
        ``{source: {variable: {metric: value}}}``, metric names as in the module docstring (no pass@k:
        :func:`process_pass_at_k_metrics`).
    """
    grouped = _group_samples(data_sources, sample_uids, infos_dict, expected_acc_counts)
    per_prompt: dict[str, dict[str, list[dict[str, float]]]] = {}
    for source, by_uid in grouped.items():
        for per_var in by_uid.values():
            preds = per_var.get("pred")
            for var, raw in per_var.items():
                values = _numeric_values(raw)
                if values is not None:
                    per_prompt.setdefault(source, {}).setdefault(var, []).append(_prompt_metrics(values, preds, seed))
    return _mean_over_prompts(per_prompt)


def process_pass_at_k_metrics(data_sources: list[str], sample_uids: list[str], infos_dict: dict[str, list[Any]],
                              expected_acc_counts: dict[tuple[str, str], int] | None = None,
                              ) -> dict[str, dict[str, dict[str, float]]]:
    """``pass@k`` for ``k = 2, 4, ... < N, N`` of every variable whose values are all 0 or 1 (True /
    False), per prompt, averaged over the prompts of each source; same layout and arguments as
    :func:`process_validation_metrics`."""
    grouped = _group_samples(data_sources, sample_uids, infos_dict, expected_acc_counts)
    per_prompt: dict[str, dict[str, list[dict[str, float]]]] = {}
    for source, by_uid in grouped.items():
        for per_var in by_uid.values():
            for var, raw in per_var.items():
                values = _numeric_values(raw)
                if values is None or len(values) < 2 or not all(float(v) in (0.0, 1.0) for v in values):
                    continue
                n, c = len(values), int(sum(float(v) for v in values))
                metrics = {f"pass@{k}": pass_at_k(n, c, k) for k in _subset_sizes(n)}
                per_prompt.setdefault(source, {}).setdefault(var, []).append(metrics)
    return _mean_over_prompts(per_prompt)


def _sample_count(metric_name: str) -> int:
    """The ``N`` or ``k`` of ``mean@N``, ``best@k/std``, ``pass@k``."""
    return int(metric_name.split("@")[-1].split("/")[0])


def flatten_validation_metrics(data_src2var2metric2val: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """verl's logged names: ``val-core/<source>/<var>/<metric>`` for the core variable's (``acc`` if
    the source has it, else ``reward``) ``mean`` / ``maj`` / ``best`` (and rlvr's ``pass``) metrics
    at the largest ``N`` of that variable, ``val-aux/<source>/<var>/<metric>`` for every other."""
    flat = {}
    for source, by_var in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in by_var else "reward"
        for var, metrics in by_var.items():
            n_max = max(_sample_count(name) for name in metrics)
            for name, value in metrics.items():
                core = (var == core_var and name.startswith(("mean", "maj", "best", "pass"))
                        and _sample_count(name) == n_max)
                flat[f"{'val-core' if core else 'val-aux'}/{source}/{var}/{name}"] = value
    return flat


def compute_validation_metrics(data_sources: Sequence[str], sample_uids: Sequence[Any],
                               infos_dict: dict[str, Sequence[Any]], seed: int = 42,
                               sample_turns: Sequence[int] | None = None) -> dict[str, float]:
    """The validation metrics a verl trainer logs, plus pass@k: :func:`process_validation_metrics` and
    :func:`process_pass_at_k_metrics` under :func:`flatten_validation_metrics`'s names, and
    ``val-aux/num_turns/{min,max,mean}`` when the samples' turn counts are given."""
    merged = process_validation_metrics(list(data_sources), list(sample_uids), dict(infos_dict), seed)
    for source, by_var in process_pass_at_k_metrics(list(data_sources), list(sample_uids), dict(infos_dict)).items():
        for var, metrics in by_var.items():
            merged[source][var].update(metrics)
    flat = flatten_validation_metrics(merged)
    if sample_turns is not None and len(sample_turns):
        turns = np.asarray(sample_turns)
        flat.update({"val-aux/num_turns/min": float(turns.min()), "val-aux/num_turns/max": float(turns.max()),
                     "val-aux/num_turns/mean": float(turns.mean())})
    return flat
