"""A composition as AReaL's actor settings: `actor.rejection_sampling` (with actor.use_decoupled_loss: true), no
block (decoupled loss, weight 1), or PPO's clip on pi/mu (actor.use_decoupled_loss: false, AReaL's default).

level token: the weight rho_t, masked (mask) or clamped (clamp) by a bound on the metric; level sequence with the
ratio metric: the geometric mean exp(S/T) is every token's weight. Metrics: ratio, kl_k1 (+l), kl_k2 (l^2 / 2).
"""

from __future__ import annotations

import math

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, yaml
from ._own import own_settings, prefixed

HEADER = ["AReaL actor rejection sampling (decoupled loss)"]
SUFFIX = "areal.yaml"
EDGE_SPACE = "ratio"  # functional.py:180: (metric >= lower) & (metric <= upper), metric = exp(l) in float32
PARTS = frozenset({"binary_kl", "batch_rule"})  # the later parts it writes (_parts.later_parts)
_NO = "AReaL's rejection sampling is one bound on one metric with a token or geometric weight"


def _rule(comp: Composition) -> dict:
    w, crit = comp.weight, comp.criteria
    level = {"token": "token", "geometric": "sequence"}.get(w.level)
    if level is None or w.band is not None or w.self_normalize or len(crit) > 1:
        raise CannotExpress(f"{_NO} (this weight: {w.level})")
    if not crit:  # clamp: the weight bounded to [lower or 0, upper]
        if math.isinf(w.upper):
            raise CannotExpress(f"{_NO}: an untouched weight has no AReaL setting")
        return dict(level=level, action="clamp", metric="ratio", agg="mean", upper=w.upper,
                    lower=w.clip_low or None)
    c = crit[0]
    if not w.plain(w.level) or c.advantage is not None or c.high is None and c.statistic != "k1":
        raise CannotExpress(f"{_NO} (a mask with an untouched weight and an upper bound)")
    level, agg = ("token", "mean") if c.agg == "token" else ("sequence", c.agg)
    if w.level != ("geometric" if level == "sequence" and c.statistic == "ratio" else "token"):
        raise CannotExpress(f"{_NO} (its weight is the geometric ratio exactly when a rollout's ratio is bounded)")
    if c.statistic == "ratio" and c.agg in ("token", "sum", "mean", "max"):
        return dict(level=level, action="mask", metric="ratio", agg=agg, upper=c.high, lower=c.low)
    if c.statistic == "binary_kl" and c.agg in ("token", "sum", "mean", "max"):
        return dict(level=level, action="mask", metric="binary_kl", agg=agg, upper=c.high, lower=c.low)
    if c.statistic == "k2" and c.agg in ("token", "sum", "mean", "max"):
        return dict(level=level, action="mask", metric="kl_k2", agg=agg, upper=c.high, lower=c.low)
    if c.statistic == "k1" and c.agg in ("token", "sum", "mean", "min") and c.low is not None:  # AReaL's k1 is +l
        return dict(level=level, action="mask", metric="kl_k1", agg="max" if c.agg == "min" else agg,
                    upper=-c.low, lower=None if c.high is None else -c.high)
    raise CannotExpress(f"{_NO} (not {c.statistic} {c.agg})")


def settings(comp: Composition) -> Settings:
    if comp.penalty is not None:
        raise CannotExpress("AReaL's KL term is to a reference model, not the sampler")
    if any(c.strict or c.leaves_normaliser for c in comp.criteria):
        raise CannotExpress("AReaL's bounds are inclusive and its rejections keep the normaliser")
    notes: list[str] = []
    if comp.log_ratio_clamp is not None:
        notes.append(f"AReaL clamps no log-ratio (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    clip = comp.ppo_clip()
    if clip is not None and not clip[1]:  # pi_old = the sampler's log-probs: PPO clips pi/mu
        ppo = clip[0]
        keys = {"actor.use_decoupled_loss": False, "actor.recompute_logprob": False, "actor.eps_clip": ppo.eps_low,
                "actor.eps_clip_higher": ppo.eps_high, "actor.c_clip": ppo.clip_c}
        return Settings(keys, notes)
    if comp.weight.level == "none" and not comp.criteria:
        return Settings({"actor.use_decoupled_loss": True, "actor.rejection_sampling": None}, notes)
    m2 = {} if comp.batch_rule is None else {"actor.m2_threshold": comp.batch_rule.threshold}  # M2PO
    if comp.weight.level == "none" and not comp.criteria:
        return Settings({"actor.use_decoupled_loss": True, **m2, "actor.rejection_sampling": None}, notes)
    rule = _rule(comp)
    keys = {"actor.use_decoupled_loss": True, **m2, **{f"actor.rejection_sampling.{k}": v for k, v in rule.items()}}
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)


_RULE = ("level", "action", "metric", "agg", "upper", "lower")  # actor.rejection_sampling's keys
own_key = prefixed("actor.", {k: f"actor.rejection_sampling.{k}" for k in _RULE})


def own(cfg) -> Settings:
    """AReaL's own preset: the actor's keys; the rejection_sampling block only when the preset turns it on (off,
    its knobs have no place: a comment names them). pi_old is the sampler's without the decoupled loss
    (recompute_logprob: false)."""
    on = cfg.rejection_sampling
    skip = ({"rejection_sampling": "on: it is the actor.rejection_sampling block written here"} if on else
            {k: "rejection_sampling is off (actor.rejection_sampling: null)" for k in ("rejection_sampling", *_RULE)})
    extra = {} if cfg.use_decoupled_loss else {"actor.recompute_logprob": False}
    if not on:
        extra["actor.rejection_sampling"] = None
    return own_settings(cfg, own_key, skip=skip, extra=extra)
