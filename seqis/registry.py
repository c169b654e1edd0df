"""Names to outputs: the one place a registry name or preset key is looked up, and `run` / `run_many`.

    name or key --entry--> (EstimatorSpec, its default config) --resolve--> Composition --> output

`ESTIMATORS` (seqis/estimators/) and `PRESETS` (seqis/presets/) are tables of records (seqis/core/spec.py); this module
sits above both, so neither imports the other. The evaluators' seam is `run_many`: a composition goes to the compiled
graph (evaluators/compiled.py) when this process chose it for the batch's device and dtype (`compiled_status()`) and
the graph knows its parts (`compiled.supports`); else to the fast evaluator (evaluators/fast.py); a composition whose
parts the fast evaluator does not know either (`fast.supports`) is evaluated by the plain one (evaluators/plain.py,
the definition the other two are held to by the tests).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache, lru_cache

from .core.compose import Composition
from .core.ratios import Ratios
from .core.spec import EstimatorSpec
from .core.types import Batch, Config, EstimatorOutput
from .estimators import ESTIMATORS
from .evaluators import compiled, fast
from .evaluators.plain import AGGREGATIONS, evaluate
from .presets import PRESETS

Correctable = str | Composition  # a registry name, a preset key ("verl/bypass_pg_is") or a composition


@cache
def _default_config(cls: type[Config]) -> Config:
    return cls()  # frozen: one instance serves every call


def entry(name: str) -> tuple[EstimatorSpec, Config]:
    """The registry entry a name or preset key runs, and its default config (a preset's: the framework's)."""
    if name in ESTIMATORS:
        spec = ESTIMATORS[name]
        return spec, _default_config(spec.config)
    if name in PRESETS:
        return PRESETS[name].estimator, PRESETS[name].config
    raise ValueError(f"unknown estimator {name!r}; known: {', '.join([*ESTIMATORS, *PRESETS])}")


@dataclass(frozen=True)
class About:
    """What a registry name or preset key is, in words, for whoever shows or exports it."""

    summary: str  # one line
    source: str  # the paper or the framework's code it reproduces
    export_framework: str | None  # the framework whose own settings export it (a preset's); None: a registry entry


def about(name: str) -> About:
    """A registry estimator's or a preset's summary, source and export framework."""
    if name in PRESETS:
        p = PRESETS[name]
        return About(p.summary, p.source, p.export_framework)
    spec, _ = entry(name)
    return About(spec.summary, spec.section("Source"), None)


def resolve_config(name: str, cfg: Config | None) -> Config:
    """The config to use: the defaults for None; a config of the wrong class is refused."""
    spec, default = entry(name)
    if cfg is None:
        return default
    if not isinstance(cfg, spec.config):
        raise ValueError(f"{name} takes a {spec.config.__name__}, got {type(cfg).__name__}")
    return cfg


def resolve(x: Correctable, cfg: Config | None = None) -> Composition:
    """The composition a registry name or preset key (with cfg, or its defaults) or a Composition stands for."""
    if isinstance(x, Composition):
        if cfg is not None:
            raise ValueError(f"a Composition carries its own knobs: cfg must be None, got {type(cfg).__name__}")
        return x
    if not isinstance(x, str):
        raise ValueError(f"run takes an estimator name, a preset key or a Composition, got {type(x).__name__}")
    return _composed(entry(x)[0], resolve_config(x, cfg))


@lru_cache(maxsize=1024)
def _composed(spec: EstimatorSpec, cfg: Config) -> Composition:
    return spec.compose(cfg)


def head_fields(x: Correctable) -> tuple[str, ...]:
    """The Batch fields beyond the two log-probs that a correction reads, from its entry's composition: the
    sampler's head (score centering), and topk_support too for the exact variant; () for the rest."""
    sc = resolve(x).centering
    if sc is None:
        return ()
    return (*Batch.HEAD, "topk_support") if sc.exact else Batch.HEAD


def needs_head(x: Correctable) -> bool:
    """Whether a correction reads the sampler's head (a batch without one cannot run it)."""
    return bool(head_fields(x))


