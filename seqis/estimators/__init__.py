"""The estimator registry: one row per estimator, and `run`, the only dispatcher.

A new estimator is one new file (a config dataclass and a pure function `fn(Ratios, cfg) -> Correction`)
and one new row in ESTIMATORS; the app, the tests and the benchmark pick it up from this table.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..types import Config
from ._common import AGGREGATIONS, Correction, Ratios
from .geo_is import GeoISConfig, geo_is
from .geo_mask import GeoMaskConfig, geo_mask
from .icepop import IcePopConfig, icepop
from .max_mask import MaxMaskConfig, max_mask
from .mis_po import MISPOConfig, mis_po
from .pg import PGConfig, pg
from .prefix_is import PrefixISConfig, prefix_is
from .seq_is import SeqISConfig, seq_is
from .seq_mis import SeqMISConfig, seq_mis
from .seq_mis_product import SeqMISProductConfig, seq_mis_product
from .seq_tis import SeqTISConfig, seq_tis
from .token_tis import TokenTISConfig, token_tis


@dataclass(frozen=True)
class EstimatorSpec:
    """name, the pure function, its config class, a one-line summary, a LaTeX formula for the weight,
    and whether it is one of the four seed estimators (the rest are references for comparison)."""

    name: str
    fn: Callable[[Ratios, Config], Correction]
    config: type[Config]
    summary: str
    formula: str
    seed: bool = False

    def section(self, heading: str) -> str:
        """A paragraph of the estimator's module docstring: "Trades", "Reduces to" or "Source"."""
        doc = sys.modules[self.fn.__module__].__doc__ or ""
        m = re.search(rf"^{heading}:(.*?)(?=^\w[\w ]*:|\Z)", doc, flags=re.S | re.M)
        return " ".join(m.group(1).split()) if m else ""


_ROWS = [
    EstimatorSpec("seq_tis", seq_tis, SeqTISConfig, "Truncated sequence IS: min(w_j, C) on every token.",
                  r"\min\big(w_j,\ C\big),\quad w_j = \exp S_j", seed=True),
    EstimatorSpec("seq_mis", seq_mis, SeqMISConfig,
                  "Geometric gate on exp(S/T), untempered product weight w_j inside it.",
                  r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
                  r"\cdot \min\big(w_j,\ e^{40}\big)", seed=True),
    EstimatorSpec("geo_mask", geo_mask, GeoMaskConfig,
                  "Geometric trust region: a pure 0/1 filter on exp(S/T), optional token clip.",
                  r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
                  r"\cdot \big(1\ \text{or}\ \min(\rho_t, C)\big)",
                  seed=True),
    EstimatorSpec("mis_po", mis_po, MISPOConfig, "Token band times trajectory band (Step 3.5 Flash).",
                  r"\mathbb{1}\big[t_{lo} \le \rho_t \le t_{hi}\big]\cdot\mathbb{1}\big[g_{lo} \le e^{S_j/T_j}"
                  r" \le g_{hi}\big]", seed=True),
    EstimatorSpec("pg", pg, PGConfig, "No correction: plain REINFORCE on the sampler's tokens.", r"1"),
    EstimatorSpec("seq_is", seq_is, SeqISConfig, "Untruncated sequence IS: unbiased, variance ~ (1+chi2)^T.",
                  r"\min\big(w_j,\ e^{40}\big)"),
    EstimatorSpec("token_tis", token_tis, TokenTISConfig, "Truncated token IS: min(rho_t, C) per token.",
                  r"\min\big(\rho_t,\ C\big)"),
    EstimatorSpec("icepop", icepop, IcePopConfig, "IcePop: rho_t where it lies in a band, else 0.",
                  r"\rho_t\cdot\mathbb{1}\big[\mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"),
    EstimatorSpec("seq_mis_product", seq_mis_product, SeqMISProductConfig,
                  "Li's Seq-MIS: drop rollouts with w_j > C, keep w_j otherwise.",
                  r"\mathbb{1}\big[w_j \le C\big]\cdot w_j"),
    EstimatorSpec("geo_is", geo_is, GeoISConfig, "GeoMean IS: the geometric ratio exp(S/T) as the weight.",
                  r"\min\big(e^{S_j/T_j},\ C\big)"),
    EstimatorSpec("prefix_is", prefix_is, PrefixISConfig, "Cumulative prefix ratio up to each token.",
                  r"\min\Big(\exp\sum_{s\le t} \ell_s,\ C\Big)"),
    EstimatorSpec("max_mask", max_mask, MaxMaskConfig, "Drop a rollout if any token's ratio leaves the band.",
                  r"\mathbb{1}\big[\forall t:\ \mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"),
]

ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in _ROWS}
SEED_ESTIMATORS: tuple[str, ...] = tuple(s.name for s in _ROWS if s.seed)

from .dispatch import resolve_config, run, run_many  # noqa: E402  (reads ESTIMATORS)

__all__ = ["ESTIMATORS", "SEED_ESTIMATORS", "AGGREGATIONS", "EstimatorSpec", "Ratios", "Correction", "resolve_config",
           "run", "run_many"]
