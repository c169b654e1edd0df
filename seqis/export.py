"""An estimator's settings as config snippets for the trainers it came from: prime-rl TOML and verl YAML.

    from seqis.export import prime_rl_toml, verl_yaml
    print(prime_rl_toml("seq_tis", ESTIMATORS["seq_tis"].config(seq_clip=3.0)))

prime-rl: the trainer's `[loss]` table (`[trainer.loss]` in a combined rl.toml) of its masked-IS default
loss: `ratio_type` ("token": the weight is rho_t; "sequence": the weight is w_j, truncated at
`sequence_clip_high`), token / sequence-max / geometric bands (`token_mask_*`, `sequence_mask_*`,
`geo_mask_*`), `adv_tau`, `kl_tau`. Releases from March 2026 replaced that default loss; there, load an
estimator as `loss.type = "custom"`.

verl: `algorithm.rollout_correction` in bypass mode with the REINFORCE loss (pi_theta / pi_rollout with
no PPO clip, which is what seqis computes): `rollout_is` ("token" / "sequence" weights, truncated at
`rollout_is_threshold`, or "lower_upper" for IcePop's zeroing band), `rollout_rs` (comma-separated
rejection criteria such as "token_k1", "seq_mean_k1", "seq_max_k2"), `rollout_rs_threshold`. verl's k1
statistic is -l = log(mu / pi), so a seqis band [lo, hi] on pi / mu becomes verl's "1/hi_1/lo".

Where a knob has no equivalent, or the trainer weighs tokens differently, the snippet says so in a
comment line; `Snippet.exact` is False then. Pure Python: no torch, no streamlit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .estimators import resolve_config
from .types import Config

INF = math.inf


@dataclass
class Mapping:
    """One trainer's keys for one estimator setting, and what does not carry over."""

    keys: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.notes


@dataclass(frozen=True)
class Snippet:
    text: str  # the TOML / YAML text, comments included
    exact: bool  # True when every knob maps and the trainer computes the same weights
    filename: str  # a file name for a download


def _fmt(x: float) -> str:
    """A float in full (repr) precision: 1/1.001 must not round the band's edge."""
    return repr(float(x))


def describe(name: str, cfg: Config | None = None) -> str:
    """'seq_tis: seq_clip=2.0, adv_tau=1.0'"""
    cfg = resolve_config(name, cfg)
    knobs = ", ".join(f"{k}={v}" for k, v in cfg.as_dict().items())
    return f"{name}: {knobs}" if knobs else name


# ---------------------------------------------------------------------------------------------------------
# prime-rl


_PRIME_OFF = dict(token_mask_low=0.0, token_mask_high=INF, sequence_mask_low=0.0, sequence_mask_high=INF,
                  geo_mask_low=0.0, geo_mask_high=INF, sequence_clip_high=INF)
_RHO_NOT_ONE = "prime-rl weighs each kept token by rho_t (ratio_type token); {name} weighs it 1"


