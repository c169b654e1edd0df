"""An independent generator for testing the diagnosis: random next-token models, not the project's recurrent LMs.

`seqis.samplers.generators` draws its logits from small recurrent LMs; the detectors were measured there. This
module shares none of their code or their entropy profile, so a detector that passes here was not tuned on it.
Each position's logits are drawn afresh (a "random next-token model": the context is the draw):

    z = beta * N(0, 1)^V                      (a branching position, beta ~ U(0.5, 3.5): H from ~6 to ~1 nats)
    z[one token] += margin                    (a near-certain position, a share `certain_frac` of them: the margin
                                               is beta sqrt(2 ln V), about the largest Gaussian, plus U(4, 12))

then shifted so the largest logit is ~ U(10, 28), where real logits sit and rounding acts. The profile is
continuous (every entropy from near 0 to near log V), unlike the recurrent LMs' near-certain / branching split.

The sampler rounds the logits through `sampler_format` (fp32, bf16, fp16, or "fp8": e4m3, emulated by rounding the
significand to 4 bits, i.e. 3 stored mantissa bits, and saturating at 448), divides by `temperature`, applies
top-k / top-p (seqis.samplers.tiny_lm.truncate, vLLM's order), log-softmaxes in fp32, draws a token and reports
its log-prob. The trainer scores it with the fp32 logits and reports its entropy (`extras["entropy"]`).

Truth in metadata, per rollout: kept_log_mass (sum over its tokens of log pi(K), the trainer's mass on the
sampler's kept set K), temperature (the sampler's, one value per rollout).

    from seqis.samplers.random_next_token import RandomNextToken
    batch = RandomNextToken(sampler_format="bf16", temperature=0.7).make(seed=3)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from ..core.types import Batch
from .tiny_lm import truncate

FORMATS = ("fp32", "bf16", "fp16", "fp8")
E4M3_MAX = 448.0
_CHUNK = 32  # positions made at once: (B, _CHUNK, V) logits


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to fp8 e4m3 (4 significant bits, round half to even; saturating at +-448), kept in fp32.
    Values below e4m3's smallest normal (2^-6) are rounded as if normal: a logit that small does not matter."""
    m, e = torch.frexp(x.float())  # x = m 2^e, |m| in [0.5, 1)
    return torch.ldexp(torch.round(m * 16) / 16, e).clamp(-E4M3_MAX, E4M3_MAX)


def round_to(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded through the named format, back in fp32."""
    if fmt == "fp8":
        return round_e4m3(x)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if fmt not in dtypes:
        raise ValueError(f"sampler_format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    return x.to(dtypes[fmt]).float()


@dataclass(frozen=True)
class RandomNextToken:
    """96 rollouts of 50-400 loss tokens from random next-token models with LLM-like peaked distributions."""

    vocab: int = 1024
    n_rollouts: int = 96
    min_len: int = 50
    max_len: int = 400
    certain_frac: float = 0.6  # share of near-certain positions
    sampler_format: str = "bf16"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if self.sampler_format not in FORMATS:
            raise ValueError(f"sampler_format must be one of {', '.join(FORMATS)}, got {self.sampler_format!r}")
        if not (0 < self.temperature and 0 < self.top_p <= 1 and 0 <= self.top_k < self.vocab):
            raise ValueError(f"bad sampler settings: temperature {self.temperature}, top_p {self.top_p}, "
                             f"top_k {self.top_k} (vocab {self.vocab})")
        if not 1 <= self.min_len <= self.max_len:
            raise ValueError(f"need 1 <= min_len <= max_len, got {self.min_len}, {self.max_len}")

    def replace(self, **changes) -> RandomNextToken:
        return replace(self, **changes)

    @torch.no_grad()
    def make(self, seed: int = 0) -> Batch:
        """The batch for this seed: the same seed gives the same contexts whatever the sampler's settings."""
        g = torch.Generator().manual_seed(int(seed))
        B, T = self.n_rollouts, self.max_len
        lengths = torch.randint(self.min_len, self.max_len + 1, (B,), generator=g)
        out = {k: torch.zeros(B, T) for k in ("trainer", "sampler", "entropy", "kept")}
        for t0 in range(0, T, _CHUNK):
            cols = slice(t0, min(T, t0 + _CHUNK))
            z = self._logits(B, cols.stop - cols.start, g)  # (B, C, V)
            for k, v in self._sample(z, g).items():
                out[k][:, cols] = v
        mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
        zero = torch.zeros(())
        advantages = torch.randn(B, generator=g)  # unrelated to the sampler: the lag test's null holds
        return Batch(
            trainer_logprobs=torch.where(mask, out["trainer"], zero),
            inference_logprobs=torch.where(mask, out["sampler"], zero),
            advantages=advantages, loss_mask=mask,
            metadata={"group_id": (torch.arange(B) // 8).tolist(), "length": lengths.tolist(),
                      "kept_log_mass": torch.where(mask, out["kept"], zero).sum(-1).tolist(),
                      "temperature": [self.temperature] * B},
            extras={"entropy": torch.where(mask, out["entropy"], zero)})

    def _logits(self, B: int, C: int, g: torch.Generator) -> torch.Tensor:
        """(B, C, V) fp32 logits: Gaussian at a spread beta per position, a margin on one token at a share of
        positions, shifted so the largest logit is between 10 and 28."""
        V = self.vocab
        beta = 0.5 + 3.0 * torch.rand(B, C, 1, generator=g)
        z = beta * torch.randn(B, C, V, generator=g)
        certain = torch.rand(B, C, 1, generator=g) < self.certain_frac
        lead = beta * (2 * math.log(V)) ** 0.5  # about the largest of V Gaussians: the margin is beyond it
        margin = torch.where(certain, lead + 4 + 8 * torch.rand(B, C, 1, generator=g), torch.zeros(()))
        z.scatter_add_(-1, torch.randint(V, (B, C, 1), generator=g), margin)
        top = 10 + 18 * torch.rand(B, C, 1, generator=g)
        return z - z.amax(-1, keepdim=True) + top

    def _sample(self, z: torch.Tensor, g: torch.Generator) -> dict[str, torch.Tensor]:
        """The sampler's draw from (B, C, V) logits: each (B, C) the trainer's log pi(y), the sampler's log mu(y),
        the trainer's entropy and log pi(K) of the sampler's kept set."""
        B, C, V = z.shape
        logp = torch.log_softmax(z, -1).reshape(B * C, V)  # the trainer, fp32
        processed = torch.log_softmax(round_to(z, self.sampler_format) / self.temperature, -1).reshape(B * C, V)
        logq, _ = truncate(processed, self.top_k, self.top_p)  # (B C, V), -inf off the kept set
        y = torch.multinomial(logq.exp(), 1, generator=g)  # (B C, 1)
        kept = logp.masked_fill(torch.isinf(logq), -torch.inf).logsumexp(-1)  # (B C,) log pi(K)
        entropy = -(logp.exp() * logp).sum(-1)
        return {"trainer": logp.gather(-1, y)[:, 0].reshape(B, C), "sampler": logq.gather(-1, y)[:, 0].reshape(B, C),
                "entropy": entropy.reshape(B, C), "kept": kept.reshape(B, C)}


def truth(batch: Batch) -> dict[str, float]:
    """What the sampler did, per loss token: the mean log kept mass and the temperature."""
    n = max(1, int(batch.loss_mask.sum()))
    m = batch.metadata
    return {"log_offset": sum(m["kept_log_mass"]) / n, "temperature": m["temperature"][0]}
