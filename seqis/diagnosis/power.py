"""What each detector of diagnosis.causes can see: detection rate against a fault's size, at two batch sizes, on the
generators it was not tuned on (seqis.samplers.generators, never tiny_lm), and the false-alarm rate on clean batches.

`measure()` simulates: for each fault of FAULTS and each of its magnitudes, one draw per (generator, seed),
diagnosed whole and in quarters (four disjoint blocks of whole GRPO groups: four batches a quarter the size). A
fault is detected when diagnose names its kind. Each batch also records the truth the generator knows (the mean
log offset, the temperature, the entropy gap, the per-token KL of the lag, the share of catastrophic tokens)
and diagnose's estimate of it. Clean batches (bf16 logits, bf16 model, bf16 probabilities, fp16) count a false
alarm for any warn or bad finding or any kind but precision_noise / healthy.

`python -m seqis.bench --only diagnose-power` runs it and writes POWER_TABLE (assets/bench/diagnose_power.json), which
the Diagnose page reads through `load()` and `curves()` so it never simulates on load.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..io import ASSETS_DIR

POWER_TABLE = ASSETS_DIR / "bench" / "diagnose_power.json"  # a folder of its own: not a batch
COMMAND = "python -m seqis.bench --only diagnose-power"


@dataclass(frozen=True)
class Fault:
    """A sampler (or trainer) fault at several magnitudes, and what names it."""

    kind: str  # the finding kind that detects it
    knob: str  # the generator knob that sets it
    values: tuple  # its magnitudes, mildest first
    measure: str  # the truth recorded per batch (the x of the page's curve) and the evidence that estimates it
    label: str  # the measure in words, for the x axis
    extra: dict = field(default_factory=dict)  # knobs set alongside (raw log-probs: report="raw")
    tolerance: float | None = None  # relative: an estimate within it of the truth counts as accurate
    scale: int = 1  # draws of this many times the generator's prompts (lag needs hundreds of rollouts)


FAULTS: dict[str, Fault] = {
    "top-p": Fault("sampler_truncation", "top_p", (0.99, 0.97, 0.95, 0.9, 0.8), "log_offset",
                   "mean log kept mass per token (nats)", tolerance=0.25),
    "top-k": Fault("sampler_truncation", "top_k", (200, 100, 50, 20, 5), "log_offset",
                   "mean log kept mass per token (nats)", tolerance=0.25),
    "temperature": Fault("temperature_mismatch", "temperature", (0.98, 1.02, 0.95, 1.05, 0.9, 1.1, 0.8, 1.2, 0.7, 1.3),
                         "temperature", "the sampler's temperature / the trainer's", tolerance=0.05),
    "raw log-probs": Fault("raw_logprobs", "temperature", (0.95, 0.9, 0.8), "entropy_gap",
                           "entropy gap, E_q[-log pi] - H (nats per token)", extra={"report": "raw"}, tolerance=0.25),
    "catastrophic": Fault("catastrophic_tokens", "bug_rate", (0.0005, 0.001, 0.002, 0.005), "bug_share",
                          "share of tokens a kernel bug forced"),
    "lag": Fault("policy_lag", "lag_steps", (1, 2, 4, 8), "kl", "per-token KL of the lag (trainer ahead)", scale=4),
}
# what a clean sampler may be: every generator with each of these over its preset's rounding
CLEAN = {"bf16 logits": dict(rounding="logits"), "bf16 model": dict(rounding="model"),
         "bf16 probabilities": dict(rounding="probs"), "fp16 logits": dict(sampler_dtype="fp16", rounding="logits")}
SIZES = ("quarter", "whole")


def _estimate(findings, fault: Fault) -> float | None:
    f = next((f for f in findings if f.kind == fault.kind and f.group is None), None)
    key = {"bug_share": "share"}.get(fault.measure, fault.measure)
    return None if f is None or key not in f.evidence else float(f.evidence[key])


def _truth(batch, fault: Fault, value) -> float:
    """What the generator's sampler did to this batch, in the fault's measure."""
    from ..samplers.generators import truth

    if fault.measure == "temperature":
        return float(value)  # the knob is the truth
    t = truth(batch)
    if fault.measure == "bug_share":
        return t["bug_tokens"] / max(1, int(batch.loss_mask.sum()))
    return t[fault.measure]


def _parts(batch):
    """The batch whole and in four disjoint quarters of its rollouts (whole GRPO groups when they fit)."""
    B = batch.loss_mask.shape[0]
    q = B // 4
    yield "whole", batch
    for i in range(4):
        yield "quarter", batch.select(list(range(i * q, (i + 1) * q)))


def measure(generators: tuple[str, ...] | None = None, seeds: int = 3, clean_seeds: int = 7,
            faults: dict[str, Fault] | None = None, values: Callable[[Fault], tuple] | None = None,
            log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Simulate every fault at every magnitude and the clean batches; returns the power table (plain data,
    the JSON that POWER_TABLE holds)."""
    from ..samplers.generators import GENERATORS, make
    from .causes import diagnose

    generators = tuple(generators or GENERATORS)
    faults = faults or FAULTS
    t0 = time.perf_counter()
    rows = []  # one per diagnosed batch
    for name, fault in faults.items():
        for value in (values(fault) if values else fault.values):
            for gen in generators:
                if fault.knob == "top_k" and value >= GENERATORS[gen]().vocab:
                    continue
                size_knobs = {"n_prompts": GENERATORS[gen]().n_prompts * fault.scale} if fault.scale > 1 else {}
                for seed in range(seeds):
                    b = make(gen, seed=seed, **{fault.knob: value}, **fault.extra, **size_knobs)
                    for size, part in _parts(b):
                        found = diagnose(part)
                        truth = _truth(part, fault, value)
                        rows.append({"fault": name, "value": value, "generator": gen, "size": size,
                                     "tokens": int(part.loss_mask.sum()), "truth": truth,
                                     "detected": any(f.kind == fault.kind and f.group is None for f in found),
                                     "estimate": _estimate(found, fault)})
            if log:
                log(f"{name} {value}: {time.perf_counter() - t0:.0f} s")
    clean = []
    for label, knobs in CLEAN.items():
        for gen in generators:
            for seed in range(clean_seeds):
                b = make(gen, seed=100 + seed, **knobs)
                for size, part in _parts(b):
                    found = diagnose(part)
                    alarm = [f"{f.kind}/{f.severity}" for f in found
                             if f.severity != "ok" or f.kind not in ("precision_noise", "healthy")]
                    clean.append({"precision": label, "generator": gen, "size": size,
                                  "tokens": int(part.loss_mask.sum()), "alarms": alarm})
        if log:
            log(f"clean {label}: {time.perf_counter() - t0:.0f} s")
    return summarize(rows, clean, generators, seeds, clean_seeds, faults)


