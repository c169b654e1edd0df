"""Every correction the RL frameworks ship, as an exact preset: `PRESETS["framework/name"]`.

    from seqis import PRESETS, run
    p = PRESETS["trl/sequence_mask"]      # .summary, .source, .estimator, .config (the framework's defaults)
    out = run("verl/bypass_pg_geo_rs_token_tis", batch)          # a key wherever an estimator name goes
    out = run("trl/sequence_mask", batch, p.config.replace(vllm_importance_sampling_clip_max=2.0))

One file per framework. Each reproduces what the framework's code computes (not its docs; the quirks are kept and
named in `.summary`): its config class mirrors the framework's own settings, and its `compose(cfg)` reads them
the way the framework's code does, into a `Composition` (an IS weight, chained rejection criteria, a penalty).
The gradient coefficient is taken at the first minibatch, where a PPO ratio pi_theta / pi_old is 1.
"""

from __future__ import annotations

from ..core.spec import Preset
from . import (
    areal,
    art,
    custom,
    miles,
    ms_swift,
    nemo_rl,
    open_instruct,
    openrlhf,
    prime_rl,
    roll,
    skyrl,
    slime,
    tinker,
    torchforge,
    trl,
    tunix,
    verl,
    vime,
)
from .custom import CUSTOM

FRAMEWORKS = {  # framework -> its module, in the order the app lists them
    "verl": verl,
    "trl": trl,
    "nemo-rl": nemo_rl,
    "prime-rl": prime_rl,
    "slime": slime,
    "miles": miles,
    "skyrl": skyrl,
    "areal": areal,
    "openrlhf": openrlhf,
    "ms-swift": ms_swift,
    "open-instruct": open_instruct,
    "roll": roll,
    "tinker": tinker,
    "art": art,
    "torchforge": torchforge,
    "tunix": tunix,
    "vime": vime,
    "custom": custom,  # not a framework: one correction built from the mechanism's parts, knob by knob
}

PRESETS: dict[str, Preset] = {p.key: p for module in FRAMEWORKS.values() for p in module.PRESETS}


def presets_of(framework: str) -> dict[str, Preset]:
    """The presets of one framework, key -> preset, in their file's order."""
    return {p.key: p for p in FRAMEWORKS[framework].PRESETS}


__all__ = ["CUSTOM", "FRAMEWORKS", "PRESETS", "Preset", "presets_of"]
