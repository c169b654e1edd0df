"""A correction's settings in each framework's own config language, derived from its composition.

    from seqis.export import export, export_all
    print(export("seq_tis", "verl").text)                      # a registry name, a preset key or a Composition
    snippets = export_all("trl/sequence_mask")                  # framework -> Snippet

Each exporter (one file per framework) reads the composition's parts (its weight, criteria, penalty, clamp) and
maps them onto the framework's keys, never on the correction's name. What a framework cannot express comes back
as a Snippet with expressible=False whose text says why; what it expresses with a difference (its own log-ratio
clamp, a knob it lacks) is expressible with exact=False and the difference in a NOTE line. Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.compose import Composition
from ..core.types import Config
from ..presets import PRESETS
from ..registry import entry, resolve
from . import (
    areal,
    art,
    miles,
    ms_swift,
    nemo_rl,
    open_instruct,
    openrlhf,
    prime_rl,
    prime_rl_legacy,
    roll,
    skyrl,
    slime,
    tinker,
    torchforge,
    trl,
    tunix,
    verl,
)
from ._format import CannotExpress, Settings
from ._parts import edge_note, later_parts

EXPORTERS = {
    "prime-rl": prime_rl, "prime-rl-legacy": prime_rl_legacy, "verl": verl,
    "trl": trl, "nemo-rl": nemo_rl, "slime": slime, "skyrl": skyrl,
    "areal": areal, "openrlhf": openrlhf,
    "ms-swift": ms_swift,
    "open-instruct": open_instruct,
    "roll": roll,
    "tinker": tinker,
    "art": art,
    "torchforge": torchforge,
    "tunix": tunix,
    "miles": miles,
}


@dataclass(frozen=True)
class Snippet:
    framework: str
    text: str  # the config text, comments included; or a comment saying why it cannot be expressed
    expressible: bool  # the framework has settings for every part
    exact: bool  # expressible, and the framework computes the same weights (no NOTE lines)
    filename: str  # a file name for a download
    uncarried: tuple[str, ...] = ()  # each setting the text could not carry, and why (also a NOTE line in the text)


def describe(x: str | Composition, cfg: Config | None = None) -> str:
    """'seq_tis: seq_clip=2.0, adv_tau=1.0' (a composition: its own description)."""
    if isinstance(x, Composition):
        return f"custom: {x.describe()}"
    knobs = ", ".join(f"{k}={v}" for k, v in (entry(x)[1] if cfg is None else cfg).as_dict().items())
    return f"{x}: {knobs}" if knobs else x


def export(x: str | Composition, framework: str, cfg: Config | None = None, *,
           composition: Composition | None = None) -> Snippet:
    """The correction's settings in the framework's config language. composition: what (x, cfg) resolves to, when
    the caller holds it already (the explorer resolves each correction once and passes it down)."""
    comp = composition if composition is not None else resolve(x, cfg)
    exporter = EXPORTERS[framework]
    stem = "custom" if isinstance(x, Composition) else x.replace("/", "_")
    if isinstance(x, str) and is_own(x, framework):
        return _own(x, framework, entry(x)[1] if cfg is None else cfg, f"{stem}.{exporter.SUFFIX}")
    missing = sorted(later_parts(comp) - getattr(exporter, "PARTS", frozenset()))
    try:
        s: Settings = exporter.settings(comp)  # its own refusal first: it names the part most to the point
        if missing:
            raise CannotExpress(f"{framework} has no setting for {', '.join(missing)}")
        if note := edge_note(comp, framework, getattr(exporter, "EDGE_SPACE", None)):
            s.notes.append(note)
    except CannotExpress as why:
        also = [f"# cannot carry either: {part} ({framework} has no setting for it)" for part in missing
                if part not in str(why)]  # every part it lacks is named, not only the first refusal
        text = "\n".join([f"# seqis {describe(x, cfg)}", f"# cannot express in {framework}: {why}", *also]) + "\n"
        return Snippet(framework, text, False, False, f"{stem}.{exporter.SUFFIX}")
    return _text(x, framework, cfg, exporter.HEADER, s, f"{stem}.{exporter.SUFFIX}")


def is_own(key: str, framework: str) -> bool:
    """Whether `key` is a preset of `framework` on the framework's own knobs, which its exporter writes knob by knob
    (`own`): not a seed estimator shown under a framework's name, nor another framework's preset (vime's are written
    as Miles flags through their composition, so Miles's tail floors, which differ, are noted)."""
    preset = PRESETS.get(key)
    return (preset is not None and preset.export_framework == framework and framework.startswith(preset.framework)
            and preset.estimator.reference is None and hasattr(EXPORTERS.get(framework), "own"))


def _text(x: str | Composition, framework: str, cfg: Config | None, header: list[str], s: Settings,
          filename: str) -> Snippet:
    """The snippet: its comments (what it is, the exporter's header, what the run needs, each NOTE), the settings
    in the framework's format, and any side file; each NOTE is also in `uncarried`."""
    comments = [f"seqis {describe(x, cfg)}", *header, *s.comments, *(f"NOTE: {n}" for n in s.notes)]
    files = [line for name, lines in s.files.items() for line in (f"# --- {name} ---", *lines)]
    text = "\n".join([*(f"# {c}" for c in comments), *EXPORTERS[framework].write(s), *files]) + "\n"
    return Snippet(framework, text, True, not s.notes, filename, tuple(s.notes))


def _own(key: str, framework: str, cfg: Config, filename: str) -> Snippet:
    """A framework's own preset in its own framework: the preset's settings key by key (the exporter's `own`), never
    a composition's reading of them, which can name another algorithm with the same first gradient."""
    exporter = EXPORTERS[framework]
    header = getattr(exporter, "OWN_HEADER", [*exporter.HEADER, "every knob of the preset as it sets it"])
    return _text(key, framework, cfg, header, exporter.own(cfg), filename)


def export_all(x: str | Composition, cfg: Config | None = None) -> dict[str, Snippet]:
    comp = resolve(x, cfg)
    return {framework: export(x, framework, cfg, composition=comp) for framework in EXPORTERS}


def prime_rl_toml(x: str | Composition, cfg: Config | None = None, *,
                  composition: Composition | None = None) -> Snippet:
    """prime-rl's current [trainer.loss] when it can express the correction, else the pre-March-2026 [loss]
    table the seed's ablations ran on (its header says which)."""
    current = export(x, "prime-rl", cfg, composition=composition)
    return current if current.expressible else export(x, "prime-rl-legacy", cfg, composition=composition)


def verl_yaml(x: str | Composition, cfg: Config | None = None) -> Snippet:
    return export(x, "verl", cfg)


__all__ = ["EXPORTERS", "CannotExpress", "Snippet", "describe", "export", "export_all",
           "is_own", "prime_rl_toml", "verl_yaml"]
