"""The advice's comparison, made cheap (issue 43: 16-20 s on a 256 x 4096 batch), says exactly what the plain way of
computing it says: every candidate evaluated on its own by `seqis.run` (score centering and all), each token's
"effectively dropped" decided from the formula (its weight below NEGLIGIBLE x the median weight of the kept tokens,
the median always taken), and the readings summed by hand. On the truth cases (seqis.diagnosis.truth_cases: the
advice benchmark's batches) the suggestion, its knobs, what was fitted and every reading's figures agree."""

from __future__ import annotations

import math

import pytest
import torch

from seqis import SEED_ESTIMATORS, Batch, run
from seqis.core.ratios import Ratios
from seqis.diagnosis import fit
from seqis.diagnosis.advice import advise, batch_facts, candidates_of, conclude, outlier_shares, read, readings_over
from seqis.diagnosis.summaries import NEGLIGIBLE, effectively_kept
from seqis.diagnosis.truth_cases import CASES, make_case
from seqis.registry import resolve, resolve_config, run_many

SCOPES = {"seed four": list(SEED_ESTIMATORS), "registry": None}


def kept_by_formula(out) -> torch.Tensor:
    """(B, T): kept by the rules and weighing at least NEGLIGIBLE x the median kept weight (float64, always)."""
    kept = out.masks["kept"]
    if not bool(kept.any()):
        return kept
    w = out.weights.double()
    return kept & (w >= NEGLIGIBLE * float(w[kept].median()))


def summary_by_hand(out, kept: torch.Tensor) -> dict[str, float]:
    """The four figures a reading takes from the effective batch, from their definitions."""
    ro = out.rollouts
    valid = ro["length"] > 0
    n, n_tok = int(valid.sum()), float(ro["length"].sum())
    w = torch.where(valid, ro["weight"].double(), 0.0)
    w = w / w.max() if float(w.max()) > 0 else w
    ess = float(w.sum() ** 2 / (w**2).sum()) if float(w.max()) > 0 else 0.0
    return {"tokens_kept_frac": float(kept.sum()) / n_tok,
            "rollouts_kept_frac": int((ro["accepted"] & valid & kept.any(-1)).sum()) / n,
            "clipped_frac": int((ro["clipped"] & valid).sum()) / n, "ess_frac": ess / n}


def reference_advice(batch: Batch, estimators):
    """The advice computed the plain way: one candidate (and its fitted twin) at a time through seqis.run."""
    r, candidates_given = Ratios.of(batch), candidates_of(estimators, (), batch)
    facts, o = batch_facts(batch, r), fit.outlying_rollouts(r)
    readings = []
    for name, cfg in candidates_given[0]:
        cfg = resolve_config(name, cfg)
        moved = fit.fit_bands(name, cfg, r, o)
        for c, fitted in [(cfg, ())] + ([moved] if moved is not None else []):
            out = run(name, batch, c)
            kept = kept_by_formula(out)
            shares = outlier_shares(kept.sum(-1), r, o.flags) if o.count else (math.nan, math.nan)
            readings.append(read(name, resolve(name, c), summary_by_hand(out, kept), facts, knobs=dict(c.as_dict()),
                                 fitted=fitted, outliers=shares))
    return conclude(facts, o, *candidates_given, readings)


def figures(advice) -> list[tuple]:
    return [(x.label, x.knobs, x.tokens_kept, x.rollouts_kept, x.clipped, x.ess, x.outliers_dropped,
             x.typical_kept) for x in advice.readings]


@pytest.mark.parametrize("name", (*CASES, "clean"))
@pytest.mark.parametrize("scope", SCOPES)
def test_the_advice_matches_its_one_by_one_reference_on_the_truth_cases(name, scope):
    for seed in (0, 1) if scope == "seed four" else (0,):  # the registry's: a hundred candidates one by one
        batch = make_case(name, seed).batch
        got, want = advise(batch, SCOPES[scope]), reference_advice(batch, SCOPES[scope])
        assert (got.suggestion, got.knobs, got.fitted) == (want.suggestion, want.knobs, want.fitted), (name, seed)
        assert got.compared == want.compared and got.scope == want.scope and got.outliers == want.outliers
        for g, w in zip(figures(got), figures(want), strict=True):  # (label, knobs, 3 shares, ess, 2 shares)
            assert g[:5] == w[:5] and g[6:] == pytest.approx(w[6:], abs=0, nan_ok=True), (name, seed, g[0])
            # ESS from the rollouts' weights: seqis.run and run_many sum a rollout's l_t in their own order
            assert g[5] == pytest.approx(w[5], rel=1e-9), (name, seed, g[0])
        assert got.reasons == want.reasons and got.caveats == want.caveats


def test_the_registry_comparison_reads_centered_presets_and_negligible_weights():
    """The reference test above covers both shortcuts: the clean case's batch carries the sampler's head (so score
    centering presets are compared, evaluated without their centering term), and the catastrophic case has
    corrections whose kept weights fall below the floor (the median taken) beside ones where none does."""
    clean = make_case("clean", 0).batch
    assert any(resolve(n, c).centering is not None for n, c in candidates_of(None, (), clean)[0])
    case = make_case("catastrophic", 0)
    candidates, _ = candidates_of(None, (), case.batch)
    outs = run_many([n for n, _ in candidates], case.batch)
    paths = {torch.equal(effectively_kept(out), out.masks["kept"]) for out in outs.values()}
    assert paths == {True, False}
    for n, out in outs.items():
        assert torch.equal(effectively_kept(out), kept_by_formula(out)), n


def test_effectively_kept_takes_the_median_only_when_a_weight_is_below_the_floor():
    """Weights spanning more than 1/NEGLIGIBLE with none below NEGLIGIBLE x the median (a median far above the
    smallest): the formula's answer whichever way it is reached; an infinite weight, the same."""
    g = torch.Generator().manual_seed(3)
    inference = -torch.rand(6, 12, generator=g, dtype=torch.float64) - 0.1
    trainer = inference + 0.01 * torch.randn(6, 12, generator=g, dtype=torch.float64)
    trainer[1, 2] -= 16.0  # e^-16 ~ 1e-7 of the others: below the floor
    trainer[4, 5] += 40.0  # e^40: the largest weight sets the shortcut's floor far above the median's
    for est in ("seq_is", "seq_tis", "token_tis", "seq_mis", "pg"):
        out = run(est, Batch(trainer, inference, torch.ones(6, dtype=torch.float64)))
        assert torch.equal(effectively_kept(out), kept_by_formula(out)), est


def test_a_centered_preset_on_a_batch_without_the_head_still_names_what_it_lacks():
    batch = make_case("clean", 0).batch
    bare = Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, batch.loss_mask)
    centered = next(n for n, c in candidates_of(None, (), batch)[0] if resolve(n, c).centering is not None)
    r = Ratios.of(bare)
    with pytest.raises(ValueError, match="top-k head"):
        readings_over(bare, [(centered, None)], r, batch_facts(bare, r), fit.outlying_rollouts(r))
