"""Batch validation messages, and diagnostics against their definitions."""

import math

import pytest
import torch

from seqis import Batch, diagnose, diagnostics, run
from seqis.diagnosis.statistics import percentiles

D = torch.float64


def ok(B=2, T=3):
    return dict(trainer_logprobs=torch.zeros(B, T), inference_logprobs=torch.zeros(B, T), advantages=torch.zeros(B),
                loss_mask=torch.ones(B, T, dtype=torch.bool))


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(trainer_logprobs=[[0.0]]), "Batch.trainer_logprobs must be a torch.Tensor"),
        (dict(trainer_logprobs=torch.zeros(2, 3, dtype=torch.long)), "Batch.trainer_logprobs must be a float tensor"),
        (dict(trainer_logprobs=torch.zeros(6), inference_logprobs=torch.zeros(6)), "must be 2-D"),
        (dict(inference_logprobs=torch.zeros(2, 4)), "inference_logprobs must have the shape of trainer_logprobs"),
        (dict(advantages=torch.zeros(3)), r"advantages must be \(2,\) or \(2, 3\)"),
        (dict(advantages=torch.zeros(2, 3, dtype=torch.int32)), "advantages must be a float tensor"),
        (dict(loss_mask=torch.ones(2, 2, dtype=torch.bool)), r"loss_mask must be a \(2, 3\) bool tensor"),
        (dict(loss_mask=torch.ones(2, 3)), "loss_mask must be bool"),
    ],
)
def test_batch_validation_names_the_field_and_prints_the_shapes(change, message):
    with pytest.raises(ValueError, match=message) as e:
        Batch(**(ok() | change))
    assert "got trainer_logprobs" in str(e.value) or "must be a torch.Tensor" in str(e.value)


def test_batch_shapes_appear_in_the_message():
    with pytest.raises(ValueError, match=r"got trainer_logprobs \(2, 3\) float32, inference_logprobs \(2, 4\)"):
        Batch(**(ok() | dict(inference_logprobs=torch.zeros(2, 4))))


def test_batch_metadata_length_and_integer_mask():
    with pytest.raises(ValueError, match=r"metadata\['prompt'\] must have one value per rollout \(2\), got 1"):
        Batch(**ok(), metadata={"prompt": ["a"]})
    b = Batch(**(ok() | dict(loss_mask=torch.tensor([[1, 0, 1], [0, 0, 1]]))))
    assert b.loss_mask.dtype == torch.bool and b.loss_mask.sum() == 3
    assert Batch(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2)).loss_mask.all()


