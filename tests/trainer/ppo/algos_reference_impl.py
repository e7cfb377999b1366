"""Independent reference implementations of the algorithms verl 0.9.1 added (DPPO, SAPO, DRO,
REINFORCE / bypass mode, GDPO, GRPO pass@k, the optimal token baseline), used only by the tests.

Written from the papers' and verl's documented formulas with plain Python loops over float64
scalars (no torch, no code shared with rlvr), in the style of ``ppo_reference_impl``. Inputs are
nested lists ``[batch][response_len]``.
"""

from __future__ import annotations

import math

from ppo_reference_impl import _groups, _mean, _std, agg_loss, masked_mean, masked_whiten


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _rows(*mats):
    return zip(*mats)


# ------------------------------------------------------------------------------------------ losses
def dppo(old, new, adv, mask, low, high, cap, variant, mode, weights=None):
    """DPPO-Binary-TV / -KL: ``(loss, clipfrac, ppo_kl, clipfrac_lower)``."""
    losses, outside, kls, capped = [], [], [], []
    for i, (o_row, n_row, a_row) in enumerate(_rows(old, new, adv)):
        l_row, out_row, kl_row, cap_row = [], [], [], []
        for t, (o, n, a) in enumerate(zip(o_row, n_row, a_row)):
            lr = _clip(n - o, -20.0, 20.0)
            r = math.exp(lr)
            p, po = math.exp(n), math.exp(o)
            if variant == "tv":
                ok = (p - po <= high) if a > 0 else (p - po >= -low)
            else:
                d = po * (o - n) + (1 - po) * math.log((1 - po + 1e-8) / (1 - p + 1e-8))
                ok = (d <= high or p <= po) if a > 0 else (d <= low or p >= po)
            m = 1.0 if ok else 0.0
            w = weights[i][t] if weights is not None else 1.0
            l_row.append(-a * min(r, cap) * n * m * w)
            out_row.append(1.0 - m)
            kl_row.append(-lr)
            cap_row.append(m if r > cap else 0.0)
        losses.append(l_row), outside.append(out_row), kls.append(kl_row), capped.append(cap_row)
    return (agg_loss(losses, mask, mode), masked_mean(outside, mask), masked_mean(kls, mask),
            masked_mean(capped, mask))


def sapo(old, new, adv, mask, tau_pos, tau_neg, weights=None):
    """SAPO's loss, always the mean over sequences of the token mean, and the per-token gradient
    ``d loss_token / d log pi`` (before aggregation)."""
    losses, grads = [], []
    for i, (o_row, n_row, a_row) in enumerate(_rows(old, new, adv)):
        l_row, g_row = [], []
        for t, (o, n, a) in enumerate(zip(o_row, n_row, a_row)):
            r = math.exp(_clip(n - o, -20.0, 20.0))
            tau = tau_pos if a > 0 else tau_neg
            s = 1.0 / (1.0 + math.exp(-tau * (r - 1.0)))
            w = weights[i][t] if weights is not None else 1.0
            l_row.append(-s * 4.0 / tau * a * w)
            g_row.append(-a * w * 4.0 * s * (1.0 - s) * r)
        losses.append(l_row), grads.append(g_row)
    return agg_loss(losses, mask, "seq-mean-token-mean"), grads


def dro(old, new, adv, mask, beta, mode):
    losses = [[-(n * a - 0.5 * beta * (n - o) ** 2) for o, n, a in zip(*row)] for row in _rows(old, new, adv)]
    kls = [[o - n for o, n in zip(o_row, n_row)] for o_row, n_row in zip(old, new)]
    return agg_loss(losses, mask, mode), masked_mean(kls, mask)


def reinforce(rollout, new, adv, mask, mode, weights=None):
    losses = [[-a * n * (weights[i][t] if weights is not None else 1.0) for t, (n, a) in enumerate(zip(n_row, a_row))]
              for i, (n_row, a_row) in enumerate(zip(new, adv))]
    kls = [[r - n for r, n in zip(r_row, n_row)] for r_row, n_row in zip(rollout, new)]
    return agg_loss(losses, mask, mode), masked_mean(kls, mask)


def token_correction(rollout, new, mask, is_cap, rs_upper, rs_lower):
    """Token-level truncated IS weights ``min(pi / pi_rollout, is_cap)`` and the token rejection
    mask (kept when ``rs_lower <= pi / pi_rollout <= rs_upper``)."""
    weights, kept = [], []
    for r_row, n_row, m_row in zip(rollout, new, mask):
        w_row, k_row = [], []
        for r, n, m in zip(r_row, n_row, m_row):
            ratio = math.exp(_clip(n - r, -20.0, 20.0))
            w_row.append(min(ratio, is_cap) if m else 0.0)
            k_row.append(m if rs_lower <= ratio <= rs_upper else 0.0)
        weights.append(w_row), kept.append(k_row)
    return weights, kept


