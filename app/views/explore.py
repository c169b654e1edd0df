"""Explore: one batch of rollouts under several estimators, side by side.

Top: the batch (upload your own, an example, or a synthetic scenario). Then per estimator a rollout map with
its bands and its knobs, each column an st.fragment: a knob move reruns that column and redraws only the
sections that depend on it (token heatmap, one rollout's coefficients, weight histograms, effective batch,
tables, the downloads and the export) into slots the full run made. Everything drawn or handed out comes from one
view of the bridge (ui/explore_data.py) over the corrections the columns hold; every widget is bound to the URL.
"""

from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass

import pandas as pd
import streamlit as st
from ui import explore_data as data
from ui import framework, head_view, warm
from ui.batch_source import batch_source
from ui.numbers import number
from ui.png import to_png
from ui.presets import FIRST_ESTIMATORS, FIRST_SCENARIO, PREFIX, arrival, key_estimators
from ui.runtime.chart import chart, prepare
from ui.st_private import fragment_rerun
from ui.state import ARRIVED_KEY, bound, first_look, set_view, switch_page
from ui.widgets import config_from_state, knob_widgets

from seqis import ESTIMATORS
from seqis.diagnosis.advice import Advice
from seqis.diagnosis.summaries import NEGLIGIBLE

P = PREFIX  # "ex."
PICKS = "explore.picks"  # session state: name -> the config its column's knobs hold (valid ones only)
PER_ROW = 4
NO_COLOR = "(status)"
STORY = (
    "**What to look at.** 256 rollouts with long-tailed lengths, every token's log-ratio "
    "l ~ N(-s²/2, s²) with s = 0.05 (a valid IS model; grey dots: the theory's ±2σ funnel of S/T). "
    "A rollout's product weight w = exp(S) spreads like s√T, so **seq_tis** clips the long ones (orange "
    "diamonds above the curve w = C) and **seq_mis** hands them untempered weights (see the histogram: its "
    "ESS collapses). Their geometric ratio exp(S/T) spreads like s/√T, so Li's band [0.5, 2] accepts "
    "every rollout, while **mis_po**'s narrow trajectory band [0.996, 1.001] rejects the *short* rollouts "
    "(red crosses). Move a slider: its map, the charts, the tables and the downloads below follow."
)


def table(slot, frame: pd.DataFrame) -> None:
    """A table in the page's number format; plain st.table, not st.dataframe (its grid is 1.2 MB of JavaScript
    to compile on a first load); wide ones scroll sideways in their own box (style.py), never cut."""
    slot.table(frame.map(number))


# ---------------------------------------------------------------------------------------------------------
# sections that depend on several estimators: drawn by the full run, and by a column's fragment after a move


# the sections a column's fragment redraws after a knob move (the advice only while its expander is open)
SHARED_SLOTS = ("heat", "coef", "weights", "metrics", "effective")
HANDOUT = "explore.handout"  # session state: what the downloads hand out, made by the run that drew the page
CODE_OPEN = f"{P}export.show"  # the export popover's open state


def _knobs(knobs: dict) -> str:
    """The knobs that are numbers (thresholds, clips): a preset's switches and names (verl's bypass_mode, loss_type,
    its None edges) made a wall of text here; its export lists them all."""
    return ", ".join(f"{k} = {number(v)}" if isinstance(v, float) else f"{k} = {v}" for k, v in knobs.items()
                     if k != "adv_tau" and isinstance(v, int | float) and not isinstance(v, bool))


def draw_advice(slot, advice) -> None:
    """The batch read against each shown estimator, and where to start (diagnosis.advice), as one block of text."""
    f = advice.facts
    # a line per estimator, not a table: at 900 px a table's last column ("what binds here") was a word wide
    rows = [f"- `{r.label}` keeps {r.tokens_kept:.0%} of the tokens, accepts {r.rollouts_kept:.0%} of the "
            f"rollouts, ESS {r.ess:.0%}: {r.why[0]}" for r in advice.readings]
    slot.markdown(
        f"**The batch.** {advice.regime}. Rollout lengths: median {f['length_p50']:.0f}, 90th percentile "
        f"{f['length_p90']:.0f}, longest {f['length_max']:.0f}. |l| 99th percentile {f['abs_l_p99']:.2g}, "
        f"largest {f['abs_l_max']:.2g}; {f['catastrophic']:.0f} tokens with |l| > log 10. Untruncated "
        f"sequence weights: ESS {f['ess_seq']:.0%} of the rollouts.\n\n"
        f"**Start with `{advice.suggestion}`** ({_knobs(advice.knobs) or 'no knobs'}"
        + (", fitted to this batch" if advice.fitted else "") + "): " + "; ".join(advice.reasons) + "."
        + f"  \n*The advice {advice.scope}.*"
        + ("" if not advice.caveats else "  \n**Caveats:** " + "; ".join(advice.caveats) + ".")
        + "\n\n" + "\n".join(rows))


