"""Independent reference implementations of the core algorithms, used only by the tests.

Written straight from the published formulas with plain Python loops over float64 scalars (no
torch ops, no shared code with rlvr) so that agreement with rlvr's vectorised torch code is
evidence that both are right. Inputs are nested lists (``[batch][response_len]``) of floats.
"""

from __future__ import annotations

import math


def masked_whiten(values, mask):
    """(x - mean) / sqrt(unbiased var + 1e-8) over the valid positions."""
    valid = [v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m]
    mean = sum(valid) / len(valid)
    var = sum((v - mean) ** 2 for v in valid) / (len(valid) - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in values]


def zero_outside(values, mask):
    return [[v if m else 0.0 for v, m in zip(row, mrow)] for row, mrow in zip(values, mask)]


def agg_loss(loss, mask, mode):
    """token-mean / token-sum / seq-mean-token-sum / seq-mean-token-mean / seq-mean-token-sum-norm."""
    if mode == "token-sum":
        return sum(v for row, mrow in zip(loss, mask) for v, m in zip(row, mrow) if m)
    if mode == "token-mean":
        num = sum(v for row, mrow in zip(loss, mask) for v, m in zip(row, mrow) if m)
        den = sum(1 for mrow in mask for m in mrow if m)
        return num / den if den else 0.0
    seq_losses = []
    for row, mrow in zip(loss, mask):
        n = sum(1 for m in mrow if m)
        if n == 0:
            continue
        total = sum(v for v, m in zip(row, mrow) if m)
        if mode == "seq-mean-token-sum":
            seq_losses.append(total)
        elif mode == "seq-mean-token-mean":
            seq_losses.append(total / n)
        elif mode == "seq-mean-token-sum-norm":
            seq_losses.append(total / len(mrow))
        else:
            raise ValueError(mode)
    return sum(seq_losses) / len(seq_losses) if seq_losses else 0.0


def masked_mean(values, mask):
    num = sum(v for row, mrow in zip(values, mask) for v, m in zip(row, mrow) if m)
    den = sum(1 for mrow in mask for m in mrow if m)
    return num / den if den else 0.0


def _clip(x, lo, hi):
    return min(max(x, lo), hi)


def _map2(fn, *mats):
    return [[fn(*vals) for vals in zip(*rows)] for rows in zip(*mats)]


def ppo_loss(old, new, adv, mask, clip_low, clip_high, clip_c, mode):
    """Dual-clip PPO: returns (loss, clipfrac, ppo_kl, clipfrac_lower)."""
    clipped, lower, losses, kls = [], [], [], []
    for o_row, n_row, a_row in zip(old, new, adv):
        c_row, l_row, loss_row, kl_row = [], [], [], []
        for o, n, a in zip(o_row, n_row, a_row):
            lr = _clip(n - o, -20.0, 20.0)
            r = math.exp(lr)
            l1 = -a * r
            l2 = -a * _clip(r, 1 - clip_low, 1 + clip_high)
            l_ppo = max(l1, l2)
            l3 = -a * clip_c
            loss_row.append(min(l_ppo, l3) if a < 0 else l_ppo)
            c_row.append(1.0 if l2 > l1 else 0.0)
            l_row.append(1.0 if (a < 0 and l_ppo > l3) else 0.0)
            kl_row.append(-lr)
        clipped.append(c_row), lower.append(l_row), losses.append(loss_row), kls.append(kl_row)
    return (agg_loss(losses, mask, mode), masked_mean(clipped, mask), masked_mean(kls, mask),
            masked_mean(lower, mask))


def kl(lp, ref, name):
    """Per-token KL estimate."""
    base = name.rstrip("+")
    x = lp - ref
    if base in ("kl", "k1"):
        return x
    if base == "abs":
        return abs(x)
    if base in ("mse", "k2"):
        return 0.5 * x * x
    if base in ("low_var_kl", "k3"):
        y = _clip(ref - lp, -20.0, 20.0)
        return _clip(math.exp(y) - y - 1.0, -10.0, 10.0)
    raise ValueError(name)


