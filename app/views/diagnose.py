"""Diagnose: why the trainer and the sampler disagree, from one batch (seqis.diagnosis.causes).

Findings as cards coloured by severity, a fault that only one group of a metadata column shows first (its card names
the group, its chart draws the group's tokens), each with the chart that proves it and, beside it, what its detector
can see at this batch's size (the committed power table of `python -m seqis.bench --only diagnose-power`); the
findings per group of a metadata column; the raw ratios before any correction and what each correction
truncates and masks; the worst rollout token by token. The batch is a sampler fault of the tiny transformer or
of a recurrent LM of seqis.samplers.generators (the truth known) or the explorer's batch (upload, example or synthetic,
shared with Explore). A new upload on Explore opens here first; a button carries it back to Explore.
"""

import streamlit as st
from ui import diagnose_data as data
from ui.batch_source import batch_source
from ui.runtime.chart import chart
from ui.state import ARRIVED_KEY, bound, first_look, hold_batch, set_view, switch_page

P = "dg."
SOURCES = {"fault": "Sampler fault demo (tiny transformer, recurrent LMs)",
           "batch": "Your batch (upload, example, synthetic)"}
BADGE = {"bad": ":red-background[**bad**]", "warn": ":orange-background[**warn**]", "ok": ":green-background[ok]"}
TITLES = {"sampler_truncation": "Sampler truncation (top-p / top-k)", "temperature_mismatch": "Temperature mismatch",
          "raw_logprobs": "Raw log-probs reported", "policy_lag": "Policy lag (trainer side)",
          "token_misalignment": "Token misalignment", "catastrophic_tokens": "Catastrophic tokens",
          "precision_noise": "Precision noise", "healthy": "Healthy", "no_loss_tokens": "No loss tokens"}
HEADLINE = {"sampler_truncation": "log_offset", "temperature_mismatch": "temperature", "token_misalignment": "shift",
            "catastrophic_tokens": "count", "precision_noise": "dtype", "raw_logprobs": "entropy_gap",
            "policy_lag": "gain"}

st.title("Diagnose")
st.caption("Why do the trainer's and the sampler's log-probs disagree? Each finding names a cause, shows the "
           "evidence and says what to do; thresholds follow NeMo-RL's and verl's published guidance.")

kind = bound(st.radio, "Batch", f"{P}source", "fault", options=list(SOURCES), format_func=SOURCES.get,
             valid=lambda v: v in SOURCES, horizontal=True, label_visibility="collapsed")
if kind == "fault":
    c1, c2 = st.columns([3, 1])
    fault = bound(c1.selectbox, "Fault", f"{P}fault", next(iter(data.FAULTS)), options=list(data.FAULTS),
                  valid=lambda v: v in data.FAULTS)
    seed = bound(c2.number_input, "Seed", f"{P}seed", 0, min_value=0, max_value=2**31 - 1, step=1,
                 valid=lambda v: isinstance(v, int) and v >= 0)
    src, payload = data.fault_source(fault, int(seed)), None
    st.caption(data.fault_caption(fault))
    hold_batch(src, payload)  # Explore shows the same batch
else:
    src, payload = batch_source()
    first_look(src)  # seen here: Explore will not send it back
    arrived = st.session_state.pop(ARRIVED_KEY, None)
    if arrived is not None:
        st.success(f"**{arrived}** loaded. An upload opens here first: what its mismatch says and why. "
                   "**Open this batch in Explore** (below) to see what each correction keeps and drops.",
                   icon=":material/upload_file:")

try:
    d = data.diagnosis(src, None, _payload=payload)
except (ValueError, OSError) as e:
    st.error(f"{src.label}: {e}")
    st.stop()

if st.button("Open this batch in Explore", icon=":material/scatter_plot:", key=f"{P}open.explore"):
    hold_batch(src, payload)
    if kind == "fault":  # Explore's file source with no new upload shows the held batch
        set_view({"ex.source": "upload"})
    switch_page("views/explore.py")

st.subheader("Findings")
if d.shift:
    st.info(f"Everything below reads the inference log-probs {d.shift} position(s) later, where they line up.")
