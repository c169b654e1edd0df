"""A composition as verl's `algorithm.rollout_correction` (bypass mode: pi_old = the sampler).

rollout_is: "token" / "sequence" weights, truncated at rollout_is_threshold or zeroed outside a "lower_upper"
band (IcePop); rollout_rs: comma-separated criteria on k1 = -l (a "lower_upper" band on mu/pi), k2, k3, per token
or a rollout's sum / mean / max; loss_type reinforce (-w A log pi) or ppo_clip (PPO on pi/mu, the actor's
clip_ratio and clip_ratio_c). A ratio band [lo, hi] on pi/mu is the k1 band "1/hi_1/lo". verl clamps every
log-ratio at +-20, so a bound below e^-20 never bites: an open lower side is written as 1e-10.
"""

from __future__ import annotations

import math

from ..core.compose import SAFETY_BOUND, Composition, Criterion
from ._format import CannotExpress, Settings, adv_tau_note, fmt, yaml
from ._parts import open_high, open_low, refuse_conditioned

HEADER = ["verl rollout correction in bypass mode (pi_old = the sampler's log-probs);",
          "k1 thresholds are 'lower_upper' on mu/pi: a band [lo, hi] on pi/mu is '1/hi_1/lo';",
          "verl leaves rejected tokens out of the loss denominator (seqis agg='kept-token-mean')"]
SUFFIX = "verl.yaml"
EDGE_SPACE = "log"  # rollout_corr_helper.py:316: (per_token_stat >= lower_log) & (per_token_stat <= upper_log)
BLOCK, ACTOR = "algorithm.rollout_correction", "actor_rollout_ref.actor"
NEVER_BITES = 1e-10  # below verl's e^-20 clamp: an open lower bound
_AGG = {"token": "token", "sum": "seq_sum", "mean": "seq_mean", "max": "seq_max"}
PARTS = frozenset({"centering"})  # the later parts it writes (_parts.later_parts): score centering, verl #8010
TOPK = 128  # the head verl's score-centering runs read (actor_rollout_ref.rollout.topk_log_probs)
SC_FLOOR = 1e-6  # score_centering_correction's eps: both tail masses clamped at it
SC_REFUSALS = ["score centering (verl #8010, after 0.9.1) runs with vLLM rollouts returning processed log-probs of",
               "the full support (top_p 1, top_k -1), the FSDP actor without fused kernels, no distillation;",
               "topk_log_probs is the head size K (vLLM's max_logprobs is raised to it); verl refuses score_centering",
               "with bypass_mode False, loss_type ppo_clip, rollout_is sequence, or a token rollout_is with",
               "rollout_is_batch_normalize (tests/trainer/config/test_score_centering_config.py at c6236f5)"]


def _k1_band(lo_l: float | None, hi_l: float | None) -> str:
    """A band lo_l <= -l <= hi_l (k1 units, log space) as verl's 'lower_upper' on mu/pi."""
    lower = NEVER_BITES if open_low(lo_l) else math.exp(lo_l)
    upper = math.inf if open_high(hi_l) else math.exp(hi_l)
    return f"{fmt(lower)}_{fmt(upper)}"


