"""A composition as ROLL's train_infer_correction (is_weight and filters).

is_weight: the token, geometric or sequence ratio clamped to [0, upper_bound]; each filter keeps the ratio (and/or
pi_old - mu) at its agg_type (token; geometric: the rollout mean; sequence: the rollout sum) inside its band.
ROLL clamps no log-ratio.
"""

from __future__ import annotations

import math

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, clamp_note, yaml
from ._own import own_settings

HEADER = ["ROLL pipeline config (train_infer_correction)"]
SUFFIX = "roll.yaml"
BLOCK = "train_infer_correction"
_LEVEL = {"token": "token", "geometric": "geometric", "sequence": "sequence"}
_AGG = {"token": "token", "mean": "geometric", "sum": "sequence"}  # a criterion's aggregate -> ROLL's agg_type
_STAT = {"ratio": "ratio", "prob_diff": "diff"}
_OPEN_LOW = {"ratio": 0.0, "prob_diff": -math.inf}


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("ROLL's KL loss is to a reference model, not the sampler")
    if w.band is not None or w.clip_low > 0 or w.self_normalize or w.level not in ("none", *_LEVEL):
        raise CannotExpress("ROLL's IS weight is the token, geometric or sequence ratio clamped from above only")
    keys: dict = {f"{BLOCK}.is_weight.enabled": w.level != "none"}
    if w.level != "none":
        keys.update({f"{BLOCK}.is_weight.weight_type": _LEVEL[w.level],
                     f"{BLOCK}.is_weight.upper_bound": None if math.isinf(w.upper) else w.upper,
                     f"{BLOCK}.is_weight.detach": True})
    filters: dict[str, dict] = {}  # agg_type -> the filter's fields
    for c in comp.criteria:
        if c.statistic not in _STAT or c.agg not in _AGG or c.advantage is not None:
            raise CannotExpress(f"ROLL filters by the ratio or pi_old - mu per token, rollout mean or sum, not "
                                f"{c.statistic} by {c.agg}{' conditioned on the advantage' if c.advantage else ''}")
        f = filters.setdefault(_AGG[c.agg], dict(enabled=True, agg_type=_AGG[c.agg], ratio_enabled=False))
        name = _STAT[c.statistic]
        if f.get(f"{name}_enabled"):
            raise CannotExpress(f"ROLL's filter has one {name} band per level")
        f.update({f"{name}_enabled": True, f"{name}_low": _OPEN_LOW[c.statistic] if c.low is None else c.low,
                  f"{name}_high": math.inf if c.high is None else c.high})
    for f in filters.values():
        f.setdefault("diff_enabled", False)
    keys[f"{BLOCK}.filters"] = list(filters.values())
    clamp_note("ROLL", None, comp.log_ratio_clamp, notes)
    adv_tau_note(comp.adv_tau, notes)
    return Settings(keys, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)


def own_key(name: str, cfg=None) -> str:
    """is_weight_<key> is train_infer_correction.is_weight.<key>; filter_<key> is the <key> of the one filter in
    train_infer_correction.filters (filters.0.<key>)."""
    group, key = name.split("_", 1)
    if group == "is":  # is_weight_<key>
        return f"{BLOCK}.is_weight.{name.removeprefix('is_weight_')}"
    return f"{BLOCK}.filters.0.{key}"


def own(cfg) -> Settings:
    """ROLL's own preset: the is_weight block and one filter, every key as the preset sets it (a filter it leaves
    off is written with enabled: false); the weight is detached, as ROLL's correction is."""
    s = own_settings(cfg, own_key)
    head = f"{BLOCK}.filters.0."
    one = {k.removeprefix(head): v for k, v in s.keys.items() if k.startswith(head)}
    keys = {k: v for k, v in s.keys.items() if not k.startswith(head)}
    keys.update({f"{BLOCK}.is_weight.detach": True, f"{BLOCK}.filters": [one]})
    return Settings(keys, s.notes, comments=s.comments)