for f in d.findings:
    with st.container(border=True):
        head = HEADLINE.get(f.kind)
        value = f.evidence.get(head) if head else None
        shown = f"{value:.4g}" if isinstance(value, float) else value
        where = "" if f.group is None else f" · only in **{f.evidence.get('by', 'group')} = {f.group}**"
        st.markdown(f"{BADGE[f.severity]} **{TITLES.get(f.kind, f.kind)}**{where}" + (f" · {head} = `{shown}`" if head
                                                                                       else ""))
        st.write(f.message)
        drawn = [(name, g) for name, g in (("chart", data.figure(d, f)), ("power", data.power_figure(f)))
                 if g is not None]  # the chart that proves it, and what its detector can see at this size
        for col, (name, g) in zip(st.columns(2) if len(drawn) == 2 else [st.container()] * len(drawn), drawn):
            with col:
                chart(g, key=f"{P}{name}.{f.kind}" + ("" if f.group is None else f".{f.evidence.get('by')}.{f.group}"))
        if f.kind == "precision_noise" and f.group is None:  # nothing fired: what could have been seen here
            tokens = int(f.evidence.get("n_tokens", 0))
            grid, seen = data.power_grid(tokens), data.power_summary(tokens)
            if grid is not None:
                chart(grid, key=f"{P}power.grid")
                st.caption("The share of simulated batches in which each test named its fault, against the "
                           "fault's size, on recurrent LMs the diagnosis was not tuned on (seqis.samplers.generators; "
                           "`python -m seqis.bench --only diagnose-power`, docs/diagnose.md).")
            if seen is not None:
                with st.expander("The mildest fault each test found at this size, as a table"):
                    st.caption("Each detector on generators it was not tuned on (samplers.generators): the mildest "
                               "fault it found in 90% of simulated batches of about this many tokens. Milder "
                               "faults can hide in a batch this size. Regenerate: `python -m seqis.bench --only "
                               "diagnose-power` (docs/diagnose.md).")
                    st.dataframe(seen, hide_index=True)
        with st.expander("Evidence"):  # a chi-square estimate below 0 is noise: shown as 0, as the message says
            st.json({k: max(v, 0.0) if k.startswith("chi2") and isinstance(v, float) else v
                     for k, v in f.evidence.items() if k != "agreement"})

st.subheader("Per group")
by = bound(st.selectbox, "Group by a metadata column", f"{P}by", "none", options=["none", *d.metadata_columns],
           valid=lambda v: v == "none" or v in d.metadata_columns)
if by != "none":
    grouped = data.diagnosis(src, by, _payload=payload)
    rows = [{"group": str(f.group), "severity": f.severity, "finding": f.kind,
             "evidence": ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                                   for k, v in f.evidence.items() if k in HEADLINE.values())}
            for f in grouped.findings if f.group is not None]
    st.dataframe(rows, hide_index=True)
else:
    st.caption("Pick a column (environment, turn, rank, ...) to diagnose each of its values on its own.")

st.subheader("Raw ratios, and what each correction truncates and masks")
tables = data.ratio_tables(src, _payload=payload)
if tables.skipped:
    st.caption(tables.skipped)
c1, c2 = st.columns(2)
c1.caption("Per-token log-ratio l and ratio rho = e^l before any correction")
c1.dataframe(tables.quantiles, column_config={"log_ratio": st.column_config.NumberColumn(format="%.4g"),
                                              "ratio": st.column_config.NumberColumn(format="%.4g")})
c2.caption("Share of loss tokens outside common token bands")
c2.dataframe(tables.bands, column_config={"share_outside": st.column_config.NumberColumn(format="%.3g")})
st.caption("Each correction (estimator or framework preset, at its defaults): the share of loss tokens it drops "
           "or truncates, and the share of rollouts it rejects (every token dropped), drops a token of, or truncates.")
share = dict(min_value=0.0, max_value=1.0, format="%.3f", width="small")
# two narrow tables, not one of five columns: at 900 px that one showed 2 of its 5 columns
k1, k2 = st.columns(2, gap="medium")
k1.markdown("**Loss tokens**")
k1.dataframe(tables.corrections[["tokens_masked", "tokens_truncated"]], column_config={
    "tokens_masked": st.column_config.ProgressColumn("dropped", **share),
    "tokens_truncated": st.column_config.ProgressColumn("truncated", **share)})
k2.markdown("**Rollouts**")
k2.dataframe(tables.corrections[["rollouts_masked", "rollouts_partly_masked", "rollouts_truncated"]], column_config={
    "rollouts_masked": st.column_config.ProgressColumn("rejected", **share),
    "rollouts_partly_masked": st.column_config.ProgressColumn("a token dropped", **share),
    "rollouts_truncated": st.column_config.ProgressColumn("truncated", **share)})

st.subheader("The worst tokens")
st.caption("The loss tokens of largest |log-ratio| (token ids and the trainer's entropy when the batch has them).")
st.dataframe(d.worst, hide_index=True)

st.subheader(f"The worst rollout, token by token (rollout {d.rollout})")
chart(data.charts.rollout_figure(d.rollout_tokens), key=f"{P}chart.rollout")
with st.expander("Its tokens"):
    st.dataframe(d.rollout_tokens, hide_index=True)