def advice_key(src: data.Source) -> str:
    """The advice expander's open state, one per kind of batch: open at first for a file, closed for a scenario."""
    return f"{P}advice.{src.kind}"


def shared_slots(src: data.Source) -> tuple[str, ...]:
    """The slots every column's fragment writes: the advice only while its expander is open (closed, nothing
    there moves with the knobs; opening it reruns the page, which draws it)."""
    return ("advice", *SHARED_SLOTS) if st.session_state.get(advice_key(src)) else SHARED_SLOTS


@dataclass(frozen=True)
class Dependents:
    """What the shared slots show for the shown columns' current corrections, computed before any of it is drawn."""

    advice: Advice | None  # while its expander is open
    heat: data.charts.Figure  # serialized (ui/runtime/chart.prepare)
    coef: data.charts.Figure
    weights: data.charts.Figure
    metrics: pd.DataFrame  # unformatted: `table` prints them
    effective: pd.DataFrame


def dependents(view: data.ExploreView) -> Dependents | None:
    """The shared slots' figures (serialized) and tables from the view of every shown column's
    current correction; and what the downloads hand out, left in HANDOUT: the CSVs and the export snippet from
    these very corrections (a download carries what the page shows at this moment, and its button, drawn once by
    the page, is not redrawn by a move). None when no correction is shown."""
    handout = st.session_state.setdefault(HANDOUT, {})
    if not view.corrections:
        handout.clear()
        return None
    drops = st.session_state.get(f"{P}drops")
    drops = drops if drops in view.names else view.names[0]
    rollout = int(st.session_state.get(f"{P}rollout", 0))
    figures = view.heatmap(drops, rollout), view.coefficients(rollout), view.weights()
    prepare(*figures)
    t = view.tables()
    name, fw = view.export_pick(st.session_state.get(f"{P}export"), st.session_state.get(f"{P}export.fw"))
    handout.update(csv=view.csv_later(),  # written when clicked, from what this run shows
                   export=(fw, view.export(name, fw)) if name in view.names else None)
    return Dependents(view.advice() if "advice" in shared_slots(view.src) else None, *figures, t.metrics,
                      t.effective)


def draw_dependents(d: Dependents | None, slots: dict, src: data.Source) -> None:
    """Draw every shared slot (the sections that depend on several columns) from what `dependents` computed."""
    if d is None:
        for key in shared_slots(src):
            slots[key].empty()
        return
    if d.advice is not None:
        draw_advice(slots["advice"], d.advice)
    for key in ("heat", "coef", "weights"):
        with slots[key]:
            chart(getattr(d, key), key=f"{P}{key}")
    table(slots["metrics"], d.metrics)
    table(slots["effective"], d.effective)
    if fragment_rerun() and st.session_state.get(CODE_OPEN):  # the export's code is open: redraw the page, so
        st.rerun(scope="app")  # that it shows these knobs (a move with the popover open is rare)


def draw_downloads(slot, handout: dict) -> None:
    """The CSV buttons, drawn by the page: a click writes the CSV from HANDOUT, what the page shows then."""
    with slot.container():
        d1, d2 = st.columns(2)
        for col, label, i, fname, key in ((d1, "Metrics CSV", 0, "seqis-metrics.csv", f"{P}csv"),
                                          (d2, "Rollouts CSV", 1, "seqis-rollouts.csv", f"{P}csv_rollouts")):
            col.download_button(label, lambda i=i: handout["csv"][i](), file_name=fname, mime="text/csv",
                                on_click="ignore", key=key, disabled="csv" not in handout)