def full_kl(logp_row, logq_row):
    return sum(math.exp(p) * (p - q) for p, q in zip(logp_row, logq_row))


def value_loss(vpreds, returns, values, mask, clip, mode):
    losses, clipped = [], []
    for vp_row, r_row, v_row in zip(vpreds, returns, values):
        l_row, c_row = [], []
        for vp, ret, v in zip(vp_row, r_row, v_row):
            e1 = (vp - ret) ** 2
            e2 = (_clip(vp, v - clip, v + clip) - ret) ** 2
            l_row.append(max(e1, e2))
            c_row.append(1.0 if e2 > e1 else 0.0)
        losses.append(l_row), clipped.append(c_row)
    return 0.5 * agg_loss(losses, mask, mode), masked_mean(clipped, mask)


# --------------------------------------------------------------------------- advantage estimators
def gae(rewards, values, mask, gamma, lam):
    """GAE over the valid tokens only (gaps skipped), then whitened. Returns (adv, returns)."""
    raw = [[0.0] * len(row) for row in rewards]
    returns = [[0.0] * len(row) for row in rewards]
    for i, (r_row, v_row, m_row) in enumerate(zip(rewards, values, mask)):
        next_v, next_a = 0.0, 0.0
        for t in reversed([t for t, m in enumerate(m_row) if m]):
            delta = r_row[t] + gamma * next_v - v_row[t]
            next_a = delta + gamma * lam * next_a
            next_v = v_row[t]
            raw[i][t] = next_a
            returns[i][t] = next_a + v_row[t]
    return zero_outside(masked_whiten(raw, mask), mask), returns


def _groups(index):
    groups = {}
    for i, uid in enumerate(index):
        groups.setdefault(uid, []).append(i)
    return groups


def _mean(xs):
    return sum(xs) / len(xs)


def _std(xs):
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _broadcast(per_row, mask):
    return [[per_row[i] if m else 0.0 for m in mrow] for i, mrow in enumerate(mask)]


def _lone(value, singleton):
    """A group of one: baseline 0, so the advantage is ``value`` ("score"), or 0 ("zero")."""
    return value if singleton == "score" else 0.0


def grpo_scalar(scores, index, norm_by_std, eps, singleton="score"):
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        if len(rows) == 1:
            i = rows[0]
            adv[i] = _lone(scores[i] / (1.0 + eps) if norm_by_std else scores[i], singleton)
            continue
        s = [scores[i] for i in rows]
        for i in rows:
            adv[i] = (scores[i] - _mean(s)) / (_std(s) + eps) if norm_by_std else scores[i] - _mean(s)
    return adv


def grpo(rewards, mask, index, norm_by_std=True, eps=1e-6, singleton="score"):
    return _broadcast(grpo_scalar([sum(r) for r in rewards], index, norm_by_std, eps, singleton), mask)


def rloo(rewards, mask, index, singleton="score"):
    scores = [sum(r) for r in rewards]
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        for i in rows:
            others = [scores[j] for j in rows if j != i]
            adv[i] = scores[i] - _mean(others) if others else _lone(scores[i], singleton)
    return _broadcast(adv, mask)


def opo(rewards, mask, index, singleton="score"):
    scores = [sum(r) for r in rewards]
    lengths = [sum(1 for m in mrow if m) for mrow in mask]
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        if len(rows) == 1:
            adv[rows[0]] = _lone(scores[rows[0]], singleton)
            continue
        baseline = sum(lengths[j] * scores[j] for j in rows) / sum(lengths[j] for j in rows)
        for i in rows:
            adv[i] = scores[i] - baseline
    return _broadcast(adv, mask)