# ------------------------------------------------------------------------------------- estimators
def _grpo_row_scores(scores, index, norm_by_std, eps):
    out = [0.0] * len(scores)
    for rows in _groups(index).values():
        values = [scores[i] for i in rows]
        mean, std = (_mean(values), _std(values)) if len(values) > 1 else (0.0, 1.0)
        for i in rows:
            out[i] = (scores[i] - mean) / (std + eps) if norm_by_std else scores[i] - mean
    return out


def gdpo(dimensions, weights, index, mask, eps=1e-6, norm_by_std=True):
    """``dimensions``: per reward key, one score per row."""
    total = [0.0] * len(index)
    for w, scores in zip(weights, dimensions):
        for i, a in enumerate(_grpo_row_scores(scores, index, norm_by_std, eps)):
            total[i] += w * a
    whitened = masked_whiten([[total[i] * m for m in m_row] for i, m_row in enumerate(mask)], mask)
    return [[v * m for v, m in zip(row, m_row)] for row, m_row in zip(whitened, mask)]


def grpo_passk(scores, index, mask, eps=1e-6, norm_by_std=True):
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        ordered = sorted(rows, key=lambda i: (-scores[i], i))  # the first row with the top score wins
        best, runner_up = ordered[0], ordered[1]
        margin = scores[best] - scores[runner_up]
        if norm_by_std:
            margin /= _std([scores[i] for i in rows]) + eps
        adv[best] = margin
    return [[adv[i] * m for m in m_row] for i, m_row in enumerate(mask)]


def _reward_to_go(rewards, mask):
    out = []
    for r_row, m_row in zip(rewards, mask):
        acc, row = 0.0, [0.0] * len(r_row)
        for t in reversed(range(len(r_row))):
            acc += r_row[t] * m_row[t]
            row[t] = acc
        out.append(row)
    return out


def _energy(old, spsq, mask, weights):
    out = []
    for i, (o_row, s_row, m_row) in enumerate(zip(old, spsq, mask)):
        acc, row = 0.0, []
        for t, (o, s, m) in enumerate(zip(o_row, s_row, m_row)):
            w = 1.0 - 2.0 * math.exp(o) + s
            if weights is not None:
                w *= weights[i][t] ** 2
            acc += w * m
            row.append(acc)
        out.append(row)
    return out


def _tail_row(lengths):
    """``(row, second longest length)`` of the unique longest of ``lengths`` ({row: length}), else None."""
    ordered = sorted(lengths.values())
    longest = [i for i, n in lengths.items() if n == ordered[-1]]
    return (longest[0], ordered[-2]) if len(longest) == 1 and ordered[-1] > ordered[-2] else None


def optimal_token_baseline(rewards, mask, index, old, spsq, weights=None, zero_tail=True, eps=1e-8):
    """Columns aligned; returns ``(advantages, returns)`` (returns 0 outside the mask)."""
    returns, energy = _reward_to_go(rewards, mask), _energy(old, spsq, mask, weights)
    width = len(mask[0])
    adv = [[0.0] * width for _ in mask]
    for rows in _groups(index).values():
        baseline = {i: [0.0] * width for i in rows}
        if len(rows) > 1:
            for t in range(width):
                num = sum(returns[i][t] * energy[i][t] * mask[i][t] for i in rows)
                den = sum(energy[i][t] * mask[i][t] for i in rows) + eps
                for i in rows:
                    baseline[i][t] = num / den
            tail = _tail_row({i: sum(mask[i]) for i in rows}) if zero_tail else None
            if tail is not None:
                row, second = tail
                baseline[row][int(second):] = [0.0] * (width - int(second))
        for i in rows:
            adv[i] = [(returns[i][t] - baseline[i][t]) * mask[i][t] for t in range(width)]
    return adv, [[g * m for g, m in zip(g_row, m_row)] for g_row, m_row in zip(returns, mask)]


def tir_optimal_token_baseline(rewards, mask, index, old, spsq, weights=None, zero_tail=True, eps=1e-8):
    """The k-th valid tokens of a group's responses aligned; returns the advantages."""
    returns, energy = _reward_to_go(rewards, mask), _energy(old, spsq, mask, weights)
    positions = [[t for t, m in enumerate(m_row) if m] for m_row in mask]
    adv = [[0.0] * len(m_row) for m_row in mask]
    for rows in _groups(index).values():
        rows = [i for i in rows if positions[i]]
        width = max((len(positions[i]) for i in rows), default=0)
        ret = {i: [returns[i][t] for t in positions[i]] + [0.0] * (width - len(positions[i])) for i in rows}
        eng = {i: [energy[i][t] for t in positions[i]] + [0.0] * (width - len(positions[i])) for i in rows}
        baseline = {i: [0.0] * width for i in rows}
        if len(rows) > 1:
            for k in range(width):
                num = sum(ret[i][k] * eng[i][k] for i in rows)
                den = sum(eng[i][k] for i in rows) + eps
                for i in rows:
                    baseline[i][k] = num / den
            tail = _tail_row({i: len(positions[i]) for i in rows}) if zero_tail else None
            if tail is not None:
                row, second = tail
                baseline[row][second:] = [0.0] * (width - second)
        for i in rows:
            for k, t in enumerate(positions[i]):
                adv[i][t] = ret[i][k] - baseline[i][k]
    return adv
