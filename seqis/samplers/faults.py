"""Real sampler faults, with the truth known: the tiny transformer sampled by a faulty inference engine.

The `tiny_lm` scenario of `samplers.scenarios`: the shipped tiny causal transformer (`samplers.tiny_lm`) samples
GRPO groups through a sampler with the faults users meet in RL stacks, and the fp32 trainer rescores them
at temperature 1 over the full vocabulary, as a trainer that does not know about them would:

  sampler_dtype  bf16 / fp16 / fp32 weights and activations in the sampler: plain precision noise
  temperature    the sampler divides its logits by it, the trainer does not: l = (1 - 1/tau) log pi + log Z_t
  top_p, top_k   the sampler renormalises over the kept tokens: l = log(kept mass) <= 0 on every token
  shift          the inference log-probs arrive `shift` positions late (an off-by-one in the export)
  bug_rate       a kernel bug: at that fraction of decoding steps one token's logit jumps above the rest
                 (bug_token), so the sampler emits it where the trainer finds it absurd

The truth travels in the batch's metadata, per rollout: `kept_log_mass` (sum over its loss tokens of the log
of the mass the sampler kept; its mean per token is the truncation's log offset) and `bug_tokens` (loss tokens
the bug chose where the trainer gives them under 5%). Batches are cached per (config, seed): the model's
weights load in milliseconds and 128 rollouts decode in a few seconds on one CPU core.

    from seqis.samplers.scenarios import make_batch
    batch = make_batch("tiny_lm", seed=0, top_p=0.9)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.types import Batch, Knobs, knob
from .heads import HEAD_K, shifted_head

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class TinyLMFaultConfig(Knobs):
    """The tiny transformer sampled with a faulty sampler (temperature, top-p / top-k, off-by-one, kernel bug)."""

    name: ClassVar[str] = "tiny_lm"

    n_prompts: int = knob(16, "Prompts; each gets a GRPO group of group_size rollouts.", ge=1, ui=(1, 64))
    group_size: int = knob(8, "G: rollouts per prompt.", ge=1, ui=(1, 16))
    sampler_dtype: str = knob("bf16", "The sampler's number format (the trainer is fp32).", choices=tuple(DTYPES))
    temperature: float = knob(1.0, "The sampler's temperature (the trainer's is 1).", gt=0.0, ui=(0.5, 1.5),
                              finite=True)
    top_p: float = knob(1.0, "The sampler's nucleus: keep the smallest set of tokens holding this much mass, "
                        "renormalised (1: off).", gt=0.0, ui=(0.5, 1.0))
    top_k: int = knob(0, "The sampler keeps only the k most likely tokens, renormalised (0: off).", ge=0,
                      ui=(0, 64))
    shift: int = knob(0, "The inference log-probs arrive this many positions late (negative: early).",
                      ge=-2, ui=(-2, 2))
    bug_rate: float = knob(0.0, "Fraction of decoding steps where the kernel bug forces bug_token.", ge=0.0,
                           ui=(0.0, 0.02))
    bug_token: int = knob(7, "The token the kernel bug forces.", ge=0, ui=(0, 63))
    head_k: int = knob(HEAD_K, "K: the sampler's top-k head each token carries (score centering reads it; 0: none).",
                       ge=0, ui=(0, 64))

    def __post_init__(self):
        for f in ("n_prompts", "group_size", "top_k", "shift", "bug_token", "head_k"):  # a slider may hand over 8.0
            v = getattr(self, f)
            if isinstance(v, float) and v.is_integer():
                object.__setattr__(self, f, int(v))
        super().__post_init__()
        if self.top_p > 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.bug_rate > 1:
            raise ValueError(f"bug_rate must be in [0, 1], got {self.bug_rate}")
        if abs(self.shift) > 2:
            raise ValueError(f"shift must be in [-2, 2], got {self.shift}")
        if self.bug_token >= 64:
            raise ValueError(f"bug_token must be a content token below 64, got {self.bug_token}")

    def make(self, *, seed: int = 0, device=None, dtype: torch.dtype = torch.float32) -> Batch:
        """The batch for this fault and seed (cached on the CPU; a fresh copy on `device`)."""
        from .generators import fresh_copy

        return fresh_copy(_rollouts(self, int(seed)), device, dtype)


@functools.cache
def _model():
    from .tiny_lm import pretrained

    return pretrained()


@functools.lru_cache(maxsize=16)
def _rollouts(cfg: TinyLMFaultConfig, seed: int) -> Batch:
    from .generators import one_thread
    from .tiny_lm import Sampling, rollouts

    lm, lang = _model()
    sampling = Sampling(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, bug_token=cfg.bug_token,
                        bug_rate=cfg.bug_rate)
    with one_thread():  # decoding's small steps: see seqis.samplers.generators.one_thread
        b = rollouts(lm, lang, n_prompts=cfg.n_prompts, group_size=cfg.group_size, seed=seed,
                     sampler_dtype=DTYPES[cfg.sampler_dtype], sampling=sampling, head_k=cfg.head_k)
    if cfg.shift:  # position t reports the sampler's log-prob of position t - shift (and its head, both sides)
        late = torch.roll(b.inference_logprobs, cfg.shift, dims=1)  # (B, T)
        b = Batch(b.trainer_logprobs, late, b.advantages, b.loss_mask, b.metadata, b.extras,
                  **shifted_head(b, cfg.shift))
    return b


def truth(batch: Batch) -> dict[str, float]:
    """What a tiny_lm batch's sampler did, from its metadata: the truncation's mean log offset per loss token
    and the number of absurd tokens the kernel bug chose."""
    n = max(1, int(batch.loss_mask.sum()))
    return {"log_offset": sum(batch.metadata["kept_log_mass"]) / n,
            "bug_tokens": int(sum(batch.metadata["bug_tokens"]))}