def draw_export(slot, handout: dict) -> None:
    """The picked correction's settings in the picked trainer's language, with its current knobs: shown in a
    popover and downloaded, both from HANDOUT's snippet (the download reads it when clicked)."""
    fw, snip = handout.get("export") or (None, None)
    if snip is None:  # no correction shown, or its knobs are invalid: the column says why
        slot.empty()
        return
    with slot.container():
        b1, b2 = st.columns(2, vertical_alignment="center")
        # its code drawn while open (opening reruns the page): a knob move redraws no code nobody reads, and the
        # code view's highlighter is 1.5 MB of JavaScript a first load skips
        pop = b1.popover(f"Show {snip.filename}", icon=":material/code:", key=CODE_OPEN, on_change="rerun")
        if pop.open:
            note = "" if snip.exact else " (approximate: see the NOTE lines)" if snip.expressible else \
                " (cannot express)"
            pop.code(snip.text + (f"# {fw}{note}\n" if note else ""), language=data.language(snip))
        # the text as a function: a string is sent to the browser with every run (it fetches each one), a
        # function only when clicked
        # (the snippet drawn here if a later move left none: that column's knobs are invalid and it says so)
        b2.download_button(f"Download {snip.filename}", lambda: (handout.get("export") or (fw, snip))[1].text,
                           file_name=snip.filename, mime="text/plain", on_click="ignore", key=f"{P}dl")


def estimator_column(name: str, src: data.Source, payload, names: list[str], slots: dict, color_by,
                     last: bool) -> None:
    """One estimator's rollout map, knobs and numbers; a knob move reruns only this (an st.fragment), which then
    redraws the shared slots from the view of every column's correction (each column keeps its current one in
    PICKS). In a full run every column writes the shared slots (Streamlit keeps a fragment's place in a slot it
    wrote in the full run): all but the last clear them, the last draws them."""
    first = data.start(name)  # a registry estimator at its defaults, or a preset at its framework's
    kind, prefix, defaults = type(first.config), f"{P}{name}", first.config.as_dict()
    picks = st.session_state.setdefault(PICKS, {})
    shared = last or fragment_rerun()
    # Everything this run draws is computed before it sends any of it, so the browser renders the page once for
    # the lot (each render walks the whole page; sections sent as they were made cost it one render each). The
    # knobs' values are in the session before their widgets are drawn (a move's new value too).
    held = config_from_state(kind, prefix, defaults)
    if held is not None:
        picks[name] = held
    view = data.explore(src, tuple((n, picks[n]) for n in names if n in picks), payload)
    d = dependents(view) if shared else None
    fig = view.rollout_map(name, color_by) if held is not None else None
    if fig is not None:
        prepare(fig)
    plot_slot = st.container()
    panel = st.container(border=True)
    panel.markdown(f"**{name}** · {first.about.summary}")
    cfg, err = knob_widgets(kind, prefix, container=panel, defaults=defaults)
    if err:
        picks.pop(name, None)
        panel.error(f"{name}: {err}")
    else:
        picks[name] = cfg
    if cfg != held:  # the widgets made another config than the session held (a value they refused): redo
        view = data.explore(src, tuple((n, picks[n]) for n in names if n in picks), payload)
        d = dependents(view) if shared else None
        fig = None if err else view.rollout_map(name, color_by)
    if not err:
        with plot_slot:
            chart(fig, key=f"{P}map.{name}")
        panel.markdown("  \n".join(column_numbers(view.estimator(name))), help="ESS: (Σw)² / Σw² of the applied "
                       "rollout weights. Theory: the Gaussian closed forms (theory.formulas) at this batch's lengths.")
    if shared:
        draw_dependents(d, slots, src)
    else:
        for key in shared_slots(src):
            slots[key].empty()


def column_numbers(v: data.EstimatorView) -> list[str]:
    """What survives under one correction, in words, with the theory's value where it has one."""
    eff, th = v.effective, v.theory
    lines = [f"tokens kept **{eff['tokens_kept_frac']:.1%}** · ESS **{number(eff['ess'])}** of "
             f"{int(eff['rollouts'])}",
             f"rollouts accepted **{eff['rollouts_kept_frac']:.1%}**"
             + (f" (theory {th['rollouts_kept_frac']:.1%})" if "rollouts_kept_frac" in th else "")]
    if eff["tokens_negligible"] > 0:  # kept by the rules with no gradient to speak of: said, beside the rules' own
        n_tok, n_roll = int(eff["tokens_negligible"]), int(eff["rollouts_negligible"])
        lines.append(f"weight negligible (below {NEGLIGIBLE:g} x the median): **{n_tok:,}** tokens, "
                     f"**{n_roll:,}** rollouts, counted as dropped")
    if "clipped_frac" in th or eff["clipped_frac"] > 0:
        lines.append(f"rollouts clipped **{eff['clipped_frac']:.1%}**"
                     + (f" (theory {th['clipped_frac']:.1%})" if "clipped_frac" in th else ""))
    return lines


