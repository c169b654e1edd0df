"""Compare: any mix of framework presets and registry estimators side by side on one batch (Explore's), each
column with its own framework's knobs and its exported config, then where they disagree on this batch: the
tokens one keeps and another drops, the rollouts one accepts and another rejects, the tokens both keep at weights
more than 1% apart. Everything comes from one view of the bridge (ui/explore_data.py), as on Explore; every
widget is bound to the URL under "cmp.".
"""

from __future__ import annotations

import io
import zipfile

import pandas as pd
import streamlit as st
from ui import explore_data as data
from ui import head_view
from ui.batch_source import batch_source
from ui.numbers import number
from ui.presets import COMPARE_FIRST, compare_first
from ui.runtime.chart import chart
from ui.state import bound, first_look
from ui.widgets import knob_widgets

from seqis import ESTIMATORS
from seqis.presets import FRAMEWORKS, presets_of
from seqis.registry import runnable, skipped_note

P = "cmp."
PER_ROW = 4
MAX_SHOWN = 8
FIRST = COMPARE_FIRST  # three frameworks' defaults
# the picker's options grouped by framework (in the order Learn lists them), the registry's estimators last
GROUP = {k: fw for fw in FRAMEWORKS for k in presets_of(fw)}  # a preset key -> its framework
OPTIONS = [*GROUP, *ESTIMATORS]
PATTERNS = 12  # rows of the "who keeps which tokens" table


def group_of(key: str) -> str:
    """The framework whose preset this is, "seqis" for a registry estimator."""
    return GROUP.get(key, "seqis")


def label(key: str) -> str:
    """A picker option: its framework, then its own name ("verl · decoupled_token_is"; "seqis · seq_tis"), so
    typing a framework's name finds all of its presets."""
    return f"{group_of(key)} · {key.split('/', 1)[-1]}"


def column(key: str) -> data.Estimators:
    """One correction's column head: its name and summary, its framework's knobs; returns its (name, config)
    pair, or () when its knobs are invalid (said here)."""
    first = data.start(key)
    st.markdown(f"**{group_of(key)}** · `{key.split('/', 1)[-1]}`")
    st.caption(first.about.summary)
    panel = st.container(border=True)
    cfg, err = knob_widgets(type(first.config), f"{P}{key}", container=panel, defaults=first.config.as_dict())
    if err:
        panel.error(f"{key}: {err}")
        return ()
    return ((key, cfg),)


def draw_numbers(view: data.ExploreView, key: str, where) -> None:
    v = view.estimator(key)
    eff = v.effective
    where.markdown(f"tokens kept **{eff['tokens_kept_frac']:.1%}** · rollouts accepted "
                   f"**{eff['rollouts_kept_frac']:.1%}** · ESS **{number(eff['ess'])}** of {int(eff['rollouts'])}")
    m = v.metrics
    if "sc_correction" in m:  # a head correction: what score centering reads and adds, in its own column
        where.markdown(f"score centering: sc_correction **{number(m['sc_correction'])}** · sampler head mass "
                       f"**{number(m['sc_sampler_head_mass'])}** · trainer's **{number(m['sc_train_head_mass'])}**")


def draw_export(view: data.ExploreView, key: str, where) -> None:
    """The column's config in its own framework's language (a registry estimator: prime-rl's), with a download."""
    fw = view.frameworks(key)[0]
    snip = view.export(key, fw)
    note = "" if snip.exact else " (approximate: see the NOTE lines)" if snip.expressible else " (cannot express)"
    where.markdown(f"**{fw} config**{note}")
    where.code(snip.text, language=data.language(snip), wrap_lines=True)
    where.download_button(f"Download {snip.filename}", lambda: snip.text, file_name=snip.filename,
                          mime="text/plain", on_click="ignore", key=f"{P}dl.{key}")  # sent when clicked


def matrix(frame: pd.DataFrame, total: int) -> pd.DataFrame:
    """A pair table as the page prints it: the count and its share of the total ("1,234 (12.5%)"), blank on the
    diagonal."""
    out = frame.astype(object).copy()
    for i, r in enumerate(frame.index):
        for j, c in enumerate(frame.columns):
            v = int(frame.loc[r, c])
            out.loc[r, c] = "" if i == j else f"{number(v)} ({v / max(total, 1):.1%})"
    return out


def disagreement_csv(d: data.Disagreement) -> str:
    """The three pair tables, long: table, row, column, count."""
    frames = [m.stack().rename_axis(["row", "column"]).reset_index(name="count").assign(table=name)
              for name, m in (("tokens kept by row, dropped by column", d.tokens),
                              ("rollouts accepted by row, rejected by column", d.rollouts),
                              ("tokens both keep, weights more than 1% apart", d.weights))]
    long = pd.concat(frames)[["table", "row", "column", "count"]]
    return long[long.row != long.column].to_csv(index=False)