def summarize(rows: list[dict], clean: list[dict], generators, seeds: int, clean_seeds: int,
              faults: dict[str, Fault]) -> dict[str, Any]:
    """Detection rates per (fault, magnitude, size), pooled over generators and seeds, with each generator's
    rate; the clean batches' false alarms."""
    out: dict[str, Any] = {"command": COMMAND, "generators": list(generators), "seeds": seeds,
                           "sizes": {}, "faults": {}, "false_alarms": {}}
    for size in SIZES:
        toks = [r["tokens"] for r in rows + clean if r["size"] == size]
        out["sizes"][size] = {"tokens_median": _median(toks),
                              "per_generator": {g: _median([r["tokens"] for r in rows + clean
                                                            if r["size"] == size and r["generator"] == g])
                                                for g in generators}}
    for name, fault in faults.items():
        cells = []
        for value in fault.values:
            for size in SIZES:
                sel = [r for r in rows if r["fault"] == name and r["value"] == value and r["size"] == size]
                if not sel:
                    continue
                hits = [r for r in sel if r["detected"]]
                accurate = None
                if fault.tolerance is not None and hits:
                    ok = [r for r in hits if r["estimate"] is not None and r["truth"] != 0
                          and abs(r["estimate"] / r["truth"] - 1) <= fault.tolerance]
                    accurate = len(ok) / len(hits)
                cells.append({"value": value, "size": size, "n": len(sel), "rate": len(hits) / len(sel),
                              "accurate": accurate, "tokens": _median([r["tokens"] for r in sel]),
                              "truth": _mean([r["truth"] for r in sel]),
                              "per_generator": {g: _rate([r for r in sel if r["generator"] == g])
                                                for g in generators}})
        out["faults"][name] = {"kind": fault.kind, "knob": fault.knob, "measure": fault.measure,
                               "label": fault.label, "tolerance": fault.tolerance, "cells": cells}
    for size in SIZES:
        sel = [c for c in clean if c["size"] == size]
        out["false_alarms"][size] = {"batches": len(sel), "alarms": sum(bool(c["alarms"]) for c in sel),
                                     "tokens": _median([c["tokens"] for c in sel]),
                                     "examples": sorted({a for c in sel for a in c["alarms"]})[:10]}
    out["clean_precisions"] = list(CLEAN)
    out["clean_seeds"] = clean_seeds
    return out


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else 0


