"""A composition as Miles command-line flags: slime's flags (see slime.py), with Miles's function paths."""

from __future__ import annotations

from ..compose import Composition
from . import slime
from ._format import Settings

HEADER = ["Miles training flags (slime's, same code)"]
SUFFIX = "miles.sh"
_ICEPOP = "miles.backends.training_utils.loss_hub.corrections.icepop_function"
_MIS = "examples.infra_features.train_infer_mismatch_helper.mis.compute_mis_weights_with_cp"


def settings(comp: Composition) -> Settings:
    return slime.settings(comp, icepop=_ICEPOP, mis=_MIS)


write = slime.write
