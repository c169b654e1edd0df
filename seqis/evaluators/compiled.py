"""The compiled evaluator: `torch.compile`d graphs (inductor: C++ on the CPU, Triton on a GPU), each for many
compositions.

Why so few graphs: a graph per composition would compile once per estimator and preset (seconds each). Here a
composition is not Python constants in the graph but a vector of knobs, a 1-d tensor (`knobs`): its weight's level
and truncation, the clamp c, each rule's band in log space (an absent rule is the band [-inf, inf], which keeps
everything) and the aggregation. The graph computes every part for every composition (a token rule, a rollout
rule on the mean, the sum, the max and the min of the clamped log-ratios, a weight at any level) and the knobs pick
what applies; compiled with `dynamic=True`, the batch's shape is symbolic too. So a dtype (and the advantages' rank)
compiles once per process, and new shapes or knobs do not recompile. There are two such graphs: `forward`, for any
composition `supports` (two passes over the batch: the rows' sums, then the tokens), and `forward_rows`, for one
whose every part is per rollout on advantages per rollout (one pass; the seed estimators seq_tis, seq_mis and
geo_mask), chosen by `rowwise`.

What a graph returns is what a training step reads: the loss's value, the metrics, the per-rollout values and
the weights ((B, T), or (B,) for the rows graph: spread over the loss tokens when read). The gradient is the weights
times a per-rollout factor, written in the backward (one pass); the masks are made when first read, by the same
functions run eagerly.

The definition stays seqis/evaluators/plain.py: tests/test_compiled.py holds this module to it on hypothesis-drawn
batches. A composition with any part outside `supports` (a weight band or self-normalisation, a penalty, a rule on
another statistic or conditioned on the advantage, ...) is evaluated by the eager evaluators, and so is every
composition when this path is off. Whether it is on is decided once per process (`compiled_status`): SEQIS_COMPILE=1
compiles, =0 never; unset, it compiles for CUDA batches only, so neither `make test` nor the explorer's first chart
(both on the CPU) waits for a compile. No compiler, a compile that raises, or a dtype other than float32 / float64
falls back to the eager path, and the status says why.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..core.compose import Composition
from ..core.ratios import MAX_LOG_WEIGHT
from ..core.types import Batch, EstimatorOutput
from .plain import AGGREGATIONS, edges, log_of

LEVELS = ("none", "token", "sequence", "geometric")
# the knob vector's entries, in order (a band's edges are logs of ratio edges)
KNOBS = ("level", "clamp", "log_clip_low", "log_upper", "log_cap", "token_lo", "token_hi", "mean_lo", "mean_hi",
         "sum_lo", "sum_hi", "max_lo", "max_hi", "min_lo", "min_hi", "agg", "adv_tau")
K = {name: i for i, name in enumerate(KNOBS)}
RULE_SLOTS = ("token", "mean", "sum", "max", "min")
DTYPES = (torch.float32, torch.float64)
METRICS = ("mismatch_kl", "masked_mismatch_kl", "unmasked_mismatch_kl", "is_masked", "seq_log_ratio",
           "geo_log_ratio", "is_clipped", "is_token_masked", "is_traj_masked", "seq_weight")


# ---------------------------------------------------------------------------------------------------------
# which compositions, and their knobs


@lru_cache(maxsize=1024)
def supports(comp: Composition) -> bool:
    """Whether the graph computes this composition: a weight at a level in LEVELS with at most a truncation and a
    lower clamp, rules on the log-ratio's band (per token, or a rollout's mean, sum, max or min), a clamp c applied
    token by token; nothing else."""
    w = comp.weight
    return (w.level in LEVELS and w.band is None and not w.self_normalize and w.token_clip is None
            and w.gamma is None and comp.penalty is None and comp.batch_rule is None and comp.centering is None
            and (comp.log_ratio_clamp is None or (comp.clamp_order == "token"
                                                   and comp.weight_clamp_order == "aggregate"))
            and all(c.statistic == "ratio" and c.agg in RULE_SLOTS and c.advantage is None and not c.strict
                    and not c.leaves_normaliser and c.edge_space == "log" for c in comp.criteria))


@dataclass(frozen=True)
class Shape:
    """What of a composition is structure, not a knob: which masks and flags it reports (plain.py's has_*)."""

    has_gate: bool  # a rollout-level rule: "traj_masked", and a rollout is accepted by the gate
    has_tripped: bool  # a token rule or a max / min rule: "token_masked"
    truncated: bool  # a truncation: "clipped"


@lru_cache(maxsize=1024)
def knobs_of(comp: Composition, agg: str) -> tuple[tuple[float, ...], Shape]:
    """The composition's knob vector (KNOBS' order) and its shape; several rules of one slot meet in one band."""
    w, c = comp.weight, comp.log_ratio_clamp
    k = dict(level=LEVELS.index(w.level), clamp=math.inf if c is None else c,
             log_clip_low=log_of(w.clip_low) if w.clip_low > 0 else -math.inf, log_upper=log_of(w.upper),
             log_cap=min(log_of(w.upper), MAX_LOG_WEIGHT), agg=AGGREGATIONS.index(agg), adv_tau=comp.adv_tau)
    for slot in RULE_SLOTS:
        k[f"{slot}_lo"], k[f"{slot}_hi"] = -math.inf, math.inf
    for rule in comp.criteria:
        lo, hi = edges(rule)
        k[f"{rule.agg}_lo"] = max(k[f"{rule.agg}_lo"], log_of(lo))
        k[f"{rule.agg}_hi"] = min(k[f"{rule.agg}_hi"], log_of(hi))
    aggs = {rule.agg for rule in comp.criteria}
    shape = Shape(has_gate=bool(aggs - {"token"}), has_tripped=bool(aggs & {"token", "max", "min"}),
                  truncated=w.truncated)
    return tuple(float(k[name]) for name in KNOBS), shape


@lru_cache(maxsize=256)
def _knob_tensor(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


# ---------------------------------------------------------------------------------------------------------
# the math, written once: the graph's body and the masks' eager pass


def ratios(t, q, m):
    """(log pi, log mu, l) on loss tokens (0 elsewhere; a non-finite l counts as 0), T_j, S_j (plain.Pieces)."""
    zero = t.new_zeros(())
    logp, logq = torch.where(m, t, zero), torch.where(m, q, zero)
    l = torch.where(m, logp - logq, zero)
    l = torch.where(torch.isfinite(l), l, zero)
    return logp, logq, l, m.sum(-1).to(t.dtype), l.sum(-1)


def verdicts(logp, l, T, m, k):
    """Step 1 (plain.rules) for every slot at once: (lc, keep, gate, token_masked). A rollout rule on the mean or the
    sum is tolerant by its sum's rounding (plain's tol_c); on the max or the min it is not."""
    c = k[K["clamp"]]
    lc = l.clamp(-c, c)  # (B, T)
    Sc, Tc, logp_sum = lc.sum(-1), T.clamp(min=1), logp.sum(-1)
    tol = torch.finfo(l.dtype).eps * (logp_sum.abs() + (logp_sum - Sc).abs()) / Tc  # (B,)
    band = lambda x, slot: (x >= k[K[f"{slot}_lo"]]) & (x <= k[K[f"{slot}_hi"]])
    tolerant = lambda x, slot, e: (x >= k[K[f"{slot}_lo"]] - e) & (x <= k[K[f"{slot}_hi"]] + e)
    hi = torch.where(m, lc, -math.inf).amax(-1)  # (B,) the rollout's largest and smallest clamped l
    lo = torch.where(m, lc, math.inf).amin(-1)
    passes = tolerant(Sc / Tc, "mean", tol) & tolerant(Sc, "sum", tol * T) & band(hi, "max") & band(lo, "min")
    in_token = band(lc, "token")
    token_masked = m & ~(in_token & band(lc, "max") & band(lc, "min"))
    return lc, m & in_token, (T > 0) & passes, token_masked


def exponent(l, lc, T, S, k):
    """(B, T) the weight's exponent x at its level (0 for none), clamped to [-c, c]: l_t, S_j or S_j / T_j."""
    c, level = k[K["clamp"]], k[K["level"]]
    row = torch.where(level == 2, S, S / T.clamp(min=1)).clamp(-c, c)  # (B,) sequence or geometric
    x = torch.where(level == 1, lc, row[:, None])
    return torch.where(level == 0, torch.zeros_like(x), x)


def weight(x, k):
    """Step 2 (plain.weight): min(max(e^x, clip_low), upper, e^40), and where its truncation acted."""
    raised = torch.maximum(x, k[K["log_clip_low"]])
    w = torch.exp(torch.minimum(raised, k[K["log_cap"]]))
    return w, (x > k[K["log_upper"]]) | (x < k[K["log_clip_low"]])


def pieces(t, q, m, k):
    """Steps 1-3 on the batch: the log-ratios, the verdicts, the weight and what is kept (plain.evaluate's)."""
    logp, logq, l, T, S = ratios(t, q, m)
    lc, keep, gate, token_masked = verdicts(logp, l, T, m, k)
    w, beyond = weight(exponent(l, lc, T, S, k), k)
    kept = keep & gate[:, None]
    clipped = m & beyond & gate[:, None]  # (B, T)
    return dict(logp=logp, l=l, T=T, S=S, keep=keep, gate=gate, token_masked=token_masked, kept=kept,
                clipped=clipped, weights=torch.where(kept, w, torch.zeros_like(w)))


def normaliser(T, valid, N, n_kept, k):
    """(B,) s_t per rollout for the aggregation the knob names (plain.normaliser)."""
    n_valid = valid.sum().clamp(min=1).to(T.dtype)
    agg = k[K["agg"]]
    return torch.where(agg == 0, 1 / N.clamp(min=1), torch.where(
        agg == 1, 1 / n_kept.clamp(min=1), torch.where(agg == 2, 1 / (T.clamp(min=1) * n_valid), 1 / n_valid)))


def forward(t, q, m, adv, k):
    """The graph: (loss value, metrics vector in METRICS' order, (5, B) rows: T, S, G, applied weight, kept count,
    (B,) gate, (B,) clipped rollouts, (B,) the gradient's factor -s_j adv_tau, (B, T) weights). Every (B, T)
    reduction is a row sum first (then a sum of B values), so that inductor fuses them all into the one loop over
    the batch that writes the weights: two passes in all, the first for the rows' sums that the rules and a
    rollout's weight read."""
    p = pieces(t, q, m, k)
    l, T, S, kept, weights, gate = p["l"], p["T"], p["S"], p["kept"], p["weights"], p["gate"]
    zero = t.new_zeros(())
    Tc, valid, N = T.clamp(min=1), T > 0, T.sum()
    k3 = torch.where(m, torch.expm1(l) - l, zero)
    kept_len = kept.sum(-1).to(t.dtype)  # (B,)
    n_kept = kept_len.sum()
    applied, G = weights.sum(-1) / Tc, S / Tc
    clipped_rows = p["clipped"].any(-1)
    mean_over = lambda x, select: torch.where(select, x, zero).sum() / select.sum().clamp(min=1)
    metrics = torch.stack([
        k3.sum(-1).sum() / N.clamp(min=1),
        torch.where(kept, zero, k3).sum(-1).sum() / (N - n_kept).clamp(min=1),
        torch.where(kept, k3, zero).sum(-1).sum() / n_kept.clamp(min=1),
        (N - n_kept) / N.clamp(min=1),
        mean_over(S, valid),
        mean_over(G, valid),
        mean_over(clipped_rows.to(t.dtype), valid),
        (N - p["keep"].sum(-1).sum()) / N.clamp(min=1),
        torch.where(gate, zero, T).sum() / N.clamp(min=1),
        mean_over(applied, valid & (kept_len > 0)),
    ])
    factor = -normaliser(T, valid, N, n_kept, k) * k[K["adv_tau"]]  # (B,)
    if adv.dim() == 1:  # sum_j factor_j A_j sum_t w_t log pi_t
        loss = (factor * adv * (weights * p["logp"]).sum(-1)).sum()
    else:
        loss = (factor * (weights * torch.where(m, adv, zero) * p["logp"]).sum(-1)).sum()
    return loss, metrics, torch.stack([T, S, G, applied, kept_len]), gate, clipped_rows, factor, weights


def forward_rows(t, q, m, adv, k):
    """The graph of a composition whose every part is per rollout (no token rule, a weight that is not per token),
    with advantages per rollout: one pass over the batch, the rest on (B,) values (plain's kept tokens of a rollout
    are all or none of its loss tokens). The same results as `forward`, with the (B,) applied weight w_j (0 for a
    rejected rollout) in place of the (B, T) weights."""
    logp, logq, l, T, S = ratios(t, q, m)
    _, _, gate, _ = verdicts(logp, l, T, m, k)  # its (B, T) parts unused: not computed
    zero = t.new_zeros(())
    Tc, valid, N = T.clamp(min=1), T > 0, T.sum()
    c, level = k[K["clamp"]], k[K["level"]]
    x = torch.where(level == 0, zero, torch.where(level == 2, S, S / Tc).clamp(-c, c))  # (B,)
    w, beyond = weight(x, k)
    w = torch.where(gate, w, zero)
    k3 = torch.where(m, torch.expm1(l) - l, zero).sum(-1)  # (B,)
    kept_len = torch.where(gate, T, zero)
    n_kept = kept_len.sum()
    applied, G = w * kept_len / Tc, S / Tc
    clipped_rows = valid & beyond & gate
    mean_over = lambda x, select: torch.where(select, x, zero).sum() / select.sum().clamp(min=1)
    metrics = torch.stack([
        k3.sum() / N.clamp(min=1),
        torch.where(gate, zero, k3).sum() / (N - n_kept).clamp(min=1),
        torch.where(gate, k3, zero).sum() / n_kept.clamp(min=1),
        (N - n_kept) / N.clamp(min=1),
        mean_over(S, valid),
        mean_over(G, valid),
        mean_over(clipped_rows.to(t.dtype), valid),
        zero,  # no token rule
        torch.where(gate, zero, T).sum() / N.clamp(min=1),
        mean_over(applied, valid & (kept_len > 0)),
    ])
    factor = -normaliser(T, valid, N, n_kept, k) * k[K["adv_tau"]]  # (B,)
    loss = (factor * adv * w * logp.sum(-1)).sum()
    return loss, metrics, torch.stack([T, S, G, applied, kept_len]), gate, clipped_rows, factor, w


def rowwise(comp: Composition, batch: Batch) -> bool:
    """Whether `forward_rows` computes the composition on this batch."""
    return (batch.advantages.dim() == 1 and comp.weight.level != "token"
            and all(c.agg != "token" for c in comp.criteria))


# ---------------------------------------------------------------------------------------------------------
# the loss node, and the outputs


class _Loss(torch.autograd.Function):
    """The loss's value, whose backward writes d loss / d log pi = w_t factor_j A (one pass): weights (B, T), or (B,)
    a rollout's weight on each of its loss tokens."""

    @staticmethod
    def forward(ctx, trainer, value, weights, factor, adv, mask):
        ctx.save_for_backward(weights, factor, adv, mask)
        ctx.dtype = trainer.dtype
        return value.clone()

    @staticmethod
    def backward(ctx, g):
        weights, factor, adv, mask = ctx.saved_tensors
        if weights.dim() == 1:
            grad = torch.where(mask, (weights * factor * adv * g)[:, None], 0.0)
        elif adv.dim() == 1:
            grad = weights * (factor * adv * g)[:, None]
        else:
            grad = torch.where(mask, adv, 0).mul_(weights).mul_((factor * g)[:, None])
        return grad.to(ctx.dtype), None, None, None, None, None


def _outputs(batch: Batch, t, q, adv, kv, shape: Shape, result, n: int) -> list[EstimatorOutput]:
    """n outputs (each its own loss node) sharing the graph's result; masks made when first read."""
    value, metrics, rows, gate, clipped_rows, factor, weights = result
    m = batch.loss_mask
    T, S, G, applied, kept_len = rows.unbind(0)
    metric = dict(zip(METRICS, metrics.unbind()))  # is_clipped is 0 without a truncation: nothing is beyond
    made = {}

    def mask(name):
        def make():
            if not made:
                p = pieces(t, q, m, kv)
                made.update(kept=p["kept"], token_masked=p["token_masked"], traj_masked=m & ~p["gate"][:, None],
                            clipped=p["clipped"])
            return made[name]
        return make

    names = ["kept"] + (["token_masked"] if shape.has_tripped else []) + (
        ["traj_masked"] if shape.has_gate else []) + (["clipped"] if shape.truncated else [])
    rollouts = dict(length=T, seq_log_ratio=S, geo_log_ratio=G, weight=applied,
                    accepted=gate if shape.has_gate else kept_len > 0,
                    clipped=clipped_rows if shape.truncated else torch.zeros_like(gate),
                    kept_fraction=kept_len / T.clamp(min=1))
    spread = (lambda: torch.where(m, weights[:, None], 0.0)) if weights.dim() == 1 else weights
    return [EstimatorOutput(loss=_Loss.apply(batch.trainer_logprobs, value, weights, factor, adv, m),
                            weights=spread, masks={name: mask(name) for name in names}, metrics=dict(metric),
                            rollouts=dict(rollouts)) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------
# the choice, made once per process, and the entry point


@dataclass(frozen=True)
class Choice:
    """Which devices' batches the graph serves (none: the eager path everywhere), and why, in one line."""

    devices: tuple[str, ...]
    status: str


_choice: Choice | None = None
PROBE = (16, 300)  # the probe batch's shape (B, T)
_graphs: dict | None = None  # "tokens": the compiled `forward`, "rows": `forward_rows`; made with the choice


def compiled_status() -> str:
    """One line: which path `run` takes and why ("compiled (inductor, cpu, float32 and float64)", "eager:
    SEQIS_COMPILE=0", "eager: compile failed: <reason>"). The first call makes the choice (compiling, when it
    compiles, on a small batch); later ones return it."""
    return _chosen().status


@contextmanager
def chosen(setting: str) -> Iterator[str]:
    """For the duration, the choice SEQIS_COMPILE=setting makes ("1" compiles, "0" is eager), yielding its status;
    the process's own afterwards. For whoever times or compares both paths in one process (the bench)."""
    global _choice, _graphs
    saved = _choice, _graphs
    _choice = _decide(setting)
    try:
        yield _choice.status
    finally:
        _choice, _graphs = saved


def _chosen() -> Choice:
    global _choice
    if _choice is None:
        _choice = _decide(os.environ.get("SEQIS_COMPILE", ""))
    return _choice


def _decide(setting: str) -> Choice:
    """SEQIS_COMPILE=0: eager; =1: compiled for the CPU and CUDA; unset: compiled for CUDA batches only (a CPU
    run, the tests and the explorer, never waits for a compile). The graph is compiled here, on a small batch
    of the device's, so a compiler that is missing or fails says so now."""
    if setting == "0":
        return Choice((), "eager: SEQIS_COMPILE=0")
    if setting not in ("", "1"):
        return Choice((), f"eager: SEQIS_COMPILE={setting!r} is neither 0 nor 1")
    cuda = torch.cuda.is_available()
    if setting == "" and not cuda:
        return Choice((), "eager: auto on a host without CUDA (SEQIS_COMPILE=1 compiles for the CPU)")
    if not callable(getattr(torch, "compile", None)):
        return Choice((), "eager: this torch has no torch.compile")
    devices = ("cuda",) if setting == "" else ("cpu", "cuda") if cuda else ("cpu",)
    global _graphs
    try:
        _graphs = {name: torch.compile(fn, dynamic=True) for name, fn in _EAGER.items()}
        _probe("cuda" if cuda else "cpu")
    except Exception as e:  # noqa: BLE001 - any failure of the compiler means the eager path
        _graphs = None
        return Choice((), f"eager: compile failed: {_reason(e)}")
    rest = "" if "cpu" in devices else "; cpu batches eager"
    return Choice(devices, f"compiled (inductor, {', '.join(devices)}, float32 and float64{rest})")


def _reason(e: Exception) -> str:
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def _probe(device: str) -> None:
    """Each graph run once on a 16 x 300 float32 batch, so that its symbolic shapes serve a trainer's batches: sizes
    other than 0 and 1, unequal, and over 4,096 tokens (inductor compiles smaller batches' loops apart). The batch
    has padding (-inf and NaN log-probs off the loss mask) and a rollout of each length class, and each graph's
    loss, metrics and rows must equal the same function run eagerly: a graph that computes something else is not
    used (`Disagrees`). Seen here: inductor's on-disk cache is not keyed by the CPU capability torch runs with
    (ATEN_CPU_CAPABILITY), and a graph compiled for another one, read from a cache shared across machines or
    settings, returned a rollout's log-ratio sum as 8 instead of 0."""
    g = torch.Generator().manual_seed(0)
    B, T = PROBE
    m = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    q = -3 * torch.rand(PROBE, generator=g)
    t = torch.where(m, q + 0.1 * torch.randn(PROBE, generator=g), -math.inf)
    q = torch.where(m, q, math.nan)
    t, q, m = t.to(device), q.to(device), m.to(device)
    adv = torch.randn(B, generator=g).to(device)
    values, _ = knobs_of(Composition(), "token-mean")
    kv = _knob_tensor(values, t.dtype, t.device)
    for name, graph in _graphs.items():
        got, want = graph(t, q, m, adv, kv), _EAGER[name](t, q, m, adv, kv)
        for a, b in zip(got[:3], want[:3]):
            if not torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True):
                raise Disagrees(f"the compiled {name} graph disagrees with its eager run on a probe batch (a "
                                f"stale inductor cache from another CPU? TORCHINDUCTOR_CACHE_DIR="
                                f"{os.environ.get('TORCHINDUCTOR_CACHE_DIR', 'unset')})")


class Disagrees(RuntimeError):
    """A compiled graph whose results differ from the eager run of its own code."""


_EAGER = {"tokens": forward, "rows": forward_rows}


def accepts(batch: Batch) -> bool:
    """Whether the graph serves this batch: the choice covers its device, its log-probs are float32 or float64,
    and it has at least two rollouts and two tokens (a size of 1 would compile a graph of its own)."""
    t = batch.trainer_logprobs
    B, T = batch.loss_mask.shape
    return t.device.type in _chosen().devices and t.dtype in DTYPES and B >= 2 and T >= 2


def _fell_back(e: Exception) -> None:
    """A compile that raised on a later dtype or rank: the eager path from now on, said once."""
    global _choice, _graphs
    _choice, _graphs = Choice((), f"eager: compile failed: {_reason(e)}"), None
    warnings.warn(f"seqis: {_choice.status}; the eager evaluators run instead", RuntimeWarning, stacklevel=3)


# torch.compile keeps at most torch._dynamo.config.recompile_limit (8) compiled variants of a function, and past
# that runs it uncompiled: the generic graph's code eagerly, several times slower than the fast evaluator. Each
# graph's variants are counted here by what makes inductor compile apart (the device, dtype, advantages' rank and
# the size classes it splits at 4,096 tokens); past VARIANTS, a batch of a new kind goes to the eager evaluators.
VARIANTS = 6
_variants: dict[str, set] = {"rows": set(), "tokens": set()}


def _variant_allowed(graph: str, batch: Batch) -> bool:
    B, T = batch.loss_mask.shape
    t = batch.trainer_logprobs
    kind = (t.device, t.dtype, batch.advantages.dim(), T > 4096, B * T > 4096)
    seen = _variants[graph]
    if kind not in seen and len(seen) >= VARIANTS:
        return False
    seen.add(kind)
    return True


def evaluate_many(named: dict[Composition, int], batch: Batch, agg: str = "token-mean"
                  ) -> dict[Composition, list[EstimatorOutput]]:
    """The compositions the graph supports on the batch, as many outputs each as `named` says keys name it; {} when
    the eager path is chosen for this batch (the caller evaluates the rest, and everything on {})."""
    if not accepts(batch):
        return {}
    comps = [comp for comp in named if supports(comp)]
    t = batch.trainer_logprobs.detach()
    q, adv, m = batch.inference_logprobs.to(t.dtype), batch.advantages.to(t.dtype), batch.loss_mask
    out = {}
    for comp in comps:
        graph = "rows" if rowwise(comp, batch) else "tokens"
        if not _variant_allowed(graph, batch):
            continue
        values, shape = knobs_of(comp, agg)
        kv = _knob_tensor(values, t.dtype, t.device)
        try:
            result = _graphs[graph](t, q, m, adv, kv)
        except Exception as e:  # noqa: BLE001 - a compile for a new dtype or rank that fails: eager from now on
            _fell_back(e)
            return {}
        out[comp] = _outputs(batch, t, q, adv, kv, shape, result, named[comp])
    return out
