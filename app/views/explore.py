"""Explore: one batch of rollouts under several estimators, side by side.

Sidebar: the batch (a synthetic scenario and its knobs, an uploaded file, or an example asset).
Main: estimators and their knobs; per estimator a rollout map with its bands; the token heatmap and one
rollout's per-token gradient coefficients; weight histograms and the effective batch; metrics and
diagnostics tables (CSV); prime-rl / verl snippets and PNG downloads. Every widget is bound to the URL.
"""

from __future__ import annotations

import io
import zipfile

import pandas as pd
import streamlit as st
from ui import charts, data
from ui.presets import FIRST_BATCH, FIRST_ESTIMATORS, FIRST_SCENARIO, PREFIX, key_estimators
from ui.state import bound
from ui.widgets import knob_widgets

from seqis import ESTIMATORS
from seqis.export import prime_rl_toml, verl_yaml
from seqis.synthetic import SCENARIOS, describe

P = PREFIX  # "ex."
PER_ROW = 4
MAX_POSITIONS = {False: 1 << 25, True: 1 << 29}  # B x T a synthetic batch may have (CPU, CUDA)
SOURCES = {"synthetic": "Synthetic", "upload": "File", "asset": "Example"}
STORY = (
    "**What to look at.** 256 rollouts with long-tailed lengths, every token's log-ratio "
    "l ~ N(-s²/2, s²) with s = 0.05 (a valid IS model; grey dots: the theory's ±2σ funnel of S/T). "
    "A rollout's product weight w = exp(S) spreads like s√T, so **seq_tis** clips the long ones (orange "
    "diamonds above the curve w = C) and **seq_mis** hands them untempered weights (see the histogram: its "
    "ESS collapses). Their geometric ratio exp(S/T) spreads like s/√T, so Li's band [0.5, 2] keeps "
    "everything, while **mis_po**'s narrow trajectory band [0.996, 1.001] rejects the *short* rollouts "
    "(red crosses). Move a slider: the map, the tables and the links below follow."
)


# ---------------------------------------------------------------------------------------------------------
# the batch (sidebar)


def _g(v) -> str:
    """A table cell: 4 significant digits, blank when the estimator does not report it."""
    if pd.isna(v):
        return ""
    return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 1000 else f"{v:.4g}"


def _current() -> tuple[data.Source, bytes | None] | None:
    return st.session_state.get(f"{P}_current")


def _hold(src: data.Source, payload: bytes | None) -> tuple[data.Source, bytes | None]:
    st.session_state[f"{P}_current"] = (src, payload)
    return src, payload


def _synthetic_source(sb) -> data.Source | None:
    scenario = bound(sb.selectbox, "Scenario", f"{P}scenario", FIRST_SCENARIO, options=list(SCENARIOS),
                     valid=lambda v: v in SCENARIOS)
    sb.caption(describe(scenario))
    cls = SCENARIOS[scenario]
    own = [f for f in cls.__dataclass_fields__ if f not in cls.__mro__[1].__dataclass_fields__]
    primary = {"n_rollouts", "max_len", "lengths", *own}
    advanced = tuple(f for f in cls.__dataclass_fields__ if f not in primary)
    cfg, err = knob_widgets(cls, f"{P}sc.{scenario}", container=sb, advanced=advanced,
                            advanced_container=sb.expander("More batch knobs"),
                            defaults=FIRST_BATCH if scenario == FIRST_SCENARIO else None)
    seed = bound(sb.number_input, "Seed", f"{P}seed", 0, min_value=0, max_value=2**31 - 1, step=1,
                 valid=lambda v: isinstance(v, int) and v >= 0)
    if err:
        sb.error(err)
        return None
    limit = MAX_POSITIONS[data.device().type == "cuda"]
    if cfg.n_rollouts * cfg.max_len > limit:
        sb.error(f"n_rollouts x max_len = {cfg.n_rollouts * cfg.max_len:,} positions is more than this device's "
                 f"{limit:,}: lower n_rollouts or max_len")
        return None
    return data.Source("synthetic", scenario, cfg, int(seed))