st.title("Compare: corrections from several frameworks")
st.caption("Any mix of the frameworks' shipped corrections and the registry's estimators on one batch (the batch "
           "Explore shows): each with its own framework's knobs and exported config, then where they disagree on "
           "this batch.")
src, payload = batch_source()
first_look(src)  # seen here: Explore will not send it to Diagnose
batch = data.load_batch(src, payload)
picks = bound(st.multiselect, "Corrections", f"{P}picks", compare_first(batch.has_head),
              options=OPTIONS, format_func=label,
              valid=lambda v: isinstance(v, list) and all(k in OPTIONS for k in v) and len(v) <= MAX_SHOWN,
              max_selections=MAX_SHOWN, placeholder="Type a framework or a correction to search",
              help="Grouped by framework (verl, trl, nemo-rl, prime-rl, ...), then the registry's estimators "
                   "(seqis); type to search. Each starts at its framework's defaults. Score centering's corrections "
                   "need a batch with the sampler's top-k head.")
picks, skipped = runnable(picks, batch)  # score centering on a batch without a head: named, not run
if skipped:
    st.warning(skipped_note(skipped))
if not batch.has_head:
    st.caption("This batch has no sampler head: score centering's corrections cannot run on it (the end of the page "
               "names them and the fields they read).")
if not picks:
    st.info("Pick at least one correction; two or more to see where they disagree.")
    st.stop()

rows = [picks[i:i + PER_ROW] for i in range(0, len(picks), PER_ROW)]
pairs: list[tuple[str, object]] = []
maps, numbers, exports = {}, {}, {}
for row in rows:
    cols = st.columns(PER_ROW if len(picks) > PER_ROW else len(row), gap="small")
    for key, col in zip(row, cols, strict=False):
        with col:
            maps[key] = st.container()  # its rollout map, drawn once every column's knobs are read
            pairs += column(key)
            numbers[key], exports[key] = st.container(), st.container()

view = data.explore(src, tuple(pairs), payload)
for key in view.names:
    with maps[key]:
        chart(view.rollout_map(key), key=f"{P}map.{key}")
    draw_numbers(view, key, numbers[key])
    draw_export(view, key, exports[key])

if len(view.corrections) < 2:
    head_view.compare_section(batch, P)  # the sampler's head: score centering
    st.stop()

st.subheader("Where they disagree on this batch")
d = view.disagreement()
st.caption(f"{d.n_tokens:,} loss tokens in {d.n_rollouts:,} rollouts. Read a table across a row: the row's "
           "correction against each column's. Two corrections can keep the same tokens and still weigh them "
           "differently (the third table).")
t1, t2 = st.columns(2, gap="medium")
t1.markdown("**Tokens the row keeps and the column drops**")
t1.table(matrix(d.tokens, d.n_tokens))
t2.markdown("**Rollouts the row accepts and the column rejects**")
t2.table(matrix(d.rollouts, d.n_rollouts))
t3, t4 = st.columns(2, gap="medium")
t3.markdown("**Tokens both keep, at weights more than 1% apart**")
t3.table(matrix(d.weights, d.n_tokens))
t4.markdown("**Who keeps which tokens** (the most common patterns)")
patterns = d.patterns.head(PATTERNS).assign(**{
    "tokens": lambda f: f["tokens"].map(number), "share of loss tokens": lambda f: f["share of loss tokens"].map(
        lambda v: f"{v:.1%}")})
t4.table(patterns.set_index("kept by"))

st.subheader("Metrics side by side")
t = view.tables()
m1, m2 = st.columns([3, 2], gap="medium")
m1.markdown("**Metrics** (prime-rl's names; blank: not reported)")
m1.table(t.metrics.map(number))
m2.markdown("**What survives**")
m2.table(t.effective.map(number))

buf = io.BytesIO()
with zipfile.ZipFile(buf, "w") as z:
    for key in view.names:
        snip = view.export(key, view.frameworks(key)[0])
        z.writestr(snip.filename, snip.text)
c1, c2, c3 = st.columns(3)
c1.download_button("Every config (zip)", buf.getvalue(), file_name="seqis-configs.zip", mime="application/zip",
                   on_click="ignore", key=f"{P}zip")
c2.download_button("Disagreement CSV", disagreement_csv(d), file_name="seqis-disagreement.csv", mime="text/csv",
                   on_click="ignore", key=f"{P}csv")
c3.download_button("Metrics CSV", view.csv_later()[0], file_name="seqis-metrics.csv", mime="text/csv",
                   on_click="ignore", key=f"{P}metrics_csv")

head_view.compare_section(batch, P)  # the sampler's head, last: score centering at each head size K
