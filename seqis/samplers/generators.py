"""Language models the diagnosis was not tuned on: small recurrent LMs sampled by a faulty bf16 sampler.

`seqis.samplers.tiny_lm` is one model with one entropy profile. These generators differ from it and from each other in
what a detector has to survive: the vocabulary (256 to 32k tokens), the entropy profile (LLM-like peaked, a
Zipf tail, flat), the sampler's precision and where it rounds, and the size of each fault. Every one of them
is cheap: a recurrent state of 32 numbers, one (B, V) logits row per decoding step, all B rollouts at once.

The model. A fixed random "world" per (vocab, profile, model_seed): token embeddings E (V, d), a contracting
recurrence A (d, d), an unembedding U (V, d), a bias b (V,) (a Zipf tail over a random ranking of the
tokens for the "zipf" profile) and a successor table (the token each token makes likely next). At each
position, from the state h (d,) and the previous token:

    h_t   = tanh(A h_{t-1} + E[y_{t-1}])
    z_t   = scale * U h_t + b + margin(h_t) * onehot(succ[y_{t-1}])      (logits, (V,))

margin(h) = relu(m0 + m1 * w.h / |w|) makes a share of the positions near-certain (the successor holds
almost all the mass) and leaves the rest branching, as an LLM's tokens are; "flat" has no margin. The logits
are then shifted so their largest is about `logit_offset` (softmax does not see a shift, rounding does: real
logits sit around 10-30, where bf16's spacing is 1/16-1/8).

The sampler (the inference engine) rounds through `sampler_dtype` (bf16 by default, as real samplers do):
  rounding "logits"  the logits are rounded to the dtype, then log-softmaxed in fp32 (vLLM's bf16 logits);
           "model"   the whole recurrence and the unembedding run in the dtype (a bf16 copy of the weights,
                     with activations rounded at each step; its state drifts from the trainer's);
           "probs"   the probabilities are rounded to the dtype and renormalised.
then applies its processing: temperature (logits / tau), top-k, top-p (vLLM's order), and a kernel bug (at a
fraction bug_rate of steps one token's logit jumps above the rest). It reports log mu of the token it drew:
the processed distribution's (report="processed"), or the raw one's (report="raw": vLLM's raw_logprobs mode,
tokens drawn from the processed distribution). shift moves the reported log-probs `shift` positions late.

The trainer rescores every token in fp32 with its own weights: the sampler's, or `lag_steps` policy-gradient
steps ahead (policy lag: each step a policy-gradient step on U and b of size lag_kl (per-token KL), from a
fresh batch of the trainer's own rollouts, on this generator's reward: the share of a fixed set of "good"
tokens in the response). Its entropy H_t and the token ids travel in batch.extras.

The truth, per rollout, in metadata (sums over the rollout's loss tokens): kept_log_mass (log of the mass the
sampler's truncation kept), entropy_gap (E_q[-log pi] - H(pi), q the distribution the token was drawn from),
kl (KL(q || pi)), bug_tokens (tokens the kernel bug forced where the trainer gives them under 5%).

    from seqis.samplers.generators import GENERATORS, make
    batch = make("lm_chat32k", seed=0, top_p=0.9)         # or seqis.samplers.scenarios.make_batch("lm_chat32k", ...)
    truth(batch)                                           # {'log_offset': ..., 'entropy_gap': ..., ...}
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from ..core.types import Batch, Knobs, knob
from .heads import HEAD_K, head_fields, shifted_head, top_k_head
from .tiny_lm import truncate

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
EOS = 0  # token 0 ends a response
_D = 32  # the recurrent state's size


@dataclass(frozen=True)
class LMGenerator(Knobs):
    """A small recurrent LM sampled by a faulty sampler (the presets below differ in vocabulary, entropy
    profile and where the sampler rounds)."""

    name: ClassVar[str] = "lm"

    vocab: int = knob(1024, "V: tokens in the vocabulary (token 0 is EOS).", ge=16, ui=(256, 32768), log=True)
    profile: str = knob("peaked", "Entropy profile: LLM-like (most positions near-certain), a Zipf tail over "
                        "the vocabulary, or flat (every position branching).", choices=("peaked", "zipf", "flat"))
    certain_frac: float = knob(0.7, "Peaked and zipf profiles: about this share of positions is near-certain.",
                               ge=0.0, ui=(0.0, 0.95))
    scale: float = knob(0.6, "Spread of the logits at a branching position (times U h).", gt=0.0, ui=(0.1, 2.0))
    logit_offset: float = knob(20.0, "The largest logit at each position (rounding depends on it).", ge=0.0,
                               ui=(0.0, 40.0))
    n_prompts: int = knob(8, "Prompts; each gets a GRPO group of group_size rollouts.", ge=1, ui=(1, 64))
    group_size: int = knob(8, "G: rollouts per prompt.", ge=1, ui=(1, 16))
    max_len: int = knob(64, "Longest response, in tokens.", ge=2, ui=(8, 512), log=True)
    mean_len: float = knob(40.0, "About the mean response length (sets EOS's bias).", gt=1.0, ui=(4.0, 512.0))
    sampler_dtype: str = knob("bf16", "The sampler's number format (the trainer is fp32).", choices=tuple(DTYPES))
    rounding: str = knob("logits", "Where the sampler rounds: its logits, its whole model, or its probabilities.",
                         choices=("logits", "model", "probs"))
    temperature: float = knob(1.0, "The sampler's temperature (the trainer's is 1).", gt=0.0, ui=(0.5, 1.5),
                              finite=True)
    top_k: int = knob(0, "The sampler keeps only the k most likely tokens (0: off).", ge=0, ui=(0, 1024))
    top_p: float = knob(1.0, "The sampler's nucleus (1: off).", gt=0.0, ui=(0.5, 1.0))
    report: str = knob("processed", "The log-probs the sampler reports: of the distribution it drew from, or "
                       "raw (before temperature and truncation).", choices=("processed", "raw"))
    shift: int = knob(0, "The inference log-probs arrive this many positions late (negative: early).", ge=-2,
                      ui=(-2, 2))
    bug_rate: float = knob(0.0, "Fraction of decoding steps where the kernel bug forces one token.", ge=0.0,
                           ui=(0.0, 0.05))
    lag_steps: int = knob(0, "Policy lag: the trainer is this many policy-gradient steps ahead.", ge=0, ui=(0, 16))
    lag_kl: float = knob(2e-4, "Each lag step moves the policy by this KL per token (a trust-region step).",
                         gt=0.0, ui=(1e-5, 1e-2), log=True)
    model_seed: int = knob(0, "The world's weights.", ge=0, ui=(0, 16))
    head_k: int = knob(HEAD_K, "K: the sampler's top-k head each token carries (score centering reads it; 0: none).",
                       ge=0, ui=(0, 64))

    def __post_init__(self):
        for f in ("vocab", "certain_frac", "n_prompts", "group_size", "max_len", "top_k", "shift", "lag_steps",
                  "model_seed", "head_k"):
            v = getattr(self, f)
            if isinstance(v, float) and v.is_integer() and f != "certain_frac":
                object.__setattr__(self, f, int(v))
        super().__post_init__()
        if self.top_p > 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k >= self.vocab:
            raise ValueError(f"top_k must be below vocab ({self.vocab}), got {self.top_k}")
        if self.bug_rate > 1:
            raise ValueError(f"bug_rate must be in [0, 1], got {self.bug_rate}")
        if abs(self.shift) > 2:
            raise ValueError(f"shift must be in [-2, 2], got {self.shift}")
        if self.rounding == "probs" and self.sampler_dtype == "fp16":
            raise ValueError("rounding='probs' with fp16 would flush probabilities under 6e-8 to zero (a "
                             "truncation, not rounding); use bf16 or fp32")

    def make(self, *, seed: int = 0, device=None, dtype: torch.dtype = torch.float32) -> Batch:
        """The batch for this config and seed (cached on the CPU; a fresh copy on `device`)."""
        return fresh_copy(_cached(self, int(seed)), device, dtype)


def fresh_copy(b: Batch, device=None, dtype: torch.dtype = torch.float32) -> Batch:
    """A copy of a cached batch on `device` in `dtype` (nothing shared: a caller may edit it in place)."""
    return Batch(b.trainer_logprobs.to(device=device, dtype=dtype, copy=True),
                 b.inference_logprobs.to(device=device, dtype=dtype, copy=True),
                 b.advantages.to(device=device, dtype=dtype, copy=True), b.loss_mask.to(device, copy=True),
                 {k: list(v) for k, v in b.metadata.items()},
                 {k: x.to(device, copy=True) for k, x in b.extras.items()},
                 **{n: None if x is None else x.to(device=device, dtype=dtype if x.is_floating_point() else x.dtype,
                                                   copy=True) for n, x in zip((*Batch.HEAD, "topk_support"), b.head())})


def _preset(cls_name: str, name: str, doc: str, **defaults) -> type[LMGenerator]:
    """A subclass of LMGenerator with other defaults (its knobs' help and ranges kept)."""
    fields = []
    for f in dataclasses.fields(LMGenerator):
        if f.name in defaults:
            fields.append((f.name, f.type, dataclasses.field(default=defaults.pop(f.name), metadata=f.metadata)))
    assert not defaults, defaults
    return dataclasses.make_dataclass(cls_name, fields, bases=(LMGenerator,), frozen=True,
                                      namespace={"name": name, "__doc__": doc, "__module__": __name__})


# the generators the tests and the power bench draw from: none of them is tiny_lm
PRESETS: tuple[type[LMGenerator], ...] = (
    _preset("Byte256", "lm_byte256", "256 tokens, every position branching (entropy 1.5-3.5 nats), bf16 logits.",
            vocab=256, profile="flat", scale=2.0, logit_offset=12.0),
    _preset("Code4k", "lm_code4k", "4k tokens, a Zipf tail, the whole sampler model in bf16.",
            vocab=4096, profile="zipf", certain_frac=0.55, scale=0.5, logit_offset=24.0, rounding="model"),
    _preset("Chat32k", "lm_chat32k", "32k tokens, LLM-like peaked entropy, bf16 logits around 20; short rollouts.",
            vocab=32768, profile="peaked", certain_frac=0.75, scale=0.45, n_prompts=4, max_len=48, mean_len=30.0),
    _preset("Mixed1k", "lm_mixed1k", "1k tokens, half the positions branching, bf16 probabilities.",
            vocab=1024, profile="peaked", certain_frac=0.5, scale=0.8, rounding="probs"),
)
GENERATORS: dict[str, type[LMGenerator]] = {c.name: c for c in PRESETS}


def make(name: str, *, seed: int = 0, **overrides) -> Batch:
    """The batch of generator `name` (a key of GENERATORS) with knob overrides."""
    if name not in GENERATORS:
        raise ValueError(f"no generator {name!r}; the generators: {', '.join(GENERATORS)}")
    return GENERATORS[name]().replace(**overrides).make(seed=seed)


def truth(batch: Batch) -> dict[str, float]:
    """What a generator's sampler did, per loss token, from its metadata."""
    n = max(1, int(batch.loss_mask.sum()))
    m = batch.metadata
    return {"log_offset": sum(m["kept_log_mass"]) / n, "entropy_gap": sum(m["entropy_gap"]) / n,
            "kl": sum(m["kl"]) / n, "bug_tokens": int(sum(m["bug_tokens"]))}


# ---------------------------------------------------------------------------------------------------------
# the world: fixed random weights per (vocab, profile, model_seed)


@dataclass(frozen=True)
class _World:
    E: torch.Tensor  # (V, d) token embeddings
    A: torch.Tensor  # (d, d) recurrence
    U: torch.Tensor  # (V, d) unembedding
    b: torch.Tensor  # (V,) bias
    succ: torch.Tensor  # (V,) the token each token makes likely next
    w: torch.Tensor  # (d,) the direction of certainty
    m0: float  # margin(h) = relu(m0 + m1 w.h)
    m1: float
    eos: float  # EOS's logit sits this far above the log-partition of the others (before the margin)
    good: torch.Tensor  # (V,) bool: the tokens the reward counts
    prompts: torch.Tensor  # (P, d) the prompts' initial states


def _world(cfg: LMGenerator) -> _World:
    """The world of a config: its weights depend only on the model's knobs, not on the sampler's."""
    return _weights(cfg.replace(**{f.name: f.default for f in dataclasses.fields(LMGenerator)
                                   if f.name not in _MODEL_KNOBS}))


_MODEL_KNOBS = ("vocab", "profile", "certain_frac", "scale", "mean_len", "model_seed")


@functools.lru_cache(maxsize=8)
def _weights(cfg: LMGenerator) -> _World:
    """The weights, with EOS's bias and the margin calibrated on states reached by random text."""
    V, d = cfg.vocab, _D
    g = torch.Generator().manual_seed(1000 + cfg.model_seed)
    E = 0.4 * torch.randn(V, d, generator=g)  # (V, d)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g))
    A = 0.8 * q  # (d, d) contracting: the state forgets
    U = 3 * torch.randn(V, d, generator=g) / math.sqrt(d)  # (V, d)
    b = torch.zeros(V)
    if cfg.profile == "zipf":
        b = -1.1 * torch.log1p(torch.randperm(V, generator=g).float())  # p ~ rank^-1.1 before the state's part
    succ = torch.randint(1, V, (V,), generator=g)  # (V,) never EOS
    w = torch.randn(d, generator=g)
    w = w / w.norm()
    good = torch.rand(V, generator=g) < 0.15
    good[EOS] = False
    prompts = 0.5 * torch.randn(512, d, generator=g)  # (P, d)

    h = prompts.clone()  # states after a few random tokens: what the calibration below sees
    for _ in range(6):
        h = torch.tanh(h @ A.T + E[torch.randint(1, V, (h.shape[0],), generator=g)])
    z = cfg.scale * h @ U.T + b  # (512, V) logits before the margin
    prev = torch.randint(1, V, (h.shape[0],), generator=g)
    gap = z.logsumexp(-1) - z.gather(-1, succ[prev][:, None])[:, 0]  # (512,) nats the successor is behind
    s = h @ w  # (512,)
    frac = 0.0 if cfg.profile == "flat" else cfg.certain_frac
    if frac > 0:  # margin(h) = relu(m0 + m1 w.h): 5 nats ahead of the rest at the (1 - frac) quantile, then more
        m1 = 6.0 / float(s.std())
        m0 = float(gap.median()) + 5.0 - m1 * float(s.quantile(1 - frac))
    else:
        m1, m0 = 0.0, -1.0
    # EOS ends a branching position with chance about 1 / (mean_len (1 - frac)): about mean_len tokens a response
    p_end = min(0.5, 1.0 / (cfg.mean_len * max(1.0 - frac, 0.05)))
    eos = math.log(p_end / (1 - p_end))
    return _World(E, A, U, b, succ, w, m0, m1, eos, good, prompts)


# ---------------------------------------------------------------------------------------------------------
# one decoding step's logits, for the trainer (fp32) and the sampler (its dtype)


def _exact(x: torch.Tensor) -> torch.Tensor:
    return x


def _rounding(dt: torch.dtype):
    """x -> x rounded to dt (kept in fp32): what a low-precision kernel writes out. Matrix products accumulate in
    fp32 and round their output, as GPU bf16 / fp16 GEMMs do (and CPU bf16 kernels are 50x slower)."""
    return lambda x: x.to(dt).float()


def _logits(w: _World, cfg: LMGenerator, h: torch.Tensor, prev: torch.Tensor, U: torch.Tensor,
            b: torch.Tensor, rnd=_exact) -> torch.Tensor:
    """(B, d) states and (B,) previous tokens -> (B, V) logits; rnd rounds every intermediate result (the
    sampler's low-precision model: U and b arrive rounded too)."""
    z = rnd(rnd(cfg.scale * rnd(h @ U.T)) + b)  # (B, V)
    z[:, EOS] = rnd(rnd(z[:, 1:].logsumexp(-1)) + w.eos)  # EOS about p_end where nothing is certain
    margin = rnd(torch.relu(w.m0 + w.m1 * rnd(h @ w.w)))  # (B,)
    z = rnd(z.scatter_add(1, w.succ[prev][:, None], margin[:, None]))
    return rnd(z - z.max(-1, keepdim=True).values + cfg.logit_offset)  # the largest logit at logit_offset


def _step_state(w: _World, h: torch.Tensor, y: torch.Tensor, A: torch.Tensor | None = None,
                E: torch.Tensor | None = None, rnd=_exact) -> torch.Tensor:
    A = w.A if A is None else A
    E = w.E if E is None else E
    return rnd(torch.tanh(rnd(rnd(h @ A.T) + E[y])))  # (B, d)


def _sampler_logp(cfg: LMGenerator, z_fp32: torch.Tensor, z_model: torch.Tensor | None,
                  hit: torch.Tensor | None, bug_token: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampler's raw and processed (B, V) log-probs in fp32, and (B,) log of the kept mass."""
    dt = DTYPES[cfg.sampler_dtype]
    if cfg.rounding == "model":
        z = z_model.float()
    elif cfg.rounding == "logits":
        z = z_fp32.to(dt).float()
    else:
        z = z_fp32
    if hit is not None:  # the kernel bug: one token's logit above the largest, where it fires
        z = z.clone()
        z[:, bug_token] = torch.where(hit, z.max(-1).values + 4.0, z[:, bug_token])
    if cfg.rounding == "probs":
        p = z.softmax(-1).to(dt).float()  # (B, V) rounded probabilities
        raw = (p / p.sum(-1, keepdim=True)).log()
    else:
        raw = z.log_softmax(-1)  # (B, V)
    logp = raw if cfg.temperature == 1.0 else (raw / cfg.temperature).log_softmax(-1)
    return (raw, *truncate(logp, cfg.top_k, cfg.top_p))


# ---------------------------------------------------------------------------------------------------------
# rollouts


@dataclass
class _Rollouts:
    tokens: torch.Tensor  # (B, L + 1) prompt marker then the response
    length: torch.Tensor  # (B,) response tokens (EOS included)
    trainer: torch.Tensor  # (B, L) log pi
    entropy: torch.Tensor  # (B, L)
    sampler: torch.Tensor  # (B, L) the reported log mu
    kept: torch.Tensor  # (B, L) log kept mass
    gap: torch.Tensor  # (B, L) E_q[-log pi] - H(pi)
    kl: torch.Tensor  # (B, L) KL(q || pi)
    bugged: torch.Tensor  # (B, L) bool
    head: tuple | None = None  # the sampler's top-k head: ids (B, L, K), its reported log q, the trainer's log p


def _decode(w: _World, cfg: LMGenerator, prompt: torch.Tensor, g: torch.Generator, U: torch.Tensor,
            b: torch.Tensor, sampler: bool = True) -> _Rollouts:
    """Sample B rollouts (prompt: (B,) prompt ids) by the faulty sampler (or, sampler=False, by the trainer's own
    fp32 policy with weights U, b and no fault), scoring every token by the fp32 trainer with weights U, b."""
    B, L = prompt.shape[0], cfg.max_len
    dt = DTYPES[cfg.sampler_dtype]
    h = w.prompts[prompt]  # (B, d) fp32 trainer state
    model = sampler and cfg.rounding == "model"  # the sampler runs its own low-precision copy of the model
    rnd = _rounding(dt) if model else _exact
    hs = rnd(h) if model else None  # its state drifts from the trainer's
    Us, bs, As, Es = (rnd(w.U), rnd(w.b), rnd(w.A), rnd(w.E)) if model else (None,) * 4
    prev = torch.full((B,), EOS, dtype=torch.int64)  # the prompt marker: EOS starts a document
    tokens = torch.full((B, L + 1), EOS, dtype=torch.int64)
    out = {k: torch.zeros(B, L) for k in ("trainer", "entropy", "sampler", "kept", "gap", "kl")}
    bugged = torch.zeros(B, L, dtype=torch.bool)
    finished = torch.zeros(B, dtype=torch.bool)
    length = torch.full((B,), L, dtype=torch.int64)
    bug_token = int(w.succ[1])  # a fixed, ordinary token
    k = min(cfg.head_k, cfg.vocab) if sampler else 0
    head = (torch.full((B, L, k), -1, dtype=torch.int64), torch.zeros(B, L, k), torch.zeros(B, L, k))
    for t in range(L):  # one decoding step for every rollout at once
        z = _logits(w, cfg, h, prev, U, b)  # (B, V) the trainer's logits (fp32)
        logpi = z.log_softmax(-1)
        if sampler:
            zs = _logits(w, cfg, hs, prev, Us, bs, rnd) if model else None
            # the sampler's own fp32 logits are the trainer's only without lag; with lag, the stale weights
            z0 = z if U is w.U else _logits(w, cfg, h, prev, w.U, w.b)
            hit = torch.rand(B, generator=g) < cfg.bug_rate if cfg.bug_rate > 0 else None
            raw, logq, kept = _sampler_logp(cfg, z0, zs, hit, bug_token)  # (B, V), (B, V), (B,)
        else:
            raw = logq = logpi
            kept, hit = torch.zeros(B), None
        q = logq.exp()
        y = _draw(q, g)  # (B,)
        y = torch.where(finished, EOS, y)
        tokens[:, t + 1] = y
        pi = logpi.exp()
        H = -(pi * logpi).sum(-1)  # (B,)
        cross = -(q * logpi.clamp(min=-1e4)).sum(-1)  # (B,) E_q[-log pi]
        out["trainer"][:, t] = logpi.gather(-1, y[:, None])[:, 0]
        out["entropy"][:, t] = H
        out["sampler"][:, t] = (logq if cfg.report == "processed" else raw).gather(-1, y[:, None])[:, 0]
        if k:  # the head of the distribution the sampler reports, with the trainer's log-probs of it
            head[0][:, t], head[1][:, t], head[2][:, t] = top_k_head(
                logq if cfg.report == "processed" else raw, logpi, k)
        out["kept"][:, t] = kept
        out["gap"][:, t] = cross - H
        out["kl"][:, t] = (q * (logq - logpi)).nan_to_num().sum(-1)  # 0 log 0 = 0 on dropped tokens
        if hit is not None:
            bugged[:, t] = hit & (y == bug_token)
        newly = ~finished & (y == EOS)
        length = torch.where(newly, t + 1, length)
        finished |= newly
        if bool(finished.all()):
            break
        h = _step_state(w, h, y)
        if model:
            hs = _step_state(w, hs, y, As, Es, rnd)
        prev = y
    return _Rollouts(tokens, length, out["trainer"], out["entropy"], out["sampler"], out["kept"], out["gap"],
                     out["kl"], bugged, head if k else None)


def _draw(q: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """(B, V) probabilities -> (B,) one token each, by the inverse CDF (torch.multinomial is 10x slower on 32k
    tokens); a token of probability 0 is never drawn."""
    cdf = q.double().cumsum(-1)  # (B, V)
    u = (1.0 - torch.rand(q.shape[0], 1, generator=g, dtype=torch.float64)) * cdf[:, -1:]  # (B, 1) in (0, total]
    return torch.searchsorted(cdf, u)[:, 0].clamp(max=q.shape[1] - 1)


def _reward(w: _World, r: _Rollouts) -> torch.Tensor:
    """(B,) the share of good tokens in each response."""
    L = r.trainer.shape[1]
    mask = torch.arange(L)[None, :] < r.length[:, None]  # (B, L)
    good = w.good[r.tokens[:, 1:]] & mask
    return good.sum(-1).double() / r.length.clamp(min=1)


def _grpo(reward: torch.Tensor, group_size: int) -> torch.Tensor:
    mean = reward.view(-1, group_size).mean(-1).repeat_interleave(group_size)  # (B,)
    return reward - mean


def _lagged_weights(w: _World, cfg: LMGenerator, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The trainer's (U, b): lag_steps policy-gradient steps on the GRPO objective sum_j A_j sum_t log pi(y_t),
    each from a fresh batch of the trainer's own rollouts, each sized so the policy moves by lag_kl per token
    (KL(before || after) on that batch: a trust-region step). Only U and b move: the state h does not depend
    on them, so the gradient is exact in closed form. The steps of a (config, seed) are one sequence from one
    random stream, so the weights after k steps are kept and a longer lag continues from them."""
    path = _lag_path(cfg.replace(lag_steps=0), seed)  # [(U, b) after 0, 1, ... steps]
    while len(path) <= cfg.lag_steps:
        path.append(_lag_step(w, cfg, *path[-1]))
    return path[cfg.lag_steps][:2]


@functools.lru_cache(maxsize=8)
def _lag_path(cfg: LMGenerator, seed: int) -> list:
    """The trajectory of a (config without lag, seed): (U, b, the random stream after that step) per step."""
    w = _world(cfg)
    return [(w.U, w.b, torch.Generator().manual_seed(10_000 + seed))]


def _lag_step(w: _World, cfg: LMGenerator, U: torch.Tensor, b: torch.Tensor, g: torch.Generator):
    """One trust-region policy-gradient step from (U, b), drawing its rollouts from a copy of the stream g."""
    g = torch.Generator().set_state(g.get_state())
    P = w.prompts.shape[0]
    prompt = torch.randint(P, (cfg.n_prompts,), generator=g).repeat_interleave(cfg.group_size)
    r = _decode(w, cfg, prompt, g, U, b, sampler=False)
    adv = _grpo(_reward(w, r), cfg.group_size).float()  # (B,)
    gU, gb = _replay(w, cfg, r, prompt, U, b, adv=adv)
    trial = 1e-2 / max(float(torch.cat([gU.flatten(), gb]).norm()), 1e-30)
    kl = float(_replay(w, cfg, r, prompt, U, b, step=(trial * gU, trial * gb)))  # KL is about c * eta^2
    eta = trial * math.sqrt(cfg.lag_kl / kl) if kl > 0 else 0.0
    return U + eta * gU, b + eta * gb, g


def _replay(w: _World, cfg: LMGenerator, r: _Rollouts, prompt: torch.Tensor, U: torch.Tensor, b: torch.Tensor,
            adv: torch.Tensor | None = None, step: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Replay the fp32 states of rollouts r position by position (the recurrence of decoding) and return
    either the policy gradient d/d(U, b) of sum_j adv_j sum_t log pi(y_t) ((onehot - pi) adv at every loss
    token; times scale h for U), or, with step = (dU, db), the mean over loss tokens of KL(pi_(U, b) ||
    pi_(U + dU, b + db))."""
    B, L = r.trainer.shape
    gU, gb, kl = torch.zeros_like(U), torch.zeros_like(b), torch.zeros(())
    h = w.prompts[prompt]
    prev = torch.full((B,), EOS, dtype=torch.int64)
    for t in range(int(r.length.max())):
        live = (t < r.length).float()  # (B,) position t is a loss token
        logpi = _logits(w, cfg, h, prev, U, b).log_softmax(-1)  # (B, V)
        y = r.tokens[:, t + 1]
        if step is None:
            resid = -logpi.exp() * (live * adv)[:, None]  # (B, V)
            resid.scatter_add_(1, y[:, None], (live * adv)[:, None])
            gb += resid.sum(0)
            gU += cfg.scale * resid.T @ h
        else:
            after = _logits(w, cfg, h, prev, U + step[0], b + step[1]).log_softmax(-1)
            kl = kl + (live * (logpi.exp() * (logpi - after)).sum(-1)).sum()
        h, prev = _step_state(w, h, y), y
    return (gU, gb) if step is None else kl / r.length.sum()


@contextlib.contextmanager
def one_thread():
    """One intra-op thread while decoding: a step's (B, V) operations are too small to split, and on a busy
    machine OpenMP's waiting threads make them 10-20x slower (measured on 2 shared cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@functools.lru_cache(maxsize=64)
def _cached(cfg: LMGenerator, seed: int) -> Batch:
    with one_thread():
        return _generate(cfg, seed)


def _generate(cfg: LMGenerator, seed: int) -> Batch:
    w = _world(cfg)
    U, b = _lagged_weights(w, cfg, seed) if cfg.lag_steps else (w.U, w.b)
    g = torch.Generator().manual_seed(seed)
    B = cfg.n_prompts * cfg.group_size
    prompt = torch.randint(w.prompts.shape[0], (cfg.n_prompts,), generator=g).repeat_interleave(cfg.group_size)
    r = _decode(w, cfg, prompt, g, U, b)
    T = int(r.length.max())
    mask = torch.arange(T)[None, :] < r.length[:, None]  # (B, T) the response, EOS included
    inference = r.sampler[:, :T]
    if cfg.shift:  # position t reports the sampler's log-prob of position t - shift
        inference = torch.roll(inference, cfg.shift, dims=1)
    reward = _reward(w, r)
    absurd = r.bugged[:, :T] & mask & (r.trainer[:, :T] < math.log(0.05))
    zero = torch.zeros(())

    def per_rollout(x):
        return torch.where(mask, x[:, :T], zero).sum(-1).tolist()

    batch = Batch(
        trainer_logprobs=torch.where(mask, r.trainer[:, :T], zero),
        inference_logprobs=torch.where(mask, inference, zero),
        advantages=_grpo(reward, cfg.group_size).float(),
        loss_mask=mask,
        metadata={"group_id": (torch.arange(B) // cfg.group_size).tolist(), "reward": reward.tolist(),
                  "length": r.length.tolist(), "kept_log_mass": per_rollout(r.kept),
                  "entropy_gap": per_rollout(r.gap), "kl": per_rollout(r.kl),
                  "bug_tokens": absurd.sum(-1).tolist()},
        extras={"entropy": r.entropy[:, :T], "token_ids": r.tokens[:, 1:T + 1]},
        **head_fields(None if r.head is None else tuple(x[:, :T] for x in r.head), mask, None, torch.float32,
                      whole_support=0 < cfg.top_k <= cfg.head_k and cfg.top_p >= 1.0 and cfg.report == "processed"),
    )
    if cfg.shift and batch.has_head:  # the head arrives as late as the log-probs
        batch = Batch(batch.trainer_logprobs, batch.inference_logprobs, batch.advantages, mask, batch.metadata,
                      batch.extras, **shifted_head(batch, cfg.shift))
    return batch
