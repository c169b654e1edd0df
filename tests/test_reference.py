"""Every estimator, preset and composition against a plain reference written here from the formulas.

The reference shares no code with seqis: plain float64 python over each rollout's loss tokens (loops,
math.exp), written from the formula table of DESIGN.md ("Estimators", "Metric definitions") for the twelve
named estimators, and from the definitions in seqis/estimators/compose.py for compositions (every preset in
the registry, and hypothesis-drawn custom ones). Compared on hypothesis-drawn ragged batches (empty rollouts,
prompt tokens inside the loss span, NaN / -inf / finite padding, per-rollout and per-token advantages, some
exactly 0, log-ratios from 0 to catastrophic) under every aggregation: the weights, the kept mask, the
autograd gradient and the metrics.

It catches a wrong formula: with geo_is composed as Weight("sequence") (the weight exp(S_j) instead of
exp(S_j / T_j)) the geo_is cases here fail, while the rest of the suite (properties that compare a fast path
with another fast path) still passes.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from strategies import configs, examples, ulps_around

from seqis import AGGREGATIONS, ESTIMATORS, Batch, run
from seqis.core.compose import BatchRule, Composition, Criterion, Penalty, Weight
from seqis.core.ratios import Ratios
from seqis.evaluators import fast
from seqis.evaluators.plain import evaluate
from seqis.registry import entry, resolve

D = torch.float64
CAP = 40.0  # every weight is at most e^40 (DESIGN: min(w_j, e^40))

# ------------------------------------------------------------------------------------------------------
# batches


@st.composite
def batches(draw, B_max=6, T_max=10):
    B, T = draw(st.integers(1, B_max)), draw(st.integers(1, T_max))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    scale = draw(st.sampled_from([0.0, 1e-3, 0.05, 0.5, 3.0, 30.0]))
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    if draw(st.booleans()):
        mask[:, 0] = False  # a prompt token before the loss tokens
    inference = -torch.rand(B, T, generator=g, dtype=D) * 3
    trainer = inference + scale * torch.randn(B, T, generator=g, dtype=D)
    pad_t = torch.tensor(draw(st.sampled_from([-math.inf, math.nan, 0.0, 5.0])), dtype=D)
    pad_i = torch.tensor(draw(st.sampled_from([math.nan, -math.inf, 0.0])), dtype=D)
    shape = (B, T) if draw(st.booleans()) else (B,)
    adv = torch.randn(shape, generator=g, dtype=D)
    if draw(st.booleans()):
        adv = torch.where(torch.rand(shape, generator=g) < 0.25, 0.0, adv)  # some advantages exactly 0
    return Batch(torch.where(mask, trainer, pad_t).requires_grad_(), torch.where(mask, inference, pad_i), adv, mask)


class Rollout:
    """One rollout's loss tokens as python floats: positions, log pi, log mu, l, and A per token."""

    def __init__(self, batch: Batch, j: int):
        self.pos = [t for t, m in enumerate(batch.loss_mask[j].tolist()) if m]
        tl, il = batch.trainer_logprobs.detach()[j].tolist(), batch.inference_logprobs[j].tolist()
        self.logp = [tl[t] for t in self.pos]
        self.logq = [il[t] for t in self.pos]
        self.l = [p - q for p, q in zip(self.logp, self.logq)]
        a = batch.advantages[j]
        self.A = [a.item()] * len(self.pos) if a.dim() == 0 else [a.tolist()[t] for t in self.pos]
        self.T = len(self.pos)
        self.S = sum(self.l)
        self.G = self.S / self.T if self.T else 0.0


def w_of(x: float) -> float:
    """exp(x) with the e^40 cap every weight keeps."""
    return math.exp(min(x, CAP))


def in_band(x: float, lo: float, hi: float, space: str = "log") -> bool:
    """lo <= exp(x) <= hi, for a ratio given as its log x: x against log lo, log hi, or (space "ratio") exp(x)
    itself against lo, hi."""
    if space == "ratio":
        return lo <= math.exp(x) <= hi
    return (lo == 0 or x >= math.log(lo)) and (hi == math.inf or x <= math.log(hi))


def prefix_sums(xs):
    out, acc = [], 0.0
    for x in xs:
        acc += x
        out.append(acc)
    return out


# ------------------------------------------------------------------------------------------------------
# the formula table of DESIGN.md, per rollout: (weights, dropped by a token rule, rejected by a rollout rule,
# clipped)