def _file_source(sb, kind: str) -> tuple[data.Source, bytes] | None:
    """An uploaded file or an asset: loaded once per content digest; a bad file shows the loader's
    message and returns None (the previous batch stays)."""
    if kind == "upload":
        up = sb.file_uploader("Batch file", type=data.upload_formats(), key=f"{P}upload",
                              help="One row per rollout with list columns, padded [B, T] arrays or a packed "
                                   "micro-batch; verl's names are understood. Nothing is executed or stored.")
        if up is None:
            return None
        raw, name = up.getvalue(), up.name
    else:
        found = data.assets()
        if not found:
            sb.info("No example batches in assets/ yet.")
            return None
        name = bound(sb.selectbox, "Example batch", f"{P}asset", sorted(found)[0], options=sorted(found),
                     valid=lambda v: v in found)
        raw = found[name].read_bytes()
    dig = data.digest(raw)
    held = st.session_state.get(f"{P}_file.{kind}")
    if held is not None and held[0].digest == dig:
        return held
    if st.session_state.get(f"{P}_bad.{kind}", (None,))[0] == dig:  # the same bad file: say it again
        sb.error(st.session_state[f"{P}_bad.{kind}"][1])
        return None
    try:
        src = data.source_of_file(raw, name, kind=kind)
    except (ValueError, OSError, ImportError) as e:  # BatchFormatError is a ValueError
        msg = str(e) if name in str(e) else f"{name}: {e}"
        st.session_state[f"{P}_bad.{kind}"] = (dig, msg)
        sb.error(msg)
        return None
    st.session_state[f"{P}_file.{kind}"] = (src, raw)
    return src, raw


def batch_source() -> tuple[data.Source, bytes | None]:
    sb = st.sidebar
    sb.header("Batch")
    kind = bound(sb.radio, "Source", f"{P}source", "synthetic", options=list(SOURCES), format_func=SOURCES.get,
                 valid=lambda v: v in SOURCES, horizontal=True, label_visibility="collapsed")
    if kind == "synthetic":
        src = _synthetic_source(sb)
        if src is not None:
            return _hold(src, None)
    else:
        got = _file_source(sb, kind)
        if got is not None:
            return _hold(*got)
    held = _current()
    if held is None:  # nothing loaded yet: the first view's batch
        cls = SCENARIOS[FIRST_SCENARIO]
        held = _hold(data.Source("synthetic", FIRST_SCENARIO, cls(**FIRST_BATCH), 0), None)
    sb.caption(f"Showing the previous batch: {held[0].label}")
    return held


# ---------------------------------------------------------------------------------------------------------
# the page


st.title("Explore: one batch, several estimators")
src, payload = batch_source()
try:
    shape = data.load_batch(src, _payload=payload).shape
except (ValueError, OSError, RuntimeError) as e:  # RuntimeError: out of memory
    st.session_state.pop(f"{P}_current", None)  # do not hold on to a batch that cannot be built
    st.error(f"Could not load {src.label}: {e}")
    st.stop()
st.sidebar.caption(f"{src.label}: **{shape[0]} rollouts x {shape[1]} positions**")
st.sidebar.caption("This view lives in the URL: copy the address to share it.")

intro = st.container()
names = bound(st.multiselect, "Estimators", key_estimators(), FIRST_ESTIMATORS, options=list(ESTIMATORS),
              valid=lambda v: isinstance(v, list) and all(n in ESTIMATORS for n in v),
              help="Each estimator's knobs are drawn from its config; add any from the registry.",
              placeholder="Pick estimators to compare")
if src.kind == "synthetic" and src.name == FIRST_SCENARIO:
    intro.caption(STORY)
if not names:
    st.info("Pick at least one estimator.")
    st.stop()

# knobs and rollout maps: one column per estimator, the knobs right under the map they move
info = data.rollout_info(src, _payload=payload)
noise = data.noise_scale(src)
views: dict[str, data.EstimatorView] = {}
figures: dict[str, object] = {}
st.subheader("Rollout map")
st.caption("One point per rollout: its length T and geometric log-ratio S/T. Dashed: the estimator's bands "
           "(horizontal: a geometric band; curve: a product clip w = C, i.e. S/T = log C / T). Blue: kept, "
           "orange: weight clipped, red: rollout dropped. Hover for a rollout's numbers and metadata.")
