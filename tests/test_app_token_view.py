"""Explore's token heatmap (issue 43 item 5, Miles #2476): masked positions inside a rollout are greyed out and never
set the colour range (a -30 nat masked span flattened it), the range comes from the loss tokens, and a catastrophic
token beyond the range is marked with a cross, not clipped away into its end colour."""

import math
import sys
from pathlib import Path

import numpy as np
import torch

from seqis import Batch
from seqis.core.ratios import Ratios
from seqis.diagnosis.summaries import token_map

sys.path.insert(0, str(Path(__file__).parents[1] / "app"))
from ui import explore_charts as charts  # noqa: E402


def _batch() -> Batch:
    B, T = 8, 64
    g = torch.Generator().manual_seed(0)
    infer = -torch.rand(B, T, generator=g) * 2  # (B, T)
    train = infer + 0.05 * torch.randn(B, T, generator=g)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, 10:20] = False  # a masked span inside every rollout (a tool's output) ...
    train[:, 10:20] = infer[:, 10:20] - 30.0  # ... whose log-ratio is -30 nats
    mask[3, 40:] = False  # rollout 3 ends at position 40: beyond it is padding, not masked
    train[5, 30] = infer[5, 30] - 12.0  # one catastrophic loss token
    return Batch(train.clamp(max=0), infer, torch.randn(B, generator=g), mask)


def _figure():
    b = _batch()
    r = Ratios.of(b)
    tm = token_map(r, max_cols=64)
    rows, cols = torch.nonzero(r.mask, as_tuple=True)
    lengths = r.mask.sum(-1).numpy()
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    values = tm.values.numpy()
    extent = charts.extents(offsets, cols.numpy())[tm.index.numpy()]  # (R,) each row's last loss position + 1
    fig = charts.token_heatmap(values, tm.block, tm.index.numpy(), extent=extent)
    return {t.name: t for t in fig.plotly.data}, values, tm.index.numpy()


def test_the_colour_range_comes_from_the_loss_tokens_and_masked_positions_are_grey():
    traces, values, index = _figure()
    heat = traces["log-ratio"]
    assert heat.zmax < 1.0  # the -30 nat masked span would have made it 30; the 99th percentile of the loss tokens
    masked = np.asarray(traces["masked"].z, dtype=float)
    assert np.all(masked[:, 10:20] == 1.0)  # every row's masked span
    row3 = int(np.flatnonzero(index == 3)[0])
    assert np.isnan(masked[row3, 40:]).all()  # rollout 3's padding is not "masked"
    assert np.isnan(masked[:, :10]).all() and np.isnan(masked[:, 20:40]).all()  # loss tokens are coloured


def test_a_catastrophic_token_is_marked_not_clipped():
    traces, values, index = _figure()
    cross = traces["catastrophic"]
    row5 = int(np.flatnonzero(index == 5)[0])
    assert list(cross.y) == [row5] and list(cross.x) == [30]
    assert abs(float(cross.customdata[0])) > max(math.log(10), traces["log-ratio"].zmax)
