"""Knob values fitted to a batch: the rollout bands that drop the batch's outlying rollouts and keep the rest.

Why: a trajectory band's default edges ([0.996, 1.001] for mis_po) were tuned on another model and engine; on a
batch with per-token noise 0.04 they drop a quarter of the rollouts, bad and good alike, while a band fitted to the
batch ([0.9825, 1.045] in the issue's case) drops exactly the few rollouts that are off. The advice proposes such
edges wherever a band's threshold decides what a correction keeps.

Outlying rollouts (`outlying_rollouts`): under a common per-token noise s, a rollout's mean log-ratio
g_j = S_j / T_j scatters around the batch's centre m with standard error s / sqrt(T_j). So
u_j = (g_j - m) sqrt(T_j) is ~ N(0, s^2) for every typical rollout whatever its length; m is the median of g and s
comes from the median absolute deviation of u (1.4826 MAD: a few bad rollouts cannot inflate it). A rollout is
outlying when |u_j| / s exceeds z* = max(4, Phi^-1(1 - 0.05 / (2 n))) (n valid rollouts: on a batch of pure noise,
about one batch in twenty has a false one). A catastrophic token (|l| = 20 in 300 tokens: g moves by 0.07, 25
standard errors), a group sampled by a drifted or lagged engine, all show here.

Fitted edges (`fit_bands`): for a correction whose rollout band (geometric exp(S/T) or product exp(S), unconditioned
on the advantage) comes from a knob, found by probing the composition (no branch on a name), each edge is put where
it drops the most of the outlying rollouts' tokens for the fewest of the typical ones' (`best_cut`: a single band
cannot follow the test's length-dependent edge, so a short typical rollout may lie beyond a long outlying one):
between the last rollout it drops and the first it keeps, no farther out than the bulk's z* bound; with nothing to
drop on that side, just beyond the outermost rollout. The value is the shortest decimal inside the middle half of
that gap. An edge that already drops exactly those is left as it is.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import torch

from ..core.ratios import Ratios
from ..core.types import Config
from ..registry import resolve, resolve_config

Z_FLOOR = 4.0  # the outlier test's least z, whatever the batch's size
FALSE_ALARM = 0.05  # the outlier test's chance of any false flag on a batch of pure noise (Bonferroni over rollouts)
MAD_SCALE = 1.4826  # MAD -> standard deviation for a normal
FITTED_LEVELS = ("geometric", "sequence")  # the rollout bands a fit moves: the statistic g_j or S_j
PROBE = 1e-3  # a knob is probed at (1 +- PROBE) x its value


@dataclass(frozen=True)
class Outliers:
    """The batch's outlying rollouts by their mean log-ratio (see the module docstring)."""

    flags: torch.Tensor  # (B,) bool: outlying valid rollouts
    z: torch.Tensor  # (B,) float64: (g_j - m) sqrt(T_j) / s, 0 for an empty rollout
    centre: float  # m: median of g_j over the valid rollouts
    s: float  # the typical rollouts' per-token spread
    z_crit: float  # the test's edge

    @property
    def count(self) -> int:
        return int(self.flags.sum())


def z_crit(n: int) -> float:
    """The outlier test's edge for n rollouts."""
    return max(Z_FLOOR, NormalDist().inv_cdf(1 - FALSE_ALARM / (2 * max(n, 1))))


@torch.no_grad()
def outlying_rollouts(r: Ratios) -> Outliers:
    """The rollouts whose mean log-ratio is off the batch's by more than z* of its length's standard errors."""
    valid = r.valid  # (B,)
    g = r.geo_log_ratio.double()  # (B,) S_j / T_j
    T = r.length.double()  # (B,)
    n = int(valid.sum())
    zc = z_crit(n)
    if n < 3:  # no bulk to measure against
        zero = torch.zeros_like(g)
        return Outliers(torch.zeros_like(valid), zero, float(g[valid].median()) if n else 0.0, 0.0, zc)
    m = float(g[valid].median())
    u = (g - m) * T.sqrt()  # (B,) ~ N(0, s^2) for a typical rollout
    uv = u[valid]
    s = MAD_SCALE * float((uv - uv.median()).abs().median())
    s = max(s, 1e-12 * max(1.0, float(uv.abs().max())))  # an exact batch: any departure is an outlier
    z = torch.where(valid, u / s, 0.0)  # (B,)
    return Outliers(valid & (z.abs() > zc), z, m, s, zc)


def _float_fields(cfg: Config) -> list[str]:
    return [f.name for f in dataclasses.fields(cfg) if f.name != "adv_tau" and isinstance(getattr(cfg, f.name), float)]


def _fittable(bands) -> dict[tuple[str, str], float]:
    """(level, side) -> edge of the unconditioned rollout bands a fit moves."""
    out = {}
    for b in bands:
        if b.level in FITTED_LEVELS and b.advantage is None:
            out[(b.level, "low")], out[(b.level, "high")] = b.low, b.high
    return out


def band_knobs(name: str, cfg: Config | None = None) -> dict[tuple[str, str], str]:
    """(level, side) -> the config field that sets that rollout band edge, one to one (the edge equals the knob),
    found by moving each float knob a little and reading the composition's bands."""
    return dict(_band_knobs(name, resolve_config(name, cfg)))


