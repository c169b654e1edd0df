"""A composition as OpenRLHF flags (openrlhf >= 0.11, #1339): --algo.advantage.is_correction_level token with mode
clip clamps rho_t to [low, high] (tis), with mode mask zeroes it outside (icepop); level seq keeps raw rho_t on
rollouts whose geometric ratio lies in [low, high] (seq-mask-tis). GSPO against the sampler is
--actor.policy_loss_type gspo with the correction on (PPO-clip on the geometric ratio, a per-rollout mean loss)."""

from __future__ import annotations

from ..core.compose import Composition
from ._format import CannotExpress, Settings, adv_tau_note, flags
from ._parts import token_is_mode

HEADER = ["OpenRLHF train_ppo_ray flags (openrlhf >= 0.11)"]
SUFFIX = "openrlhf.sh"
EDGE_SPACE = "ratio"  # loss.py:238: (stat >= low) & (stat <= high), stat = exp(l) or exp(mean l)
_NO = "OpenRLHF's IS correction is a token ratio clamped (tis), banded (icepop) or gated by the geometric ratio"
_A = "--algo.advantage.is_correction"
_LEVEL_MODE = {"tis": ("token", "clip"), "icepop": ("token", "mask"), "seq-mask-tis": ("seq", "mask")}


def _gspo(comp: Composition) -> Settings | None:
    """GSPO's sign-conditioned pair on the geometric ratio with the geometric weight, if that is the composition."""
    if not comp.weight.plain("geometric") or len(comp.criteria) != 2:
        return None
    up = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage, c.low) == ("ratio", "mean", "positive", None)]
    down = [c for c in comp.criteria if (c.statistic, c.agg, c.advantage) == ("ratio", "mean", "negative")]
    if len(up) != 1 or len(down) != 1 or up[0].high is None or down[0].low is None:
        return None
    eps = (float(f"{1.0 - down[0].low:.15g}"), float(f"{up[0].high - 1.0:.15g}"))
    return Settings({"--actor.policy_loss_type": "gspo", "--actor.eps_clip_low_high": eps,
                     "--actor.dual_clip": down[0].high, f"{_A}_level": "token",
                     "--actor.loss_agg_mode": "seq-mean-token-mean"})


def settings(comp: Composition) -> Settings:
    w, crit, notes = comp.weight, comp.criteria, []
    if comp.penalty is not None:
        raise CannotExpress("OpenRLHF's KL term is to a reference model, not the sampler")
    if w.level == "none" and not crit:
        return Settings({f"{_A}_level": "off"})
    if (s := _gspo(comp)) is not None:
        adv_tau_note(comp.adv_tau, s.notes)
        return s
    kind, lo, hi = token_is_mode(comp, _NO)
    kind = kind or "tis"  # a plain token ratio: clip with open bounds
    if comp.log_ratio_clamp is not None:
        notes.append(f"OpenRLHF clamps no log-ratio of the IS weight (this correction: +-{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    level, mode = _LEVEL_MODE[kind]
    return Settings({f"{_A}_level": level, f"{_A}_mode": mode, f"{_A}_gating": "ratio",
                     f"{_A}_threshold": (lo, hi)}, notes)


def write(s: Settings) -> list[str]:
    return flags(s.keys)


# a knob -> (its flag, its place among the flag's values): two knobs are one flag's pair of values
OWN_FLAGS = {"is_correction_level": (f"{_A}_level", 0), "is_correction_mode": (f"{_A}_mode", 0),
             "is_correction_threshold_low": (f"{_A}_threshold", 0),
             "is_correction_threshold_high": (f"{_A}_threshold", 1),
             "policy_loss_type": ("--actor.policy_loss_type", 0), "eps_clip_low": ("--actor.eps_clip_low_high", 0),
             "eps_clip_high": ("--actor.eps_clip_low_high", 1), "dual_clip": ("--actor.dual_clip", 0)}


def own_key(name: str, cfg=None) -> tuple[str, int]:
    return OWN_FLAGS.get(name, (f"--{name}", 0))


def own(cfg) -> Settings:
    """OpenRLHF's own preset: every flag the preset sets (a pair of knobs as one flag's two values); the gating
    metric is the ratio (what the preset's thresholds bound), and GSPO's loss is a per-rollout mean."""
    keys: dict = {}
    for name, v in cfg.as_dict().items():
        if name != "adv_tau":
            flag, _ = OWN_FLAGS[name]  # in OWN_FLAGS's order: low before high
            keys[flag] = (*keys.get(flag, ()), v)
    keys = {k: v[0] if len(v) == 1 else v for k, v in keys.items()}
    keys[f"{_A}_gating"] = "ratio"
    if cfg.policy_loss_type == "gspo":
        keys["--actor.loss_agg_mode"] = "seq-mean-token-mean"
    notes: list[str] = []
    adv_tau_note(cfg.adv_tau, notes)
    return Settings(keys, notes)
