"""The plain evaluator: any Composition on a batch, read top to bottom as its definition (seqis/core/compose.py).

This is what a correction *is*; seqis/evaluators/fast.py computes the same outputs faster and is tested against this
module (tests/test_evaluators.py), which in turn is tested against each estimator's own `reference` and a
per-rollout python reference (tests/test_reference.py). Nothing here is tuned for speed: (B, T) tensors are
made freely, masks are bool tensors, the loss is an ordinary autograd graph.

Notation: m the loss mask (B, T); l_t = log pi - log mu on loss tokens (0 elsewhere); S_j = sum_t l_t,
T_j = sum_t m, G_j = S_j / T_j (0 for an empty rollout); c the composition's log-ratio clamp.
Every tensor below is in the compute dtype: float64 for float64 inputs, float32 otherwise.

Metric definitions (valid rollout = T_j > 0; an empty selection gives 0.0); every correction reports all:
  mismatch_kl            mean over loss tokens of k3 = rho - 1 - l (estimates KL(mu || pi) per token)
  masked_mismatch_kl     the same over dropped loss tokens;  unmasked_mismatch_kl: over kept ones
  is_masked              fraction of loss tokens dropped
  is_token_masked        fraction of loss tokens a token-level rule drops (a token band, a token criterion)
  is_traj_masked         fraction of loss tokens in rollouts a rollout-level rule rejects
  is_clipped             fraction of valid rollouts whose weight was truncated
  seq_log_ratio          mean of S_j;  geo_log_ratio: mean of S_j / T_j (over valid rollouts)
  seq_weight             mean applied weight (per rollout: over its loss tokens) over valid rollouts that keep
                         some gradient
  penalty                (with a penalty term only) its value in the loss

The loss is -sum_t s_t * weights_t * adv_tau * A_t * log pi_t (+ coef * sum_t s_t f(l_t) with a penalty), s_t the
aggregation's normaliser (token-mean: 1/N, N every loss token of the batch).
"""

from __future__ import annotations

import math

import torch

from ..core.compose import Composition, Criterion
from ..core.ratios import MAX_LOG_WEIGHT, compute_dtype
from ..core.types import Batch, EstimatorOutput

AGGREGATIONS = ("token-mean", "kept-token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
_SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}


def log_of(x: float) -> float:
    """log of a knob value: log 0 = -inf, log inf = inf."""
    return -math.inf if x == 0 else math.log(x)