def lacking(x: Correctable, batch: Batch) -> tuple[str, ...]:
    """The fields a correction reads that this batch does not carry; () when it can run."""
    return tuple(name for name in head_fields(x) if getattr(batch, name) is None)


def runnable(names: Iterable[Correctable], batch: Batch) -> tuple[list[Correctable], dict[Correctable, tuple]]:
    """The corrections this batch can run, in order, and {correction: the fields it lacks} for the others (an
    uploaded file without the sampler's head skips score centering, and says which and why)."""
    ok, skipped = [], {}
    for x in names:
        lacks = lacking(x, batch)
        if lacks:
            skipped[x] = lacks
        else:
            ok.append(x)
    return ok, skipped


def skipped_note(skipped: dict) -> str:
    """One sentence naming the corrections a batch could not run and the fields they need; "" for none."""
    if not skipped:
        return ""
    fields = sorted({f for lacks in skipped.values() for f in lacks})
    names = ", ".join(str(x) for x in skipped)
    return f"Not run (this batch has no {', '.join(fields)}, which score centering reads): {names}."


def run(x: Correctable, batch: Batch, cfg: Config | None = None, *, agg: str = "token-mean") -> EstimatorOutput:
    """Evaluate one correction on a batch: a registry name or preset key (cfg=None: its defaults; a cfg
    overrides them) or a Composition (cfg must be None)."""
    return run_many([(x, cfg)], batch, agg=agg)[x]


def run_many(
    estimators: Iterable[Correctable | tuple[Correctable, Config | None]] | dict[Correctable, Config | None],
    batch: Batch,
    *,
    agg: str = "token-mean",
    ratios: Ratios | None = None,
) -> dict[Correctable, EstimatorOutput]:
    """Evaluate several corrections on one batch, computing what they share once (log-ratios, sums, counts,
    geometric ratios, k3, each statistic and its row aggregates and extremes), and a
    composition that several keys name once: those keys get outputs of their own (each its own loss node and
    gradient) that share their weights, masks and metric tensors (all detached; not to be written to).
    `estimators` is names, preset keys or Compositions, (x, cfg) pairs, or an {x: cfg} dict; the result is keyed
    by each x as given (a Composition by itself; an x given twice with two configs: the later wins; use `run` per
    config). `ratios`: the batch's Ratios, when the caller evaluates several calls on one batch."""
    items = estimators.items() if isinstance(estimators, dict) else estimators
    pairs = [(e, None) if isinstance(e, (str, Composition)) else tuple(e) for e in items]
    keys = {x: resolve(x, cfg) for x, cfg in pairs}  # x -> its composition (an x given twice: the later)
    if agg not in AGGREGATIONS:
        raise ValueError(f"agg must be one of {', '.join(AGGREGATIONS)}; got {agg!r}")
    named: dict[Composition, list[Correctable]] = {}  # identical compositions are computed once
    for x, comp in keys.items():
        named.setdefault(comp, []).append(x)
        lacks = lacking(comp, batch)
        if lacks:
            need = ", ".join(f"{n}=..." for n in head_fields(comp))
            raise ValueError(f"{x if isinstance(x, str) else 'this composition'} needs the sampler's top-k head "
                             f"(score centering): Batch({need}); this batch lacks {', '.join(lacks)}")
    outputs = compiled.evaluate_many({comp: len(xs) for comp, xs in named.items()}, batch, agg)
    known = {comp: len(xs) for comp, xs in named.items() if comp not in outputs and fast.supports(comp)}
    outputs.update(fast.evaluate_many(known, batch, agg, ratios) if known else {})
    out = {}
    for comp, xs in named.items():
        outs = outputs[comp] if comp in outputs else [evaluate(comp, batch, agg) for _ in xs]
        out.update(zip(xs, outs))
    return {x: out[x] for x in keys}


__all__ = ["About", "Correctable", "ESTIMATORS", "PRESETS", "about", "entry", "head_fields", "lacking", "needs_head",
           "resolve", "resolve_config", "run", "run_many", "runnable", "skipped_note"]
