"""Miles (radixark/miles): slime's off-policy corrections under Miles's own paths, the same code.

Miles carries slime's --use-tis (vanilla_tis_function, icepop_function), the MIS example's compute_mis_weights
(identical apart from its context-parallel gather) and OPSM (compute_opsm_mask), with slime's flag names and
defaults (--tis-clip 2, --tis-clip-low 0, --opsm-delta 1e-4, --eps-clip 0.2); see seqis/presets/slime.py for what
each computes and its quirks. Source: radixark/miles, miles/backends/training_utils/loss_hub/corrections.py and
math_utils.py, examples/infra_features/train_infer_mismatch_helper/mis.py. Read at 31f1ca9 (2026-08-21).
"""

from __future__ import annotations

from ..spec import Preset
from .slime import ROWS

AT = "radixark/miles@31f1ca9: "
_WHERE = {"tis": (f"{AT}miles/backends/training_utils/loss_hub/corrections.py (vanilla_tis_function)",
                  "since 2025-10-22 (Miles, synced from slime)"),
          "icepop": (f"{AT}miles/backends/training_utils/loss_hub/corrections.py (icepop_function)",
                     "since 2025-12-10 (Miles, synced from slime)"),
          "mis": (f"{AT}examples/infra_features/train_infer_mismatch_helper/mis.py (compute_mis_weights)",
                  "since 2025-11-24 (Miles, synced from slime)"),
          "opsm": (f"{AT}miles/backends/training_utils/loss_hub/math_utils.py (compute_opsm_mask)",
                   "since 2025-12-10 (Miles, synced from slime)")}

PRESETS = [Preset(f"miles/{name}", summary, _WHERE[name][0], est, cfg,
                  exporter="miles", versions=_WHERE[name][1]) for name, summary, est, cfg in ROWS]