def evaluate(comp: Composition, batch: Batch, agg: str = "token-mean") -> EstimatorOutput:
    """The composition on the batch: loss (differentiable in trainer_logprobs), weights, masks, metrics and
    per-rollout values."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    dtype = compute_dtype(batch.trainer_logprobs)
    m = batch.loss_mask  # (B, T) bool
    zero = torch.zeros((), dtype=dtype, device=m.device)
    logp = torch.where(m, batch.trainer_logprobs.detach().to(dtype), zero)  # (B, T) log pi on loss tokens
    logq = torch.where(m, batch.inference_logprobs.to(dtype), zero)  # (B, T) log mu
    l = torch.where(m, logp - logq, zero)  # (B, T)
    l = torch.where(torch.isfinite(l), l, zero)  # a log-prob of -inf or nan on a loss token counts as l = 0
    T = m.sum(-1).to(dtype)  # (B,) T_j
    valid = T > 0  # (B,)
    N = T.sum()  # () loss tokens
    S = l.sum(-1)  # (B,)
    G = S / T.clamp(min=1)  # (B,)
    # a ratio within the rounding of its log-probs of a band edge is on it: each l_t carries eps * |log p| of
    # rounding, so S_j / T_j is within eps * (|sum log pi| + |sum log mu|) / T_j of its exact value
    eps = torch.finfo(dtype).eps
    logp_sum = logp.sum(-1)  # (B,)
    tol_geo = eps * (logp_sum.abs() + (logp_sum - S).abs()) / T.clamp(min=1)  # (B,)
    adv = batch.advantages.to(dtype)  # (B,) or (B, T)

    # 1. the rejection rules, on log-ratios clamped token by token to [-c, c]
    c = comp.log_ratio_clamp
    lc = l if c is None else l.clamp(-c, c)  # (B, T)
    Sc = lc.sum(-1)  # (B,)
    tol_c = eps * (logp_sum.abs() + (logp_sum - Sc).abs()) / T.clamp(min=1)  # (B,) as tol_geo, clamped
    gate = valid.clone()  # (B,) the rollouts every rollout-level rule accepts
    keep = m.clone()  # (B, T) the loss tokens every token-level rule keeps (before the gate)
    has_gate = False
    token_masked = torch.zeros_like(m)  # (B, T) tokens outside a token rule's band, or tripping a max / min rule
    has_token_rule = has_tripped = False
    left = torch.zeros_like(m)  # (B, T) tokens dropped by a rule that also takes them out of the token count N
    for rule in comp.criteria:
        x = statistic(rule.statistic, lc, logp, logq)  # (B, T)
        lo, hi = edges(rule)
        cond = None if rule.advantage is None else _SIGN[rule.advantage](adv, 0)  # (B,) or (B, T)
        outside = m & ~within(x, rule.statistic, lo, hi, rule.strict, rule.edge_space)  # (B, T) outside the band
        if rule.agg == "token":
            drop = outside
        else:
            raw_aggregate = (comp.clamp_order == "aggregate" and rule.statistic == "ratio"
                             and rule.agg in ("sum", "mean"))
            x_j = aggregate(l if raw_aggregate else x, m, T, rule.agg)  # (B,)
            if raw_aggregate and c is not None:  # SkyRL, slime: the rollout's raw sum or mean, then clamped
                x_j = x_j.clamp(-c, c)
            if rule.strict or rule.edge_space == "ratio":  # (B,) open edges, or exp(x) against C: no tolerance
                fails = ~within(x_j, rule.statistic, lo, hi, rule.strict, rule.edge_space)
            elif rule.statistic == "ratio" and rule.agg in ("sum", "mean"):  # a product or geometric band, tolerant
                tol = (tol_geo if raw_aggregate else tol_c) * (1 if rule.agg == "mean" else T)
                fails = (x_j < log_of(lo) - tol) | (x_j > log_of(hi) + tol)
            else:
                fails = ~within(x_j, rule.statistic, lo, hi)  # (B,)
            drop = m & fails[:, None]  # (B, T) every token of a failing rollout
            if rule.agg in ("max", "min"):
                token_masked |= outside
                has_tripped = True
        if cond is not None:  # the rule drops only where A has the sign
            drop = drop & (cond if cond.dim() == 2 else cond[:, None])
        if rule.leaves_normaliser:
            left |= drop
        if rule.agg == "token" or (cond is not None and cond.dim() == 2):  # a per-token verdict
            keep &= ~drop
            token_masked |= outside
            has_token_rule = has_tripped = True
        else:  # a per-rollout verdict
            gate &= ~drop.any(-1)
            has_gate = True

    if comp.batch_rule is not None:  # M2PO: the batch's largest l^2 dropped until the rest's mean is below
        dropped = m2po_dropped(l, m, comp.batch_rule.threshold)  # (B, T)
        keep &= ~dropped
        left |= dropped
        token_masked |= dropped
        has_token_rule = has_tripped = True

    # 2. the IS weight at its level; its exponent is the raw log-ratios aggregated, then clamped (weight clamp
    # order "aggregate"), or each token's clamped log-ratio aggregated ("token": ms-swift, open-instruct)
    w = comp.weight
    each = comp.weight_clamp_order == "token" and c is not None
    clipped_rows = None  # (B,) rollouts whose weight was truncated (None: no truncation)
    clipped_tokens = None  # (B, T) for a token or prefix weight
    if w.level == "none":
        weight = torch.ones_like(l)  # (B, T)
    else:
        lw = lc if each else l  # (B, T) the log-ratios the weight aggregates
        x = {"token": lw, "prefix": lw.cumsum(-1), "sequence": lw.sum(-1),
             "geometric": lw.sum(-1) / T.clamp(min=1)}[w.level]  # (B, T) or (B,)
        if w.token_clip is not None:  # the product of token ratios each truncated (TRL's token TIS inside VESPO)
            x = torch.where(m, lc.clamp(max=log_of(w.token_clip)), zero).sum(-1)  # (B,)
        x = x if c is None or each else x.clamp(-c, c)
        raised = x.clamp(min=log_of(w.clip_low)) if w.clip_low > 0 else x
        weight = torch.exp(raised.clamp(max=min(log_of(w.upper), MAX_LOG_WEIGHT)))  # min(max(e^x, lo), hi, e^40)
        if w.gamma is not None:  # VESPO: phi(W) = exp(lambda + k log W - lambda W), (k, lambda) by A's sign
            k_pos, lam_pos, k_neg, lam_neg = w.gamma
            up = adv >= 0  # (B,) or (B, T)
            x_a = x if up.dim() == 1 else x[:, None]
            knob = lambda v: torch.tensor(v, dtype=dtype, device=up.device)  # exact in float64 (a python float
            k = torch.where(up, knob(k_pos), knob(k_neg))  # given to where would be rounded to float32)
            lam = torch.where(up, knob(lam_pos), knob(lam_neg))
            weight = torch.exp((lam + k * x_a - lam * torch.exp(x_a)).clamp(max=MAX_LOG_WEIGHT))
        if w.truncated:
            beyond = x > log_of(w.upper)
            if w.clip_low > 0:
                beyond |= x < log_of(w.clip_low)
            if w.per_rollout:
                clipped_rows = valid & beyond
            else:
                clipped_tokens = m & beyond
        band_ok = None
        if w.band is not None:  # outside the band the token (or the rollout) is dropped
            lo, hi = w.band
            if w.edge_space == "ratio":  # exp(x) against the edges, as the framework writes it: no tolerance
                band_ok = (valid if w.per_rollout else m) & within(x, "ratio", lo, hi, False, "ratio")
            elif w.per_rollout:
                tol = (tol_c if each else tol_geo) * (1 if w.level == "geometric" else T)
                band_ok = valid & (x >= log_of(lo) - tol) & (x <= log_of(hi) + tol)  # (B,)
            else:
                band_ok = m & (x >= log_of(lo)) & (x <= log_of(hi))  # (B, T)
            if not w.per_rollout:
                keep &= band_ok
                token_masked |= m & ~band_ok
                has_token_rule = has_tripped = True
        if w.self_normalize:  # divided by its mean over the batch, before the rules reject anything
            if w.per_rollout:
                applied = torch.where(valid if band_ok is None else band_ok, weight, zero)
                count = torch.tensor(len(valid), dtype=dtype) if w.normalize_all else valid.sum()  # slime: every one
                mean = applied.sum() / count.clamp(min=1)
            else:
                applied = torch.where(m if band_ok is None else band_ok, weight, zero)
                mean = applied.sum() / N.clamp(min=1)
            weight = weight / torch.where(mean > 1e-8, mean, 1.0)
        if w.per_rollout:
            if band_ok is not None:
                gate &= band_ok
                has_gate = True
            weight = (weight[:, None] if weight.dim() == 1 else weight).expand_as(l)  # (B, T)
    if clipped_rows is not None and has_gate:
        clipped_rows &= gate

    # 3. what is kept, and the weights
    gate &= valid
    kept = keep & gate[:, None]  # (B, T)
    weights = torch.where(kept, weight, zero)  # (B, T) the gradient coefficient before adv_tau * A
    if left.any():  # tokens out of the count N (NeMo-RL's sample_mask, M2PO): the rest weigh N / N_after more
        weights = weights * (N / (N - (left & m).sum()).clamp(min=1))
    if clipped_tokens is not None:
        clipped_tokens &= gate[:, None]
        clipped_rows = clipped_tokens.any(-1)

    # 4. the loss: -sum s_t * weights_t * adv_tau * A_t * log pi_t (+ the penalty)
    n_kept = kept.sum().to(dtype)
    n_valid = valid.sum().clamp(min=1).to(dtype)
    s = {"token-mean": 1 / N.clamp(min=1), "kept-token-mean": 1 / n_kept.clamp(min=1),
         "seq-mean-token-mean": (1 / (T.clamp(min=1) * n_valid))[:, None],
         "seq-mean-token-sum": 1 / n_valid}[agg]  # () or (B, 1)
    A = adv if adv.dim() == 2 else adv[:, None].expand_as(l)  # (B, T)
    tl = torch.where(m, batch.trainer_logprobs.to(dtype), zero)  # (B, T) differentiable
    loss = -(s * weights * comp.adv_tau * torch.where(m, A, zero) * tl).sum()
    metrics = {}
    if comp.penalty is not None:
        l_grad = torch.where(m, tl - logq, zero)  # (B, T) l, differentiable in log pi
        f = l_grad.square() if comp.penalty.statistic == "squared_log_ratio" else torch.expm1(l_grad) - l_grad
        penalty = comp.penalty.coef * (s * torch.where(m, f, zero)).sum()
        loss = loss + penalty
        metrics["penalty"] = penalty.detach()

    # 5. metrics and per-rollout values
    k3 = torch.where(m, torch.expm1(l) - l, zero)  # (B, T)
    n_dropped = N - n_kept
    mean_over = lambda x, select: torch.where(select, x, zero).sum() / select.sum().clamp(min=1)
    kept_len = kept.sum(-1).to(dtype)  # (B,)
    applied = weights.sum(-1) / T.clamp(min=1)  # (B,) the mean applied weight over a rollout's loss tokens
    metrics = {
        "mismatch_kl": k3.sum() / N.clamp(min=1),
        "masked_mismatch_kl": torch.where(kept, zero, k3).sum() / n_dropped.clamp(min=1),
        "unmasked_mismatch_kl": torch.where(kept, k3, zero).sum() / n_kept.clamp(min=1),
        "is_masked": n_dropped / N.clamp(min=1),
        "seq_log_ratio": mean_over(S, valid),
        "geo_log_ratio": mean_over(G, valid),
        "is_clipped": mean_over(clipped_rows.to(dtype), valid) if clipped_rows is not None else zero,
        "is_token_masked": (N - keep.sum()) / N.clamp(min=1) if has_token_rule else zero,
        "is_traj_masked": torch.where(gate, zero, T).sum() / N.clamp(min=1) if has_gate else zero,
        **metrics,
        "seq_weight": mean_over(applied, valid & (kept_len > 0)),
    }
    masks = {"kept": kept}
    if has_tripped:
        masks["token_masked"] = token_masked
    if has_gate:
        masks["traj_masked"] = m & ~gate[:, None]
    if clipped_tokens is not None:
        masks["clipped"] = clipped_tokens
    elif clipped_rows is not None:
        masks["clipped"] = m & clipped_rows[:, None]
    rollouts = {
        "length": T,
        "seq_log_ratio": S,
        "geo_log_ratio": G,
        "weight": applied,
        "accepted": gate & valid if has_gate else kept_len > 0,
        "clipped": clipped_rows if clipped_rows is not None else torch.zeros_like(valid),
        "kept_fraction": kept_len / T.clamp(min=1),
    }
    return EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=metrics, rollouts=rollouts)


def statistic(name: str, lc: torch.Tensor, logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """(B, T) a criterion's statistic per token, from the clamped log-ratios lc: the log-ratio itself for "ratio"
    (its bands compare in log space), k1 = -l, k2 = l^2 / 2, k3 = rho - 1 - l, e^|l|, |rho - 1|; from the two
    log-probs as the frameworks take them: prob_diff = exp(log pi) - exp(log mu) (prime-rl's arithmetic, which
    decides a token on a band edge), and the binary KLs of the split "this token or another"."""
    if name == "ratio":
        return lc
    if name == "k1":
        return -lc
    if name == "k2":
        return lc.square() / 2
    if name == "k3":
        return torch.expm1(lc) - lc
    if name == "exp_abs_log_ratio":
        return torch.exp(lc.abs())
    if name == "abs_ratio_minus_one":
        return torch.expm1(lc).abs()
    if name == "binary_kl":  # AReaL's KPop: both directions, probabilities clamped to [1e-8, 1 - 1e-8]
        p, q = torch.exp(logp).clamp(1e-8, 1 - 1e-8), torch.exp(logq).clamp(1e-8, 1 - 1e-8)
        return torch.maximum(binary_kl(p, q), binary_kl(q, p))
    if name == "binary_kl_mu":  # SkyRL's DPPO: KL_B(mu || pi), 1e-8 inside the complement's log, signed by pi - mu
        mu, pi = torch.exp(logq), torch.exp(logp)
        kl = mu * (logq - logp) + (1 - mu) * torch.log((1 - mu + 1e-8) / (1 - pi + 1e-8))
        return kl * torch.sign(pi - mu)
    return torch.exp(logp) - torch.exp(logq)  # prob_diff


def binary_kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p) || Bernoulli(q)) = p log(p / q) + (1 - p) log((1 - p) / (1 - q))."""
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def m2po_dropped(l: torch.Tensor, m: torch.Tensor, threshold: float) -> torch.Tensor:
    """(B, T) bool: the loss tokens M2PO drops. Their l^2, largest first (ties in batch order), are dropped until
    the mean of the rest is below the threshold; if no count gets there, all but the smallest go."""
    m2 = l[m].square()  # (n,) the loss tokens, row by row
    n = m2.numel()
    if n == 0 or float(m2.double().mean()) < 0.9 * threshold:  # the mean is already below: nothing goes (the
        return torch.zeros_like(m)  # margin covers the rounding of the sorted sums below; no sort needed)
    order = torch.sort(m2, descending=True, stable=True).indices  # (n,)
    suffix = m2[order].flip(0).cumsum(0).flip(0) / torch.arange(n, 0, -1, dtype=m2.dtype, device=m2.device)
    below = (suffix < threshold).nonzero()
    k = int(below[0]) if len(below) else n - 1
    flat = torch.zeros(n, dtype=torch.bool, device=m.device)
    flat[order[:k]] = True
    out = torch.zeros_like(m)
    out[m] = flat
    return out