@pytest.mark.parametrize("field", ["trainer_logprobs", "inference_logprobs"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_log_prob_on_a_loss_token_is_refused_with_its_row_token_and_count(field, value):
    x = torch.full((3, 5), -0.5)
    x[1, 3] = x[2, 0] = value  # two loss tokens; the first in row-major order is (1, 3)
    x[0, 4] = math.nan  # padding may hold anything
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[0, 4] = False
    kw = dict(trainer_logprobs=torch.full((3, 5), -0.5), inference_logprobs=torch.full((3, 5), -0.7),
              advantages=torch.ones(3), loss_mask=mask) | {field: x}
    with pytest.raises(ValueError) as e:
        Batch(**kw)
    msg = str(e.value)
    assert msg.startswith(f"Batch: row 1, token 3: {field} is {value}") and "(2 loss tokens with a non-finite" in msg
    assert "drop_nonfinite=True" in msg
    b = Batch(**kw, drop_nonfinite=True)
    assert b.n_dropped_nonfinite == 2 and int(b.loss_mask.sum()) == 14 - 2
    assert not b.loss_mask[1, 3] and not b.loss_mask[2, 0] and mask[1, 3]  # the caller's mask is not written to
    assert b.select([1, 2]).n_dropped_nonfinite == 0 and b.to("cpu").n_dropped_nonfinite == 2
    out = run("token_tis", b)  # nothing non-finite reaches an estimator
    assert math.isfinite(float(out.loss)) and float(out.weights[1, 3]) == 0.0


def test_both_log_probs_bad_on_one_token_are_named_together_and_a_clean_batch_drops_nothing():
    tl, il = torch.zeros(2, 2), torch.zeros(2, 2)
    tl[0, 1], il[0, 1] = -math.inf, -math.inf  # -inf - -inf is NaN: caught by their sum too
    with pytest.raises(ValueError, match="row 0, token 1: trainer_logprobs is -inf and inference_logprobs is -inf "
                                         r"on a loss token \(1 loss token with"):
        Batch(tl, il, torch.zeros(2))
    clean = Batch(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2), drop_nonfinite=True)
    assert clean.n_dropped_nonfinite == 0 and clean.loss_mask.all()


@pytest.mark.parametrize("drop", [False, True])
def test_the_finite_check_over_blocks_of_rows_finds_a_bad_loss_token_behind_inf_padding(drop):
    """A batch larger than one block of rows, -inf on every row's padding (as frameworks dump it): the whole
    tensors' sums are not finite, so the blocked masked pass decides; a NaN on a loss token in a late block is
    named by its row and token, and padding alone is accepted."""
    B, T = 300, 2048  # 600k positions: several blocks of rows
    tl, il = torch.full((B, T), -0.5), torch.full((B, T), -0.6)
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[:, -7:] = False
    tl[:, -7:], il[:, -3:] = -math.inf, math.nan  # padding may hold anything
    assert Batch(tl, il, torch.ones(B), mask).n_dropped_nonfinite == 0
    tl[257, 100] = math.nan
    il[299, 0] = math.inf
    if drop:
        b = Batch(tl, il, torch.ones(B), mask, drop_nonfinite=True)
        assert b.n_dropped_nonfinite == 2 and not b.loss_mask[257, 100] and not b.loss_mask[299, 0]
        assert int(b.loss_mask.sum()) == int(mask.sum()) - 2 and mask[257, 100]  # the caller's mask is kept
        return
    with pytest.raises(ValueError, match=r"^Batch: row 257, token 100: trainer_logprobs is nan on a loss token \(2 "):
        Batch(tl, il, torch.ones(B), mask)


def test_finite_log_probs_whose_sums_overflow_are_accepted():
    x = torch.full((2, 3), -3e38)  # each finite; their sums overflow float32
    assert Batch(x, x, torch.zeros(2)).n_dropped_nonfinite == 0
    x[1, 2] = -math.inf
    with pytest.raises(ValueError, match="row 1, token 2: trainer_logprobs is -inf and inference_logprobs is -inf"):
        Batch(x, x, torch.zeros(2))


def test_large_finite_half_precision_log_probs_are_not_taken_for_infinities():
    x = torch.full((1, 2), -40000.0, dtype=torch.float16)  # their sum overflows float16; each is finite
    assert Batch(x, x, torch.zeros(1, dtype=torch.float16)).n_dropped_nonfinite == 0


def test_select_and_to_keep_a_checked_batch_without_checking_again():
    b = Batch(torch.zeros(4, 3), torch.zeros(4, 3), torch.arange(4.0), metadata={"id": list("abcd")})
    s = b.select(torch.tensor([False, True, False, True]))  # a mask over rollouts
    assert s.metadata["id"] == ["b", "d"] and s.advantages.tolist() == [1.0, 3.0]
    assert b.select([]).shape == (0, 3) and b.select(slice(1, 3)).metadata["id"] == ["b", "c"]
    with pytest.raises(ValueError, match="1-D list or tensor of rollout indices, got a 0-D one"):
        b.select(2)


def test_batch_prints_one_line():
    b = Batch(torch.zeros(4, 300, requires_grad=True), torch.zeros(4, 300), torch.zeros(4),
              torch.arange(300)[None, :] < torch.tensor([[10], [20], [0], [300]]), metadata={"env": list("abcd")})
    text = repr(b)
    assert "\n" not in text and len(text) < 200, text
    assert text == ("Batch(4 rollouts x 300 positions; 330 loss tokens; float32; cpu; advantages per rollout; "
                    "trainer_logprobs requires grad; metadata env)")
    assert str(b) == text
    out = run("seq_tis", b)
    line = repr(out)
    assert "\n" not in line and line.startswith("EstimatorOutput(loss ") and "4 rollouts x 300" in line, line


def test_diagnose_says_no_loss_tokens_and_nothing_else():
    b = Batch(torch.full((3, 4), -0.5), torch.full((3, 4), -0.6), torch.ones(3), torch.zeros(3, 4, dtype=torch.bool),
              metadata={"env": ["a", "b", "a"]})
    for found in (diagnose(b), diagnose(b, by="env")):
        assert [(f.kind, f.severity, f.group) for f in found] == [("no_loss_tokens", "bad", None)]
        assert found[0].evidence == {"n_tokens": 0, "n_rollouts": 3}
        assert "nothing could be diagnosed" in found[0].message


def test_diagnostics_by_hand():
    # rollout 0: l = (0.1, -0.3), rollout 1: l = (0.2), rollout 2 empty
    l = torch.tensor([[0.1, -0.3], [0.2, 0.0], [0.0, 0.0]], dtype=D)
    mask = torch.tensor([[True, True], [True, False], [False, False]])
    batch = Batch(l - 1.0, torch.full_like(l, -1.0), torch.zeros(3, dtype=D), mask)
    d = diagnostics(batch)
    toks = [0.1, -0.3, 0.2]
    S = [-0.2, 0.2]
    w = [math.exp(s) for s in S]
    assert d["kl_k1"] == pytest.approx(-sum(toks) / 3)
    assert d["kl_k3"] == pytest.approx(sum(math.expm1(x) - x for x in toks) / 3)
    assert d["chi2_token"] == pytest.approx(sum(math.exp(2 * x) - 1 for x in toks) / 3)
    assert d["chi2_seq"] == pytest.approx(sum(x * x - 1 for x in w) / 2)
    assert d["ess_seq"] == pytest.approx(sum(w) ** 2 / (2 * sum(x * x for x in w)))
    assert d["ppl_ratio"] == pytest.approx((math.exp(0.1) + math.exp(-0.2)) / 2)
    assert d["abs_log_ratio_max"] == pytest.approx(0.3)
    assert d["abs_log_ratio_p50"] == pytest.approx(0.2)
    assert d["n_rollouts"] == 2 and d["n_tokens"] == 3


def test_diagnostics_survive_extremes_and_empty_batches():
    l = torch.tensor([[800.0 / 100] * 100, [-8.0] * 100], dtype=D)
    d = diagnostics(Batch(l - 10, torch.full_like(l, -10.0), torch.zeros(2, dtype=D)))
    assert all(math.isfinite(v) for v in d.values())
    assert 0 < d["ess_seq"] <= 1
    empty = Batch(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3, dtype=torch.bool))
    d = diagnostics(empty)
    assert d["n_tokens"] == 0 and d["ess_seq"] == 0.0 and d["abs_log_ratio_p99"] == 0.0