def _mean(xs):
    xs = [x for x in xs if x is not None and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else math.nan


def _rate(sel):
    return sum(r["detected"] for r in sel) / len(sel) if sel else None


def write(table: dict[str, Any], path: Path = POWER_TABLE) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(table, indent=1, allow_nan=False, default=_finite) + "\n")


def _finite(v):
    raise TypeError(f"not JSON: {v!r}")


def load(path: Path = POWER_TABLE) -> dict[str, Any] | None:
    """The committed power table, or None when it is missing (regenerate it with COMMAND)."""
    p = Path(path)
    return json.loads(p.read_text()) if p.is_file() else None


# the evidence of a finding that sits on its detector's x axis, and how to read it there
EVIDENCE = {"sampler_truncation": ("log_offset", abs), "temperature_mismatch": ("temperature", float),
            "raw_logprobs": ("entropy_gap", abs), "catastrophic_tokens": ("share", float),
            "policy_lag": ("kl_k3", float)}


def view(table: dict[str, Any], kind: str, tokens: int, size: str | None = None) -> dict[str, Any] | None:
    """What the detector of a finding kind can see at a batch of `tokens` loss tokens: the simulated size
    nearest it (in log scale; or the size named, one of SIZES) and, per fault it detects, the points (x: the
    truth in the fault's measure, |.| for offsets and gaps; rate; the knob's value; the median tokens of its
    batches) at that size. None for a kind without a detector."""
    faults = {name: f for name, f in table["faults"].items() if f["kind"] == kind}
    if not faults:
        return None
    sizes = {s: _median([c["tokens"] for f in faults.values() for c in f["cells"] if c["size"] == s]) for s in SIZES}
    sizes = {s: t for s, t in sizes.items() if t}
    if size is None:
        size = min(sizes, key=lambda s: abs(math.log(max(tokens, 1) / sizes[s])))
    read = EVIDENCE[kind][1]
    points = {name: [{"x": read(c["truth"]), "rate": c["rate"], "value": c["value"], "n": c["n"],
                      "tokens": c["tokens"]} for c in f["cells"] if c["size"] == size] for name, f in faults.items()}
    label = next(iter(faults.values()))["label"]
    return {"kind": kind, "size": size, "tokens": sizes[size], "points": points, "label": label,
            "evidence": EVIDENCE[kind][0]}


def views(table: dict[str, Any], tokens: int, size: str | None = None) -> dict[str, dict[str, Any]]:
    """Every detector's view at a batch of `tokens` loss tokens (or at the size named), kind -> view(), in the
    table's order."""
    kinds = dict.fromkeys(f["kind"] for f in table["faults"].values())
    return {k: view(table, k, tokens, size) for k in kinds}


def smallest_seen(table: dict[str, Any], tokens: int, rate: float = 0.9) -> dict[str, Any]:
    """Per fault: the mildest simulated magnitude its detector found in at least `rate` of the batches at the
    size nearest `tokens` (None when none was), with that size's tokens."""
    out = {}
    for name, f in table["faults"].items():
        v = view({"faults": {name: f}}, f["kind"], tokens)
        seen = [p for p in v["points"][name] if p["rate"] >= rate]
        mild = min(seen, key=lambda p: abs(p["x"] - (1.0 if f["measure"] == "temperature" else 0.0)), default=None)
        out[name] = {"kind": f["kind"], "knob": f["knob"], "value": mild and mild["value"], "x": mild and mild["x"],
                     "tokens": v["tokens"], "label": f["label"]}
    return out