def edges(c: Criterion) -> tuple[float, float]:
    """The band's edges, open sides as 0 (a ratio) or -inf, and inf."""
    low = c.low if c.low is not None else (0.0 if c.statistic == "ratio" else -math.inf)
    return low, c.high if c.high is not None else math.inf


def within(x: torch.Tensor, name: str, lo: float, hi: float, strict: bool = False,
           space: str = "log") -> torch.Tensor:
    """lo <= statistic <= hi (strict: lo < statistic < hi); a ratio's x is its log, compared with log lo, log hi
    (space "log"), or exp(x) in x's dtype compared with lo, hi rounded to that dtype (space "ratio": the
    frameworks' `exp(l) <= C`)."""
    if name == "ratio" and space == "ratio":
        x = torch.exp(x)
    elif name == "ratio":
        lo, hi = log_of(lo), log_of(hi)
    return ((x > lo) & (x < hi)) if strict else ((x >= lo) & (x <= hi))


def aggregate(x: torch.Tensor, m: torch.Tensor, T: torch.Tensor, agg: str) -> torch.Tensor:
    """(B,) the statistic's sum, mean, max or min over each rollout's loss tokens."""
    if agg == "sum":
        return torch.where(m, x, 0.0).sum(-1)
    if agg == "mean":
        return torch.where(m, x, 0.0).sum(-1) / T.clamp(min=1)
    fill = -math.inf if agg == "max" else math.inf
    filled = torch.where(m, x, torch.full_like(x, fill))
    return filled.amax(-1) if agg == "max" else filled.amin(-1)