column_fragment = warm.fragment(estimator_column)  # its reruns hold the background warm-up back


# ---------------------------------------------------------------------------------------------------------
# the page

st.title("Explore: one batch, several estimators")
st.page_link("views/lessons.py", label="New here? Lessons: the five facts, one chart at a time",
             icon=":material/menu_book:")
arrival("ex")
src, payload = batch_source()
if first_look(src):  # a new upload opens on Diagnose first: why its log-probs disagree, then what corrections do
    st.session_state[ARRIVED_KEY] = src.label
    set_view({"dg.source": "batch"})
    switch_page("views/diagnose.py")
try:
    bv = data.batch_view(src, _payload=payload)
except (ValueError, OSError, RuntimeError) as e:  # RuntimeError: out of memory
    st.error(f"Could not load {src.label}: {e}")
    st.stop()
B, T = bv.shape
st.sidebar.caption(f"{src.label}: **{B} rollouts x {T} positions**")
st.sidebar.caption("This view's settings live in the URL: copy the address to share them. A link cannot carry an "
                   "uploaded file: whoever opens it is asked to upload the file again." if src.kind == "upload" else
                   "This view lives in the URL: copy the address to share it.")

intro = st.container()
c1, c_fw, c_preset, c2 = st.container(key="narrow-ex-controls").columns([3, 1, 1.5, 1], vertical_alignment="bottom")
with c1:
    names = bound(st.multiselect, "Estimators", key_estimators(), FIRST_ESTIMATORS, options=list(ESTIMATORS),
                  valid=lambda v: isinstance(v, list) and all(n in ESTIMATORS for n in v),
                  help="Each estimator's knobs are drawn from its config; add any from the registry.",
                  placeholder="Pick estimators to compare")
mine = framework.pick(c_fw, c_preset)
if mine is not None:  # my framework's correction, first, beside the estimators
    st.caption(framework.caption(mine))
    names = [mine, *[n for n in names if n != mine]]
    st.page_link("views/compare.py", label="Several frameworks' presets side by side, with their configs and where "
                 "they disagree: Compare", icon=":material/compare_arrows:")
with c2:
    meta = [k for k, v in bv.metadata.items() if len(v) == B]
    color_by = bound(st.selectbox, "Colour rollouts by", f"{P}color", NO_COLOR, options=[NO_COLOR, *meta],
                     valid=lambda v: v in [NO_COLOR, *meta],
                     help="Status (accepted / clipped / rejected, also shown by the symbol) or a metadata column.")
color_by = None if color_by == NO_COLOR else color_by
if src.kind == "synthetic" and src.name == FIRST_SCENARIO:
    intro.caption(STORY)
if not names:
    st.info("Pick at least one estimator.")
    st.stop()

# the page's skeleton first: the advice, a column per estimator, then one slot per dependent chart or table
advice_box = st.expander("What this means for your batch", expanded=src.is_file, key=advice_key(src),
                         on_change="rerun")
advice_box.caption("The batch's mismatch read against each estimator's band and clip (closed forms and the "
                   "literature's thresholds; seqis.diagnosis), and a suggested start. Follows the knobs below.")
slots = {"advice": advice_box.empty()}
st.subheader("Rollout map")
st.caption("One point per rollout: its length T and geometric log-ratio S/T. Dashed: the estimator's bands "
           "(horizontal: a geometric band; curve: a product clip w = C, i.e. S/T = log C / T). Blue: accepted, "
           "orange: accepted with its weight clipped, red: rejected (every token dropped). Hover for a rollout's "
           "numbers and metadata.")
columns = []
for start in range(0, len(names), PER_ROW):
    row = names[start:start + PER_ROW]
    cols = st.columns(PER_ROW if len(names) > PER_ROW else len(row), gap="small")  # a short last row: same widths
    columns += list(zip(row, cols[:len(row)], strict=True))

