"""A composition as SkyRL's `trainer.algorithm.off_policy_correction`, or its policy losses on the sampler.

TIS weight (token or sequence, truncated from above); rejections: any token below / above the outlier thresholds,
tokens outside [token_mask_is_threshold_low, _high], rollouts whose geometric or product ratio leaves its band.
A plain token ratio with DPPO's sign-conditioned probability-difference pair is `policy_loss_type: dppo`
(binary_tv); a token ratio clamped to [low, high] with low > 0 is `policy_loss_type: cispo` on the rollout.
"""

from __future__ import annotations

import math

from ..core.compose import SAFETY_BOUND, Composition, Criterion, Weight
from ._format import CannotExpress, Settings, adv_tau_note, yaml
from ._own import own_settings, prefixed

HEADER = ["SkyRL off-policy correction"]
SUFFIX = "skyrl.yaml"
EDGE_SPACE = "ratio"  # off_policy_correction_utils.py:108, :176, :227, :243: the ratio against its bounds (float32)
PARTS = frozenset({"strict", "binary_kl_mu", "clamp_order"})  # the later parts it writes (_parts.later_parts)
BLOCK = "trainer.algorithm.off_policy_correction"
_SEQ_MASK = {"mean": ("geometric", "geo_mask"), "sum": ("product", "product_mask")}  # agg -> metric, key prefix


ALGO = "trainer.algorithm"
_GRADIENT_BAND = (math.exp(-SAFETY_BOUND), math.exp(SAFETY_BOUND))  # DPPO's clamp: no gradient where |l| > 20


_DPPO_TYPE = {"prob_diff": "binary_tv", "binary_kl_mu": "binary_kl"}  # the pair's statistic -> dppo_type


def _dppo(comp: Composition) -> tuple[dict, tuple[Criterion, ...], list[str]] | None:
    """DPPO's keys and the other criteria, when the composition has its sign-conditioned pair (the probability
    difference: binary_tv; the signed binary KL: binary_kl)."""
    pair = None
    for stat, kind in _DPPO_TYPE.items():
        up = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage, c.low) == (stat, "token", "positive", None)]
        down = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage, c.high) == (stat, "token", "negative",
                                                                                         None)]
        if len(up) == 1 and len(down) == 1:
            pair = kind, up, down
            break
    if pair is None or not comp.weight.plain("token"):
        return None
    kind, up, down = pair
    band = [c for c in comp.criteria if c.statistic == "ratio" and c.agg == "token" and c.advantage is None
            and (c.low, c.high) == _GRADIENT_BAND]
    rest = tuple(c for c in comp.criteria if c is not up[0] and c is not down[0] and c not in band)
    notes = [] if band else ["SkyRL's DPPO ratio is exp(clamp(l, +-20)): a token with |l| > 20 has no gradient"]
    keys = {f"{ALGO}.policy_loss_type": "dppo", f"{ALGO}.dppo.dppo_type": kind,
            f"{ALGO}.dppo.delta_low": -down[0].low, f"{ALGO}.dppo.delta_high": up[0].high}
    return keys, rest, notes