def formula(name: str, r: Rollout, cfg):
    T, S, G, l = r.T, r.S, r.G, r.l
    ones, none = [1.0] * T, [False] * T
    if name == "pg":  # 1
        return ones, none, False, False
    if name == "seq_is":  # min(w_j, e^40)
        return [w_of(S)] * T, none, False, False
    if name == "seq_tis":  # min(w_j, C)
        return [min(w_of(S), cfg.seq_clip)] * T, none, False, S > math.log(cfg.seq_clip)
    if name == "seq_mis":  # 1[lo <= exp(S/T) <= hi] * min(w_j, e^40)
        return [w_of(S)] * T, none, not in_band(G, cfg.geo_mask_low, cfg.geo_mask_high), False
    if name == "geo_mask":  # 1[lo <= exp(S/T) <= hi] * (1, or min(rho_t, token_clip))
        out = not in_band(G, cfg.geo_mask_low, cfg.geo_mask_high)
        if cfg.token_clip is None:
            return ones, none, out, False
        C = cfg.token_clip
        return [min(w_of(x), C) for x in l], none, out, not out and any(x > math.log(C) for x in l)
    if name == "mis_po":  # 1[tlo <= rho_t <= thi] * 1[glo <= exp(S/T) <= ghi]
        token_out = [not in_band(x, cfg.token_mask_low, cfg.token_mask_high) for x in l]
        return ones, token_out, not in_band(G, cfg.geo_mask_low, cfg.geo_mask_high), False
    if name == "token_tis":  # min(rho_t, C)
        C = cfg.token_clip
        return [min(w_of(x), C) for x in l], none, False, any(x > math.log(C) for x in l)
    if name == "icepop":  # rho_t * 1[lo <= rho_t <= hi]
        token_out = [not in_band(x, cfg.token_mask_low, cfg.token_mask_high) for x in l]
        return [w_of(x) for x in l], token_out, False, False
    if name == "seq_mis_product":  # 1[w_j <= C] * w_j
        return [w_of(S)] * T, none, S > math.log(cfg.seq_clip), False
    if name == "geo_is":  # min(exp(S/T), C)
        C = cfg.geo_clip
        return [min(w_of(G), C)] * T, none, False, G > math.log(C)
    if name == "prefix_is":  # min(exp(sum of l_s for s <= t), C)
        C, prefix = cfg.prefix_clip, prefix_sums(l)
        return [min(w_of(p), C) for p in prefix], none, False, any(p > math.log(C) for p in prefix)
    if name == "max_mask":  # 1[every token has lo <= rho_t <= hi]
        return ones, none, not all(in_band(x, cfg.token_mask_low, cfg.token_mask_high) for x in l), False
    raise KeyError(f"no formula for {name}: add its row here")


# ------------------------------------------------------------------------------------------------------
# a composition (compose.py), per rollout: (weights before self-normalisation, dropped by a token rule,
# rejected by a rollout rule, clipped, band kept per token (for the self-normalising mean))

SIGN = {None: lambda a: True, "positive": lambda a: a > 0, "negative": lambda a: a < 0,
        "non-negative": lambda a: a >= 0, "non-positive": lambda a: a <= 0}


def log_(x: float) -> float:
    """log, nan outside its domain (as torch's): a log-prob above 0 makes a probability above 1"""
    return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)


def binary_kl(p: float, q: float) -> float:
    return p * log_(p / q) + (1 - p) * log_((1 - p) / (1 - q))


def stat(name: str, l: float, logp: float, logq: float) -> float:
    pi, mu = math.exp(logp), math.exp(logq)
    clip = lambda x: min(max(x, 1e-8), 1 - 1e-8)  # noqa: E731  (AReaL's clamp of the probabilities)
    return {"ratio": lambda: l, "k1": lambda: -l, "k2": lambda: l * l / 2, "k3": lambda: math.expm1(l) - l,
            "prob_diff": lambda: pi - mu, "exp_abs_log_ratio": lambda: math.exp(abs(l)),
            "abs_ratio_minus_one": lambda: abs(math.expm1(l)),
            "binary_kl": lambda: max(binary_kl(clip(pi), clip(mu)), binary_kl(clip(mu), clip(pi))),
            "binary_kl_mu": lambda: (mu * (logq - logp) + (1 - mu) * log_((1 - mu + 1e-8) / (1 - pi + 1e-8)))
            * ((pi > mu) - (pi < mu)),
            "logit_gradient": lambda: math.exp(l) * (1 - pi)}[name]()


def passes(c: Criterion, x: float) -> bool:
    lo, hi = c.low, c.high
    if c.statistic == "ratio" and c.edge_space == "ratio":  # x is a log-ratio, its exp compared with the edges
        x = math.exp(x)
    elif c.statistic == "ratio":  # x is a log-ratio
        lo = None if lo in (None, 0.0) else math.log(lo)
        hi = None if hi in (None, math.inf) else math.log(hi)
    if c.strict:
        return (lo is None or x > lo) and (hi is None or x < hi)
    return (lo is None or x >= lo) and (hi is None or x <= hi)


