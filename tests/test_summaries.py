"""What the explorer's summaries count as dropped: no gradient, whether the rules drop a token or its weight is
negligible (below NEGLIGIBLE x the median weight of the kept tokens), the rules' own rejections beside it."""

from __future__ import annotations

import torch

from seqis import Batch, run
from seqis.core.ratios import Ratios
from seqis.diagnosis.summaries import NEGLIGIBLE, correction_fractions, effective_batch, effectively_kept


def catastrophic_batch() -> Batch:
    """8 rollouts of 16 tokens at small valid-IS noise; rollout 2 holds a token at l = -30 and rollout 5 one at
    l = -18: seq_tis keeps both (no rule rejects) with weights e^-30 ~ 1e-13 and e^-18 ~ 1e-8."""
    g = torch.Generator().manual_seed(0)
    inference = -torch.rand(8, 16, generator=g, dtype=torch.float64) - 0.1
    trainer = inference + 0.02 * torch.randn(8, 16, generator=g, dtype=torch.float64)
    trainer[2, 3] = inference[2, 3] - 30.0
    trainer[5, 7] = inference[5, 7] - 18.0
    return Batch(trainer, inference, torch.ones(8, dtype=torch.float64))


def test_a_kept_rollout_with_a_negligible_weight_counts_as_dropped():
    batch = catastrophic_batch()
    out = run("seq_tis", batch)
    assert bool(out.masks["kept"].all())  # the rules keep every token ...
    w = out.rollouts["weight"]
    assert float(w[2]) < 1e-12 and float(w[5]) < 1e-7  # ... two rollouts with no gradient to speak of
    kept = effectively_kept(out)
    assert kept.sum(-1).tolist() == [16, 16, 0, 16, 16, 0, 16, 16]
    eff = effective_batch(out)
    assert eff["tokens_rejected"] == 0 and eff["tokens_negligible"] == 32 and eff["tokens_kept"] == 96
    assert eff["rollouts_kept"] == 6 and eff["rollouts_negligible"] == 2
    fractions = correction_fractions({"seq_tis": out}, Ratios.of(batch)).loc["seq_tis"]
    assert fractions["tokens_masked"] == 32 / 128 and fractions["tokens_negligible"] == 32 / 128
    assert fractions["rollouts_masked"] == 2 / 8


def test_the_threshold_is_a_fraction_of_the_median_kept_weight():
    """A weight just above NEGLIGIBLE x the median is kept, just below it is dropped (the formula, by hand)."""
    batch = catastrophic_batch()
    out = run("seq_tis", batch)
    w = out.weights
    median = float(w[out.masks["kept"]].median())
    want = out.masks["kept"] & (w >= NEGLIGIBLE * median)
    assert torch.equal(effectively_kept(out), want)


def test_the_rules_rejections_stay_beside_the_negligible_weights():
    batch = catastrophic_batch()
    out = run("mis_po", batch)  # the token band rejects the two catastrophic rollouts by its rules
    eff = effective_batch(out)
    assert eff["tokens_rejected"] > 0 and eff["tokens_negligible"] == 0
    assert eff["tokens_kept"] + eff["tokens_rejected"] + eff["tokens_negligible"] == 128
