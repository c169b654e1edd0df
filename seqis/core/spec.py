"""The records the registry holds: an estimator (`EstimatorSpec`) and a framework's preset (`Preset`).

Both are plain data. An estimator is one module of seqis/estimators/ (its docstring, LATEX, config class, compose
and reference); `EstimatorSpec.of(module)` reads it, so the formula, its LaTeX and its "Trades", "Reduces to" and
"Source" paragraphs live once, in that file. A preset is a framework's shipped correction: a key, what it runs
and with which knobs, where its code lives and since when it ships. Nothing here evaluates anything: the
registry (seqis/registry.py) turns a name into a composition and the evaluators into an output.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from .types import Config

if TYPE_CHECKING:
    import torch

    from .compose import Composition
    from .types import Batch

Reference = Callable[["Batch", Config], tuple["torch.Tensor", "torch.Tensor"]]


@dataclass(frozen=True)
class EstimatorSpec:
    """An estimator: its name, config class, composition (as a function of the config), its plain reference
    (weights (B, T), kept (B, T) from the formula), a one-line summary, its weight as LaTeX, its module's
    docstring, and whether it is one of the four seed estimators (the rest are references for comparison).
    A preset built on a framework's own knobs is an EstimatorSpec without a reference or a docstring."""

    name: str
    compose: Callable[[Config], Composition]
    config: type[Config]
    summary: str
    formula: str = r"\text{see the composition}"
    reference: Reference | None = None
    doc: str = ""
    seed: bool = False

    @classmethod
    def of(cls, module: ModuleType, *, seed: bool = False) -> EstimatorSpec:
        """The estimator a module of seqis/estimators/ defines: NAME (its file's name unless set), CONFIG,
        compose, reference, LATEX and a docstring whose first line is the summary."""
        doc = module.__doc__ or ""
        return cls(name=getattr(module, "NAME", module.__name__.rsplit(".", 1)[-1]), compose=module.compose,
                   config=module.CONFIG, summary=doc.strip().splitlines()[0], formula=module.LATEX,
                   reference=module.reference, doc=doc, seed=seed)

    def section(self, heading: str) -> str:
        """A paragraph of the module docstring: "Trades", "Reduces to" or "Source" ("" if it has none)."""
        m = re.search(rf"^{heading}:(.*?)(?=^\w[\w ]*:|\Z)", self.doc, flags=re.S | re.M)
        return " ".join(m.group(1).split()) if m else ""

    @property
    def fn(self) -> Reference | None:
        """The estimator as a pure function of (batch, cfg): its reference, (weights (B, T), kept (B, T)).
        `seqis.run(name, batch, cfg)` gives the whole output (loss, masks, metrics) from the fast evaluator."""
        return self.reference


@dataclass(frozen=True)
class Preset:
    """A framework's shipped correction, as `PRESETS["framework/name"]`."""

    key: str  # "framework/name", e.g. "verl/bypass_pg_geo_rs"
    summary: str  # one line: what it computes, its defaults, where the code differs from the docs
    source: str  # "owner/repo@commit-or-release: path/to/file.py (function)", the code read and reproduced
    estimator: EstimatorSpec  # the entry it runs: .compose(cfg) -> Composition
    config: Config  # the framework's default knob values (an instance of estimator.config)
    exporter: str | None = None  # the seqis.export exporter that writes it, when not the framework's own
    versions: str = ""  # when the framework shipped it: "since 2026-09-18 (prime-rl #3586)", "A .. B (#x .. #y)"

    @property
    def export_framework(self) -> str:
        return self.exporter or self.framework

    @property
    def framework(self) -> str:
        return self.key.split("/", 1)[0]

    @property
    def name(self) -> str:
        return self.key.split("/", 1)[1]

    def compose(self, cfg: Config | None = None) -> Composition:
        return self.estimator.compose(self.config if cfg is None else cfg)