@functools.lru_cache(maxsize=512)
def _band_knobs(name: str, cfg: Config) -> tuple[tuple[tuple[str, str], str], ...]:
    base = _fittable(resolve(name, cfg).ratio_bands())
    found: dict[tuple[str, str], str] = {}
    for f in _float_fields(cfg):
        v = getattr(cfg, f)
        if not (0 < v < math.inf):
            continue
        for probe in (v * (1 + PROBE), v * (1 - PROBE)):
            try:
                moved = _fittable(resolve(name, dataclasses.replace(cfg, **{f: probe})).ratio_bands())
            except ValueError:  # the probe crossed the other edge
                continue
            changed = [k for k in base if moved.get(k) != base[k]]
            if len(changed) == 1 and base[changed[0]] == v and moved[changed[0]] == probe:
                found[changed[0]] = f
            break
    return tuple(found.items())


def statistic(r: Ratios, level: str) -> torch.Tensor:
    """(B,) float64: the log of the ratio a rollout band at `level` reads (geometric S_j / T_j, sequence S_j)."""
    return (r.geo_log_ratio if level == "geometric" else r.seq_log_ratio).double()


def bulk_bound(o: Outliers, r: Ratios, level: str, side: int) -> float:
    """The typical rollouts' z* bound on the statistic, outermost over the lengths present (side -1: low, +1: high)."""
    T = r.length.double()[r.valid]  # (n,)
    g_edge = o.centre + side * o.z_crit * o.s / T.sqrt()  # (n,) the bound on g_j at each length
    x = g_edge * T if level == "sequence" else g_edge
    return float(x.min() if side < 0 else x.max())


def short_decimal(lo: float, hi: float) -> float:
    """The shortest decimal in the middle half of (lo, hi) (lo < hi, both positive): a band edge a person can read."""
    a, b = lo + (hi - lo) / 4, hi - (hi - lo) / 4
    mid = (lo + hi) / 2
    for digits in range(1, 16):
        x = float(f"{mid:.{digits}g}")
        if a <= x <= b:
            return x
    return mid


def best_cut(x: torch.Tensor, flags: torch.Tensor, w: torch.Tensor, side: int, z: torch.Tensor) -> int:
    """How many of the outermost rollouts on one side (side -1: lowest x first, +1: highest) a band edge should drop:
    the k maximising (share of this side's flagged rollouts' tokens dropped) - (share of the typical rollouts'
    tokens dropped); the fewest on a tie (0: none). The other side's flagged rollouts neither count nor cost."""
    order = torch.argsort(x * side, descending=True)  # (n,) outermost first
    mine = (flags & (z * side > 0))[order]  # (n,) flagged on this side
    typical = ~flags[order]
    ww = w[order].double()
    total_f, total_t = float(ww[mine].sum()), float(ww[typical].sum())
    gain = (torch.where(mine, ww, 0.0).cumsum(0) / max(total_f, 1e-300)
            - torch.where(typical, ww, 0.0).cumsum(0) / max(total_t, 1e-300))  # (n,) dropping the k + 1 outermost
    gain = torch.cat([torch.zeros(1, dtype=gain.dtype), gain])  # (n + 1,) k = 0 .. n
    return int(torch.argmax(gain))  # the first maximum: the fewest dropped


def _edge(x: torch.Tensor, flags: torch.Tensor, w: torch.Tensor, z: torch.Tensor, current: float, side: int,
          bound: float) -> float | None:
    """A new edge (a ratio) for one side of a band, or None when the current edge already drops what `best_cut`
    drops there. The edge sits between the first rollout kept and the last dropped, or the bulk's z* bound when
    that is nearer the kept one (with none dropped: between the outermost rollout and the bound)."""
    k = best_cut(x, flags, w, side, z)
    ordered = torch.sort(x * side, descending=True).values * side  # (n,) outermost first
    if k >= len(ordered):  # every rollout flagged on this side: nothing to keep
        return None
    inner = float(ordered[k])  # the first kept rollout
    outer = float(ordered[k - 1]) if k else (-math.inf if side < 0 else math.inf)
    cur = math.log(current) if 0 < current < math.inf else (-math.inf if current <= 0 else math.inf)
    if (cur - inner) * side >= 0 and (outer - cur) * side > 0:  # keeps the first kept, drops the last dropped
        return None
    if (bound - inner) * side > 0:  # the bulk's bound beyond the kept rollout: no farther than it
        outer = bound if (outer - bound) * side > 0 else outer
    if not math.isfinite(outer) or (outer - inner) * side <= 0:  # a little room beyond the kept rollout
        outer = inner + side * (abs(inner) * 1e-3 + 1e-9)
    lo, hi = sorted((outer, inner))
    return short_decimal(math.exp(lo), math.exp(hi))


def fit_bands(name: str, cfg: Config | None, r: Ratios, o: Outliers) -> tuple[Config, tuple[str, ...]] | None:
    """(config with the rollout bands fitted, the knobs moved), or None when there is nothing to fit (no such
    band, no edge to move, or fewer than three typical rollouts)."""
    cfg = resolve_config(name, cfg)
    knobs = band_knobs(name, cfg)
    if not knobs or int((r.valid & ~o.flags).sum()) < 3:
        return None
    valid = r.valid
    flags, w, z = o.flags[valid], r.length[valid], o.z[valid]  # (n,) each
    changes: dict[str, float] = {}
    for (level, side_name), field in knobs.items():
        side = -1 if side_name == "low" else 1
        x = statistic(r, level)[valid]  # (n,)
        e = _edge(x, flags, w, z, getattr(cfg, field), side, bulk_bound(o, r, level, side))
        if e is not None:
            changes[field] = e
    if not changes:
        return None
    try:
        return dataclasses.replace(cfg, **changes), tuple(changes)
    except ValueError:  # the fitted edges cross (the outliers sit on both sides of every typical rollout)
        return None