def m2po(rollouts: list, threshold: float) -> set:
    """(rollout, token index) of the loss tokens M2PO drops: by l^2 from the largest (ties in batch order) until
    the rest's mean is below the threshold; if none gets there, all but the last."""
    tokens = [(r.l[i] ** 2, j, i) for j, r in enumerate(rollouts) for i in range(r.T)]
    order = sorted(range(len(tokens)), key=lambda n: -tokens[n][0])  # sorted() is stable
    n = len(order)
    k = next((k for k in range(n) if sum(tokens[o][0] for o in order[k:]) / (n - k) < threshold), n - 1)
    return {tokens[o][1:] for o in order[:k]}


def nan_max(v: list) -> float:
    """max, nan when any value is nan (a statistic outside its domain fails every band, as torch's amax)"""
    return math.nan if any(math.isnan(x) for x in v) else max(v)


def nan_min(v: list) -> float:
    return math.nan if any(math.isnan(x) for x in v) else min(v)


def composed(comp: Composition, r: Rollout, per_token_adv: bool, batch_dropped: list | None = None):
    c_ = comp.log_ratio_clamp
    clamp = (lambda x: x) if c_ is None else (lambda x: max(-c_, min(c_, x)))
    T, w = r.T, comp.weight
    token_drop, rollout_out = list(batch_dropped or [False] * T), False
    left = list(token_drop)  # the tokens out of the loss's count N: the batch rule's, and leaves_normaliser rules'
    # criteria on the clamped per-token log-ratios
    lc = [clamp(x) for x in r.l]
    for c in comp.criteria:
        s = [stat(c.statistic, lc[t], r.logp[t], r.logq[t]) for t in range(T)]
        if c.agg == "token":
            fails = [not passes(c, x) for x in s]
        else:
            if comp.clamp_order == "aggregate" and c.statistic == "ratio" and c.agg in ("sum", "mean"):
                s = r.l  # the raw log-ratios aggregated, the aggregate clamped
                agg = clamp(sum(s) if c.agg == "sum" else sum(s) / T) if T else 0.0
            else:
                of = {"sum": sum, "mean": lambda v: sum(v) / len(v), "max": nan_max, "min": nan_min}[c.agg]
                agg = of(s) if T else 0.0
            fails = [not passes(c, agg)] * T
        if c.agg == "token" or (c.advantage is not None and per_token_adv):
            dropped = [f and SIGN[c.advantage](a) for f, a in zip(fails, r.A)]
            token_drop = [d or x for d, x in zip(token_drop, dropped)]
            if c.leaves_normaliser:
                left = [d or x for d, x in zip(left, dropped)]
        elif T and fails[0] and SIGN[c.advantage](r.A[0]):
            rollout_out = True
            if c.leaves_normaliser:
                left = [True] * T
    # the weight, its exponent clamped after aggregating the raw log-ratios, or (weight clamp order "token") the
    # aggregate of each token's clamped log-ratio, not clamped again
    each = comp.weight_clamp_order == "token" and c_ is not None
    lw = lc if each else r.l
    S = sum(lw)
    x = {"none": None, "token": lw, "sequence": [S] * T, "geometric": [S / T if T else 0.0] * T,
         "prefix": prefix_sums(lw)}[w.level]
    if x is None:
        return [1.0] * T, token_drop, rollout_out, False, [True] * T, left
    if w.token_clip is not None:  # the product of the token ratios, each clamped then truncated
        x = [sum(min(v, math.log(w.token_clip)) for v in lc)] * T
    x = x if each else [clamp(v) for v in x]
    hi = math.inf if w.clip is None else w.clip
    weights = [min(max(w_of(v), w.clip_low), hi) for v in x]
    if w.gamma is not None:  # VESPO's phi(W) = exp(lambda + k log W - lambda W), (k, lambda) by A's sign
        kl = [(w.gamma[0], w.gamma[1]) if a >= 0 else (w.gamma[2], w.gamma[3]) for a in r.A]
        weights = [w_of(lam + k * v - lam * math.exp(v)) for v, (k, lam) in zip(x, kl)]
    clipped = w.truncated and any(v > math.log(hi) or (w.clip_low > 0 and v < math.log(w.clip_low)) for v in x)
    band_ok = [True] * T
    if w.band is not None:
        band_ok = [in_band(v, *w.band, w.edge_space) for v in x]
        if w.per_rollout:
            rollout_out |= T > 0 and not band_ok[0]
        else:
            token_drop = [d or not ok for d, ok in zip(token_drop, band_ok)]
    return weights, token_drop, rollout_out, clipped and not rollout_out, band_ok, left


