"""Learn: one card per estimator (formula, what it trades, what it reduces to, source, defaults) with
presets that open the page where the point lives (Explore, Length & thresholds, Bias & variance, Training) on a
setting that shows it; that page says what to look at on arrival. Everything on a card comes from the
registry (seqis.ESTIMATORS) and the estimator's module docstring, so a new estimator gets a card free."""

from __future__ import annotations

import math

import streamlit as st
from ui.framework import preset_view
from ui.presets import TITLES, open_preset, presets_for
from ui.state import query, set_view, switch_page

from seqis import ESTIMATORS, SEED_ESTIMATORS
from seqis.core.types import knobs
from seqis.presets import FRAMEWORKS, presets_of

EXPLORE = "views/explore.py"


def _default(v) -> str:
    if v is None:
        return "off"
    if isinstance(v, float) and math.isinf(v):
        return "∞"
    return f"{v:g}" if isinstance(v, float) else str(v)


def framework_presets(framework: str) -> None:
    """One framework's shipped corrections: what its code computes (its module docstring), then one row per
    preset with when the framework shipped it, its quirks and the code read (repository@commit: file)."""
    presets = presets_of(framework)
    with st.expander(f"**{framework}** · {len(presets)} preset{'s' * (len(presets) > 1)}"):
        st.code(FRAMEWORKS[framework].__doc__.strip(), language=None, wrap_lines=True)
        rows = [f"| `{p.name}` | *{p.versions.replace('|', '/')}.* {p.summary.replace('|', '/')} | "
                f"`{p.source.replace('|', '/')}` |" for p in presets.values()]
        st.markdown("\n".join(["| preset | shipped; what the code computes (quirks) | source |", "|---|---|---|",
                                *rows]))
        pick, go = st.columns([3, 1], vertical_alignment="bottom")
        key = pick.selectbox("Open in Explore", list(presets), format_func=lambda k: k.split("/", 1)[1],
                             key=f"learn.fw.{framework}")
        if go.button("Open", key=f"learn.fw.{framework}.open", width="stretch"):
            set_view(preset_view(key), reset="ex.fw")
            switch_page(EXPLORE, query(preset_view(key)))


def card(name: str) -> None:
    spec = ESTIMATORS[name]
    with st.container(border=True):
        head, tag = st.columns([5, 1])
        head.markdown(f"### `{name}`")
        head.markdown(spec.summary)
        tag.markdown(":blue-badge[seed]" if spec.seed else ":gray-badge[reference]")
        st.latex(r"w_{j,t} = " + spec.formula)
        for heading in ("Trades", "Reduces to", "Source"):
            text = spec.section(heading)
            if text:
                st.markdown(f"**{heading}.** {text}")
        rows = [f"| `{f.name}` | {_default(f.default)} | {f.metadata['help'].replace('|', '/')} |"
                for f in knobs(spec.config)]
        st.markdown("\n".join(["| knob | default | meaning |", "|---|---|---|", *rows]))
        st.caption("Presets (each opens the page where its point lives):")
        cols = st.columns(2)
        for i, preset in enumerate(presets_for(name)):
            if cols[i % 2].button(preset.label, key=f"learn.{name}.{i}", width="stretch",
                                  help=f"{preset.help} Opens {TITLES[preset.page]}."):
                open_preset(preset)


st.title("Learn: the estimators")
st.markdown(
    "Every estimator multiplies each loss token's gradient by a weight built from the log-ratios "
    "l_t = log π(y_t) − log μ(y_t) of its rollout: S_j = Σ_t l_t over rollout j's T_j loss tokens, the "
    "product ratio w_j = exp(S_j) (the exact importance weight, unbiased, variance growing like "
    "(1 + χ²)^T, χ² the per-token chi-square) and the geometric ratio exp(S_j / T_j) (a per-token average that "
    "does not grow with length). The four **seed** estimators are prime-rl's sequence-level IS ablations; the "
    "**reference** ones are there to compare. Each preset opens the page where its point lives, with its "
    "setting; the link it opens can be shared. New here? The **Lessons** page teaches the five facts one chart at "
    "a time."
)
st.page_link("views/lessons.py", label="Lessons: the five facts, one chart at a time", icon=":material/menu_book:")
seeds = [n for n in ESTIMATORS if n in SEED_ESTIMATORS]
refs = [n for n in ESTIMATORS if n not in SEED_ESTIMATORS]
st.subheader("Seed estimators")
cols = st.columns(2, gap="medium")
for i, name in enumerate(seeds):
    with cols[i % 2]:
        card(name)
st.subheader("Reference estimators")
cols = st.columns(2, gap="medium")
for i, name in enumerate(refs):
    with cols[i % 2]:
        card(name)

st.subheader("What the frameworks ship")
st.markdown(
    "Every framework's shipped correction is a preset `framework/name` (`seqis.PRESETS`), run wherever an "
    "estimator name goes. Each reproduces what the framework's **code** computes at its default knob values, "
    "quirks included; where the code and its docs differ, the row says so. All of them are one mechanism: an "
    "IS weight, chained rejection rules, an optional penalty."
)
for framework in FRAMEWORKS:
    framework_presets(framework)
