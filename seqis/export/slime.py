"""A composition as slime command-line flags: --use-tis (vanilla TIS or IcePop), the MIS example's
--custom-config-path YAML, or --use-opsm with --use-rollout-logprobs (PPO-clip on pi/mu).
"""

from __future__ import annotations

import math

from ..core.compose import SAFETY_BOUND, Composition, Criterion
from ._format import CannotExpress, Settings, adv_tau_note, flags, yaml
from ._own import dashed, own_settings

HEADER = ["slime training flags"]
SUFFIX = "slime.sh"
PARTS = frozenset({"clamp_order", "normalize_all"})  # the later parts it writes (_parts.later_parts)
_ICEPOP = "slime.backends.megatron_utils.loss.icepop_function"
_MIS = "examples.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"
_AGG_LEVEL = {"token": "token", "sum": "sequence", "mean": "geometric"}  # a ratio criterion's agg -> slime level


def _opsm(comp: Composition) -> Settings | None:
    ppo, rest = comp.ppo_clip() or (None, comp.criteria)
    if ppo is None or len(rest) != 1:
        return None
    c = rest[0]
    if (c.statistic, c.agg, c.advantage, c.low) != ("k1", "mean", "negative", None) or c.high is None:
        return None
    return Settings({"--use-rollout-logprobs": True, "--use-opsm": True, "--opsm-delta": c.high,
                     "--eps-clip": ppo.eps_low, "--eps-clip-high": ppo.eps_high, "--eps-clip-c": ppo.clip_c})


def _mis(comp: Composition, path: str) -> Settings:
    """The MIS example's YAML (written into the flags' comment) for a weight with ratio rejections."""
    w, rs, veto = comp.weight, [], None
    for c in comp.criteria:
        if c.statistic == "ratio" and c.agg == "min" and c.high is None and c.advantage is None:
            veto = c.low
        elif c.statistic == "ratio" and c.agg in _AGG_LEVEL and c.advantage is None:
            rs.append(c)
        else:
            raise CannotExpress("slime's MIS rejects by ratio bands (token / sequence / geometric) and a per-token "
                                f"veto only, not {c.statistic} {c.agg}")
    if len(rs) > 1 or w.level not in ("token", "sequence", "geometric") or w.band is not None:
        raise CannotExpress("slime's MIS takes one weight level (truncated or clipped) and one RS band")
    mode = "clip" if w.clip_low > 0 else "truncate"
    if math.isinf(w.upper) and w.clip_low == 0:
        raise CannotExpress("slime's MIS always bounds its weight (truncate, clip or mask)")
    r: Criterion | None = rs[0] if rs else None
    use_rs = r is not None or veto is not None
    cfg = dict(use_tis=True, use_rs=use_rs, tis_level=w.level, tis_mode=mode,
               tis_lower_bound=w.clip_low or None, tis_upper_bound=w.upper,
               rs_level=_AGG_LEVEL[r.agg] if r else w.level, **_rs_band(r, use_rs), rs_veto_threshold=veto,
               tis_batch_normalize=w.self_normalize)
    return Settings({"--use-tis": True, "--custom-tis-function-path": path, "--custom-config-path": "mis.yaml"},
                    files={"mis.yaml": yaml(cfg)})


def _rs_band(r: Criterion | None, use_rs: bool) -> dict:
    """The RS band's bounds, each written out: mis.py fills an unset one from the TIS bounds (rs_lower_bound from
    tis_lower_bound or 1 / tis_upper_bound, rs_upper_bound from tis_upper_bound: THUDM/slime@624b824 mis.py lines
    174-176), a band the composition may not have; the veto runs only under use_rs, so a veto alone gets [0, inf]
    (the RS ratio is exp of a log-ratio clamped at +-20: nothing is rejected)."""
    if not use_rs:
        return dict(rs_lower_bound=None, rs_upper_bound=None)
    low = r.low if r is not None and r.low is not None else 0.0
    high = r.high if r is not None and r.high is not None else math.inf
    return dict(rs_lower_bound=low, rs_upper_bound=high)