# ------------------------------------------------------------------------------------------------------
# the output from per-rollout values


def reference(batch: Batch, rows: list, agg: str, adv_tau: float = 1.0, penalty: Penalty | None = None,
              self_normalize: str | None = None):
    """weights (B, T), kept (B, T), d loss / d trainer_logprobs (B, T) and the metrics."""
    B, T = batch.shape
    rollouts = [Rollout(batch, j) for j in range(B)]
    if self_normalize is not None:  # divide by the mean weight over loss tokens / valid rollouts, before rejection
        if self_normalize == "token":
            vals = [w * ok for row in rows for w, ok in zip(row[0], row[4])]
        else:
            vals = [row[0][0] * (row[4][0] and True) for row, r in zip(rows, rollouts) if r.T]
            if self_normalize == "all":  # slime: the empty rollouts count, with weight 0
                vals += [0.0] * sum(r.T == 0 for r in rollouts)
        mean = sum(vals) / max(len(vals), 1)
        if mean > 1e-8:
            rows = [([w / mean for w in row[0]], *row[1:]) for row in rows]
    weights = torch.zeros(B, T, dtype=D)
    kept = torch.zeros(B, T, dtype=torch.bool)
    n_tok = sum(r.T for r in rollouts)
    n_valid = sum(r.T > 0 for r in rollouts)
    k3_kept = k3_dropped = 0.0
    n_token_dropped = n_traj = 0
    applied = {}
    for j, (r, row) in enumerate(zip(rollouts, rows)):
        w, token_drop, rollout_out = row[0], row[1], row[2]
        n_token_dropped += sum(token_drop)
        n_traj += r.T if rollout_out else 0
        for i, t in enumerate(r.pos):
            keep = not (token_drop[i] or rollout_out)
            kept[j, t] = keep
            weights[j, t] = w[i] if keep else 0.0
            k3 = math.expm1(r.l[i]) - r.l[i]
            k3_kept, k3_dropped = (k3_kept + k3, k3_dropped) if keep else (k3_kept, k3_dropped + k3)
        if r.T and kept[j].any():
            applied[j] = float(weights[j].sum()) / r.T
    n_kept = int(kept.sum())
    n_left = sum(sum(row[5]) for row in rows if len(row) > 5)
    if n_left:  # those tokens left the loss's count N: the kept ones weigh N / N_after more
        weights = weights * (n_tok / max(n_tok - n_left, 1))
        applied = {j: v * n_tok / max(n_tok - n_left, 1) for j, v in applied.items()}
    grad = torch.zeros(B, T, dtype=D)
    pen = 0.0
    for j, r in enumerate(rollouts):
        s = {"token-mean": 1 / max(n_tok, 1), "kept-token-mean": 1 / max(n_kept, 1),
             "seq-mean-token-mean": 1 / (max(r.T, 1) * max(n_valid, 1)), "seq-mean-token-sum": 1 / max(n_valid, 1)}[agg]
        for i, t in enumerate(r.pos):
            grad[j, t] = -s * float(weights[j, t]) * adv_tau * r.A[i]
            if penalty is not None:
                x = r.l[i]
                squared = penalty.statistic == "squared_log_ratio"
                f, df = (x * x, 2 * x) if squared else (math.expm1(x) - x, math.expm1(x))
                grad[j, t] += s * penalty.coef * df
                pen += s * penalty.coef * f
    valid = [r for r in rollouts if r.T]
    mean = lambda xs: sum(xs) / len(xs) if xs else 0.0  # noqa: E731
    metrics = {
        "mismatch_kl": sum(math.expm1(x) - x for r in rollouts for x in r.l) / max(n_tok, 1),
        "masked_mismatch_kl": k3_dropped / max(n_tok - n_kept, 1),
        "unmasked_mismatch_kl": k3_kept / max(n_kept, 1),
        "is_masked": (n_tok - n_kept) / max(n_tok, 1),
        "is_token_masked": n_token_dropped / max(n_tok, 1),
        "is_traj_masked": n_traj / max(n_tok, 1),
        "is_clipped": mean([float(row[3]) for row, r in zip(rows, rollouts) if r.T]),
        "seq_log_ratio": mean([r.S for r in valid]),
        "geo_log_ratio": mean([r.G for r in valid]),
        "seq_weight": mean(list(applied.values())),
    }
    if penalty is not None:
        metrics["penalty"] = pen
    return weights, kept, grad, metrics


