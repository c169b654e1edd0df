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
from dataclasses import dataclass

import torch

from ..core.compose import Centering, Composition, Criterion
from ..core.ratios import MAX_LOG_WEIGHT, compute_dtype
from ..core.types import Batch, EstimatorOutput

AGGREGATIONS = ("token-mean", "kept-token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
_SIGN = {"positive": torch.gt, "negative": torch.lt, "non-negative": torch.ge, "non-positive": torch.le}


def log_of(x: float) -> float:
    """log of a knob value: log 0 = -inf, log inf = inf."""
    return -math.inf if x == 0 else math.log(x)


def evaluate(comp: Composition, batch: Batch, agg: str = "token-mean") -> EstimatorOutput:
    """The composition on the batch: loss (differentiable in trainer_logprobs), weights, masks, metrics and
    per-rollout values. Read as five steps: the rules' verdicts, the IS weight, what is kept, the loss, the
    metrics."""
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    p = Pieces.of(batch)
    v = rules(comp, p)  # 1. which rollouts and tokens the rejection rules keep
    w = weight(comp, p, v)  # 2. the IS weight at its level (its band joins the verdicts)
    kept, weights = kept_weights(p, v, w)  # 3. what is kept, and the gradient coefficients
    loss, penalty = surrogate_loss(comp, batch, p, kept, weights, agg)  # 4. the loss
    out = outputs(p, v, w, kept, weights, loss, penalty)  # 5. metrics, masks and per-rollout values
    if comp.centering is not None:  # 6. score centering's additive term over the sampler's head
        centered(comp, batch, p, kept, agg, out)
    return out


@dataclass
class Pieces:
    """What every step reads of the batch, in the compute dtype: the log-probs and log-ratios on the loss tokens,
    the rollouts' sums, and how far a geometric ratio may sit from its exact value by rounding alone."""

    m: torch.Tensor  # (B, T) bool, loss tokens
    zero: torch.Tensor  # () 0 in the compute dtype
    logp: torch.Tensor  # (B, T) log pi on loss tokens (detached)
    logq: torch.Tensor  # (B, T) log mu on loss tokens
    l: torch.Tensor  # (B, T) l_t; a log-prob of -inf or nan on a loss token counts as l = 0
    T: torch.Tensor  # (B,) T_j
    valid: torch.Tensor  # (B,) T_j > 0
    N: torch.Tensor  # () loss tokens
    S: torch.Tensor  # (B,) S_j
    G: torch.Tensor  # (B,) S_j / T_j
    adv: torch.Tensor  # (B,) or (B, T) advantages
    # a ratio within the rounding of its log-probs of a band edge is on it: each l_t carries eps * |log p| of
    # rounding, so S_j / T_j is within eps * (|sum log pi| + |sum log mu|) / T_j of its exact value
    eps: float
    logp_sum: torch.Tensor  # (B,)
    tol_geo: torch.Tensor  # (B,)

    @classmethod
    def of(cls, batch: Batch) -> Pieces:
        dtype = compute_dtype(batch.trainer_logprobs)
        m = batch.loss_mask  # (B, T) bool
        zero = torch.zeros((), dtype=dtype, device=m.device)
        logp = torch.where(m, batch.trainer_logprobs.detach().to(dtype), zero)  # (B, T) log pi on loss tokens
        logq = torch.where(m, batch.inference_logprobs.to(dtype), zero)  # (B, T) log mu
        l = torch.where(m, logp - logq, zero)  # (B, T)
        l = torch.where(torch.isfinite(l), l, zero)  # a log-prob of -inf or nan on a loss token counts as l = 0
        T = m.sum(-1).to(dtype)  # (B,) T_j
        S = l.sum(-1)  # (B,)
        eps = torch.finfo(dtype).eps
        logp_sum = logp.sum(-1)  # (B,)
        tol_geo = eps * (logp_sum.abs() + (logp_sum - S).abs()) / T.clamp(min=1)  # (B,)
        return cls(m, zero, logp, logq, l, T, T > 0, T.sum(), S, S / T.clamp(min=1), batch.advantages.to(dtype),
                   eps, logp_sum, tol_geo)


@dataclass
class Verdicts:
    """The rules' verdicts so far: rollouts a rollout-level rule accepts, loss tokens a token-level rule keeps (before
    the gate), tokens a token rule marks, and those that also leave the token count N."""

    lc: torch.Tensor  # (B, T) log-ratios clamped token by token to [-c, c]
    tol_c: torch.Tensor  # (B,) as tol_geo, on the clamped sums
    gate: torch.Tensor  # (B,) the rollouts every rollout-level rule accepts
    keep: torch.Tensor  # (B, T) the loss tokens every token-level rule keeps (before the gate)
    token_masked: torch.Tensor  # (B, T) tokens outside a token rule's band, or tripping a max / min rule
    left: torch.Tensor  # (B, T) tokens dropped by a rule that also takes them out of the token count N
    has_gate: bool = False
    has_token_rule: bool = False
    has_tripped: bool = False


def rules(comp: Composition, p: Pieces) -> Verdicts:
    """Step 1: the rejection rules, on log-ratios clamped token by token to [-c, c], and M2PO's batch rule."""
    m, c = p.m, comp.log_ratio_clamp
    lc = p.l if c is None else p.l.clamp(-c, c)  # (B, T)
    Sc = lc.sum(-1)  # (B,)
    tol_c = p.eps * (p.logp_sum.abs() + (p.logp_sum - Sc).abs()) / p.T.clamp(min=1)  # (B,) as tol_geo, clamped
    v = Verdicts(lc, tol_c, p.valid.clone(), m.clone(), torch.zeros_like(m), torch.zeros_like(m))
    for rule in comp.criteria:
        x = statistic(rule.statistic, lc, p.logp, p.logq)  # (B, T)
        lo, hi = edges(rule)
        cond = None if rule.advantage is None else _SIGN[rule.advantage](p.adv, 0)  # (B,) or (B, T)
        outside = m & ~within(x, rule.statistic, lo, hi, rule.strict, rule.edge_space)  # (B, T) outside the band
        if rule.agg == "token":
            drop = outside
        else:
            raw_aggregate = (comp.clamp_order == "aggregate" and rule.statistic == "ratio"
                             and rule.agg in ("sum", "mean"))
            x_j = aggregate(p.l if raw_aggregate else x, m, p.T, rule.agg)  # (B,)
            if raw_aggregate and c is not None:  # SkyRL, slime: the rollout's raw sum or mean, then clamped
                x_j = x_j.clamp(-c, c)
            if rule.strict or rule.edge_space == "ratio":  # (B,) open edges, or exp(x) against C: no tolerance
                fails = ~within(x_j, rule.statistic, lo, hi, rule.strict, rule.edge_space)
            elif rule.statistic == "ratio" and rule.agg in ("sum", "mean"):  # a product or geometric band, tolerant
                tol = (p.tol_geo if raw_aggregate else tol_c) * (1 if rule.agg == "mean" else p.T)
                fails = (x_j < log_of(lo) - tol) | (x_j > log_of(hi) + tol)
            else:
                fails = ~within(x_j, rule.statistic, lo, hi)  # (B,)
            drop = m & fails[:, None]  # (B, T) every token of a failing rollout
            if rule.agg in ("max", "min"):
                v.token_masked |= outside
                v.has_tripped = True
        if cond is not None:  # the rule drops only where A has the sign
            drop = drop & (cond if cond.dim() == 2 else cond[:, None])
        if rule.leaves_normaliser:
            v.left |= drop
        if rule.agg == "token" or (cond is not None and cond.dim() == 2):  # a per-token verdict
            v.keep &= ~drop
            v.token_masked |= outside
            v.has_token_rule = v.has_tripped = True
        else:  # a per-rollout verdict
            v.gate &= ~drop.any(-1)
            v.has_gate = True
    if comp.batch_rule is not None:  # M2PO: the batch's largest l^2 dropped until the rest's mean is below
        dropped = m2po_dropped(p.l, m, comp.batch_rule.threshold)  # (B, T)
        v.keep &= ~dropped
        v.left |= dropped
        v.token_masked |= dropped
        v.has_token_rule = v.has_tripped = True
    return v


@dataclass
class Weighting:
    """Step 2's result: the weight per token, and what its truncation clipped."""

    weight: torch.Tensor  # (B, T)
    clipped_rows: torch.Tensor | None = None  # (B,) rollouts whose weight was truncated (None: no truncation)
    clipped_tokens: torch.Tensor | None = None  # (B, T) for a token or prefix weight


def weight(comp: Composition, p: Pieces, v: Verdicts) -> Weighting:
    """Step 2: the IS weight at its level; its exponent is the raw log-ratios aggregated, then clamped (weight clamp
    order "aggregate"), or each token's clamped log-ratio aggregated ("token": ms-swift, open-instruct). A weight's
    band drops tokens or rollouts (joining the verdicts); self-normalised, it is divided by its batch mean."""
    w, c, m = comp.weight, comp.log_ratio_clamp, p.m
    if w.level == "none":
        return Weighting(torch.ones_like(p.l))  # (B, T)
    each = comp.weight_clamp_order == "token" and c is not None
    lw = v.lc if each else p.l  # (B, T) the log-ratios the weight aggregates
    x = {"token": lw, "prefix": lw.cumsum(-1), "sequence": lw.sum(-1),
         "geometric": lw.sum(-1) / p.T.clamp(min=1)}[w.level]  # (B, T) or (B,)
    if w.token_clip is not None:  # the product of token ratios each truncated (TRL's token TIS inside VESPO)
        x = torch.where(m, v.lc.clamp(max=log_of(w.token_clip)), p.zero).sum(-1)  # (B,)
    x = x if c is None or each else x.clamp(-c, c)
    raised = x.clamp(min=log_of(w.clip_low)) if w.clip_low > 0 else x
    out = Weighting(torch.exp(raised.clamp(max=min(log_of(w.upper), MAX_LOG_WEIGHT))))  # min(max(e^x, lo), hi, e^40)
    if w.gamma is not None:  # VESPO: phi(W) = exp(lambda + k log W - lambda W), (k, lambda) by A's sign
        out.weight = vespo(w.gamma, x, p.adv)
    if w.truncated:
        beyond = x > log_of(w.upper)
        if w.clip_low > 0:
            beyond |= x < log_of(w.clip_low)
        if w.per_rollout:
            out.clipped_rows = p.valid & beyond
        else:
            out.clipped_tokens = m & beyond
    band_ok = None if w.band is None else weight_band(w, x, p, v, each)  # outside it, the token or rollout goes
    if w.self_normalize:  # divided by its mean over the batch, before the rules reject anything
        if w.per_rollout:
            applied = torch.where(p.valid if band_ok is None else band_ok, out.weight, p.zero)
            count = torch.tensor(len(p.valid), dtype=p.zero.dtype) if w.normalize_all else p.valid.sum()  # slime
            mean = applied.sum() / count.clamp(min=1)
        else:
            applied = torch.where(m if band_ok is None else band_ok, out.weight, p.zero)
            mean = applied.sum() / p.N.clamp(min=1)
        out.weight = out.weight / torch.where(mean > 1e-8, mean, 1.0)
    if w.per_rollout:
        if band_ok is not None:
            v.gate &= band_ok
            v.has_gate = True
        out.weight = (out.weight[:, None] if out.weight.dim() == 1 else out.weight).expand_as(p.l)  # (B, T)
    if out.clipped_rows is not None and v.has_gate:
        out.clipped_rows &= v.gate
    return out


def vespo(gamma: tuple[float, float, float, float], x: torch.Tensor, adv: torch.Tensor) -> torch.Tensor:
    """VESPO's weight phi(W) = exp(lambda + k log W - lambda W), x = log W, (k, lambda) chosen by A's sign."""
    k_pos, lam_pos, k_neg, lam_neg = gamma
    up = adv >= 0  # (B,) or (B, T)
    x_a = x if up.dim() == 1 else x[:, None]
    knob = lambda value: torch.tensor(value, dtype=x.dtype, device=up.device)  # exact in float64 (a python float
    k = torch.where(up, knob(k_pos), knob(k_neg))  # given to where would be rounded to float32)
    lam = torch.where(up, knob(lam_pos), knob(lam_neg))
    return torch.exp((lam + k * x_a - lam * torch.exp(x_a)).clamp(max=MAX_LOG_WEIGHT))


def weight_band(w, x: torch.Tensor, p: Pieces, v: Verdicts, each: bool) -> torch.Tensor:
    """(B,) or (B, T) where the weight's exponent x is inside its band; a token band joins the token verdicts."""
    lo, hi = w.band
    if w.edge_space == "ratio":  # exp(x) against the edges, as the framework writes it: no tolerance
        band_ok = (p.valid if w.per_rollout else p.m) & within(x, "ratio", lo, hi, False, "ratio")
    elif w.per_rollout:
        tol = (v.tol_c if each else p.tol_geo) * (1 if w.level == "geometric" else p.T)
        band_ok = p.valid & (x >= log_of(lo) - tol) & (x <= log_of(hi) + tol)  # (B,)
    else:
        band_ok = p.m & (x >= log_of(lo)) & (x <= log_of(hi))  # (B, T)
    if not w.per_rollout:
        v.keep &= band_ok
        v.token_masked |= p.m & ~band_ok
        v.has_token_rule = v.has_tripped = True
    return band_ok


def kept_weights(p: Pieces, v: Verdicts, w: Weighting) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: (B, T) the kept tokens and their weights, the gradient coefficient before adv_tau * A; tokens out of
    the count N (NeMo-RL's sample_mask, M2PO) make the rest weigh N / N_after more."""
    v.gate &= p.valid
    kept = v.keep & v.gate[:, None]  # (B, T)
    weights = torch.where(kept, w.weight, p.zero)  # (B, T)
    if v.left.any():
        weights = weights * (p.N / (p.N - (v.left & p.m).sum()).clamp(min=1))
    if w.clipped_tokens is not None:
        w.clipped_tokens &= v.gate[:, None]
        w.clipped_rows = w.clipped_tokens.any(-1)
    return kept, weights


def normaliser(p: Pieces, kept: torch.Tensor, agg: str) -> torch.Tensor:
    """() or (B, 1): s_t, the aggregation's normaliser of each loss token's term."""
    n_valid = p.valid.sum().clamp(min=1).to(p.zero.dtype)
    return {"token-mean": 1 / p.N.clamp(min=1), "kept-token-mean": 1 / kept.sum().to(p.zero.dtype).clamp(min=1),
            "seq-mean-token-mean": (1 / (p.T.clamp(min=1) * n_valid))[:, None],
            "seq-mean-token-sum": 1 / n_valid}[agg]


def surrogate_loss(comp: Composition, batch: Batch, p: Pieces, kept: torch.Tensor, weights: torch.Tensor,
                   agg: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step 4: the loss -sum s_t * weights_t * adv_tau * A_t * log pi_t (+ the penalty, also returned alone)."""
    m, zero = p.m, p.zero
    s = normaliser(p, kept, agg)  # () or (B, 1)
    A = p.adv if p.adv.dim() == 2 else p.adv[:, None].expand_as(p.l)  # (B, T)
    tl = torch.where(m, batch.trainer_logprobs.to(zero.dtype), zero)  # (B, T) differentiable
    loss = -(s * weights * comp.adv_tau * torch.where(m, A, zero) * tl).sum()
    if comp.penalty is None:
        return loss, None
    l_grad = torch.where(m, tl - p.logq, zero)  # (B, T) l, differentiable in log pi
    f = l_grad.square() if comp.penalty.statistic == "squared_log_ratio" else torch.expm1(l_grad) - l_grad
    penalty = comp.penalty.coef * (s * torch.where(m, f, zero)).sum()
    return loss + penalty, penalty.detach()


def outputs(p: Pieces, v: Verdicts, w: Weighting, kept: torch.Tensor, weights: torch.Tensor, loss: torch.Tensor,
            penalty: torch.Tensor | None) -> EstimatorOutput:
    """Step 5: the metrics (their definitions are this module's docstring), masks and per-rollout values."""
    m, zero, N, T, valid = p.m, p.zero, p.N, p.T, p.valid
    k3 = torch.where(m, torch.expm1(p.l) - p.l, zero)  # (B, T)
    n_kept = kept.sum().to(zero.dtype)
    n_dropped = N - n_kept
    mean_over = lambda x, select: torch.where(select, x, zero).sum() / select.sum().clamp(min=1)
    kept_len = kept.sum(-1).to(zero.dtype)  # (B,)
    applied = weights.sum(-1) / T.clamp(min=1)  # (B,) the mean applied weight over a rollout's loss tokens
    clipped_rows = w.clipped_rows
    metrics = {
        "mismatch_kl": k3.sum() / N.clamp(min=1),
        "masked_mismatch_kl": torch.where(kept, zero, k3).sum() / n_dropped.clamp(min=1),
        "unmasked_mismatch_kl": torch.where(kept, k3, zero).sum() / n_kept.clamp(min=1),
        "is_masked": n_dropped / N.clamp(min=1),
        "seq_log_ratio": mean_over(p.S, valid),
        "geo_log_ratio": mean_over(p.G, valid),
        "is_clipped": mean_over(clipped_rows.to(zero.dtype), valid) if clipped_rows is not None else zero,
        "is_token_masked": (N - v.keep.sum()) / N.clamp(min=1) if v.has_token_rule else zero,
        "is_traj_masked": torch.where(v.gate, zero, T).sum() / N.clamp(min=1) if v.has_gate else zero,
        **({} if penalty is None else {"penalty": penalty}),
        "seq_weight": mean_over(applied, valid & (kept_len > 0)),
    }
    masks = {"kept": kept}
    if v.has_tripped:
        masks["token_masked"] = v.token_masked
    if v.has_gate:
        masks["traj_masked"] = m & ~v.gate[:, None]
    if w.clipped_tokens is not None:
        masks["clipped"] = w.clipped_tokens
    elif clipped_rows is not None:
        masks["clipped"] = m & clipped_rows[:, None]
    rollouts = {
        "length": T,
        "seq_log_ratio": p.S,
        "geo_log_ratio": p.G,
        "weight": applied,
        "accepted": v.gate & valid if v.has_gate else kept_len > 0,
        "clipped": clipped_rows if clipped_rows is not None else torch.zeros_like(valid),
        "kept_fraction": kept_len / T.clamp(min=1),
    }
    return EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=metrics, rollouts=rollouts)


def centered(comp: Composition, batch: Batch, p: Pieces, kept: torch.Tensor, agg: str, out: EstimatorOutput) -> None:
    """Step 6: score centering (seqis/core/compose.py, Centering) added to the loss on every loss token (as verl adds
    it: a token the IS weight zeroes keeps its centering term), with its metrics and the head's coefficients."""
    add_centering(comp.centering, batch, p.m, normaliser(p, kept, agg), p.adv * comp.adv_tau, [out])


def add_centering(sc: Centering, batch: Batch, m: torch.Tensor, s: torch.Tensor, adv: torch.Tensor,
                  outs: list[EstimatorOutput]) -> None:
    """Adds s_t * adv_t * C_t (s: the aggregation's normaliser, () or (B, 1); adv: A times adv_tau, (B,) or (B, T))
    to each output's loss, a graph of its own per output (each may be differentiated alone), with verl's metrics
    (sc_correction: the mean of C_t without the advantage; the mean head masses) and head_weights = -c. The plain
    and the fast evaluator both add the term here: it is one definition."""
    zero = s.new_zeros(())
    slots, c, P, Q = head_coefficients(sc, batch, m, zero)
    A = torch.where(m, adv if adv.dim() == 2 else adv[:, None].expand(m.shape), zero)  # (B, T)
    mean = lambda x: torch.where(m, x, zero).sum() / m.sum().clamp(min=1)
    for out in outs:
        C = centered_score(sc, batch, slots, c, zero)  # (B, T) C_t, differentiable in the head's log p
        out.loss = out.loss + (s * A * C).sum()
        out.metrics.update(sc_correction=mean(C.detach()), sc_sampler_head_mass=mean(Q), sc_train_head_mass=mean(P))
        out.head_weights = -c  # d loss / d log p_v = s * adv_tau * A_t * c_v = -head_weights * adv_tau * A_t * s


def head_coefficients(sc: Centering, batch: Batch, m: torch.Tensor, zero: torch.Tensor):
    """(slots, c, P, Q): the head's filled slots on loss tokens (B, T, K) (the support's, exact), the detached
    coefficients c_v (B, T, K), and the trainer's and the sampler's head masses (B, T). With no floor on either side
    and both tail masses within rounding of 0 (the whole vocabulary in the head) there is no tail: alpha = 1, so c_v
    is the exact-support form q_v f(p_v / q_v) - p_v (rho_tail would be 0 / 0)."""
    if not batch.has_head:
        raise ValueError("score centering needs the sampler's top-k head: Batch(topk_ids=..., "
                         "topk_inference_logprobs=..., topk_trainer_logprobs=...)")
    ids, logq_h, logp_h, support = batch.head()
    slots = (ids >= 0) & m[..., None]  # (B, T, K) the head's filled slots on loss tokens
    if sc.exact:
        if support is None:
            raise ValueError("exact score centering needs the replayed support: Batch(topk_support=...)")
        slots = slots & support
    with torch.no_grad():
        logp_h = torch.where(slots, logp_h.to(zero.dtype), zero)  # (B, T, K) log p_v
        logq_h = torch.where(slots, logq_h.to(zero.dtype), zero)  # (B, T, K) log q_v
        pv = torch.where(slots, logp_h.exp(), zero)  # (B, T, K) p_v
        qv = torch.where(slots, logq_h.exp(), zero)  # (B, T, K) q_v
        P, Q = pv.sum(-1), qv.sum(-1)  # (B, T) the head's masses
        if sc.exact:  # the trainer renormalised on the support; no tail
            pv = pv / P.clamp(min=1e-30)[..., None]
            ratio = torch.where(slots, pv / qv.clamp(min=1e-30), zero)
            c = qv * sc.head_rule(ratio, pv, qv) - pv  # (B, T, K)
        else:
            ratio = torch.where(slots, (logp_h - logq_h).exp(), zero)  # (B, T, K) p_v / q_v
            c = qv * sc.head_rule(ratio, pv, qv) - tail_alpha(sc, 1 - Q, 1 - P, ids.shape[-1])[..., None] * pv
        c = torch.where(slots, c, zero)
    return slots, c, P, Q


def tail_alpha(sc: Centering, tail_q: torch.Tensor, tail_p: torch.Tensor, K: int) -> torch.Tensor:
    """(B, T) alpha = rho_tail f(1 / rho_tail), rho_tail = max(1 - Q, sampler_floor) / max(1 - P, trainer_floor), a
    mass never below 0 (1 - Q under 0 is rounding). A sampler's tail of 0 over a floored trainer's (rho = 0): the
    limit, lim f(x) / x as x grows (1 for f = x, untruncated IS; 0 for a bounded f), not 0 * inf. No floor either
    side and both tails within rounding of 0 (the whole vocabulary in the head): no tail, alpha = 1."""
    eps = K * torch.finfo(tail_q.dtype).eps  # a head of K probabilities sums to 1 within about K ulps
    tq, tp = tail_q.clamp(min=sc.sampler_floor or 0.0), tail_p.clamp(min=sc.trainer_floor or 0.0)
    none = ((tq <= eps) & (tp <= eps) if not sc.sampler_floor and not sc.trainer_floor
            else torch.zeros_like(tail_q, dtype=torch.bool))
    rho = torch.where(none, 1.0, tq) / torch.where(none, 1.0, tp)  # (B, T)
    top = torch.finfo(rho.dtype).max
    edge = sc.f(rho.new_full((), top)) / top  # lim rho f(1 / rho) as rho -> 0
    inv = 1 / rho
    return torch.where(none, 1.0, torch.where(torch.isfinite(inv), rho * sc.f(inv), edge))


def centered_score(sc: Centering, batch: Batch, slots: torch.Tensor, c: torch.Tensor, zero: torch.Tensor):
    """(B, T) C_t = sum over the head of c_v log p_v (log p'_v renormalised on the support, exact), differentiable in
    topk_trainer_logprobs."""
    logp_h = torch.where(slots, batch.topk_trainer_logprobs.to(zero.dtype), zero)  # (B, T, K)
    if sc.exact:
        logp_h = logp_h - torch.logsumexp(torch.where(slots, logp_h, -math.inf), -1, keepdim=True).nan_to_num(
            0.0, 0.0, 0.0)
    return (c * torch.where(slots, logp_h, zero)).sum(-1)


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
    if name == "logit_gradient":  # Aleph Alpha's Kolibri: the bound rho_t (1 - pi_t) on the token's logit gradient
        return torch.exp(lc) * -torch.expm1(logp)
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

