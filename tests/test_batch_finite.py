"""Batch's finite check (seqis.core.types.nonfinite_loss_tokens: chunk sums, then a token-by-token look) against a
plain per-token reference written from the rule: a loss token whose trainer or inference log-prob is NaN or +-inf is
refused (ValueError naming the first one, row-major) or dropped with drop_nonfinite=True; padding may hold anything;
huge finite values are fine."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from seqis import Batch
from seqis.core.types import CHUNK, nonfinite_loss_tokens

BAD = (math.nan, math.inf, -math.inf)


def reference(tl, il, m):
    """(n, 2) the loss tokens with a non-finite log-prob, row-major: isfinite on both, masked, token by token."""
    return (~(torch.isfinite(tl) & torch.isfinite(il)) & m).nonzero()


def check(tl, il, m):
    """Batch refuses exactly when the reference finds a token, names the reference's first, and drops exactly its
    tokens with drop_nonfinite=True (the caller's mask untouched)."""
    want = reference(tl, il, m)
    T = tl.shape[1]
    got = nonfinite_loss_tokens(tl, il, m)
    assert got.tolist() == (want[:, 0] * T + want[:, 1]).tolist()
    adv = torch.zeros(tl.shape[0])
    before = m.clone()
    if len(want) == 0:
        assert Batch(tl, il, adv, m).n_dropped_nonfinite == 0
    else:
        row, tok = want[0].tolist()
        with pytest.raises(ValueError, match=rf"row {row}, token {tok}: .*\({len(want)} loss tokens? with a non-f"):
            Batch(tl, il, adv, m)
        b = Batch(tl, il, adv, m, drop_nonfinite=True)
        assert b.n_dropped_nonfinite == len(want)
        expect = m.clone()
        expect[want[:, 0], want[:, 1]] = False
        assert torch.equal(b.loss_mask, expect)
    assert torch.equal(m, before)


def ragged(B, T, lengths, dtype=torch.float32, pad=-math.inf):
    g = torch.Generator().manual_seed(B * 1000 + T)
    il = (-torch.rand(B, T, generator=g) * 3).to(dtype)
    m = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    tl = torch.where(m, il.float() + 0.01, torch.tensor(pad)).to(dtype)
    return tl, il, m


SHAPES = [(4, 300), (3, 256), (2, 1), (1, 5), (5, 128), (2, 129), (8, 1000)]


@pytest.mark.parametrize("B,T", SHAPES)
@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("field", ["tl", "il"])
@pytest.mark.parametrize("where", ["first", "last", "middle", "padding"])
def test_one_bad_value_in_either_field_anywhere(B, T, value, field, where):
    lengths = [max(1, T - 3 * j) if j % 2 else T for j in range(B)]  # padded and unpadded rows
    tl, il, m = ragged(B, T, lengths)
    row = B - 1
    n = lengths[row]
    tok = {"first": 0, "last": n - 1, "middle": n // 2, "padding": min(n, T - 1)}[where]
    (tl if field == "tl" else il)[row, tok] = value
    check(tl, il, m)


@pytest.mark.parametrize("value", BAD)
def test_a_row_of_length_one_among_padding(value):
    tl, il, m = ragged(3, 200, [200, 1, 50])
    tl[1, 0] = value
    check(tl, il, m)
    tl[1, 0] = -0.5
    il[1, 0] = value
    check(tl, il, m)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("pad", [-math.inf, math.nan, 0.0])
def test_huge_finite_values_are_kept(dtype, pad):
    """The largest finite values of the dtype, all of one sign in a chunk (their sums overflow): not refused."""
    big = torch.finfo(dtype).max
    for fill in (big, -big, min(1e38, big), max(-3.4e38, -big)):  # -3.4e38 is -inf in bfloat16: its max is 3.39e38
        tl, il, m = ragged(4, 3 * CHUNK + 7, [3 * CHUNK + 7, 100, 1, 2 * CHUNK], dtype=dtype, pad=pad)
        tl[m] = fill
        il[m] = fill
        check(tl, il, m)
        b = Batch(tl, il, torch.zeros(4), m)
        assert b.n_dropped_nonfinite == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("value", BAD)
def test_other_dtypes_and_a_mix(dtype, value):
    tl, il, m = ragged(4, 2 * CHUNK + 3, [2 * CHUNK + 3, 130, 1, 127], dtype=dtype)
    il[2, 0] = value
    tl[0, 2 * CHUNK + 2] = value  # past the last whole chunk (the flat tail)
    check(tl, il, m)
    check(tl.float(), il, m)  # trainer float32, inference in dtype


def test_non_contiguous_and_offset_inputs():
    """A row slice starting off an 8-byte word of the mask, and transposed tensors (copied), read the same."""
    tl, il, m = ragged(9, 3 * CHUNK - 3, [300] * 9)
    tl[5, 10] = math.nan
    check(tl[1:], il[1:], m[1:])
    check(tl.t().contiguous().t(), il, m)


def test_an_empty_batch_and_integer_masks():
    e = torch.zeros(0, 7)
    assert Batch(e, e, torch.zeros(0)).n_dropped_nonfinite == 0
    tl, il, m = ragged(2, 10, [10, 4])
    tl[1, 2] = math.inf
    with pytest.raises(ValueError, match="row 1, token 2: trainer_logprobs is inf"):
        Batch(tl, il, torch.zeros(2), m.long())


VALUES = st.sampled_from([0.0, -1.5, -30.0, 1e38, -3.4e38, 3.4e38, math.nan, math.inf, -math.inf])


@st.composite
def batches(draw):
    B = draw(st.integers(1, 5))
    T = draw(st.sampled_from([1, 3, 127, 128, 129, 256, 300]))
    tl = torch.tensor(draw(st.lists(VALUES, min_size=B * T, max_size=B * T))).view(B, T)
    il = torch.tensor(draw(st.lists(VALUES, min_size=B * T, max_size=B * T))).view(B, T)
    # sparse draws: mostly finite, a few non-finite; a ragged or an arbitrary mask
    keep = torch.rand(B, T, generator=torch.Generator().manual_seed(draw(st.integers(0, 9)))) < 0.9
    tl = torch.where(keep, -0.25, tl)
    il = torch.where(keep, -0.5, il)
    if draw(st.booleans()):
        lengths = torch.tensor(draw(st.lists(st.integers(0, T), min_size=B, max_size=B)))
        m = torch.arange(T)[None, :] < lengths[:, None]
        tl = torch.where(m, tl, -math.inf)
    else:
        m = torch.tensor(draw(st.lists(st.booleans(), min_size=B * T, max_size=B * T))).view(B, T)
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    return tl.to(dtype), il.to(dtype), m


@settings(max_examples=150, deadline=None)
@given(batches())
def test_hypothesis_batches_match_the_reference(b):
    check(*b)
