"""The estimator registry: one row per estimator, and `run`, the only dispatcher.

Every estimator is a Composition (compose.py): a new estimator is one new file (a frozen config dataclass and
`compose(cfg) -> Composition`, which reads as its formula) and one new row in ESTIMATORS; the app, the tests
and the benchmark pick it up from this table, and export, summaries and widgets read the composition.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from ..types import Config
from . import (
    geo_is,
    geo_mask,
    icepop,
    max_mask,
    mis_po,
    pg,
    prefix_is,
    seq_is,
    seq_mis,
    seq_mis_product,
    seq_tis,
    token_tis,
)
from ._common import AGGREGATIONS, Correction, Ratios
from .compose import Composition, Criterion, Penalty, Weight
from .evaluate import correction
from .geo_is import GeoISConfig
from .geo_mask import GeoMaskConfig
from .icepop import IcePopConfig
from .max_mask import MaxMaskConfig
from .mis_po import MISPOConfig
from .pg import PGConfig
from .prefix_is import PrefixISConfig
from .seq_is import SeqISConfig
from .seq_mis import SeqMISConfig
from .seq_mis_product import SeqMISProductConfig
from .seq_tis import SeqTISConfig
from .token_tis import TokenTISConfig


@dataclass(frozen=True)
class EstimatorSpec:
    """name, its composition as a function of its config, its config class, a one-line summary, a LaTeX formula
    for the weight, and whether it is one of the four seed estimators (the rest are references for comparison).
    A preset's estimator is an EstimatorSpec too (seqis.presets)."""

    name: str
    compose: Callable[[Config], Composition]
    config: type[Config]
    summary: str
    formula: str
    seed: bool = False

    def fn(self, r: Ratios, cfg: Config) -> Correction:
        """The correction on a batch's Ratios (the composition of cfg, evaluated)."""
        return correction(r, self.compose(cfg))

    def section(self, heading: str) -> str:
        """A paragraph of the estimator's module docstring: "Trades", "Reduces to" or "Source"."""
        doc = sys.modules[self.compose.__module__].__doc__ or ""
        m = re.search(rf"^{heading}:(.*?)(?=^\w[\w ]*:|\Z)", doc, flags=re.S | re.M)
        return " ".join(m.group(1).split()) if m else ""


_ROWS = [
    EstimatorSpec("seq_tis", seq_tis.compose, SeqTISConfig, "Truncated sequence IS: min(w_j, C) on every token.",
                  r"\min\big(w_j,\ C\big),\quad w_j = \exp S_j", seed=True),
    EstimatorSpec("seq_mis", seq_mis.compose, SeqMISConfig,
                  "Geometric gate on exp(S/T), untempered product weight w_j inside it.",
                  r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
                  r"\cdot \min\big(w_j,\ e^{40}\big)", seed=True),
    EstimatorSpec("geo_mask", geo_mask.compose, GeoMaskConfig,
                  "Geometric trust region: a pure 0/1 filter on exp(S/T), optional token clip.",
                  r"\mathbb{1}\big[\mathrm{lo} \le e^{S_j/T_j} \le \mathrm{hi}\big]"
                  r"\cdot \big(1\ \text{or}\ \min(\rho_t, C)\big)",
                  seed=True),
    EstimatorSpec("mis_po", mis_po.compose, MISPOConfig, "Token band times trajectory band (Step 3.5 Flash).",
                  r"\mathbb{1}\big[t_{lo} \le \rho_t \le t_{hi}\big]\cdot\mathbb{1}\big[g_{lo} \le e^{S_j/T_j}"
                  r" \le g_{hi}\big]", seed=True),
    EstimatorSpec("pg", pg.compose, PGConfig, "No correction: plain REINFORCE on the sampler's tokens.", r"1"),
    EstimatorSpec("seq_is", seq_is.compose, SeqISConfig, "Untruncated sequence IS: unbiased, variance ~ (1+chi2)^T.",
                  r"\min\big(w_j,\ e^{40}\big)"),
    EstimatorSpec("token_tis", token_tis.compose, TokenTISConfig, "Truncated token IS: min(rho_t, C) per token.",
                  r"\min\big(\rho_t,\ C\big)"),
    EstimatorSpec("icepop", icepop.compose, IcePopConfig, "IcePop: rho_t where it lies in a band, else 0.",
                  r"\rho_t\cdot\mathbb{1}\big[\mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"),
    EstimatorSpec("seq_mis_product", seq_mis_product.compose, SeqMISProductConfig,
                  "Li's Seq-MIS: drop rollouts with w_j > C, keep w_j otherwise.",
                  r"\mathbb{1}\big[w_j \le C\big]\cdot w_j"),
    EstimatorSpec("geo_is", geo_is.compose, GeoISConfig, "GeoMean IS: the geometric ratio exp(S/T) as the weight.",
                  r"\min\big(e^{S_j/T_j},\ C\big)"),
    EstimatorSpec("prefix_is", prefix_is.compose, PrefixISConfig, "Cumulative prefix ratio up to each token.",
                  r"\min\Big(\exp\sum_{s\le t} \ell_s,\ C\Big)"),
    EstimatorSpec("max_mask", max_mask.compose, MaxMaskConfig, "Drop a rollout if any token's ratio leaves the band.",
                  r"\mathbb{1}\big[\forall t:\ \mathrm{lo} \le \rho_t \le \mathrm{hi}\big]"),
]

ESTIMATORS: dict[str, EstimatorSpec] = {spec.name: spec for spec in _ROWS}
SEED_ESTIMATORS: tuple[str, ...] = tuple(s.name for s in _ROWS if s.seed)

from .dispatch import about, resolve, resolve_config, run, run_many  # noqa: E402  (reads ESTIMATORS)

__all__ = ["ESTIMATORS", "SEED_ESTIMATORS", "AGGREGATIONS", "EstimatorSpec", "Ratios", "Correction", "Composition",
           "Criterion", "Penalty", "Weight", "about", "correction", "resolve_config", "resolve", "run", "run_many"]