def _rejections(criteria: tuple[Criterion, ...]) -> list[tuple[str, str | float]]:
    """Each criterion as (rollout_rs option, its threshold: a 'lower_upper' string for k1, else a number)."""
    out: list[tuple[str, str | float]] = []
    extremes = {c.agg: c for c in criteria if c.statistic == "ratio" and c.agg in ("max", "min")}
    for c in criteria:
        if c.statistic == "prob_diff":
            raise CannotExpress("verl has no probability-difference criterion")
        if c.statistic == "ratio" and c.agg in ("max", "min"):
            continue
        if c.statistic == "ratio":  # lo <= ratio <= hi  <=>  -log hi <= -l <= -log lo
            lo_l = None if c.low is None or c.low <= 0 else -math.log(c.low)
            hi_l = None if open_high(c.high) else -math.log(c.high)
            out.append((f"{_AGG[c.agg]}_k1", _k1_band(hi_l, lo_l)))
        elif c.statistic == "k1":
            if c.agg in ("max", "min"):
                raise CannotExpress(f"verl has no {c.agg} of k1 (seq_max takes k2 or k3 only)")
            out.append((f"{_AGG[c.agg]}_k1", _k1_band(c.low, c.high)))
        else:  # k2, k3: an upper bound only
            if not (c.low is None or c.low <= 0) or open_high(c.high) or c.agg == "min":
                raise CannotExpress(f"verl's {c.statistic} criteria are an upper bound per token or on a rollout's "
                                    "sum / mean / max")
            out.append((f"{_AGG[c.agg]}_{c.statistic}", c.high))
    if extremes:  # every token's ratio in [lo, hi]: verl's seq_max_k2 bounds |l| <= sqrt(2 u), symmetric only
        hi, lo = extremes.get("max"), extremes.get("min")
        if hi is None or lo is None or open_high(hi.high) or lo.low is None or lo.low <= 0 \
                or not math.isclose(math.log(hi.high), -math.log(lo.low), rel_tol=1e-12):
            raise CannotExpress("verl bounds every token of a rollout only symmetrically in log space "
                                "(seq_max_k2: |l| <= b); this band is one-sided or asymmetric")
        out.append(("seq_max_k2", 0.5 * math.log(hi.high) ** 2))
    if len({opt for opt, _ in out}) < len(out):
        raise CannotExpress("verl takes each rollout_rs option once; this needs one twice")
    return out


def settings(comp: Composition) -> Settings:
    if comp.penalty is not None:
        raise CannotExpress("verl has no penalty against the sampler in the loss (its KL loss is to a reference "
                            "model)")
    notes: list[str] = []
    ppo, criteria = comp.ppo_clip() or (None, comp.criteria)
    refuse_conditioned(criteria, "verl")
    w = comp.weight
    keys: dict = dict(rollout_is=None, rollout_is_threshold=2.0, rollout_is_batch_normalize=False)
    actor: dict = {}
    if ppo is None and w.level != "none":
        if w.level not in ("token", "sequence"):
            raise CannotExpress(f"verl's IS weights are token or sequence level, not {w.level}")
        if w.clip_low > 0:
            raise CannotExpress("verl truncates IS weights from above only (no lower clamp)")
        if w.band is not None and not math.isinf(w.upper):
            raise CannotExpress("verl's IS weight is truncated or banded, not both")
        lo, hi = w.band if w.band is not None else (None, w.upper)
        threshold = hi if lo is None else f"{fmt(max(lo, NEVER_BITES))}_{fmt(hi)}"
        keys.update(rollout_is=w.level, rollout_is_threshold=threshold,
                    rollout_is_batch_normalize=w.self_normalize)
    rs = _rejections(criteria)
    thresholds = rs[0][1] if len(rs) == 1 else ",".join(t if isinstance(t, str) else fmt(t) for _, t in rs) or None
    keys.update(rollout_rs=",".join(o for o, _ in rs) or None, rollout_rs_threshold=thresholds, bypass_mode=True,
                loss_type="reinforce" if ppo is None else "ppo_clip")
    if ppo is not None:
        actor = dict(clip_ratio_low=ppo.eps_low, clip_ratio_high=ppo.eps_high,
                     clip_ratio_c=math.inf if ppo.clip_c is None else ppo.clip_c)
    if comp.centering is not None:
        keys.update(score_centering=True)
        actor.update(_centering(comp, keys))
    if comp.log_ratio_clamp != SAFETY_BOUND:
        notes.append(f"verl clamps log-ratios at +-20 (this correction: {comp.log_ratio_clamp}); they differ only "
                     "where |l|, |S| or |S/T| exceeds 20")
    adv_tau_note(comp.adv_tau, notes)
    rollout = {"calculate_log_probs": True, **({"topk_log_probs": TOPK} if comp.centering is not None else {})}
    return Settings({**{f"{BLOCK}.{k}": v for k, v in keys.items()}, **{f"{ACTOR}.{k}": v for k, v in actor.items()},
                     **{f"actor_rollout_ref.rollout.{k}": v for k, v in rollout.items()}}, notes,
                    comments=SC_REFUSALS if comp.centering is not None else [])


