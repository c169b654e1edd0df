"""What every exporter shares: the Settings it returns, the refusal it raises, and the text formats (YAML, TOML,
command-line flags, Python keyword arguments) a framework's settings are written in. YAML and TOML are written by
PyYAML and tomli-w; flags and keyword arguments are a line each."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import tomli_w
import yaml as pyyaml


class CannotExpress(ValueError):
    """The framework has no setting for some part of the composition; the message says which and why."""


@dataclass
class Settings:
    """A framework's settings for one composition: key -> value, and notes on what does not carry over exactly
    (a quirk the framework adds, a knob it lacks); no notes means exact."""

    keys: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    files: dict[str, list[str]] = field(default_factory=dict)  # a side file the keys point to: name -> its lines
    comments: list[str] = field(default_factory=list)  # what the settings need of the run (not a difference)


def fmt(x: float) -> str:
    """A float to 15 significant digits: 1/1.001 keeps its band edge, 1 - 0.8 prints as 0.2."""
    return repr(float(f"{float(x):.15g}"))


def literal(v: Any, *, inf: str, null: str, true: str = "true", false: str = "false", quote: bool) -> str:
    if v is None:
        return null
    if isinstance(v, bool):
        return true if v else false
    if isinstance(v, str):
        return f'"{v}"' if quote or not v.replace("-", "_").replace(".", "_").isidentifier() else v
    if isinstance(v, float) and math.isinf(v):
        return inf if v > 0 else "-" + inf
    return fmt(v) if isinstance(v, float) else str(v)


def _clean(v: Any) -> Any:
    """A float to 15 significant digits (1/1.001 keeps its band edge, 1 - 0.8 is 0.2); anything else as it is."""
    return float(fmt(v)) if isinstance(v, float) and math.isfinite(v) else v


def yaml(keys: dict[str, Any]) -> list[str]:
    """Nested two-space YAML from dotted keys ("algorithm.rollout_correction.rollout_is"), in key order."""
    tree: dict[str, Any] = {}
    for dotted, v in keys.items():
        *path, name = dotted.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        node[name] = _clean(v)
    return pyyaml.safe_dump(tree, sort_keys=False, default_flow_style=False, indent=2).splitlines()


def toml(table: str, keys: dict[str, Any]) -> list[str]:
    """A TOML table (a dotted name: "trainer.loss") of the keys that have a value (TOML has no null)."""
    return toml_tables({f"{table}.{k}": v for k, v in keys.items()})


def toml_tables(keys: dict[str, Any]) -> list[str]:
    """TOML tables from dotted keys ("trainer.loss.type", "inference.vllm.max_logprobs"), those with a value."""
    tree: dict[str, Any] = {}
    for dotted, v in keys.items():
        *path, name = dotted.split(".")
        node = tree
        for p in path:
            node = node.setdefault(p, {})
        if v is not None:
            node[name] = _clean(v)
    return tomli_w.dumps(tree).splitlines()


def flags(keys: dict[str, Any]) -> list[str]:
    """Command-line flags: True -> a bare switch, False / None -> left out, a tuple -> several values."""
    out = []
    for k, v in keys.items():
        if v is True:
            out.append(k)
        elif v is not None and v is not False:
            vals = v if isinstance(v, tuple) else (v,)
            out.append(k + " " + " ".join(literal(x, inf="inf", null="", quote=False) for x in vals))
    return [" \\\n  ".join(out)]


def python_kwargs(call: str, keys: dict[str, Any]) -> list[str]:
    inf = 'float("inf")'
    args = [f"    {k}={literal(v, inf=inf, null='None', true='True', false='False', quote=True)},"
            for k, v in keys.items()]
    return [f"{call}(", *args, ")"]


def adv_tau_note(adv_tau: float, notes: list[str]) -> None:
    if adv_tau != 1.0:
        notes.append(f"adv_tau={adv_tau} has no key here: scale the advantages instead")


def clamp_note(framework: str, own: float | None, clamp: float | None, notes: list[str]) -> None:
    """A NOTE when the framework's log-ratio clamp (own: its bound, None for none) is not the correction's."""
    if clamp != own:
        theirs = "no log-ratio" if own is None else f"each log-ratio at +-{own:g}"
        mine = "none" if clamp is None else f"+-{clamp:g}"
        notes.append(f"{framework} clamps {theirs} (this correction: {mine})")