def prime_rl_mapping(name: str, cfg: Config | None = None) -> Mapping:
    """prime-rl LossConfig keys for an estimator setting (all bands listed; 0 / inf switch one off)."""
    cfg = resolve_config(name, cfg)
    k = dict(ratio_type="token", **_PRIME_OFF)
    notes: list[str] = []
    if name == "seq_tis":
        k.update(ratio_type="sequence", sequence_clip_high=cfg.seq_clip)
    elif name == "seq_mis":
        k.update(ratio_type="sequence", geo_mask_low=cfg.geo_mask_low, geo_mask_high=cfg.geo_mask_high)
    elif name == "seq_is":
        k.update(ratio_type="sequence")
    elif name == "geo_mask":
        k.update(geo_mask_low=cfg.geo_mask_low, geo_mask_high=cfg.geo_mask_high)
        if cfg.token_clip is None:
            notes.append(_RHO_NOT_ONE.format(name=name))
        else:
            notes.append(f"token_clip={cfg.token_clip} has no prime-rl key: kept tokens weigh rho_t, unclipped")
    elif name == "mis_po":
        k.update(token_mask_low=cfg.token_mask_low, token_mask_high=cfg.token_mask_high,
                 geo_mask_low=cfg.geo_mask_low, geo_mask_high=cfg.geo_mask_high)
        notes.append(_RHO_NOT_ONE.format(name=name))
    elif name == "icepop":
        k.update(token_mask_low=cfg.token_mask_low, token_mask_high=cfg.token_mask_high)
    elif name == "max_mask":
        k.update(sequence_mask_low=cfg.token_mask_low, sequence_mask_high=cfg.token_mask_high)
        notes.append(_RHO_NOT_ONE.format(name=name))
    elif name == "pg":
        notes.append(_RHO_NOT_ONE.format(name=name) + " (prime-rl always applies a ratio)")
    elif name == "token_tis":
        notes.append(f"token_clip={cfg.token_clip} has no prime-rl key: tokens weigh rho_t, unclipped")
    elif name == "seq_mis_product":
        k.update(ratio_type="sequence")
        notes.append(f"seq_clip={cfg.seq_clip} has no prime-rl key: it rejects on the product ratio, "
                     "prime-rl's sequence_mask_* bands act on the largest token ratio")
    else:
        notes.append(f"{name} has no prime-rl LossConfig equivalent; the keys below are plain token IS")
    k.update(adv_tau=cfg.adv_tau, kl_tau=0.0)
    if k["ratio_type"] == "sequence" and k["sequence_clip_high"] > math.exp(30):
        notes.append("prime-rl caps log w at 30 before truncating (seqis at 40)")
    return Mapping(k, notes)


def _literal(v: Any, *, inf: str, null: str, bare_str: bool) -> str:
    """A scalar as TOML or YAML writes it (the two differ only in inf, null and string quoting)."""
    if v is None:
        return null
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v if bare_str and v.isidentifier() else f'"{v}"'
    if isinstance(v, float) and math.isinf(v):
        return inf if v > 0 else "-" + inf
    if isinstance(v, float):
        return _fmt(v)
    return str(v)


def _snippet(name: str, cfg: Config, m: Mapping, header: list[str], body: list[str], suffix: str) -> Snippet:
    """A config file: comment lines (what it is, then the mapping's notes), then its body."""
    comments = [f"seqis {describe(name, cfg)}", *header, *(f"NOTE: {n}" for n in m.notes)]
    text = "\n".join([*(f"# {c}" for c in comments), *body]) + "\n"
    return Snippet(text, m.exact, f"{name}.{suffix}")


def _toml_value(v: Any) -> str:
    return _literal(v, inf="inf", null='""', bare_str=False)


def prime_rl_toml(name: str, cfg: Config | None = None) -> Snippet:
    cfg = resolve_config(name, cfg)
    m = prime_rl_mapping(name, cfg)
    header = ["prime-rl trainer loss (in a combined rl.toml the table is [trainer.loss]);", "0 / inf switch a band off"]
    body = ["[loss]", *(f"{key} = {_toml_value(v)}" for key, v in m.keys.items())]
    return _snippet(name, cfg, m, header, body, "prime-rl.toml")


# ---------------------------------------------------------------------------------------------------------
# verl


def _k1_band(lo: float, hi: float) -> str:
    """A seqis band lo <= pi/mu <= hi as verl's k1 threshold 'lower_upper' on mu/pi = exp(-l)."""
    lower = 1.0 / hi if hi > 0 else INF
    upper = 1.0 / lo if lo > 0 else INF
    return f"{_fmt(lower)}_{_fmt(upper)}"


