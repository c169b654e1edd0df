"""run_many against separate run() calls: every estimator and every preset, with keys that name the same
composition in one call (computed once, each key its own output and gradient), on batches whose token rules
take the sparse form, the dense form, and per-token advantages."""

import math

import pytest
import torch

from seqis import ESTIMATORS, PRESETS, Batch, run, run_many
from seqis.registry import needs_head, resolve

D = torch.float64
ALL = list(ESTIMATORS) + sorted(k for k in PRESETS if not needs_head(k))  # these batches have no head


def _batch(kind: str, B=64, T=40, seed=3) -> Batch:
    """Small noise (no token rule trips) plus catastrophic tokens in 2 rollouts ("sparse": their rows alone are
    evaluated in full) or in every other one ("dense"), some empty rollouts, -inf padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[:3] = torch.tensor([0, 1, T])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=D) * 3
    trainer = inference + 0.02 * torch.randn(B, T, generator=g, dtype=D)
    every = {"sparse": 32, "dense": 2, "per-token advantages": 4}[kind]
    trainer[2::every, 5] += 3.0  # rho = e^3: outside every token band, beyond every truncation
    trainer[2::every, 9] -= 2.5
    trainer = torch.where(mask, trainer, torch.tensor(-math.inf, dtype=D))
    shape = (B, T) if kind == "per-token advantages" else (B,)
    adv = torch.randn(shape, generator=g, dtype=D)
    adv[1] = 0.0
    return Batch(trainer.requires_grad_(), inference, adv, mask)


def _everything(out, batch) -> dict[str, torch.Tensor]:
    (grad,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return {"loss": out.loss.detach(), "grad": grad, "weights": out.weights,
            **{f"mask {k}": m for k, m in out.masks.items()}, **{f"metric {k}": v for k, v in out.metrics.items()},
            **{f"rollout {k}": v for k, v in out.rollouts.items()}}


def _assert_same(got: dict, want: dict, key) -> None:
    assert got.keys() == want.keys(), key
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-12, atol=1e-14, msg=f"{key}: {k}")


@pytest.fixture(scope="module", params=["sparse", "dense", "per-token advantages"])
def batch(request):
    return _batch(request.param)


@pytest.mark.parametrize("agg", ["token-mean", "kept-token-mean", "seq-mean-token-mean"])
def test_run_many_gives_what_each_run_gives(batch, agg):
    # every key at once, plus keys that name a composition given before (a preset that is a registry entry's
    # composition, the same composition as a Composition): computed once, each key its own output
    twins = [resolve("token_tis"), resolve("verl/bypass_ppo_clip")]
    keys = ALL + twins
    outs = run_many(keys, batch, agg=agg)
    assert list(outs) == keys
    got = {k: _everything(outs[k], batch) for k in keys}
    for k in keys:
        _assert_same(got[k], _everything(run(k, batch, agg=agg), batch), k)
    # each output's gradient is its own tensor (a trainer may write to it)
    grads = [g["grad"] for g in got.values()]
    assert len({g.data_ptr() for g in grads}) == len(grads)


def test_outputs_of_one_composition_backpropagate_independently(batch):
    # three keys name token_tis's composition: each loss gives the whole gradient, in any order, scaled by
    # what it is given, and again after retain_graph
    keys = ["token_tis", "nemo-rl/tis", resolve("token_tis")]
    want = _everything(run("token_tis", batch), batch)["grad"]
    outs = run_many(keys, batch)
    (g2,) = torch.autograd.grad(outs["nemo-rl/tis"].loss * 2, batch.trainer_logprobs, retain_graph=True)
    (g2_again,) = torch.autograd.grad(outs["nemo-rl/tis"].loss, batch.trainer_logprobs)
    (g0,) = torch.autograd.grad(outs["token_tis"].loss, batch.trainer_logprobs)
    g0.add_(1.0)  # written to by its owner: the other keys' gradients do not move
    (g1,) = torch.autograd.grad(outs[keys[2]].loss, batch.trainer_logprobs)
    torch.testing.assert_close(g2, 2 * want, rtol=1e-12, atol=0)
    torch.testing.assert_close(g2_again, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(g1, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(g0, want + 1.0, rtol=1e-12, atol=0)
    assert outs["token_tis"].weights is outs["nemo-rl/tis"].weights  # shared, detached


def test_a_penalty_adds_its_gradient_once_per_output(batch):
    # prime-rl's two presets share the KL penalty's gradient tensor; each output adds it to its own
    outs = run_many(["prime-rl/default", "prime-rl/ipo"], batch)
    for k, out in outs.items():
        _assert_same(_everything(out, batch), _everything(run(k, batch), batch), k)


def test_row_dots_in_blocks_equal_the_plain_formula():
    # dot_rows makes a * b a block of rows at a time on the CPU (no fresh (B, T) product)
    from seqis.evaluators.kernels import DOT_BLOCK, dot_rows

    g = torch.Generator().manual_seed(0)
    T = 1000
    B = 3 * (DOT_BLOCK // T) + 7  # several blocks and a short last one
    a, b = torch.randn(B, T, generator=g, dtype=D), torch.randn(B, T, generator=g, dtype=D)
    torch.testing.assert_close(dot_rows(a, b), (a * b).sum(-1), rtol=1e-12, atol=1e-12)


def test_the_sparse_rows_form_on_a_batch_of_many_rollouts():
    # 300 rollouts (the row-dot blocks and the sparse rows at scale): every preset through run_many equals its
    # run alone
    batch = _batch("sparse", B=300, T=300, seed=5)
    keys = ALL
    outs = run_many(keys, batch)
    for k in keys:
        _assert_same(_everything(outs[k], batch), _everything(run(k, batch), batch), k)


def test_a_callers_ratios_serves_later_calls_unchanged():
    # a Ratios is a frozen record: the pieces a call shares live in that call's own cache, so a Ratios the caller
    # keeps for later calls is the same record after each, and each call gives what run() gives
    import dataclasses

    from seqis.core.ratios import Ratios

    batch = _batch("sparse")
    r = Ratios.of(batch)
    before = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
    for keys in (["token_tis"], ["token_tis", "icepop", "prefix_is"], ["icepop"]):
        outs = run_many(keys, batch, ratios=r)
        assert all(getattr(r, k) is v for k, v in before.items())
        with pytest.raises(dataclasses.FrozenInstanceError):
            r.log_ratio = None
        for k in keys:
            _assert_same(_everything(outs[k], batch), _everything(run(k, batch), batch), k)


@pytest.mark.parametrize("kind", ["sparse", "dense"])
def test_row_extremes_made_with_the_log_ratios(kind):
    # Ratios.of(extremes=True) makes each row's max and min of l in its blocked pass: they are amax / amin of l
    # (padding's 0 included), clamped copies carry them clamped, and every output is what a record without them
    # gives (the extremes then come from a pass of their own)
    from seqis.core.ratios import Ratios

    batch = _batch(kind, B=300, T=900)  # several row blocks
    inference = batch.inference_logprobs.clone()
    inference[7:300:50] = torch.where(batch.loss_mask[7:300:50], inference[7:300:50], -math.inf)  # rows to clean
    batch = Batch(batch.trainer_logprobs, inference, batch.advantages, batch.loss_mask)
    with_them, without = Ratios.of(batch, extremes=True), Ratios.of(batch)
    assert without.row_max is None
    for r in (with_them, with_them.clamped(1.0)):
        torch.testing.assert_close(r.row_max, r.log_ratio.amax(-1), rtol=0, atol=0)
        torch.testing.assert_close(r.row_min, r.log_ratio.amin(-1), rtol=0, atol=0)
    keys = ["mis_po", "icepop", "geo_mask", "verl/bypass_ppo_clip"]
    a, b = run_many(keys, batch, ratios=with_them), run_many(keys, batch, ratios=without)
    for k in keys:
        _assert_same(_everything(a[k], batch), _everything(b[k], batch), k)


def test_a_correction_that_drops_no_token_reports_no_dropped_kl():
    # found: prime-rl/ipo on a batch it kept whole reported masked_mismatch_kl = 2^-15 (the rounding of the batch's
    # k3 sum minus its kept tokens' sum, in float32), and on another CPU 0.0: now summed per rollout, a rollout that
    # keeps all its tokens drops exactly 0, in the tokens form and the rows form, alone and through run_many
    from seqis.samplers.scenarios import make_batch

    batch = make_batch("catastrophic", seed=1, n_rollouts=48, max_len=96)
    outs = run_many(ALL, batch)
    whole = 0
    for k in ALL:
        for s in (run(k, batch).scalars(), outs[k].scalars()):
            if float(s["is_masked"]) == 0.0:
                whole += 1
                assert float(s["masked_mismatch_kl"]) == 0.0, k
            else:
                assert float(s["masked_mismatch_kl"]) > 0.0, k  # the dropped tokens' k3, each >= 0
    assert whole >= 10  # not vacuous: many corrections keep this batch whole
