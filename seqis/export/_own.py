"""A framework's own preset written in its own framework: the preset's config knob by knob (issue 43).

A composition cannot tell apart two algorithms with the same first gradient (verl's decoupled mode and bypass
REINFORCE; SkyRL's CISPO on the rollout and token TIS at the same cap), so a preset's own export never goes through
it: each exporter's `own(cfg)` writes every knob of the preset's config at the key its framework reads it from
(`own_key`), and names in a comment each knob it leaves out and why (a block its switch turns off has no place for
its knobs). A test reads the text back with the format's own library and compares it with the config, knob by knob.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core.types import Config
from ._format import Settings, adv_tau_note

NOT_WRITTEN = "not written"  # the comment's lead word: "not written: a, b: why"


def own_settings(cfg: Config, own_key: Callable[[str], str], *, value: Callable[[str, Any], Any] | None = None,
                 skip: dict[str, str] | None = None, extra: dict[str, Any] | None = None,
                 comments: tuple[str, ...] = (), adv_tau_key: bool = False,
                 uncarried: dict[str, str] | None = None) -> Settings:
    """Every knob of `cfg` at own_key(knob), its value as value(knob, v) gives it (the knob's own by default).
    skip: knob -> why it needs no key here (off, a default, a block written otherwise: a comment names it);
    uncarried: knob -> why the framework has no key for what it sets (a NOTE: the snippet is not exact); extra: keys
    the framework needs that the config does not record (a mode its knobs imply), written after the knobs. adv_tau
    is seqis's (a NOTE where it is not 1) unless the framework has the key (adv_tau_key)."""
    skip, uncarried = skip or {}, uncarried or {}
    keys: dict[str, Any] = {}
    for name, v in cfg.as_dict().items():
        if name in skip or name in uncarried or (name == "adv_tau" and not adv_tau_key):
            continue
        keys[own_key(name)] = v if value is None else value(name, v)
    keys.update(extra or {})
    notes: list[str] = [f"{name}={getattr(cfg, name)}: {why}" for name, why in uncarried.items()]
    if not adv_tau_key:
        adv_tau_note(cfg.adv_tau, notes)
    why: dict[str, list[str]] = {}
    for name, reason in skip.items():
        why.setdefault(reason, []).append(name)
    lines = [f"{NOT_WRITTEN}: {', '.join(names)}: {reason}" for reason, names in why.items()]
    return Settings(keys, notes, comments=[*comments, *lines])


def prefixed(prefix: str, places: dict[str, str] | None = None) -> Callable[[str], str]:
    """own_key for a framework whose keys are the config's names under one block, a few under another:
    places maps a knob to its full key."""
    places = places or {}
    return lambda name, cfg=None: places.get(name, f"{prefix}{name}")


def dashed(name: str) -> str:
    """A knob as a slime-lineage flag: tis_clip_low -> --tis-clip-low."""
    return "--" + name.replace("_", "-")