def check(out, batch, ref):
    weights, kept, grad, metrics = ref
    assert out.masks["kept"].equal(kept), f"kept\n{out.masks['kept']}\nreference\n{kept}"
    torch.testing.assert_close(out.weights, weights, rtol=1e-9, atol=1e-12, msg="weights")
    (g,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    torch.testing.assert_close(torch.where(batch.loss_mask, g, 0.0), grad, rtol=1e-9, atol=1e-12, msg="gradient")
    assert (g[~batch.loss_mask] == 0).all()
    got = out.scalars()
    for k, v in metrics.items():  # a difference of k3 sums rounds on the scale of the batch's k3
        assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12 * (1 + metrics["mismatch_kl"])), k


# ------------------------------------------------------------------------------------------------------
# the tests


@pytest.mark.parametrize("name", list(ESTIMATORS))
@settings(max_examples=examples(30), deadline=None)
@given(batch=batches(), data=st.data())
def test_every_estimator_matches_its_formula(name, batch, data):
    cfg = data.draw(configs(name, adv_taus=(1.0, 0.5, 2.0)))
    agg = data.draw(st.sampled_from(AGGREGATIONS))
    paths = data.draw(st.sampled_from(PATHS))
    out = fast_output(name, cfg, batch, agg, paths)
    rows = [formula(name, Rollout(batch, j), cfg) for j in range(batch.shape[0])]
    check(out, batch, reference(batch, rows, agg, cfg.adv_tau))


def check_composition(comp: Composition, batch: Batch, agg: str, out=None):
    per_token_adv = batch.advantages.dim() == 2
    rollouts = [Rollout(batch, j) for j in range(batch.shape[0])]
    gone = set() if comp.batch_rule is None else m2po(rollouts, comp.batch_rule.threshold)
    rows = [composed(comp, r, per_token_adv, [(j, i) in gone for i in range(r.T)]) for j, r in enumerate(rollouts)]
    norm = None
    if comp.weight.self_normalize:
        norm = ("all" if comp.weight.normalize_all else "rollout") if comp.weight.per_rollout else "token"
    out = run(comp, batch, agg=agg) if out is None else out
    check(out, batch, reference(batch, rows, agg, comp.adv_tau, comp.penalty, norm))


# the CPU shortcuts, the GPU's passes (shortcuts off), or token rules always in their sparse rows form (the few
# rows in full)
PATHS = [dict(), dict(shortcuts=False), dict(sparse_share=1.0)]


def fast_output(x, cfg, batch: Batch, agg: str, paths: dict):
    """The fast evaluator's output for a name or composition, along one of PATHS."""
    comp = resolve(x, cfg)
    if not fast.supports(comp):  # a part the fast evaluator does not know: the registry runs the plain one
        return evaluate(comp, batch, agg)
    r = Ratios.of(batch, **paths)
    return fast.evaluate_many({comp: 1}, batch, agg, r)[comp][0]


def _preset_keys() -> list[str]:
    from seqis.presets import PRESETS
    from seqis.registry import needs_head

    return sorted(k for k in PRESETS if not needs_head(k))  # score centering: tests/test_score_centering_presets.py


@pytest.mark.parametrize("key", _preset_keys() or [pytest.param("none", marks=pytest.mark.skip("no presets"))])
@settings(max_examples=examples(15), deadline=None)
@given(batch=batches(), agg=st.sampled_from(AGGREGATIONS), paths=st.sampled_from(PATHS))
def test_every_preset_matches_its_composition(key, batch, agg, paths):
    comp = resolve(key)  # the preset's composition at the framework's defaults
    assert entry(key)[0].compose(entry(key)[1]) == comp
    check_composition(comp, batch, agg, out=fast_output(key, None, batch, agg, paths))


RATIO_EDGES = [0.5, 0.9, 0.999, 1.0, 1.001, 1.2, 2.0, 5.0]
STAT_BANDS = {"ratio": None, "k1": [-0.5, -0.05, 0.01, 0.3], "k2": [0.001, 0.05, 0.5], "k3": [0.001, 0.05, 0.5],
              "prob_diff": [-0.2, -0.01, 0.05, 0.2], "exp_abs_log_ratio": [1.001, 1.05, 1.5, 3.0],
              "abs_ratio_minus_one": [0.001, 0.05, 0.5], "binary_kl": [1e-4, 0.01, 0.2, 2.0],
              "binary_kl_mu": [-0.2, -0.01, 1e-4, 0.05], "logit_gradient": [0.05, 0.5, 1.0, 2.0]}


