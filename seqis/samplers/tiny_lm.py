"""A real source of trainer/sampler mismatch: a tiny causal transformer sampled in bf16, rescored in fp32.

Synthetic scenarios draw the log-ratio from a formula. This module makes it the way an RL stack does: the
same weights run twice, once by the "inference engine" (a bf16 copy, decoding token by token with a KV
cache) and once by the "trainer" (fp32, one teacher-forced pass over the whole rollout). The two passes
round differently, so log pi(y_t) - log mu(y_t) is genuine precision mismatch, largest on the tokens
where the model is unsure.

The model (0.37M parameters at the defaults) is trained for a minute on a synthetic language whose
distributions are peaked like an LLM's:
- W words, each a fixed run of 2-8 tokens with a unique first token: once a word has started, its
  remaining tokens are certain (after training, log-probs around -1e-3 .. -1e-2);
- after a word, the next word is drawn from a Zipf distribution over a per-word random order of the words
  (exponent 1.1), or the document ends (EOS, probability p_end): these are the branching tokens, with
  sampled log-probs from about -1 to -8.
Rollouts are GRPO groups: a prompt is BOS and the first token of a word (shared by the G rollouts of a
group); the response runs until EOS or max_len; reward = 1 if the response contains the word after the
prompt's word (in word order), so longer responses succeed more often.

    lm, lang = train(TinyLMConfig(), seed=0)            # ~1 minute on 2 CPU cores
    lm, lang = pretrained()                             # the same model, from assets/models/, in milliseconds
    batch = rollouts(lm, lang, n_prompts=16, group_size=8, seed=0)
    faulty = rollouts(lm, lang, sampling=Sampling(top_p=0.9))   # a sampler fault (seqis.samplers.faults)

Everything is seeded through explicit torch.Generators (initialisation, data, sampling).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..core.types import Batch
from .heads import HEAD_K, head_fields, top_k_head


@dataclass(frozen=True)
class TinyLMConfig:
    n_tokens: int = 64  # content tokens; EOS and BOS come after them
    n_words: int = 48  # words of the synthetic language (at most n_tokens: first tokens are unique)
    word_len: tuple[int, int] = (2, 8)  # shortest and longest word, in tokens
    zipf: float = 1.1  # exponent of the next-word distribution
    p_end: float = 0.05  # chance that a document ends after a word
    max_len: int = 256  # positions the model knows; the longest prompt + response
    d_model: int = 96
    n_layer: int = 3
    n_head: int = 4
    steps: int = 300  # training steps (about a minute on 2 cores)
    batch_size: int = 16  # sequences of max_len tokens per step
    lr: float = 8e-3

    @property
    def vocab(self) -> int:
        return self.n_tokens + 2

    @property
    def eos(self) -> int:
        return self.n_tokens

    @property
    def bos(self) -> int:
        return self.n_tokens + 1


# ---------------------------------------------------------------------------------------------------------
# the synthetic language


class WordLanguage:
    """Words of fixed tokens, a Zipf next-word chain and EOS; documents are BOS word word ... EOS."""

    def __init__(self, cfg: TinyLMConfig, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        W, L = cfg.n_words, cfg.word_len[1]
        self.cfg = cfg
        self.lengths = torch.randint(cfg.word_len[0], cfg.word_len[1] + 1, (W,), generator=g)  # (W,)
        self.table = torch.randint(cfg.n_tokens, (W, L), generator=g)  # (W, L) tokens of each word
        self.table[:, 0] = torch.randperm(cfg.n_tokens, generator=g)[:W]  # unique first tokens
        zipf = torch.arange(1, W + 1, dtype=torch.float64) ** -cfg.zipf  # (W,)
        order = torch.rand(W, W, generator=g).argsort(-1)  # (W, W) a random ranking per word
        self.next_word = (zipf / zipf.sum())[order.argsort(-1)]  # (W, W) p(next = v | w)
        self.first_word = zipf[torch.randperm(W, generator=g)] / zipf.sum()  # (W,)
        self.word_of_first_token = torch.full((cfg.n_tokens,), -1, dtype=torch.int64)
        self.word_of_first_token[self.table[:, 0]] = torch.arange(W)

    def stream(self, n: int, length: int, g: torch.Generator) -> torch.Tensor:
        """(n, length) training text: documents back to back, each BOS words EOS."""
        cfg = self.cfg
        out = torch.empty(n, length, dtype=torch.int64)
        phase = torch.zeros(n, dtype=torch.int64)  # 0: BOS next, 1: inside a word, 2: EOS next
        word = torch.zeros(n, dtype=torch.int64)
        k = torch.zeros(n, dtype=torch.int64)  # position inside the word
        for t in range(length):  # one step per token, all sequences at once
            out[:, t] = torch.where(phase == 0, cfg.bos, torch.where(phase == 2, cfg.eos, self.table[word, k]))
            first = torch.multinomial(self.first_word.expand(n, -1), 1, generator=g)[:, 0]  # (n,)
            nxt = torch.multinomial(self.next_word[word], 1, generator=g)[:, 0]  # (n,)
            end = torch.rand(n, generator=g) < cfg.p_end  # (n,)
            done = (phase == 1) & (k + 1 == self.lengths[word])  # (n,) the word ends here
            word = torch.where(phase == 0, first, torch.where(done & ~end, nxt, word))
            k = torch.where((phase == 1) & ~done, k + 1, 0)
            phase = torch.where(phase == 0, 1, torch.where(phase == 2, 0, torch.where(done & end, 2, 1)))
        return out


# ---------------------------------------------------------------------------------------------------------
# the model


class Block(nn.Module):
    def __init__(self, d: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cache: list | None = None):
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # (B, T, D) each
        q, k, v = (z.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for z in (q, k, v))  # (B, H, T, d)
        if cache is not None:  # decoding one token: attend to every cached position
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)  # (B, H, t+T, d)
            cache[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or T > 1)  # (B, H, T, d)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, cfg: TinyLMConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg.d_model, cfg.n_head) for _ in range(cfg.n_layer))
        self.ln = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():  # GPT-2 initialisation, from our generator rather than the global one
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    p.zero_()
                elif p.dim() == 1:  # LayerNorm scale
                    p.fill_(1.0)
                else:
                    std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith(("proj.weight", "out.weight")) else 0.02
                    p.copy_(torch.randn(p.shape, generator=g) * std)

    def forward(self, idx: torch.Tensor, caches: list | None = None, start: int = 0) -> torch.Tensor:
        """(B, T) token ids at positions start.. -> (B, T, vocab) logits; caches: one list per block."""
        T = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(start, start + T, device=idx.device))  # (B, T, D)
        for i, block in enumerate(self.blocks):
            x = block(x, None if caches is None else caches[i])
        return self.head(self.ln(x))  # (B, T, V)


def train(cfg: TinyLMConfig = TinyLMConfig(), seed: int = 0, log_every: int = 0) -> tuple[TinyLM, WordLanguage]:
    """Train a TinyLM on its word language (next-token cross-entropy, AdamW, cosine decay)."""
    lang = WordLanguage(cfg, seed)
    model = TinyLM(cfg, seed)
    g = torch.Generator().manual_seed(seed + 1)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0, betas=(0.9, 0.98))
    warm = max(1, cfg.steps // 20)  # linear warm-up, then cosine decay to 0
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * s / cfg.steps)))
    for step in range(cfg.steps):
        x = lang.stream(cfg.batch_size, cfg.max_len + 1, g)  # (N, L + 1)
        logits = model(x[:, :-1])  # (N, L, V)
        loss = F.cross_entropy(logits.reshape(-1, cfg.vocab), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if log_every and (step % log_every == 0 or step == cfg.steps - 1):
            print(f"step {step:4d}  loss {loss.item():.4f}")
    return model.eval(), lang


WEIGHTS = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny_lm_seed0.safetensors"


def pretrained(path: Path = WEIGHTS) -> tuple[TinyLM, WordLanguage]:
    """The model of `train(TinyLMConfig(), seed=0)` (2 CPU threads) from its shipped weights, in
    milliseconds instead of minutes; trains it when the file is missing (scripts/make_assets.py writes it)."""
    cfg = TinyLMConfig()
    if not Path(path).is_file():
        return train(cfg, seed=0)
    from safetensors.torch import load_file

    model = TinyLM(cfg, seed=0)
    model.load_state_dict(load_file(str(path)))
    return model.eval(), WordLanguage(cfg, seed=0)


@dataclass(frozen=True)
class Sampling:
    """What the inference engine does to the logits before it samples (and reports log mu). The trainer
    applies none of it (temperature 1, the full vocabulary), so each setting is a known sampler fault.

    temperature   logits / temperature (applied first, as vLLM does)
    top_k, top_p  keep the k most likely tokens / the smallest set holding top_p of the mass, renormalised:
                  log mu = log p - log(kept mass) on every kept token (0 / 1.0: off)
    bug_token     a kernel bug: at a fraction bug_rate of decoding steps (per rollout), this token's logit is
                  set bug_margin above the largest, so the sampler picks it wherever the trainer finds it absurd
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    bug_token: int = 7
    bug_rate: float = 0.0
    bug_margin: float = 4.0

    def log_probs(self, logits: torch.Tensor, hit: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, V) fp32 logits -> (B, V) log mu and (B,) log of the kept mass (0 without truncation)."""
        if hit is not None:  # the kernel bug, where it fires
            bugged = logits.max(-1).values + self.bug_margin  # (B,)
            logits = logits.clone()
            logits[:, self.bug_token] = torch.where(hit, bugged, logits[:, self.bug_token])
        return truncate((logits / self.temperature).log_softmax(-1), self.top_k, self.top_p)


def truncate(logp: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, V) log-probs -> the top-k / top-p renormalised log-probs (-inf off the kept set) and (B,) log of the
    kept mass (0 without truncation): log mu = log p - log(kept mass) on every kept token."""
    if not top_k and top_p >= 1.0:
        return logp, torch.zeros(logp.shape[0])
    keep = torch.ones_like(logp, dtype=torch.bool)
    if top_k:
        keep &= logp >= logp.topk(top_k, -1).values[:, -1:]
    if top_p < 1.0:  # keep a token while the mass of the more likely ones is below top_p
        srt, idx = logp.sort(-1, descending=True)
        before = srt.exp().cumsum(-1) - srt.exp()  # (B, V) mass ahead of each token
        keep &= torch.zeros_like(keep).scatter(-1, idx, before < top_p)
    kept_mass = logp.masked_fill(~keep, -math.inf).logsumexp(-1)  # (B,)
    return (logp - kept_mass[:, None]).masked_fill(~keep, -math.inf), kept_mass