def gpg(rewards, mask, index, alpha_count="nonzero_score", singleton="score", f_norm=1.0):
    """alpha = B / M: M = rows with a non-zero score (verl), or the rows of groups with more than
    one sample and not all scores equal (the paper's samples that carry gradient)."""
    scores = [sum(r) for r in rewards]
    if alpha_count == "nonzero_score":
        counted = [i for i, s in enumerate(scores) if s != 0]
    else:
        counted = [i for rows in _groups(index).values() if len(rows) > 1
                   and len({scores[j] for j in rows}) > 1 for i in rows]
    alpha = len(scores) / max(1, len(counted))
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        for i in rows:
            if len(rows) == 1:
                adv[i] = _lone(alpha * scores[i] / f_norm, singleton)
            else:
                adv[i] = alpha * (scores[i] - _mean([scores[j] for j in rows])) / f_norm
    return _broadcast(adv, mask)


def reinforce_pp(rewards, mask, gamma):
    returns = [[0.0] * len(row) for row in rewards]
    for i, (r_row, m_row) in enumerate(zip(rewards, mask)):
        running = 0.0
        for t in reversed([t for t, m in enumerate(m_row) if m]):
            running = r_row[t] + gamma * running
            returns[i][t] = running
    return zero_outside(masked_whiten(returns, mask), mask), returns


def reinforce_pp_baseline(rewards, mask, index, singleton="score"):
    scores = [sum(r) for r in rewards]
    centred = [0.0] * len(scores)
    for rows in _groups(index).values():
        m = _mean([scores[j] for j in rows]) if len(rows) > 1 or singleton == "zero" else 0.0
        for i in rows:
            centred[i] = scores[i] - m
    return zero_outside(masked_whiten(_broadcast(centred, mask), mask), mask)


def remax(rewards, mask, baselines):
    adv, returns = [], []
    for r_row, m_row, b in zip(rewards, mask, baselines):
        g_row = [sum(r_row[k] for k in range(t, len(r_row)) if m_row[k]) if m_row[t] else 0.0
                 for t in range(len(r_row))]
        returns.append(g_row)
        adv.append([(g - b) if m else 0.0 for g, m in zip(g_row, m_row)])
    return adv, returns


def sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def egpo(rewards, mask, index, log_prob, alpha, beta, threshold, norm="group", eps=1e-6, norm_by_std=True,
         singleton="score"):
    """EGPO as documented in rlvr.trainer.ppo.egpo (independent loop version)."""
    scores = [sum(r) for r in rewards]
    base = grpo_scalar(scores, index, norm_by_std, eps, singleton)
    unc = []
    for lp_row, m_row in zip(log_prob, mask):
        n = sum(1 for m in m_row if m)
        unc.append(-sum(lp for lp, m in zip(lp_row, m_row) if m) / n if n else 0.0)
    norm_groups = _groups(index) if norm == "group" else {"all": list(range(len(scores)))}
    conf = [0.0] * len(scores)
    for rows in norm_groups.values():
        u = [unc[j] for j in rows]
        sd = _std(u) if len(u) > 1 else 0.0
        for i in rows:
            conf[i] = sigmoid(-(unc[i] - _mean(u)) / (sd + eps))
    adv = [0.0] * len(scores)
    for rows in _groups(index).values():
        if len(rows) == 1:
            adv[rows[0]] = base[rows[0]]  # its own group: confidence 0.5, the GRPO advantage unchanged
            continue
        degenerate = len({scores[j] for j in rows}) == 1
        for i in rows:
            if degenerate:
                adv[i] = beta * (1 - conf[i]) if scores[i] >= threshold else -beta * conf[i]
            elif base[i] < 0:
                adv[i] = base[i] * (1 + alpha * (2 * conf[i] - 1))
            else:
                adv[i] = base[i]
    return _broadcast(adv, mask)


