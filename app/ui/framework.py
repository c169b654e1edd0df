"""Explore's "my framework" picker: a framework and one of its shipped corrections (or a custom composition),
drawn beside the estimators picked; each preset's knobs start at the framework's defaults. Learn's list of
presets by framework opens Explore on one of them through `preset_view`. The exports themselves come from the
bridge (ui/explore_data.py)."""

from __future__ import annotations

from typing import Any

import streamlit as st

from seqis.presets import FRAMEWORKS, PRESETS, presets_of

from .presets import PREFIX
from .state import bound

NONE = "none"
KEY_FRAMEWORK = f"{PREFIX}fw"


def key_preset(framework: str) -> str:
    return f"{PREFIX}fw.{framework}"


def pick(container=st, preset_container=None) -> str | None:
    """The framework select box and its preset's (in `preset_container`, default the same); the preset key, or
    None when no framework is picked."""
    frameworks = [NONE, *FRAMEWORKS]
    framework = bound(container.selectbox, "My framework", KEY_FRAMEWORK, NONE, options=frameworks,
                      valid=lambda v: v in frameworks,
                      help="Run your framework's shipped correction (its code's defaults) beside the estimators; "
                           "custom builds one from the mechanism's parts.")
    if framework == NONE:
        return None
    keys = list(presets_of(framework))
    where = preset_container or container
    return bound(where.selectbox, "Its correction", key_preset(framework), keys[0], options=keys,
                 format_func=lambda k: k.split("/", 1)[1], valid=lambda v: v in keys,
                 help="The framework's presets; each reproduces what its code computes (quirks included).")


def preset_view(key: str) -> dict[str, Any]:
    """Explore's widget keys that open it on a preset (for Learn's buttons)."""
    framework = PRESETS[key].framework
    return {KEY_FRAMEWORK: framework, key_preset(framework): key}


def caption(key: str) -> str:
    p = PRESETS[key]
    return f"{p.summary}  \nSource: `{p.source}`"