@torch.no_grad()
def rollouts(model: TinyLM, lang: WordLanguage, *, n_prompts: int = 16, group_size: int = 8, seed: int = 0,
             max_len: int | None = None, sampler_dtype: torch.dtype = torch.bfloat16,
             sampling: Sampling = Sampling(), head_k: int = HEAD_K) -> Batch:
    """GRPO groups sampled by a `sampler_dtype` copy of the model (KV cache, token by token, with `sampling`'s
    temperature, truncation and kernel bug) and rescored by the fp32 model in one pass. Positions: BOS, the
    prompt token, then the response; the loss mask covers the response up to and including EOS.
    Metadata: group_id, reward, length, prompt_word, finished, and the truth about the sampler per rollout:
    kept_log_mass (sum over its loss tokens of log of the mass the sampler kept: the truncation offset) and
    bug_tokens (loss tokens the kernel bug chose where the trainer gives them under 5%). Extras: the trainer's
    entropy and the token ids at each position. The sampler's top-`head_k` head at each position (of the distribution
    it drew from: after temperature and truncation; a truncated-away token leaves its slot empty), with the fp32
    trainer's log-probs of those tokens (seqis.samplers.heads; head_k = 0: none)."""
    cfg = model.cfg
    L = min(max_len or cfg.max_len, cfg.max_len)
    g = torch.Generator().manual_seed(seed)
    B = n_prompts * group_size
    prompt_word = torch.multinomial(lang.first_word, n_prompts, replacement=True, generator=g)  # (n_prompts,)
    prompt_word = prompt_word.repeat_interleave(group_size)  # (B,)
    tokens = torch.full((B, L), cfg.eos, dtype=torch.int64)  # (B, L)
    tokens[:, 0], tokens[:, 1] = cfg.bos, lang.table[prompt_word, 0]
    sampler_logprobs = torch.zeros(B, L)  # (B, L) log mu of each token given its prefix (0 at BOS)

    sampler = copy.deepcopy(model).to(sampler_dtype)
    caches = [[] for _ in sampler.blocks]
    logits = sampler(tokens[:, :2], caches).float()  # (B, 2, V) prefill
    sampler_logprobs[:, 1] = logits[:, 0].log_softmax(-1).gather(-1, tokens[:, 1:2])[:, 0]
    finished = torch.zeros(B, dtype=torch.bool)
    length = torch.full((B,), L, dtype=torch.int64)  # (B,) positions used: prompt + response
    kept_log_mass = torch.zeros(B, L)  # (B, L) log of the mass the sampler kept (truncation)
    bugged = torch.zeros(B, L, dtype=torch.bool)  # (B, L) the kernel bug fired here
    k = min(head_k, cfg.vocab)
    head_ids = torch.full((B, L, k), -1, dtype=torch.int64)  # (B, L, K) the sampler's top-k ids (-1: empty)
    head_q = torch.zeros(B, L, k)  # (B, L, K) their log mu
    for t in range(2, L):  # decode one token per step for every rollout (finished ones idle on EOS)
        hit = torch.rand(B, generator=g) < sampling.bug_rate if sampling.bug_rate > 0 else None  # (B,)
        logp, kept_log_mass[:, t] = sampling.log_probs(logits[:, -1], hit)  # (B, V), (B,)
        y = torch.multinomial(logp.exp(), 1, generator=g)[:, 0]  # (B,)
        head_ids[:, t], head_q[:, t], _ = top_k_head(logp, logp, k)
        y = torch.where(finished, cfg.eos, y)
        tokens[:, t] = y
        sampler_logprobs[:, t] = logp.gather(-1, y[:, None])[:, 0]
        if hit is not None:
            bugged[:, t] = hit & (y == sampling.bug_token)
        newly = ~finished & (y == cfg.eos)
        length = torch.where(newly, t + 1, length)
        finished |= newly
        if bool(finished.all()):
            break
        logits = sampler(y[:, None], caches, start=t).float()  # (B, 1, V)

    trainer_logprobs = torch.zeros(B, L)  # (B, L) log pi from one fp32 teacher-forced pass
    entropy = torch.zeros(B, L)  # (B, L) the trainer's entropy at each position
    logp = model(tokens[:, :-1]).log_softmax(-1)  # (B, L - 1, V)
    trainer_logprobs[:, 1:] = logp.gather(-1, tokens[:, 1:, None])[..., 0]
    entropy[:, 1:] = -(logp.exp() * logp).sum(-1)
    head_p = torch.zeros(B, L, k)  # (B, L, K) the trainer's log pi of the sampler's head
    head_p[:, 1:] = logp.gather(-1, head_ids[:, 1:].clamp(min=0))

    T = int(length.max())
    pos = torch.arange(T)[None, :]  # (1, T)
    loss_mask = (pos >= 2) & (pos < length[:, None])  # (B, T) the response, EOS included
    reward = _contains_word(tokens[:, :T], loss_mask, lang, (prompt_word + 1) % cfg.n_words).double()  # (B,)
    absurd = bugged[:, :T] & loss_mask & (trainer_logprobs[:, :T] < math.log(0.05))  # (B, T)
    group_id = torch.arange(B) // group_size  # (B,)
    mean = reward.view(n_prompts, group_size).mean(-1).repeat_interleave(group_size)  # (B,)
    return Batch(
        trainer_logprobs=trainer_logprobs[:, :T],
        inference_logprobs=sampler_logprobs[:, :T],
        advantages=(reward - mean).float(),
        loss_mask=loss_mask,
        metadata={"group_id": group_id.tolist(), "reward": reward.tolist(), "length": (length - 2).tolist(),
                  "prompt_word": prompt_word.tolist(), "finished": finished.tolist(),
                  "kept_log_mass": torch.where(loss_mask, kept_log_mass[:, :T], 0.0).sum(-1).tolist(),
                  "bug_tokens": absurd.sum(-1).tolist()},
        extras={"entropy": entropy[:, :T], "token_ids": tokens[:, :T]},
        **head_fields((head_ids[:, :T], head_q[:, :T], head_p[:, :T]) if k else None, loss_mask, None, torch.float32,
                      whole_support=0 < sampling.top_k <= k and sampling.top_p >= 1.0),
    )


def _contains_word(tokens, mask, lang: WordLanguage, word) -> torch.Tensor:
    """(B,) bool: the masked part of each row contains every token of `word` (B,) in a row."""
    B, T = tokens.shape
    n = lang.lengths[word]  # (B,)
    width = int(lang.cfg.word_len[1])
    hit = torch.ones(B, T, dtype=torch.bool)  # (B, T) the word starts here (so far)
    for i in range(width):  # compare the word's i-th token at every start, for every row at once
        shifted = torch.full((B, T), -1, dtype=torch.int64)
        shifted[:, : T - i] = tokens[:, i:]
        m = torch.zeros(B, T, dtype=torch.bool)
        m[:, : T - i] = mask[:, i:]
        need = i < n  # (B,)
        ok = (shifted == lang.table[word, i][:, None]) & m
        hit &= torch.where(need[:, None], ok, True)
    return hit.any(-1)