def verl_mapping(name: str, cfg: Config | None = None) -> Mapping:
    """verl algorithm.rollout_correction keys for an estimator setting (bypass mode, REINFORCE loss)."""
    cfg = resolve_config(name, cfg)
    k: dict[str, Any] = dict(rollout_is=None, rollout_is_threshold=2.0, rollout_rs=None, rollout_rs_threshold=None)
    notes: list[str] = []
    cap = "verl bounds log w at 20 before truncating (seqis at 40)"
    if name == "seq_tis":
        k.update(rollout_is="sequence", rollout_is_threshold=cfg.seq_clip)
        if cfg.seq_clip > math.exp(20):
            notes.append(cap)
    elif name == "seq_is":
        k.update(rollout_is="sequence", rollout_is_threshold=INF)
        notes.append(cap)
    elif name == "seq_mis":
        k.update(rollout_is="sequence", rollout_is_threshold=INF, rollout_rs="seq_mean_k1",
                 rollout_rs_threshold=_k1_band(cfg.geo_mask_low, cfg.geo_mask_high))
        notes.append(cap)
    elif name == "geo_mask":
        k.update(rollout_rs="seq_mean_k1", rollout_rs_threshold=_k1_band(cfg.geo_mask_low, cfg.geo_mask_high))
        if cfg.token_clip is not None:
            k.update(rollout_is="token", rollout_is_threshold=cfg.token_clip)
    elif name == "mis_po":
        k.update(rollout_rs="token_k1,seq_mean_k1",
                 rollout_rs_threshold=_k1_band(cfg.token_mask_low, cfg.token_mask_high) + ","
                 + _k1_band(cfg.geo_mask_low, cfg.geo_mask_high))
    elif name == "token_tis":
        k.update(rollout_is="token", rollout_is_threshold=cfg.token_clip)
    elif name == "icepop":  # verl's "lower_upper" IS threshold zeroes weights outside the band (IcePop)
        k.update(rollout_is="token", rollout_is_threshold=f"{_fmt(cfg.token_mask_low)}_{_fmt(cfg.token_mask_high)}")
    elif name == "seq_mis_product":  # keep S <= log C: seq_sum_k1 = -S >= log(1/C), no other bound
        k.update(rollout_is="sequence", rollout_is_threshold=cfg.seq_clip, rollout_rs="seq_sum_k1",
                 rollout_rs_threshold=f"{_fmt(1.0 / cfg.seq_clip)}_inf")
    elif name == "max_mask":  # seq_max_k2: max_t l_t^2 / 2 <= u, i.e. |l_t| <= sqrt(2u) for every token
        lo, hi = math.log(cfg.token_mask_low) if cfg.token_mask_low > 0 else -INF, math.log(cfg.token_mask_high)
        bound = max(-lo, hi)
        k.update(rollout_rs="seq_max_k2", rollout_rs_threshold=0.5 * bound * bound)
        if not math.isclose(-lo, hi, rel_tol=1e-9):
            notes.append(f"verl's seq_max_k2 bounds |l_t| symmetrically: this uses |l_t| <= {_fmt(bound)}, "
                         f"looser than [{cfg.token_mask_low}, {cfg.token_mask_high}] on one side")
    elif name == "pg":
        pass
    else:
        notes.append(f"{name} has no verl rollout_correction equivalent (rollout_is takes token or sequence "
                     "weights only); the keys below apply no correction")
    if cfg.adv_tau != 1.0:
        notes.append(f"adv_tau={cfg.adv_tau} has no verl key: scale the advantages instead")
    k.update(bypass_mode=True, loss_type="reinforce")
    return Mapping(k, notes)


def _yaml_value(v: Any) -> str:
    return _literal(v, inf=".inf", null="null", bare_str=True)


def verl_yaml(name: str, cfg: Config | None = None) -> Snippet:
    cfg = resolve_config(name, cfg)
    m = verl_mapping(name, cfg)
    header = [
        "verl rollout correction, bypass mode + REINFORCE loss (pi_theta / pi_rollout, no PPO clip).",
        "k1 thresholds are 'lower_upper' on mu/pi: a seqis band [lo, hi] on pi/mu is '1/hi_1/lo'.",
        "verl leaves rejected tokens out of the loss denominator (seqis agg='kept-token-mean').",
    ]
    body = ["algorithm:", "  rollout_correction:", *(f"    {key}: {_yaml_value(v)}" for key, v in m.keys.items()),
            "actor_rollout_ref:", "  rollout:", "    calculate_log_probs: true"]
    return _snippet(name, cfg, m, header, body, "verl.yaml")


__all__ = ["Mapping", "Snippet", "describe", "prime_rl_mapping", "prime_rl_toml", "verl_mapping", "verl_yaml"]