@st.composite
def criteria(draw):
    statistic = draw(st.sampled_from(list(STAT_BANDS)))
    edges = RATIO_EDGES if statistic == "ratio" else STAT_BANDS[statistic]
    lo, hi = sorted(draw(st.lists(st.sampled_from(edges), min_size=2, max_size=2, unique=True)))
    side = draw(st.sampled_from(["both", "low", "high"]))
    return Criterion(statistic, draw(st.sampled_from(["token", "sum", "mean", "max", "min"])),
                     None if side == "high" else lo, None if side == "low" else hi,
                     draw(st.sampled_from([None, None, "positive", "negative", "non-negative", "non-positive"])),
                     strict=draw(st.sampled_from([False, False, True])),
                     leaves_normaliser=draw(st.sampled_from([False, False, False, True])),
                     edge_space=draw(st.sampled_from(["log", "log", "ratio"])) if statistic == "ratio" else "log")


@st.composite
def compositions(draw):
    level = draw(st.sampled_from(["none", "token", "sequence", "geometric", "prefix", "gamma"]))
    weight = Weight()
    if level == "gamma":  # VESPO's: a sequence weight of token ratios truncated, through phi
        weight = Weight("sequence", token_clip=draw(st.sampled_from([None, 3.0, math.inf])),
                        gamma=draw(st.sampled_from([(2.0, 3.0, 3.0, 2.0), (1.0, 0.5, 0.0, 1.0)])))
    elif level != "none":
        clip = draw(st.sampled_from([None, None, 1.5, 3.0, math.inf]))
        clip_low = draw(st.sampled_from([0.0, 0.0, 0.5]))
        band = draw(st.sampled_from([None, None, (0.0, 3.0), (0.5, 2.0), (0.8, math.inf)]))
        assume(clip_low < (math.inf if clip is None else clip))
        normalize = draw(st.booleans())
        every = normalize and level in ("sequence", "geometric") and draw(st.booleans())
        space = draw(st.sampled_from(["log", "ratio"])) if band is not None else "log"
        weight = Weight(level, clip, clip_low, band, normalize, normalize_all=every, edge_space=space)
    penalty = draw(st.sampled_from([None, Penalty(1e-3), Penalty(0.1, "k3")]))
    return Composition(weight, tuple(draw(st.lists(criteria(), max_size=3))), penalty,
                       draw(st.sampled_from([None, None, 1.0, 20.0])), draw(st.sampled_from([1.0, 0.7])),
                       clamp_order=draw(st.sampled_from(["token", "token", "aggregate"])),
                       batch_rule=draw(st.sampled_from([None, None, None, BatchRule(0.04), BatchRule(1.0)])),
                       weight_clamp_order=draw(st.sampled_from(["aggregate", "aggregate", "token"])))


@settings(max_examples=examples(300), deadline=None)
@given(comp=compositions(), batch=batches(), agg=st.sampled_from(AGGREGATIONS), paths=st.sampled_from(PATHS))
def test_any_composition_matches_its_definition(comp, batch, agg, paths):
    check_composition(comp, batch, agg, out=fast_output(comp, None, batch, agg, paths))