st.subheader("Tokens")
left, right = st.columns([3, 2], gap="medium")
with right:
    drops = bound(st.selectbox, "Shade the tokens dropped by", f"{P}drops", names[0], options=names,
                  valid=lambda v: v in names)
    rollout = bound(st.number_input, "Rollout", f"{P}rollout", int(bv.lengths.argmax()), min_value=0,
                    max_value=B - 1, step=1, valid=lambda v: isinstance(v, int) and 0 <= v < B,
                    help="Pick a rollout (a row of the heatmap); its per-token gradient coefficients are drawn "
                         "below for every estimator. Default: the longest.")
slots.update(heat=left.empty(), coef=right.empty())
right.caption("The coefficient is the token's weight: d loss / d log pi = -weight · adv_tau · A / N. "
              + ", ".join(f"{k} {v[rollout]}" for k, v in bv.metadata.items() if len(v) == B))
tm_rows = bv.token_values.shape[0]
pooled = f"each cell is the largest-|l| token of {bv.token_block} positions" if bv.token_block > 1 else \
    "one cell per token"
rows = f"{tm_rows} of {B} rollouts (every {B / tm_rows:.1f}th by length)" if tm_rows < B else f"all {B} rollouts"
left.caption(f"{rows}, longest first, x {T} positions; {pooled} (sign kept; colour clipped at the 99th percentile "
             f"of |l|). Grey: the share of a cell's loss tokens whose gradient the picked estimator drops. The orange "
             f"box is the picked rollout.")

st.subheader("Weights and the effective batch")
slots["weights"] = st.empty()

st.subheader("Metrics and diagnostics")
left, right = st.columns([3, 2], gap="medium")
left.markdown("**Estimator metrics** (prime-rl's names; blank: not reported)")
slots["metrics"] = left.empty()
left.markdown("**Effective batch**")
slots["effective"] = left.empty()
right.markdown("**Batch diagnostics** (estimator-free)")
table(right, pd.Series(bv.diagnostics, name="value").to_frame())
for note in bv.notes:
    right.caption(note)
downloads_slot = right.empty()

head_view.explore_section(data.load_batch(src, payload), P)  # the sampler's head: score centering

st.subheader("Export")
st.caption("An estimator's current settings as trainer config. A `# NOTE` line says where a knob has no "
           "equivalent or the trainer weighs tokens differently.")
e1, e2 = st.container(key="narrow-ex-export").columns([2, 1], vertical_alignment="bottom")
bound(e1.selectbox, "Estimator", f"{P}export", names[0], options=names, valid=lambda v: v in names)
export_name = st.session_state[f"{P}export"]
offered = data.frameworks(data.start(export_name))  # does not move with the knobs
bound(e2.selectbox, "Trainer", f"{P}export.fw", offered[0], options=offered, valid=lambda v: v in offered)
export_slot = st.empty()
png_box = st.expander("Figures as PNG")

# fill the skeleton: each estimator's column (a fragment), then the dependent slots once
for name, col in columns:
    with col:
        column_fragment(name, src, payload, names, slots, color_by, name == columns[-1][0])

handout = st.session_state.setdefault(HANDOUT, {})  # the last column's run filled it
draw_downloads(downloads_slot, handout)
draw_export(export_slot, handout)
with png_box:  # every column has drawn: its view holds what they show
    st.caption("Each chart's camera icon saves it as PNG in the browser. Here all of them render at once "
               "through kaleido and a headless chromium.")
    picks = st.session_state.get(PICKS, {})
    view = data.explore(src, tuple((n, picks[n]) for n in names if n in picks), payload)
    if st.button("Render PNGs", key=f"{P}png", disabled=not view.corrections):
        d = drops if drops in view.names else view.names[0]
        figures = view.figures(color_by, d, int(rollout))
        try:
            with st.spinner(f"Rendering {len(figures)} figures..."):
                pngs = to_png(figures)
        except RuntimeError as e:
            st.error(f"{e}. Use each chart's camera icon instead.")
        else:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                for fname, png in pngs.items():
                    z.writestr(f"{fname}.png", png)
            st.download_button(f"Download {len(pngs)} PNGs (zip)", buf.getvalue(), file_name="seqis-figures.zip",
                               mime="application/zip", on_click="ignore", key=f"{P}png_dl")
