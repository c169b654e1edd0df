"""The sampler's head on Explore and Compare (issue 42): score centering's corrections with the head size K as a knob,
per token its head coefficients, tail mass and what it adds to the gradient; on a batch without a head, which
corrections need one. The numbers come from ui/head_data.py; every widget is bound to the URL."""

from __future__ import annotations

import streamlit as st

from seqis.registry import skipped_note

from . import head_data
from .numbers import number
from .state import bound

SHOWN_TOKENS = 20  # rows of the per-token table: the tokens where score centering adds the most


def _k(prefix: str, batch) -> int:
    """The head size knob: 1 .. the batch's head (a larger head cut to the sampler's top K)."""
    K_max = head_data.head_size(batch)
    if K_max == 1:
        return 1
    return bound(st.slider, "Head size K (the sampler's top K of the batch's head)", f"{prefix}head.k", K_max,
                 min_value=1, max_value=K_max, valid=lambda v: isinstance(v, int) and 1 <= v <= K_max,
                 help="Score centering sums over the sampler's K most likely tokens and models the rest by the tail "
                      "masses' ratio; a smaller K shows what the tail model costs.")


def _heading(title: str, batch) -> dict | None:
    """The section's title; the corrections that need a head and that this batch can run (an exact variant reads
    topk_support too: the others are named in a caption), or None (said on the page) when the batch has none."""
    st.subheader(title)
    msg = head_data.needs_head_message(batch)
    if msg is not None:
        st.info(msg)
        return None
    runs, skipped = head_data.offered(batch)
    if skipped:
        st.caption(skipped_note(skipped))
    return runs


def explore_section(batch, prefix: str) -> None:
    """Explore's section: pick a score-centering correction, K and a rollout; the per-token table and one token's
    head."""
    offered = _heading("The sampler's head: score centering", batch)
    if offered is None:
        return
    c1, c2 = st.columns([3, 1], vertical_alignment="bottom")
    with c1:
        label = bound(st.selectbox, "Score-centering correction", f"{prefix}head", next(iter(offered)),
                      options=list(offered), valid=lambda v: v in offered)
    B = batch.shape[0]
    with c2:
        j = bound(st.number_input, "Rollout (head)", f"{prefix}head.rollout", 0, min_value=0, max_value=B - 1, step=1,
                  valid=lambda v: isinstance(v, int) and 0 <= v < B)
    K = _k(prefix, batch)
    x = offered[label]
    frame = head_data.token_table(batch, x, K, j)
    if frame.empty:
        st.caption(f"Rollout {j} has no loss tokens.")
        return
    st.caption(f"Rollout {j}: {len(frame)} loss tokens; mean sampler tail outside the top {K}: "
               f"{number(float(frame['sampler tail 1 - Q_H'].mean()))}. C_t = sum over the head of c_v log p_v "
               "(verl's sc_correction per token); SC's gradient: the L1 over the head of d loss / d log p_v = "
               "A_t c_v / N, what score centering adds beside the sampled token's own term (base weight).")
    top = frame.sort_values("SC's gradient (L1 over the head)", ascending=False).head(SHOWN_TOKENS)
    left, right = st.columns([3, 2], gap="medium")
    left.markdown(f"**The {len(top)} tokens where score centering adds the most**")
    left.table(top.set_index("position").map(number))
    with right:
        positions = [int(p) for p in top["position"]]
        t = bound(st.selectbox, "Token (position)", f"{prefix}head.token", positions[0], options=positions,
                  valid=lambda v: v in positions)
        st.markdown(f"**Its head** (K = {K}): c_v = q_v f(p_v / q_v) - alpha p_v")
        st.table(head_data.slot_table(batch, x, K, j, t).map(number))


def compare_section(batch, prefix: str) -> None:
    """Compare's section: the score-centering corrections side by side at head size K."""
    offered = _heading("Head corrections side by side", batch)
    if offered is None:
        return
    c1, c2 = st.columns([3, 2], vertical_alignment="bottom")
    with c1:
        picks = bound(st.multiselect, "Score-centering corrections", f"{prefix}head.picks", list(offered),
                      options=list(offered), valid=lambda v: isinstance(v, list) and all(k in offered for k in v))
    with c2:
        K = _k(prefix, batch)
    if picks:
        st.table(head_data.summary(batch, {k: offered[k] for k in picks}, K).map(number))