@pytest.mark.parametrize("paths", PATHS)
def test_a_prefix_weight_keeps_its_clamp_in_the_rows_evaluated_in_full(paths):
    # every token's |l| <= 1, so a log-ratio clamp at 1 changes no token, but the prefix sums pass 1 and the
    # clamp still caps them: exp(1.0) = 2.72 is inside the band [0.5, 3], exp(1.2) = 3.32 is not. The token
    # rule (rho <= 1.5) sends rollout 0 to be evaluated in full on the sparse path.
    l = torch.tensor([[0.6, 0.3, 0.3, 0.3], [0.01, -0.02, 0.0, 0.01], [0.0, 0.0, 0.01, 0.0]], dtype=torch.float64)
    inference = -torch.rand(3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    batch = Batch((inference + l).requires_grad_(), inference, torch.tensor([1.0, -0.5, 2.0], dtype=torch.float64),
                  torch.ones(3, 4, dtype=torch.bool))
    comp = Composition(Weight("prefix", band=(0.5, 3.0)), (Criterion("ratio", "token", high=1.5),),
                       log_ratio_clamp=1.0)
    out = fast_output(comp, None, batch, "token-mean", paths)
    assert out.masks["kept"][0].tolist() == [False, True, True, True]
    check_composition(comp, batch, "token-mean", out=out)


# ------------------------------------------------------------------------------------------------------
# the two framework-arithmetic parts at their exact edges: a band decided in ratio space, and the weight's
# exponent aggregating each token's clamped log-ratio


def _on_the_mask(rows: list[list[float]], dtype: torch.dtype, adv: float = 1.0) -> Batch:
    """Rollouts with exactly these log-ratios in dtype (log mu = 0, so l = log pi - 0 to the last bit)."""
    T = max(len(r) for r in rows)
    l = torch.tensor([r + [0.0] * (T - len(r)) for r in rows], dtype=dtype)
    mask = torch.tensor([[t < len(r) for t in range(T)] for r in rows])
    return Batch(l.clone().requires_grad_(), torch.zeros_like(l), torch.full((len(rows),), adv, dtype=dtype), mask)


def _outputs_every_way(comp: Composition, batch: Batch) -> list:
    """The plain evaluator's output, and the fast one's along every path (fast.supports it: no fallback)."""
    assert fast.supports(comp)
    return [evaluate(comp, batch)] + [fast_output(comp, None, batch, "token-mean", p) for p in PATHS]


EDGE_CASES = [(3.0, "high"), (2.0, "high"), (1.2, "high"), (0.8, "low"), (1.001, "high")]


def _edge_batch(edge: float, dtype: torch.dtype) -> Batch:
    """Tokens on the dtype's values around log C (near ratio 1 an ulp of the ratio spans many of l: 3000 either
    side), 61 to a rollout."""
    xs = ulps_around(math.log(edge), 3000 if edge in (1.001, 0.8) else 40, dtype)
    return _on_the_mask([xs[i:i + 61] for i in range(0, len(xs), 61)], dtype)


def _verdicts(batch: Batch, edge: float, side: str, space: str) -> torch.Tensor:
    """(B, T) the tokens a band kept: torch.exp(l) against C in the dtype (C rounded to it), as TRL's
    `ratio > max_val` and ms-swift's `is_ratio <= threshold` decide, or l against log C."""
    l = batch.trainer_logprobs.detach()
    x, c = (torch.exp(l), edge) if space == "ratio" else (l, math.log(edge))
    return batch.loss_mask & ((x <= c) if side == "high" else (x >= c))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("edge, side", EDGE_CASES)
def test_a_band_in_ratio_space_decides_the_exact_edge_as_exp_of_l(dtype, edge, side):
    batch = _edge_batch(edge, dtype)
    band = (0.0, edge) if side == "high" else (edge, math.inf)
    low, high = (None, edge) if side == "high" else (edge, None)
    for space in ("ratio", "log"):
        want = _verdicts(batch, edge, side, space)
        every = batch.loss_mask & (want.sum(-1) == batch.loss_mask.sum(-1))[:, None]  # a max / min rule's verdict
        comps = [(Composition(Weight("token", band=band, edge_space=space)), want),
                 (Composition(Weight("token"), (Criterion("ratio", "token", low, high, edge_space=space),)), want),
                 (Composition(Weight("none"), (Criterion("ratio", "max" if side == "high" else "min", low, high,
                                                         edge_space=space),)), every)]
        for comp, kept_want in comps:
            for out in _outputs_every_way(comp, batch):
                assert torch.equal(out.masks["kept"], kept_want), (comp.describe(), dtype)
                if space == "ratio" and comp.weight.band is not None:  # a kept token weighs exp(l) as computed
                    rho = torch.exp(batch.trainer_logprobs.detach())  # there, to the bit
                    assert torch.equal(out.weights, torch.where(want, rho, 0.0)), (comp.describe(), dtype)


def test_the_edge_cases_tell_the_two_spaces_apart():
    # the edge tests above are not vacuous: in each dtype some of their batches are decided differently in the
    # two spaces (float64 at 3: exp(log 3) = 3.0000000000000004 > 3; float32 at 1.2 and 1.001)
    for dtype in (torch.float32, torch.float64):
        differ = [edge for edge, side in EDGE_CASES if not torch.equal(
            _verdicts(_edge_batch(edge, dtype), edge, side, "ratio"), _verdicts(_edge_batch(edge, dtype), edge, side,
                                                                                "log"))]
        assert len(differ) >= 2, (dtype, differ)
    batch = _edge_batch(3.0, torch.float64)
    assert not torch.equal(_verdicts(batch, 3.0, "high", "ratio"), _verdicts(batch, 3.0, "high", "log"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_rollout_ratio_in_ratio_space_decides_the_exact_edge(dtype):
    # one-token rollouts: the geometric mean and the sum are l itself, so exp(mean) <= C decides as exp(l) <= C;
    # a sequence weight's band likewise (TRL's sequence_mask: exp(S) > 3 dropped)
    xs = ulps_around(math.log(3.0), 40, dtype)
    batch = _on_the_mask([[x] for x in xs], dtype)
    want = torch.exp(batch.trainer_logprobs.detach()[:, 0]) <= 3.0
    for agg in ("mean", "sum"):
        comp = Composition(Weight("token"), (Criterion("ratio", agg, high=3.0, edge_space="ratio"),))
        for out in _outputs_every_way(comp, batch):
            assert torch.equal(out.rollouts["accepted"], want), agg
    comp = Composition(Weight("sequence", band=(0.0, 3.0), edge_space="ratio"))
    for out in _outputs_every_way(comp, batch):
        assert torch.equal(out.masks["kept"][:, 0], want)
    assert not bool(want.all()) and bool(want.any())  # the edge lies inside these values


MIXED = [[25.0, -20.0], [0.1, 0.2, -0.3], [-30.0, 5.0, 5.0]]  # the +-20 clamp with mixed signs


@pytest.mark.parametrize("level, want", [
    ("geometric", [[1.0, 1.0], [math.exp(0.0)] * 3, [math.exp(-10.0 / 3)] * 3]),  # mean of (20, -20) = 0
    ("sequence", [[1.0, 1.0], [1.0] * 3, [math.exp(-10.0)] * 3]),  # sum of (20, -20) = 0; (-20, 5, 5) = -10
    ("prefix", [[math.exp(20.0), 1.0], [math.exp(0.1), math.exp(0.3), 1.0],
                [math.exp(-20.0), math.exp(-15.0), math.exp(-10.0)]]),
])
def test_the_weight_aggregates_each_clamped_log_ratio_in_float32(level, want):
    # ms-swift (grpo_trainer.py:2363) and open-instruct (grpo_utils.py:419) clamp each l_t at +-c before the
    # weight's mean or sum: l = (+25, -20), c = 20 -> (20, -20) -> mean 0 -> weight 1, where clamping the
    # aggregate of the raw l (verl, SkyRL, slime) gives e^2.5 (geometric) or e^5 (sequence)
    batch = _on_the_mask(MIXED, torch.float32)
    batch = Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, batch.loss_mask)
    if level != "prefix":
        want[1] = [math.exp(sum(MIXED[1]) / (3 if level == "geometric" else 1))] * 3
    comp = Composition(Weight(level), log_ratio_clamp=20.0, weight_clamp_order="token")
    T = max(len(r) for r in want)
    expect = torch.tensor([r + [0.0] * (T - len(r)) for r in want], dtype=torch.float64)
    for out in _outputs_every_way(comp, batch):
        torch.testing.assert_close(out.weights.double(), expect, rtol=3e-6, atol=0.0)
    after = Composition(Weight(level), log_ratio_clamp=20.0)  # the aggregate's clamp: another weight
    assert not torch.allclose(evaluate(after, batch).weights.double(), expect, rtol=1e-3)


def test_a_wrong_clamp_order_fails_the_reference():
    # the reference written for the other order (the aggregate of the raw l, clamped) must not pass for a
    # composition whose weight aggregates each clamped l: the hypothesis cases above would catch such a slip
    batch = _on_the_mask(MIXED, torch.float64)
    comp = Composition(Weight("geometric", clip=2.0), (Criterion("ratio", "token", high=1e9),), log_ratio_clamp=20.0,
                       weight_clamp_order="token")
    check_composition(comp, batch, "token-mean", out=fast_output(comp, None, batch, "token-mean", {}))
    wrong = Composition(comp.weight, comp.criteria, log_ratio_clamp=20.0)
    with pytest.raises(AssertionError):
        check_composition(wrong, batch, "token-mean", out=fast_output(comp, None, batch, "token-mean", {}))


def test_kolibris_logit_gradient_rule_drops_a_token_by_rho_times_one_minus_pi():
    """Aleph Alpha Kolibri's bound G_t = rho_t (1 - pi_t) <= 2, as a composable rule: rho 3 with pi 0.5 gives 1.5
    (kept), rho 3 with pi 0.2 gives 2.4 (dropped), rho 1.5 with pi 0.01 gives 1.485 (kept); rho alone or 1 - mu
    would decide otherwise."""
    pi = torch.tensor([[0.5, 0.2, 0.01]], dtype=torch.float64)
    rho = torch.tensor([[3.0, 3.0, 1.5]], dtype=torch.float64)
    batch = Batch(pi.log(), (pi / rho).log(), torch.ones(1, dtype=torch.float64))
    comp = Composition(Weight("token"), criteria=(Criterion("logit_gradient", high=2.0),))
    out = run(comp, batch)
    assert out.masks["kept"].tolist() == [[True, False, True]]
    assert evaluate(comp, batch, "token-mean").masks["kept"].tolist() == [[True, False, True]]
