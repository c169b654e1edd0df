"""A knob's widget reads what the knob declares: +inf is offered past the end of a slider exactly where the knob's
metadata says inf=True (or its default is inf), never because of the field's name."""

import dataclasses
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "app"))
from ui.widgets import knob_grid  # noqa: E402

from seqis import ESTIMATORS, PRESETS  # noqa: E402
from seqis.core.types import Config, knob, knobs  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Knobs(Config):
    seq_clip: float = knob(2.0, "a clip that may not be opened", gt=0.0, ui=(1.0, 10.0), log=True)
    cap: float = knob(2.0, "a cap that may", gt=0.0, ui=(1.0, 10.0), log=True, inf=True)
    band_high: float = knob(math.inf, "open by default", gt=0.0, ui=(1.0, 10.0), log=True)


def test_inf_is_offered_where_the_knob_declares_it_and_nowhere_else():
    grid = {f.name: knob_grid(f) for f in knobs(Knobs)}
    assert grid["seq_clip"][-1] == 10.0 and math.inf not in grid["seq_clip"]  # "clip" in its name: no matter
    assert grid["cap"][-1] == math.inf and grid["cap"][-2] == 10.0
    assert grid["band_high"][-1] == math.inf


def test_every_registered_knob_that_offers_inf_accepts_it():
    for name, entry in [*ESTIMATORS.items(), *PRESETS.items()]:
        cfg = entry.config if isinstance(entry.config, type) else type(entry.config)
        for f in knobs(cfg):
            if f.metadata.get("ui") is None or f.metadata.get("choices") or isinstance(f.default, bool):
                continue
            if knob_grid(f)[-1] == math.inf:
                assert not f.metadata["finite"], f"{name}.{f.name} offers inf but refuses it"
                assert cfg().replace(**{f.name: math.inf}).as_dict()[f.name] == math.inf, f"{name}.{f.name}"


def test_every_knob_grid_value_has_its_own_url_form_that_reads_back():
    """A bound knob slider's URL value is its shown form (fmt, Streamlit's binding): on every grid of every
    registered estimator, preset and scenario, no two values share a form and each form parses back to its value,
    so a link names one grid value."""
    from ui.state import parse
    from ui.widgets import fmt

    from seqis.samplers.scenarios import SCENARIOS

    entries = [*ESTIMATORS.items(), *PRESETS.items(), *SCENARIOS.items()]
    for name, entry in entries:
        cfg = entry if isinstance(entry, type) else getattr(entry, "config", None)
        cfg = cfg if isinstance(cfg, type) else type(cfg)
        for f in knobs(cfg):
            if f.metadata.get("ui") is None or f.metadata.get("choices") or isinstance(f.default, bool):
                continue
            grid = [None, *knob_grid(f)] if f.metadata["optional"] else knob_grid(f)
            forms = [fmt(v) for v in grid]
            assert len(set(forms)) == len(forms), f"{name}.{f.name}: two grid values share a URL form: {forms}"
            for v, form in zip(grid, forms):
                assert parse(form, f.default) == v, f"{name}.{f.name}: {form!r} reads back as {parse(form, f.default)}"