def test_ess_is_exp_minus_T_s2_under_valid_is_noise():
    # log w ~ N(-T s^2 / 2, T s^2): E[w] = 1, E[w^2] = e^(T s^2), normalised ESS -> e^(-T s^2) = 0.779 (s=.05, T=100)
    s, T, B = 0.05, 100, 20000
    g = torch.Generator().manual_seed(0)
    l = torch.randn(B, T, generator=g, dtype=D) * s - s * s / 2
    d = diagnostics(Batch(l - 1, torch.full_like(l, -1.0), torch.zeros(B, dtype=D)))
    assert d["ess_seq"] == pytest.approx(math.exp(-T * s * s), abs=0.01)
    assert d["kl_k3"] == pytest.approx(s * s / 2, rel=0.02)


def test_percentiles_on_large_inputs():
    # 2^24 + 1 elements take the sampled path: the quantiles of a uniform ramp are still right to ~1e-3
    n = (1 << 24) + 1
    x = torch.arange(n, dtype=torch.float32) / n
    p50, p99 = percentiles(x, (0.5, 0.99))
    assert p50 == pytest.approx(0.5, abs=2e-3) and p99 == pytest.approx(0.99, abs=2e-3)
    assert percentiles(torch.tensor([3.0, 1.0, 2.0]), (0.0, 0.5, 1.0)) == [1.0, 2.0, 3.0]


