"""`run` / `run_many`, the only dispatchers: a registry name, a preset key or a Composition -> its composition
-> a Correction on the batch (evaluate.py) -> the output: the surrogate loss (plus any penalty), the metrics
and the per-rollout values.

Metric definitions (valid rollout = T_j > 0; an empty selection gives 0.0); every correction reports all:
  mismatch_kl            mean over loss tokens of k3 = rho - 1 - l (estimates KL(mu || pi) per token), exact up
                         to the dtype's overflow (inf past l = 88.7 in float32)
  masked_mismatch_kl     the same over dropped loss tokens;  unmasked_mismatch_kl: over kept ones
  is_masked              fraction of loss tokens dropped
  is_token_masked        fraction of loss tokens a token-level rule drops (a token band, a token criterion)
  is_traj_masked         fraction of loss tokens in rollouts a rollout-level rule rejects (a trajectory band, ...)
  is_clipped             fraction of valid rollouts whose weight was truncated (seq_tis: S_j > log C)
  seq_log_ratio          mean of S_j;  geo_log_ratio: mean of S_j / T_j (over valid rollouts)
  seq_weight             mean applied weight (per rollout: over its loss tokens) over valid rollouts that keep
                         some gradient
  penalty                (with a penalty term only) its value in the loss

The penalty (prime-rl's KL term) adds coef * sum_t s_t f(l_t) over the loss tokens to the loss, s_t the
aggregation's normaliser (token-mean: 1/N), so d loss / d trainer_logprobs = -weights * adv_tau * A * s_t +
coef * f'(l_t) * s_t, with f'(l) = 2 l for squared_log_ratio and rho - 1 for k3. `weights` stays the
policy-gradient coefficient alone.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache, lru_cache, partial

import torch

from ..types import Batch, Config, EstimatorOutput, Masks
from . import ESTIMATORS, EstimatorSpec
from ._common import AGGREGATIONS, Correction, Ratios, token_scale
from ._kernels import (
    SharedGradient,
    any_per_row,
    as_float,
    dot,
    dot_rows,
    gated,
    known_losses,
    masked_mean,
    row_sums,
    scaled,
    spread,
    tokens_of,
)
from .compose import Composition, Penalty
from .evaluate import correction

Correctable = str | Composition  # a registry name, a preset key ("verl/bypass_pg_is") or a composition


@cache
def _default_config(cls: type[Config]) -> Config:
    return cls()  # frozen: one instance serves every call


@cache
def _presets() -> dict:
    """seqis.presets.PRESETS, imported when first asked (the package imports seqis.estimators itself)."""
    if importlib.util.find_spec("..presets", __package__) is None:
        return {}
    from ..presets import PRESETS

    return PRESETS


def entry(name: str) -> tuple[EstimatorSpec, Config]:
    """The registry entry a name or preset key runs, and its default config (a preset's: the framework's)."""
    if name in ESTIMATORS:
        spec = ESTIMATORS[name]
        return spec, _default_config(spec.config)
    presets = _presets()
    if name in presets:
        return presets[name].estimator, presets[name].config
    known = ", ".join([*ESTIMATORS, *presets])
    raise ValueError(f"unknown estimator {name!r}; known: {known}")


@dataclass(frozen=True)
class About:
    """What a registry name or preset key is, in words, for whoever shows or exports it."""

    summary: str  # one line
    source: str  # the paper or the framework's code it reproduces
    export_framework: str | None  # the framework whose own settings export it (a preset's); None: a registry entry


def about(name: str) -> About:
    """A registry estimator's or a preset's summary, source and export framework (one lookup serves both)."""
    presets = _presets()
    if name in presets:
        p = presets[name]
        return About(p.summary, p.source, p.export_framework)
    spec, _ = entry(name)
    return About(spec.summary, spec.section("Source"), None)


def resolve_config(name: str, cfg: Config | None) -> Config:
    """The config to use: the defaults for None; a config of the wrong class is refused."""
    spec, default = entry(name)
    if cfg is None:
        return default
    if not isinstance(cfg, spec.config):
        raise ValueError(f"{name} takes a {spec.config.__name__}, got {type(cfg).__name__}")
    return cfg


def resolve(x: Correctable, cfg: Config | None = None) -> Composition:
    """The composition a registry name or preset key (with cfg, or its defaults) or a Composition stands for."""
    if isinstance(x, Composition):
        if cfg is not None:
            raise ValueError(f"a Composition carries its own knobs: cfg must be None, got {type(cfg).__name__}")
        return x
    if not isinstance(x, str):
        raise ValueError(f"run takes an estimator name, a preset key or a Composition, got {type(x).__name__}")
    return _composed(entry(x)[0], resolve_config(x, cfg))


@lru_cache(maxsize=1024)
def _composed(spec: EstimatorSpec, cfg: Config) -> Composition:
    return spec.compose(cfg)


def _token_weights(r: Ratios, c: Correction) -> torch.Tensor:
    """A token-level correction's (B, T) weights before adv_tau * A, built in place on its own tensors (its keep
    mask becomes them when its token weights are a shared profile)."""
    if c.token_weights is None:
        w = c.keep
    elif c.shared_weights:
        w = c.keep.mul_(c.token_weights) if c.keep is not None else c.token_weights * r.mask_f
    else:
        w = c.token_weights.mul_(c.keep if c.keep is not None else r.mask_f)
    if c.keep is None and c.gate is not None:  # a rollout gate on token weights (geo_mask's hybrid)
        w.mul_(as_float(c.gate, r.dtype)[:, None])
    return w if c.row_weight is None else w.mul_(c.row_weight[:, None])


def _outputs(r: Ratios, batch: Batch, c: Correction, comp: Composition, agg: str,
             again: Callable[[], Correction], n: int = 1) -> list[EstimatorOutput]:
    """Loss, weights, masks, metrics and per-rollout values from a correction, for n keys that name it: n
    outputs, each with its own loss node, sharing every other tensor (detached, not to be written to).

    A correction in the rows form (row weights, a rollout gate, sparse kept rows, a shared token profile) never
    makes a (B, T) float tensor of its own in the forward: its loss and metrics are per-rollout sums, and the
    backward writes the gradient in one pass. A tokens-form correction's own (B, T) tensor becomes the gradient
    in place, so its weights and kept mask, when somebody reads them, come from `again()`, the composition
    evaluated anew. Every (B, T) tensor derived from log-ratios is finite, so masking them by multiplying with
    the 0/1 mask is safe; trainer_logprobs may hold -inf / NaN on padding and only enters the loss through the
    Ratios' cleaned copy. On the CPU a fresh (B, T) tensor costs about as much as the arithmetic on it: this
    function makes at most one.
    """
    token_level = c.per_token

    @cache
    def rebuilt() -> tuple[torch.Tensor, torch.Tensor | None]:  # a token-level output's weights and kept mask,
        c2 = again()  # from one fresh evaluation, made when either is first read
        kept_mask = c2.keep.bool() if c2.keep is not None else None
        return _token_weights(r, c2), kept_mask

    # which tokens keep a gradient, per rollout
    kept_rows = c.kept_rows
    mask_f = r.mask_f  # closures hold it, not the Ratios: a sequence-level output lets their (B, T) tensors go
    if c.keep is not None:
        kept_len = c.kept_len if c.kept_len is not None else c.keep.sum(-1)  # (B,)
        kept = lambda: rebuilt()[1]
    elif kept_rows is not None:  # the sparse form: all loss tokens but in a few rows, times the gate
        gate = c.gate if c.gate is not None else r.valid
        kept_len = c.kept_len if c.kept_len is not None else gated(gate, row_sums(r.length, kept_rows, "count"))
        kept = lambda: spread(as_float(gate, mask_f.dtype), mask_f, kept_rows).bool()
    elif c.gate is not None:
        kept_len = gated(c.gate, r.length)
        kept = partial(tokens_of, r.mask, c.gate)
    else:
        kept_len, kept = r.length, r.mask
    accepted = c.gate if c.gate is not None else kept_len > 0  # (B,)
    n_tok, n_kept = r.n_tokens, kept_len.sum()

    # common metrics: mismatch KL split into dropped / kept tokens (read `kept` before the loss takes it)
    if c.keep is not None:
        k3_kept = dot(r.k3, c.keep)
    else:
        k3_kept = gated(accepted, row_sums(r.k3_rollout, kept_rows, "k3")).sum()
    common = r.batch_metrics
    metrics = {
        "mismatch_kl": common["mismatch_kl"],
        "masked_mismatch_kl": (r.k3_total - k3_kept) / (n_tok - n_kept).clamp(min=1),
        "unmasked_mismatch_kl": k3_kept / n_kept.clamp(min=1),
        "is_masked": (n_tok - n_kept) / n_tok.clamp(min=1),
        "seq_log_ratio": common["seq_log_ratio"],
        "geo_log_ratio": common["geo_log_ratio"],
        **c.metrics,
    }

    # surrogate loss = -sum(scale * weight * adv_tau * A * log pi) over loss tokens
    scale = token_scale(r, n_kept, agg)  # () or (B, 1)
    row = scale.expand(r.length.shape) if scale.dim() == 0 else scale[:, 0]  # (B,)
    adv = batch.advantages.to(r.dtype) * comp.adv_tau
    if adv.dim() == 2:  # per-token advantages: part of the token coefficient
        adv_tok, row_adv = torch.where(r.mask, adv, 0.0), -row
    else:
        adv_tok, row_adv = None, -row * adv

    def gradient(w: torch.Tensor) -> torch.Tensor:  # (B, T) weights -> d loss / d log pi, in place
        return (w if adv_tok is None else w.mul_(adv_tok)).mul_(row_adv[:, None])

    shortcuts, length = r.shortcuts, r.length.clamp(min=1)
    if token_level:
        w = _token_weights(r, c)
        weight = kept_len / length if c.token_weights is None and c.row_weight is None else w.sum(-1) / length
        weights = lambda: rebuilt()[0]
        G = gradient(w)
        value = dot(G, r.logp)
        shared = SharedGradient(G, lambda: gradient(_token_weights(r, again())), n)
        grad_of = lambda first, g: scaled(shared.take(first), g, shortcuts)
    else:
        base = c.profile.values if c.profile is not None else mask_f  # each kept token's weight before token_w
        seq_w = c.row_weight if c.row_weight is not None else torch.ones_like(r.length)
        token_w = gated(accepted, seq_w) if c.gate is not None else seq_w  # (B,) times base on each kept token
        if c.profile is not None:  # mean applied weight over the loss tokens
            weight = token_w * row_sums(c.profile.sums, kept_rows, "factor_sums") / length
        else:
            weight = token_w if kept_rows is None else token_w * kept_len / length
        weights = cache(lambda: spread(token_w, base, kept_rows, weighted=True))
        if adv_tok is None:  # one coefficient per rollout: no (B, T) tensor in the forward
            row_coef = row_adv * token_w  # (B,) d loss / d log pi on each kept token, per unit of base
            full = c.profile.logp_sums if c.profile is not None else r.logp_rowsum
            value = (row_coef * row_sums(full, kept_rows, "logp")).sum()
            grad_of = lambda first, g: spread(row_coef * g, base, kept_rows, weighted=True)
        else:
            rebuild = lambda: gradient(spread(token_w, base, kept_rows, weighted=True))
            G = rebuild()
            value = dot(G, r.logp)
            shared = SharedGradient(G, rebuild, n)
            grad_of = lambda first, g: scaled(shared.take(first), g, shortcuts)

    if comp.penalty is not None:
        penalty, add_penalty = _penalty(r, comp.penalty, scale)
        value = value + penalty
        metrics["penalty"] = penalty
        pg_of = grad_of
        grad_of = lambda first, g: add_penalty(pg_of(first, g), g)
    metrics["seq_weight"] = masked_mean(weight, r.valid & (kept_len > 0))

    own = dict(c.masks)
    if c.gate is not None:  # a rollout gate: the loss tokens of the rollouts it rejects
        own.setdefault("traj_masked", partial(tokens_of, r.mask, ~c.gate))
    if c.clipped is not None:
        clipped = c.clipped & r.valid
        own.setdefault("clipped", partial(tokens_of, r.mask, clipped))
    masks = Masks({"kept": kept, **own})
    if c.clipped is None:
        clipped = any_per_row(masks["clipped"]) if "clipped" in masks else torch.zeros_like(r.valid)
    rollouts = {
        "length": r.length,
        "seq_log_ratio": r.seq_log_ratio,
        "geo_log_ratio": r.geo_log_ratio,
        "weight": weight,
        "accepted": accepted & r.valid,
        "clipped": clipped,
        "kept_fraction": kept_len / length,
    }
    logp = batch.trainer_logprobs.to(r.dtype)  # (B, T) differentiable: the loss nodes' input
    return [EstimatorOutput(loss=loss, weights=weights, masks=masks, metrics=dict(metrics), rollouts=dict(rollouts))
            for loss in known_losses(logp, value, grad_of, n)]


def _penalty(r: Ratios, p: Penalty, scale: torch.Tensor):
    """(value, add): coef * sum over loss tokens of s_t f(l_t), and add(G, g), which adds its d / d log pi times
    g to a (B, T) gradient G in place (no (B, T) tensor of its own): f = l^2 (f' = 2 l) or k3 = rho - 1 - l
    (f' = rho - 1 = k3 + l), on the batch's cleaned log-ratios (0 on padding: no gradient there). scale: the
    aggregation's normaliser, () or (B, 1)."""
    l = r.log_ratio  # (B, T) unclamped, 0 off the loss mask
    row_scale = scale if scale.dim() == 0 else scale[:, 0]  # () or (B,)
    if p.statistic == "squared_log_ratio":
        l2 = r.memo("l2_rows", lambda: dot_rows(l, l))  # (B,) sum of l^2 over each rollout's loss tokens
        factor = scale * (2 * p.coef)
        return (row_scale * l2).sum() * p.coef, lambda G, g: G.addcmul_(l, factor * g)
    k3 = r.k3
    factor = scale * p.coef
    return ((r.k3_rollout * row_scale).sum() * p.coef,
            lambda G, g: G.addcmul_(k3, factor * g).addcmul_(l, factor * g))


def run(x: Correctable, batch: Batch, cfg: Config | None = None, *, agg: str = "token-mean") -> EstimatorOutput:
    """Evaluate one correction on a batch: a registry name or preset key (cfg=None: its defaults; a cfg
    overrides them) or a Composition (cfg must be None)."""
    return run_many([(x, cfg)], batch, agg=agg)[x]


def run_many(
    estimators: Iterable[Correctable | tuple[Correctable, Config | None]] | dict[Correctable, Config | None],
    batch: Batch,
    *,
    agg: str = "token-mean",
    ratios: Ratios | None = None,
) -> dict[Correctable, EstimatorOutput]:
    """Evaluate several corrections on one batch, computing the shared pieces (log-ratios, sums, counts,
    geometric ratios, k3, each statistic and its row aggregates and extremes, token-weight profiles) once, and a
    composition that several keys name once: those keys get outputs of their own (each its own loss node and
    gradient) that share their weights, masks and metric tensors (all detached; not to be written to).
    `estimators` is names, preset keys or Compositions, (x, cfg) pairs, or an
    {x: cfg} dict; the result is keyed by each x as given (a Composition by itself; an x given twice with two
    configs: the later wins; use `run` per config).
    """
    items = estimators.items() if isinstance(estimators, dict) else estimators
    pairs = [(e, None) if isinstance(e, (str, Composition)) else tuple(e) for e in items]
    comps = [(x, resolve(x, cfg)) for x, cfg in pairs]
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    r = ratios if ratios is not None else Ratios.of(batch)
    if len(comps) > 1:  # build the (B, T) k3 once, for any token-level estimator's kept share (Ratios.k3)
        _ = r.k3
    keys = dict(comps)  # x -> its composition (an x given twice: the later)
    named: dict[Composition, list[Correctable]] = {}  # identical compositions are computed once
    for x, comp in keys.items():
        named.setdefault(comp, []).append(x)
    decide = r.profiles is None  # token weights on a shared profile pay when several corrections share it;
    if decide:  # for this call only (a caller's Ratios may serve several calls)
        r.profiles = len(named) > 1
    out = {}
    try:
        for comp, xs in named.items():
            again = partial(correction, r, comp)
            out.update(zip(xs, _outputs(r, batch, again(), comp, agg, again, len(xs))))
    finally:
        if decide:
            r.profiles = None
    return {x: out[x] for x in keys}