def settings(comp: Composition) -> Settings:
    w, notes = comp.weight, []
    if comp.penalty is not None:
        raise CannotExpress("SkyRL's KL loss is to a reference model, not the sampler")
    own: dict = {}
    criteria = comp.criteria
    strict = [c for c in criteria if c.strict]
    if any(c.leaves_normaliser for c in criteria):
        raise CannotExpress("SkyRL's masks keep the token-mean normaliser of the original loss mask")
    if strict:  # rollout_is: the token ratio zeroed outside an open band, the only open band SkyRL has
        c = strict[0]
        if (len(strict) > 1 or len(criteria) > 1 or not comp.weight.plain("token")
                or (c.statistic, c.agg, c.advantage) != ("ratio", "token", None) or c.low is None or c.high is None):
            raise CannotExpress("SkyRL's only open band is rollout_is's, on the token ratio alone")
        own = {f"{ALGO}.policy_loss_type": "rollout_is", f"{ALGO}.eps_clip_low": float(f"{1.0 - c.low:.15g}"),
               f"{ALGO}.eps_clip_high": float(f"{c.high - 1.0:.15g}")}
        criteria, w = (), Weight()
    elif (dppo := _dppo(comp)) is not None:
        own, criteria, notes = dppo
        w = Weight()  # the loss's own ratio is the weight: no TIS on top
    elif w.level == "token" and w.clip_low > 0 and w.band is None and not w.self_normalize:
        own = {f"{ALGO}.policy_loss_type": "cispo", f"{ALGO}.cispo.cispo_anchor": "rollout",
               f"{ALGO}.cispo.cispo_eps_clip_low": 1.0 - w.clip_low, f"{ALGO}.cispo.cispo_eps_clip_high": w.upper - 1.0}
        w = Weight()
    if w.band is not None or w.clip_low > 0 or w.self_normalize or w.level not in ("none", "token", "sequence"):
        raise CannotExpress("SkyRL's TIS weight is token or sequence level, truncated from above only")
    keys: dict = dict(tis_ratio_type=None if w.level == "none" else w.level)
    if w.level != "none":
        keys[f"{w.level}_tis_ratio_clip_high"] = w.upper
    for c in criteria:
        if c.statistic != "ratio" or c.advantage is not None:
            raise CannotExpress(f"SkyRL rejects by importance ratios only, not {c.statistic}"
                                f"{' conditioned on the advantage' if c.advantage else ''}")
        lo, hi = c.low or 0.0, math.inf if c.high is None else c.high
        if c.agg == "min" and c.high is None:
            keys["outlier_token_is_threshold_low"] = lo
        elif c.agg == "max" and c.low is None:
            keys["outlier_token_is_threshold_high"] = hi
        elif c.agg == "token":
            keys.update(token_mask_is_threshold_low=lo, token_mask_is_threshold_high=hi)
        elif c.agg in ("mean", "sum") and "sequence_mask_metric" not in keys:
            metric, prefix = _SEQ_MASK[c.agg]
            keys.update(sequence_mask_metric=metric, **{f"{prefix}_low": lo, f"{prefix}_high": hi})
        else:
            raise CannotExpress(f"SkyRL has no ratio criterion '{c.agg}' with these sides, or needs it twice")
    if comp.log_ratio_clamp != SAFETY_BOUND and not (own and "dppo" in own.values()):
        notes.append(f"SkyRL clamps log-ratios at +-20 (this correction: {comp.log_ratio_clamp})")
    elif comp.clamp_order != "aggregate" and any(c.statistic == "ratio" and c.agg in ("sum", "mean") for c in criteria):
        notes.append("SkyRL clamps a rollout's summed (mean) log-ratio at +-20, not each token's")
    adv_tau_note(comp.adv_tau, notes)
    return Settings({**own, **{f"{BLOCK}.{k}": v for k, v in keys.items()}}, notes)


def write(s: Settings) -> list[str]:
    return yaml(s.keys)


_ALGO_KEYS = ("policy_loss_type", "eps_clip_low", "eps_clip_high")
own_key = prefixed(f"{BLOCK}.", {**{k: f"{ALGO}.{k}" for k in _ALGO_KEYS},
                                 **{k: f"{ALGO}.dppo.{k}" for k in ("dppo_type", "delta_low", "delta_high")},
                                 **{k: f"{ALGO}.cispo.{k}" for k in ("cispo_eps_clip_low", "cispo_eps_clip_high",
                                                                     "cispo_anchor")},
                                 "score_centering": f"{ALGO}.score_centering_topk"})
# Score centering in SkyRL (#2244, open): trainer.algorithm.score_centering_topk, the head width (0: off), with the
# generator returning as many log-probs (generator.sampling_params.logprobs). The key as SkyRL's score-centering
# tests configure it (skyrl_train tests, "score_centering_topk": the search index's copies ids 69204233923 and
# 70242331882) and Marin's SkyRL fork runs it (marin-community/MarinSkyRL@1b5dd6b, docs: =32); #2244's own
# commit is not recorded. Its runs used 32.
SC_TOPK = 32
SC_COMMENTS = ["score centering (SkyRL #2244, open): trainer.algorithm.score_centering_topk is the sampler's head",
               f"width (0 turns it off; {SC_TOPK} as its runs), the generator returning as many log-probs; full-",
               "distribution sampling (top_p 1, top_k -1, min_p 0), regular PPO with one token TIS truncation"]


def own(cfg) -> Settings:
    """SkyRL's own preset: every knob at its key (the policy loss's under trainer.algorithm, DPPO's and CISPO's in
    their blocks, the rest in off_policy_correction); score_centering as the head width, only when on."""
    sc = cfg.score_centering
    skip = {} if sc else {"score_centering": "off (score_centering_topk 0, SkyRL's default; #2244 is open)"}
    extra = {"generator.sampling_params.logprobs": SC_TOPK} if sc else {}
    return own_settings(cfg, own_key, skip=skip, extra=extra, value=own_value,
                        comments=tuple(SC_COMMENTS) if sc else ())


def own_value(name: str, v):
    """score_centering on is the head width SkyRL reads (score_centering_topk)."""
    return (SC_TOPK if v else 0) if name == "score_centering" else v