def settings(comp: Composition, icepop: str = _ICEPOP, mis: str = _MIS) -> Settings:
    """slime's flags; Miles takes the same with its own function paths (icepop, mis)."""
    if comp.penalty is not None:
        raise CannotExpress("slime's KL loss is to a reference model, not the sampler")
    w, notes = comp.weight, []
    if (s := _opsm(comp)) is not None:
        pass
    elif comp.criteria or w.self_normalize or w.level != "token":
        s = _mis(comp, mis)
    elif w.band is not None and math.isinf(w.upper) and w.clip_low == 0:
        s = Settings({"--use-tis": True, "--custom-tis-function-path": icepop, "--tis-clip-low": w.band[0],
                      "--tis-clip": w.band[1]})
    elif w.band is None and not w.plain("token"):
        s = Settings({"--use-tis": True, "--tis-clip": w.upper, "--tis-clip-low": w.clip_low})
    else:
        raise CannotExpress("slime's --use-tis bounds the token ratio (clamp or IcePop band)")
    uses_mis = "--custom-config-path" in s.keys
    if uses_mis and comp.clamp_order != "aggregate" and comp.log_ratio_clamp is not None and any(
            c.statistic == "ratio" and c.agg in ("sum", "mean") for c in comp.criteria):
        notes.append("slime's MIS clamps a rollout's summed (mean) log-ratio at +-20, not each token's")
    if comp.log_ratio_clamp != (SAFETY_BOUND if uses_mis else None):
        notes.append(f"slime {'clamps at +-20' if uses_mis else 'clamps no log-ratio'} here (this correction: "
                     f"{comp.log_ratio_clamp})")
    adv_tau_note(comp.adv_tau, notes)
    return Settings(s.keys, notes, s.files)


def write(s: Settings) -> list[str]:
    return flags(s.keys)


MIS_FILE = "mis.yaml"
_MIS_KNOBS = ("tis_level", "tis_mode", "tis_lower_bound", "tis_upper_bound", "use_rs", "rs_level", "rs_lower_bound",
              "rs_upper_bound", "rs_veto_threshold", "tis_batch_normalize")  # the MIS example's YAML keys
_FUNCTION = ("tis_function", "icepop")  # knobs naming the TIS function: --custom-tis-function-path


def own_key(name: str, cfg=None) -> str:
    """A knob as its flag (tis_clip_low: --tis-clip-low), the MIS example's knobs as keys of its YAML file
    ("mis.yaml:tis_level"), the TIS function as --custom-tis-function-path."""
    if name in _MIS_KNOBS:
        return f"{MIS_FILE}:{name}"
    return "--custom-tis-function-path" if name in _FUNCTION else dashed(name)


def own_value(name: str, v, icepop: str = _ICEPOP):
    """The function path a TIS-function knob names (vanilla TIS: the flag left out, slime's default)."""
    if name not in _FUNCTION:
        return v
    return None if v in (False, "vanilla") else icepop  # tis_function's other value, or icepop=True


def own(cfg, icepop: str = _ICEPOP, mis: str = _MIS, extra: dict | None = None,
        comments: tuple[str, ...] = ()) -> Settings:
    """slime's own preset (Miles's with its function paths): every knob as its flag, the MIS example's in its YAML
    with the flags that load it; OPSM reads the sampler's log-probs (--use-rollout-logprobs)."""
    s = own_settings(cfg, own_key, value=lambda n, v: own_value(n, v, icepop), extra=extra, comments=comments)
    keys = {k: v for k, v in s.keys.items() if not k.startswith(f"{MIS_FILE}:")}
    side = {k.split(":", 1)[1]: v for k, v in s.keys.items() if k.startswith(f"{MIS_FILE}:")}
    lead: dict = {}
    if side:
        lead = {"--use-tis": True, "--custom-tis-function-path": mis, "--custom-config-path": MIS_FILE}
        side = {"use_tis": True, **side}
    elif "--opsm-delta" in keys:
        lead = {"--use-rollout-logprobs": True, "--use-opsm": True}
    elif "--tis-clip" in keys and "--use-tis" not in keys:
        lead = {"--use-tis": True}
    return Settings({**lead, **keys}, s.notes, files={MIS_FILE: yaml(side)} if side else {}, comments=s.comments)