def _centering(comp: Composition, keys: dict) -> dict:
    """verl's score centering: bypass REINFORCE with no IS weight or a token TIS / IcePop weight whose rule is the
    centering's f, verl's tail floors, the head of the sampler's top-k (not a replayed support); the actor's side
    repeats the settings (verl's driver checks that they match). Returns the actor's keys."""
    sc, w = comp.centering, comp.weight
    if sc.exact:
        raise CannotExpress("verl's score centering models the tail; it has no exact replayed-support variant")
    if sc.sampler_floor != SC_FLOOR or sc.trainer_floor != SC_FLOOR:
        raise CannotExpress(f"verl clamps both tail masses at {SC_FLOOR:g} (this correction: sampler "
                            f"{sc.sampler_floor}, trainer {sc.trainer_floor})")
    rule = {None: "none", "token": "truncate" if w.band is None else "band"}.get(keys["rollout_is"])
    if rule is None or comp.criteria or w.self_normalize:
        raise CannotExpress("verl's score centering composes with bypass REINFORCE and a token TIS or IcePop weight "
                            "only (no sequence weight, rejection or batch normalisation)")
    edges = (None, w.upper) if rule == "truncate" else w.band  # the weight's own rule's edges
    same = rule == sc.rule and (rule == "none" or (sc.low, sc.high) == edges)
    if not same:
        raise CannotExpress(f"verl's score centering applies the IS weight's own rule to the head ({rule}); this "
                            f"correction's centering rule is {sc.describe()}")
    return _actor_side(keys)


def _actor_side(keys: dict) -> dict:
    """The actor's score-centering keys: bypass_mode's loss and the correction's keys repeated (verl's driver checks
    that they match the algorithm's)."""
    mirror = {k: keys[k] for k in ("rollout_is", "rollout_is_threshold", "bypass_mode", "loss_type")}
    return {"policy_loss.loss_mode": "bypass_mode", "policy_loss.rollout_correction.score_centering": True,
            **{f"policy_loss.rollout_correction.{k}": v for k, v in mirror.items()}}


def own(cfg) -> Settings:
    """A verl preset's own settings (a `VerlConfig`, whose fields are verl's names), key by key as the preset sets
    them. A composition cannot tell decoupled mode from bypass REINFORCE (at the first minibatch PPO's pi_theta /
    pi_old is 1, so the gradients agree), nor carry the actor's clip when the loss is not PPO's: `settings(comp)`
    writes bypass mode for every correction, this writes the preset's own mode, loss type and clip."""
    lower_upper = lambda lo, hi: hi if lo is None else f"{fmt(lo)}_{fmt(hi)}"  # verl's 'lower_upper' threshold
    rs_threshold = cfg.rollout_rs_threshold
    if cfg.rollout_rs is not None and cfg.rollout_rs.endswith("_k1"):
        rs_threshold = lower_upper(cfg.rollout_rs_threshold_lower, cfg.rollout_rs_threshold)
    keys = dict(rollout_is=cfg.rollout_is,
                rollout_is_threshold=lower_upper(cfg.rollout_is_threshold_lower, cfg.rollout_is_threshold),
                rollout_is_batch_normalize=cfg.rollout_is_batch_normalize, rollout_rs=cfg.rollout_rs,
                rollout_rs_threshold=rs_threshold, bypass_mode=cfg.bypass_mode, loss_type=cfg.loss_type)
    notes: list[str] = []
    adv_tau_note(cfg.adv_tau, notes)
    sc = cfg.score_centering
    actor = {"clip_ratio": cfg.clip_ratio, "clip_ratio_c": cfg.clip_ratio_c}
    if sc:
        keys["score_centering"] = True
        actor.update(_actor_side(keys))
    rollout = {"calculate_log_probs": True, **({"topk_log_probs": TOPK} if sc else {})}
    return Settings({**{f"{BLOCK}.{k}": v for k, v in keys.items()}, **{f"{ACTOR}.{k}": v for k, v in actor.items()},
                     **{f"actor_rollout_ref.rollout.{k}": v for k, v in rollout.items()}}, notes,
                    comments=SC_REFUSALS if sc else [])


OWN_HEADER = ["verl's own settings for this preset (algorithm.rollout_correction and the actor's PPO clip), every key",
              "as the preset sets it; k1 thresholds are 'lower_upper' on mu/pi"]


def write(s: Settings) -> list[str]:
    return yaml(s.keys)
