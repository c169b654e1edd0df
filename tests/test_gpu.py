"""On CUDA: every estimator gives the CPU's answer, and a large batch runs on the device."""

import pytest
import torch

from seqis import ESTIMATORS, Batch, diagnostics, run, run_many

pytestmark = pytest.mark.gpu


def cpu_batch(B=64, T=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    inference = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    trainer = inference + 0.1 * torch.randn(B, T, generator=g, dtype=torch.float64)
    return Batch(trainer, inference, torch.randn(B, generator=g, dtype=torch.float64), mask)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_cuda_matches_cpu(name):
    cpu = cpu_batch()
    gpu = cpu.to("cuda")
    gpu.trainer_logprobs.requires_grad_()
    cpu.trainer_logprobs.requires_grad_()
    a, b = run(name, cpu), run(name, gpu)
    assert b.weights.device.type == "cuda"
    torch.testing.assert_close(a.weights, b.weights.cpu())
    a.loss.backward()
    b.loss.backward()
    torch.testing.assert_close(cpu.trainer_logprobs.grad, gpu.trainer_logprobs.grad.cpu())
    for k, v in a.scalars().items():
        assert v == pytest.approx(b.scalars()[k], rel=1e-9, abs=1e-12), k


def test_large_batch_on_cuda():
    # 1e8 positions: the seed estimators and the diagnostics' percentiles run on the device
    B, T = 12_208, 8_192
    g = torch.Generator(device="cuda").manual_seed(0)
    inference = -torch.rand(B, T, generator=g, device="cuda")
    trainer = (inference + 0.01 * torch.randn(B, T, generator=g, device="cuda")).requires_grad_()
    batch = Batch(trainer, inference, torch.randn(B, generator=g, device="cuda"))
    outs = run_many(["seq_tis", "seq_mis", "geo_mask", "mis_po"], batch)
    sum(o.loss for o in outs.values()).backward()
    assert torch.isfinite(trainer.grad).all()
    d = diagnostics(batch)
    assert d["n_tokens"] == B * T and 0 < d["abs_log_ratio_p50"] < d["abs_log_ratio_p99"] < d["abs_log_ratio_max"]


def test_training_on_cuda_follows_the_cpu_run():
    """seqis.lab.train: the same seeds draw the same uniforms on both devices (counter-based streams), so a
    short float64 run gives the CPU's J; the exact mode agrees to rounding."""
    from seqis.lab import BitChain, TabularAR, train

    chain = BitChain(64, 38, 0.5, 0.5)
    kw = dict(steps=20, lr=3.0, lag=4, batch_size=64, seeds=3, dtype=torch.float64)
    cpu = train(chain, ["seq_is", "geo_is", "seq_tis"], **kw)
    gpu = train(chain, ["seq_is", "geo_is", "seq_tis"], device="cuda", **kw)
    assert abs(cpu.J - gpu.J).max() < 1e-9
    toy = TabularAR(3, 4)
    a = train(toy, ["seq_is", "pg"], steps=5, lr=1.0, lag=2, batch_size=None)
    b = train(toy, ["seq_is", "pg"], steps=5, lr=1.0, lag=2, batch_size=None, device="cuda")
    assert abs(a.J - b.J).max() < 1e-12