# --------------------------------------------------------------------------- registry policy losses
def gspo(old, new, adv, mask, low, high, mode):
    losses, clipped = [], []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, mask):
        n = sum(1 for m in m_row if m)
        s = math.exp(sum(n_ - o for o, n_, m in zip(o_row, n_row, m_row) if m) / max(n, 1))
        losses.append([max(-a * s, -a * _clip(s, 1 - low, 1 + high)) for a in a_row])
        clipped.append([1.0 if -a * _clip(s, 1 - low, 1 + high) > -a * s else 0.0 for a in a_row])
    return agg_loss(losses, mask, mode), masked_mean(clipped, mask)


def gpg_loss(new, adv, mask, mode):
    return agg_loss(_map2(lambda n, a: -a * n, new, adv), mask, mode)


def cispo(old, new, adv, mask, low, high, mode):
    loss = _map2(lambda o, n, a: -_clip(math.exp(n - o), 1 - low, 1 + high) * a * n, old, new, adv)
    return agg_loss(loss, mask, mode)


def _cov(adv, logp, mask):
    cells = [(i, t) for i, m_row in enumerate(mask) for t, m in enumerate(m_row) if m]
    a_mean = _mean([adv[i][t] for i, t in cells])
    l_mean = _mean([logp[i][t] for i, t in cells])
    return {(i, t): (adv[i][t] - a_mean) * (logp[i][t] - l_mean) for i, t in cells}


def clip_cov(old, new, adv, mask, low, high, ratio, lb, ub, mode, permutation):
    """Value of the Clip-Cov loss and the set of cut cells, whose loss is 0 (``permutation`` = the
    random order, a function n -> list of indices, so the test can share the RNG draw)."""
    losses, candidates = [], []
    cov = _cov(adv, new, mask)
    for i, (o_row, n_row, a_row) in enumerate(zip(old, new, adv)):
        row = []
        for t, (o, n, a) in enumerate(zip(o_row, n_row, a_row)):
            r = math.exp(n - o)
            l1, l2 = -a * r, -a * _clip(r, 1 - low, 1 + high)
            row.append(max(l1, l2))
            if mask[i][t] and not l2 > l1 and lb < cov[(i, t)] < ub:
                candidates.append((i, t))
        losses.append(row)
    n_valid = len(cov)
    k = min(max(int(ratio * n_valid), 1), len(candidates))
    chosen = {candidates[j] for j in permutation(len(candidates))[:k]}
    for i, t in chosen:
        losses[i][t] = 0.0
    return agg_loss(losses, mask, mode), chosen


def kl_cov(old, new, adv, mask, ratio, coef, mode):
    cov = _cov(adv, new, mask)
    k = max(int(len(cov) * ratio), 1)
    top = set(sorted(cov, key=lambda cell: cov[cell], reverse=True)[:k])
    losses = [[-a * math.exp(n - o) + (coef * abs(n - o) if (i, t) in top else 0.0)
               for t, (o, n, a) in enumerate(zip(o_row, n_row, a_row))]
              for i, (o_row, n_row, a_row) in enumerate(zip(old, new, adv))]
    return agg_loss(losses, mask, mode), top


def geo_mean(old, new, adv, mask, low, high, mode):
    losses = []
    for o_row, n_row, a_row, m_row in zip(old, new, adv, mask):
        n = max(sum(1 for m in m_row if m), 1)
        total_lr, total_a = 0.0, 0.0
        for o, n_, a, m in zip(o_row, n_row, a_row, m_row):
            if not m:
                continue
            lr = n_ - o
            clr = _clip(lr, -low, high)
            # pessimistic: the smaller of the two objectives A*exp(lr), A*exp(clr)
            chosen = min(lr, clr) if a > 0 else (max(lr, clr) if a < 0 else 0.0)
            total_lr += chosen
            total_a += a
        seq_loss = -(total_a / n) * math.exp(total_lr / n)
        losses.append([seq_loss] * len(o_row))
    return agg_loss(losses, mask, mode)