def test_order_statistics_are_exact_against_a_sort(monkeypatch):
    # the bracketed selection (a strided sample, then a selection among the few in the bracket) against a plain
    # sort: ties, a constant tensor, tiny and ragged sizes, sorted and reversed orders, every rank of small ones
    from seqis.diagnosis.statistics import order_statistics

    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(100_003, generator=g).abs(), torch.randint(0, 7, (50_000,), generator=g).float(),
             torch.zeros(40_000), torch.arange(70_000.0), torch.arange(70_000.0).flip(0),
             torch.randn(5, generator=g), torch.tensor([2.0]),
             torch.cat([torch.zeros(30_000), torch.rand(20_000, generator=g)])]  # padding zeros first
    for x in cases:
        xs = x.sort().values
        n = x.numel()
        ranks = range(n) if n < 10 else sorted({0, 1, n // 100, n // 2, n - n // 100 - 1, n - 2, n - 1})
        ranks = list(ranks)
        assert order_statistics(x, ranks) == [float(xs[k]) for k in ranks], n
    # several ranks at once (their brackets overlapping, one rank twice), in float64; and a strided sample that
    # misrepresents x (every sampled position holds 0), so every bracket misses and the selection covers all of x
    x = torch.randn(60_000, generator=g, dtype=torch.float64)
    ranks = [0, 29_990, 30_000, 30_000, 30_010, 59_000, 59_999]
    xs = x.sort().values
    assert order_statistics(x, ranks) == [float(xs[k]) for k in ranks]
    x = torch.arange(100_000.0)
    x[:: 100_000 // (1 << 14)] = 0.0
    xs = x.sort().values
    ranks = [10, 50_000, 99_000, 99_999]
    assert order_statistics(x, ranks) == [float(xs[k]) for k in ranks]
    # a fault at one position of every 4th rollout of a (B, T) tensor: the strided sample (an odd stride) reads
    # every position, so it stays representative and no bracket falls back to a selection over all of x
    rows = torch.rand(256, 512, generator=g) * 0.1
    rows[::4, 0] = 3.0
    x = rows.view(-1)
    ranks = [x.numel() // 2, x.numel() - x.numel() // 200]
    sizes, kthvalue = [], torch.Tensor.kthvalue
    monkeypatch.setattr(torch.Tensor, "kthvalue", lambda self, *a, **kw: sizes.append(self.numel()) or
                        kthvalue(self, *a, **kw))
    assert order_statistics(x, ranks) == [float(x.sort().values[k]) for k in ranks]
    assert sizes and max(sizes) < x.numel() // 8, sizes
    monkeypatch.undo()
    # the loss tokens of a (B, T) tensor of |l| with padding zeros, without gathering them
    l = torch.randn(64, 300, generator=g)
    mask = torch.arange(300)[None, :] < torch.randint(1, 301, (64,), generator=g)[:, None]
    full = torch.where(mask, l, 0.0).abs().view(-1)
    assert percentiles(full, (0.5, 0.99, 1.0), below=int((~mask).sum())) == \
        percentiles(l[mask].abs(), (0.5, 0.99, 1.0))


def _drawn(B=96, T=700, seed=0, dtype=torch.float32):
    """A ragged batch with catastrophic tokens (|l| past the chi2 cap of 20, one past float32's exp range) and
    non-finite padding, for the blocked pass against the definitions."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logq = -torch.rand(B, T, generator=g, dtype=dtype) * 4
    l = torch.randn(B, T, generator=g, dtype=dtype) * 0.05
    l[::7, 3] = 25.0
    l[::11, 5] = -30.0
    l[5, 1] = 95.0
    logp = torch.where(mask, logq + l, torch.tensor(float("nan"), dtype=dtype))
    logq = torch.where(mask, logq, torch.tensor(-float("inf"), dtype=dtype))
    return Batch(logp, logq, torch.zeros(B, dtype=dtype), mask), mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_blocked_pass_sums_rho_squared_as_the_definition(dtype, shortcuts):
    # Ratios.of(chi2=True): each row's sum of rho^2 - 1, l capped at 20, against the definition in float64 (a
    # different formula, e (e + 2) from the block's expm1, would have to agree); diagnostics reads it or makes it
    from seqis.core.ratios import MAX_LOG_WEIGHT, RHO_M1_CAP, Ratios

    assert RHO_M1_CAP == math.expm1(MAX_LOG_WEIGHT / 2)
    batch, mask = _drawn(dtype=dtype)
    l = torch.where(mask, batch.trainer_logprobs.double() - batch.inference_logprobs.double(), 0.0)  # (B, T)
    want = torch.expm1(2 * l.clamp(max=MAX_LOG_WEIGHT / 2)).sum(-1)  # (B,) the definition
    r = Ratios.of(batch, chi2=True, shortcuts=shortcuts)
    tol = dict(rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-6)
    torch.testing.assert_close(r.rho2_rowsum.double(), want, **tol)
    n = int(mask.sum())
    for ratios in (r, Ratios.of(batch, shortcuts=shortcuts)):  # read from the pass, or made blockwise
        assert diagnostics(batch, ratios)["chi2_token"] == pytest.approx(float(want.sum()) / n, rel=1e-5)
    assert Ratios.of(batch).rho2_rowsum is None and r.clamped(1.0).rho2_rowsum is None
    rows = torch.tensor([5, 0, 7])
    torch.testing.assert_close(r.rows(rows).rho2_rowsum.double(), want[rows], **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shortcuts", [True, False])
def test_a_record_made_without_its_log_ratios_makes_the_same_ones_when_read(dtype, shortcuts):
    # Ratios.of(tokens=False) keeps only the per-rollout sums; l (B, T), read afterwards (the record, its rows, a
    # clamped copy), is made then, to the bit what the pass keeps, on a batch with NaN and -inf padding
    from seqis.core.ratios import Ratios

    batch, mask = _drawn(dtype=dtype)
    full, lean = Ratios.of(batch, shortcuts=shortcuts), Ratios.of(batch, shortcuts=shortcuts, tokens=False)
    assert lean.l_tokens is None and lean.l_unclamped is None
    for name in ("seq_log_ratio", "logp_rowsum", "k3_rollout", "length"):
        assert torch.equal(getattr(lean, name), getattr(full, name)), name
    rows = torch.tensor([5, 0, 7])
    assert torch.equal(lean.rows(rows).log_ratio, full.rows(rows).log_ratio)
    assert torch.equal(lean.clamped(1.0).log_ratio, full.clamped(1.0).log_ratio)
    assert torch.equal(lean.log_ratio, full.log_ratio) and lean.unclamped_log_ratio is lean.log_ratio
    l = torch.where(mask, batch.trainer_logprobs - batch.inference_logprobs, 0.0)  # the definition
    assert torch.equal(full.log_ratio, l)


def test_the_max_comes_from_the_rows_extremes_when_the_pass_made_them():
    from seqis.core.ratios import Ratios

    batch, mask = _drawn(seed=1)
    l = torch.where(mask, batch.trainer_logprobs - batch.inference_logprobs, 0.0)
    exact = float(l[mask].abs().max())
    assert exact == 95.0
    for ratios in (Ratios.of(batch, extremes=True), Ratios.of(batch)):
        assert diagnostics(batch, ratios)["abs_log_ratio_max"] == exact


def test_sampled_percentiles_are_those_of_the_strided_loss_tokens_and_near_the_exact_ones():
    from seqis.diagnosis.statistics import strided_sample

    g = torch.Generator().manual_seed(2)
    B, T = 256, 1024
    mask = torch.arange(T)[None, :] < torch.randint(1, T + 1, (B,), generator=g)[:, None]
    l = torch.randn(B, T, generator=g) * 0.1
    batch = Batch(torch.where(mask, l - 1, 0.0), torch.full((B, T), -1.0), torch.zeros(B), mask)
    exact = diagnostics(batch)
    n = 1 << 14
    sampled = diagnostics(batch, percentile_sample=n)
    # the definition: nearest-rank percentiles of |l| over the loss tokens among the positions at the stride
    at = strided_sample(B * T, n)
    assert at.step % 2 == 1 and at.step > 1
    mine = (batch.trainer_logprobs - batch.inference_logprobs).abs().reshape(-1)[at][mask.reshape(-1)[at]]
    xs = mine.sort().values
    k = lambda q: round(q * (xs.numel() - 1))
    assert sampled["abs_log_ratio_p50"] == float(xs[k(0.5)]) and sampled["abs_log_ratio_p99"] == float(xs[k(0.99)])
    # and near the exact ones: |l| of N(0, 0.1) has p50 0.0674, p99 0.258; the sample's ~8k tokens are within a
    # few rank errors (sqrt(q (1 - q) / 8k): 0.6 and 0.1 percentile points)
    assert sampled["abs_log_ratio_p50"] == pytest.approx(exact["abs_log_ratio_p50"], rel=0.03)
    assert sampled["abs_log_ratio_p99"] == pytest.approx(exact["abs_log_ratio_p99"], rel=0.03)
    assert sampled["abs_log_ratio_p50"] != exact["abs_log_ratio_p50"]  # (it is a sample)
    for key in exact:  # everything else reads every token
        if "_p50" not in key and "_p99" not in key:
            assert sampled[key] == exact[key], key
    assert diagnostics(batch, percentile_sample=B * T) == exact  # a sample as large as the batch: exact
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="percentile_sample"):
            diagnostics(batch, percentile_sample=bad)


def _near_one_reference(batch: Batch) -> dict[str, float]:
    """abs_ratio_mean and the band shares from their definitions, in numpy float64 (docs/design.md): only the
    loss tokens are read, so whatever the padding holds (-inf, NaN) cannot matter."""
    import numpy as np

    from seqis.diagnosis.statistics import RATIO_BANDS

    m = batch.loss_mask.numpy()  # (B, T)
    logp, logq = batch.trainer_logprobs.double().numpy(), batch.inference_logprobs.double().numpy()
    l = [logp[j][m[j]] - logq[j][m[j]] for j in range(m.shape[0])]  # each rollout's loss tokens' l_t
    tokens = np.concatenate(l)  # (N,)
    geo = np.array([x.mean() for x in l if x.size])  # (V,) S_j / T_j of the non-empty rollouts
    out = {"abs_ratio_mean": float(np.exp(np.minimum(np.abs(tokens), 40.0)).mean())}  # |l| capped at 40
    for lo, hi in RATIO_BANDS:
        rho, g = np.exp(tokens), np.exp(geo)
        out[f"tokens_in_{lo:g}_{hi:g}"] = float(((lo <= rho) & (rho <= hi)).mean())
        out[f"rollouts_in_{lo:g}_{hi:g}"] = float(((lo <= g) & (g <= hi)).mean())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_abs_ratio_mean_and_band_shares_against_a_float64_reference(dtype, shortcuts, seed):
    # ragged rollouts (some empty), NaN trainer and -inf sampler log-probs on the padding, catastrophic tokens
    # (one past the cap of 40); the log-ratios spread over the bands: N(0, 0.01) puts about a third of the tokens
    # inside 0.999_1.002, most inside 0.99_1.01, nearly all inside 0.95_1.05, and the rollouts' means likewise
    from seqis.evaluators.fast import Ratios

    batch, mask = _drawn(seed=seed, dtype=dtype)
    g = torch.Generator().manual_seed(seed + 10)
    l = torch.where(mask, torch.randn(mask.shape, generator=g, dtype=dtype) * 0.01, 0.0)
    l[::7, 3], l[5, 1] = 25.0, 95.0
    logq = batch.inference_logprobs
    batch = Batch(torch.where(mask, logq + l, batch.trainer_logprobs), logq, batch.advantages, mask)
    want = _near_one_reference(batch)
    got = diagnostics(batch, Ratios.of(batch, shortcuts=shortcuts))
    assert set(want) <= set(got)
    assert got["abs_ratio_mean"] == pytest.approx(want["abs_ratio_mean"], rel=1e-5)
    n, v = int(mask.sum()), int(mask.any(-1).sum())
    for key in want:
        if key.startswith("tokens_in_"):  # a token within float32's rounding of an edge may fall either way
            assert got[key] == pytest.approx(want[key], abs=2 / n), key
            assert 0.01 < got[key] < 1
        elif key.startswith("rollouts_in_"):
            assert got[key] == pytest.approx(want[key], abs=0.5 / v), key
    assert 0 < got["rollouts_in_0.999_1.002"] < got["rollouts_in_0.95_1.05"]
    assert got == diagnostics(batch)  # the record made here, or passed in


def test_band_shares_by_hand_with_tokens_and_rollouts_on_the_edges():
    # l is exact where one log-prob is 0: l = log(1.002) (logq = -log 1.002, logp = 0) sits on 0.999_1.002's upper
    # edge, l = log(0.999) on its lower edge; both are inside (the bands are inclusive, compared in log space).
    up, down, out = math.log(1.002), math.log(0.999), math.log(1.0021)
    logp = torch.tensor([[0.0, down, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    logq = torch.tensor([[-up, 0.0, -out], [-up, -up, 0.0], [-out, -out, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[True, True, True], [True, True, False], [True, True, False], [False, False, False]])
    # padding: NaN and -inf where the mask is off
    logp = torch.where(mask, logp, torch.tensor(math.nan, dtype=D))
    logq = torch.where(mask, logq, torch.tensor(-math.inf, dtype=D))
    d = diagnostics(Batch(logp, logq, torch.zeros(4, dtype=D), mask))
    # tokens: rollout 0 (up, down, out), rollout 1 (up, up), rollout 2 (out, out): 7 loss tokens, 4 on an edge of
    # 0.999_1.002 and inside, 3 just outside (1.0021); all 7 inside the wider bands
    assert d["tokens_in_0.999_1.002"] == pytest.approx(4 / 7)
    assert d["tokens_in_0.99_1.01"] == d["tokens_in_0.95_1.05"] == 1.0
    # rollouts (3 non-empty; rollout 3 is empty and left out): rollout 1's geometric ratio is exactly 1.002, on the
    # edge (exp(mean) in float64 is within its rounding of it): inside; rollout 2's is 1.0021: outside; rollout 0's
    # is (1.002 x 0.999 x 1.0021)^(1/3) = 1.00103: inside
    assert d["rollouts_in_0.999_1.002"] == pytest.approx(2 / 3)
    assert d["rollouts_in_0.99_1.01"] == d["rollouts_in_0.95_1.05"] == 1.0
    # abs_ratio_mean: mean of exp|l| = the ratio or its inverse, whichever is >= 1
    ratios = [1.002, 1 / 0.999, 1.0021, 1.002, 1.002, 1.0021, 1.0021]
    assert d["abs_ratio_mean"] == pytest.approx(sum(ratios) / 7, rel=1e-12)
    assert d["n_tokens"] == 7 and d["n_rollouts"] == 3


def test_a_geometric_ratio_on_an_edge_is_inside_whatever_the_rounding():
    # rollouts whose tokens' l average to log(1.002) in exact arithmetic but are not each log(1.002): in float32 the
    # mean S_j / T_j rounds either side of the edge (above it for one of these sampler log-probs); within the
    # rounding of its log-probs it is on the edge, as in every geometric band of seqis, so every one is inside
    from seqis.evaluators.fast import Ratios

    T, edge = 7, math.log(1.002)
    spread = torch.tensor([0.01 * (k - 3) for k in range(T)])  # (T,) sums to 0
    above = 0
    for seed in range(20):
        logq = -torch.rand(T, generator=torch.Generator().manual_seed(seed)) * 5  # (T,)
        on = Batch((logq + edge + spread)[None], logq[None], torch.zeros(1), torch.ones(1, T, dtype=torch.bool))
        assert diagnostics(on)["rollouts_in_0.999_1.002"] == 1.0, seed
        above += bool(Ratios.of(on).geo_log_ratio[0] > torch.tensor(edge))  # rounded past the edge in float32
        past = Batch((logq + edge + 2e-4 + spread)[None], logq[None], torch.zeros(1),
                     torch.ones(1, T, dtype=torch.bool))  # ratio 1.0022: outside
        assert diagnostics(past)["rollouts_in_0.999_1.002"] == 0.0, seed
    assert above >= 1  # (1 of these 20) the rounding tolerance, not luck, keeps it inside


def test_the_near_one_statistics_on_an_empty_batch_and_on_policy():
    empty = Batch(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(2), torch.zeros(2, 3, dtype=torch.bool))
    d = diagnostics(empty)
    assert d["abs_ratio_mean"] == 0.0 and d["tokens_in_0.99_1.01"] == 0.0 and d["rollouts_in_0.99_1.01"] == 0.0
    on = diagnostics(Batch(torch.full((3, 4), -1.0), torch.full((3, 4), -1.0), torch.zeros(3)))
    assert on["abs_ratio_mean"] == 1.0
    assert all(on[k] == 1.0 for k in on if k.startswith(("tokens_in_", "rollouts_in_")))
    from seqis.diagnosis.statistics import RATIO_BANDS

    assert sorted(k for k in on if "_in_" in k) == sorted(
        f"{what}_in_{k}" for what in ("tokens", "rollouts") for k in ("0.999_1.002", "0.99_1.01", "0.95_1.05"))
    assert len(RATIO_BANDS) == 3
