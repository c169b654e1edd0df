"""vime (vllm-project/vime): slime's lineage with score centering (arXiv 2609.20807) on its REINFORCE loss.

    f          --use-tis off: 1; on: vanilla TIS clamp(x, tis_clip_low, tis_clip), or icepop_function's band
               x 1[low <= x <= high] (custom_tis_function_path); the same f on the sampled token and every head token
    centering  score_centering_correction: rho = max(1 - Q_H, 1e-6) / max(1 - P_H, 1e-6) (both tails floored, as
               verl), alpha = rho f(1 / rho), c_v = sg(q_v f(p_v / q_v) - alpha p_v), loss += A sum c_v log p_v

vime's IcePop band is [0.5, 2] (docs/LITERATURE.md: since September 2026; the flags tis_clip_low 0.5, tis_clip 2 with
icepop_function). Not kept: vime's exact
top-p variant (score_centering_top_p, the replayed support) is the same form as Miles's (seqis/presets/miles.py).
Source: vllm-project/vime, vime/utils/score_centering.py (score_centering_correction, get_score_centering_is_config);
the search index's copy (id 71109864611), its commit not recorded.
"""

from __future__ import annotations

from ..core.compose import Composition
from ..core.spec import Preset
from ._preset import framework_estimator
from .miles import ScoreCenteringConfig, compose_score_centering

SC_FLOOR = 1e-6  # score_centering_correction's eps: both tail masses


def compose(cfg: ScoreCenteringConfig) -> Composition:
    return compose_score_centering(cfg, SC_FLOOR, SC_FLOOR)


ESTIMATOR = framework_estimator("vime", compose, ScoreCenteringConfig, "vime --use-score-centering.")
SOURCE = ("vllm-project/vime@main (the search index's copy, id 71109864611; commit not recorded): "
          "vime/utils/score_centering.py (score_centering_correction)")
VERSIONS = "in vime's main branch (the copy read, after arXiv 2609.20807 of 2026-09-17); no release recorded"
ICEPOP_BAND = dict(use_tis=True, icepop=True, tis_clip_low=0.5, tis_clip=2.0)

PRESETS = [
    Preset("vime/score_centering", "REINFORCE, weight 1, plus score centering over the sampler's top-k head, both "
           "tail masses floored at 1e-6.", SOURCE, ESTIMATOR, ScoreCenteringConfig(), exporter="miles",
           versions=VERSIONS),
    Preset("vime/score_centering_tis", "Token TIS clamp(rho_t, 0, 2) plus score centering with the same f on the "
           "head, both tail masses floored at 1e-6.", SOURCE, ESTIMATOR, ScoreCenteringConfig(use_tis=True),
           exporter="miles", versions=VERSIONS),
    Preset("vime/score_centering_icepop", "IcePop rho_t 1[0.5 <= rho_t <= 2] (vime's band) plus score centering with "
           "the same band on the head, both tail masses floored at 1e-6.", SOURCE, ESTIMATOR,
           ScoreCenteringConfig(**ICEPOP_BAND), exporter="miles", versions=VERSIONS),
]