for start in range(0, len(names), PER_ROW):
    row = names[start:start + PER_ROW]
    cols = st.columns(PER_ROW if len(names) > PER_ROW else len(row), gap="small")
    for col, name in zip(cols, row):
        spec = ESTIMATORS[name]
        with col:
            plot_slot = st.container()
            panel = st.container(border=True)
            panel.markdown(f"**{name}** · {spec.summary}")
            cfg, err = knob_widgets(spec.config, f"{P}{name}", container=panel)
            if err:
                panel.error(f"{name}: {err}")
                continue
            view = data.estimator_view(src, name, cfg, _payload=payload)
            views[name] = view
            fig = data.figure(("map", src, name, cfg), lambda v=view, n=name, c=cfg: charts.rollout_map(
                n, v.rollouts, charts.bands_of(c.as_dict()), metadata=info.metadata, noise_s=noise, height=330))
            figures[f"rollout_map_{name}"] = fig
            plot_slot.plotly_chart(fig, key=f"{P}map.{name}", config={"displaylogo": False})
            eff, th = view.effective, data.theory(src, view)
            lines = [f"tokens kept **{eff['tokens_kept_frac']:.1%}** · ESS **{eff['ess']:.1f}** of "
                     f"{int(eff['rollouts'])}",
                     f"rollouts kept **{eff['rollouts_kept_frac']:.1%}**"
                     + (f" (theory {th['rollouts_kept_frac']:.1%})" if "rollouts_kept_frac" in th else "")]
            if "clipped_frac" in th or eff["clipped_frac"] > 0:
                lines.append(f"rollouts clipped **{eff['clipped_frac']:.1%}**"
                             + (f" (theory {th['clipped_frac']:.1%})" if "clipped_frac" in th else ""))
            panel.markdown("  \n".join(lines), help="ESS: (Σw)² / Σw² of the applied rollout weights. Theory: "
                           "the Gaussian closed forms (seqis.theory) at this batch's lengths.")

if not views:
    st.stop()
shown = list(views)

# tokens: heatmap of l_t with one estimator's drops, and one rollout's coefficients
st.subheader("Tokens")
tm = data.token_map_view(src, _payload=payload)
left, right = st.columns([3, 2], gap="medium")
with right:
    drops = bound(st.selectbox, "Shade the tokens dropped by", f"{P}drops",
                  next((n for n in shown if views[n].effective["tokens_kept_frac"] < 1), shown[0]),
                  options=shown, valid=lambda v: v in shown)
    B = shape[0]
    rollout = bound(st.number_input, "Rollout", f"{P}rollout", int(info.lengths.argmax()), min_value=0,
                    max_value=B - 1, step=1, valid=lambda v: isinstance(v, int) and 0 <= v < B,
                    help="Pick a rollout (a row of the heatmap); its per-token gradient coefficients are drawn "
                         "below for every estimator. Default: the longest.")
    pos, lr = data.rollout_log_ratio(src, rollout, _payload=payload)
    coefs = {n: views[n].coefficients(rollout) for n in shown}
    meta = ", ".join(f"{k} {v[rollout]}" for k, v in info.metadata.items())
    fig = charts.coefficient_plot(pos, lr, coefs, height=420,
                                  title=f"rollout {rollout}: T = {int(info.lengths[rollout])}, "
                                        f"A = {info.advantages[rollout]:.3g}")
    figures["coefficients"] = fig
    st.plotly_chart(fig, key=f"{P}coef", config={"displaylogo": False})
    st.caption(f"The coefficient is the token's weight: d loss / d log pi = -weight · adv_tau · A / N. {meta}")
with left:
    fig = data.figure(("heat", src, drops, views[drops].config, rollout), lambda: charts.token_heatmap(
        tm.values, tm.block, tm.index, dropped=views[drops].dropped, dropped_label=drops, picked=rollout,
        height=520, title=f"log-ratio l_t; grey: tokens whose gradient {drops} drops"))
    figures["token_heatmap"] = fig
    st.plotly_chart(fig, key=f"{P}heat", config={"displaylogo": False})
    pooled = (f"each cell is the largest-|l| token of {tm.block} positions" if tm.block > 1
              else "one cell per token")
    rows = (f"{tm.rows} of {tm.shape[0]} rollouts (every {tm.shape[0] / tm.rows:.1f}th by length)"
            if tm.rows < tm.shape[0] else f"all {tm.rows} rollouts")
    st.caption(f"{rows}, longest first, x {tm.shape[1]} positions; {pooled} (sign kept; colour clipped at the "
               f"99th percentile of |l|). Grey: the share of a cell's loss tokens whose gradient {drops} drops. "
               f"The orange box is the picked rollout.")

# weights and the effective batch
st.subheader("Weights and the effective batch")
left, right = st.columns([3, 2], gap="medium")
fig = charts.weight_histograms({n: views[n].hist for n in shown}, height=340,
                               title="applied token weights (kept tokens)")
figures["weights"] = fig
left.plotly_chart(fig, key=f"{P}hist", config={"displaylogo": False})
theory = {n: data.theory(src, views[n]) for n in shown}
fig = charts.effective_bars({n: views[n].effective for n in shown}, theory, height=340,
                            title="what survives: tokens, rollouts, ESS / rollouts" + (" (◆ theory)" if noise else ""))
figures["effective"] = fig
right.plotly_chart(fig, key=f"{P}eff", config={"displaylogo": False})

# metrics and diagnostics
st.subheader("Metrics and diagnostics")
left, right = st.columns([3, 2], gap="medium")
metrics = pd.DataFrame({n: views[n].metrics for n in shown})
effective = pd.DataFrame({n: views[n].effective for n in shown})
diag = pd.Series(data.batch_diagnostics(src, _payload=payload), name="value")
left.markdown("**Estimator metrics** (prime-rl's names; blank: not reported)")
left.dataframe(metrics.map(_g), width="stretch")
left.markdown("**Effective batch**")
left.dataframe(effective.map(_g), width="stretch")
right.markdown("**Batch diagnostics** (estimator-free)")
right.dataframe(diag.map(_g).to_frame(), width="stretch", height=422)
long = pd.concat([
    metrics.stack().rename_axis(["name", "estimator"]).reset_index(name="value").assign(table="metric"),
    effective.stack().rename_axis(["name", "estimator"]).reset_index(name="value").assign(table="effective"),
    diag.rename_axis("name").reset_index().assign(table="diagnostic", estimator=""),
])[["table", "estimator", "name", "value"]]
per_rollout = pd.DataFrame({"rollout": range(shape[0]), "length": info.lengths,
                            **{f"{n}.{k}": views[n].rollouts[k] for n in shown for k in ("weight", "accepted",
                                                                                         "clipped")}})
c1, c2, _ = right.columns([1, 1, 1])
c1.download_button("Metrics CSV", long.to_csv(index=False), file_name="seqis-metrics.csv", mime="text/csv",
                   on_click="ignore", key=f"{P}csv")
c2.download_button("Rollouts CSV", per_rollout.to_csv(index=False), file_name="seqis-rollouts.csv",
                   mime="text/csv", on_click="ignore", key=f"{P}csv_rollouts")

# exports
st.subheader("Export")
st.caption("The current settings as trainer config. A `# NOTE` line says where a knob has no equivalent or the "
           "trainer weighs tokens differently.")
for tab, name in zip(st.tabs(shown), shown):
    with tab:
        cfg = views[name].config
        a, b = st.columns(2)
        for col, snip, lang, title in ((a, prime_rl_toml(name, cfg), "toml", "prime-rl (TOML)"),
                                       (b, verl_yaml(name, cfg), "yaml", "verl (YAML)")):
            col.markdown(f"**{title}**" + ("" if snip.exact else " · approximate, see the notes"))
            col.code(snip.text, language=lang)
            col.download_button(f"Download {snip.filename}", snip.text, file_name=snip.filename,
                                mime="text/plain", on_click="ignore", key=f"{P}dl.{snip.filename}")

with st.expander("Figures as PNG"):
    st.caption("Each chart's camera icon saves it as PNG in the browser. Here all of them render at once "
               "through kaleido and a headless chromium (a few seconds).")
    signature = (src, tuple((n, views[n].config) for n in shown), drops, rollout)
    if st.button("Render PNGs", key=f"{P}png"):
        try:
            with st.spinner("Rendering..."):
                pngs = charts.to_png(figures)
        except RuntimeError as e:
            st.error(f"{e}. Use each chart's camera icon instead.")
        else:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                for fname, png in pngs.items():
                    z.writestr(f"{fname}.png", png)
            st.session_state[f"{P}_png"] = (signature, buf.getvalue(), len(pngs))
    held = st.session_state.get(f"{P}_png")
    if held is not None and held[0] == signature:
        st.download_button(f"Download {held[2]} PNGs (zip)", held[1], file_name="seqis-figures.zip",
                           mime="application/zip", on_click="ignore", key=f"{P}png_dl")
