"""A generated prime-rl token export run: steps x ranks x environments with an incident at one step and
environment, written exactly as prime-rl writes it; the example under assets/, the tests' run, the bench's.

Each (step, rank) file holds `rollouts_per_rank` sequences from `seqis.samplers.scenarios` (gaussian mismatch, s =
0.03), environments taking turns; every record is a prompt (outside the loss mask, trainer log-probs as
the trainer computes them, the first one null as prime-rl writes a non-finite value) followed by the
rollout's tokens. At the incident's step and environment, 5% of the tokens (at least one per rollout) get
a sampler log-prob 6 nats too low: catastrophic tokens, a per-token KL far above the rest of the run.

schema "plain" (June 2026: loss_mask, advantages, rewards), "losses" (per-channel `losses` records: the
last prompt token carries a `ce` channel, so loss_mask, their union, differs from the rl mask; export_step
and run_id) or "weights" (current: rl/ce/ref_kl weight streams, null but for every fourth record, whose
last token has rl weight 0). The fields prime-rl computes itself (mismatch_kl, is_masked, ...) are
written as it computes them (float32 over every token), for realism: readers must ignore them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import torch

from ..core.types import Batch
from ..samplers.scenarios import make_batch
from .run import concat

SCHEMAS = ("plain", "losses", "weights")
INCIDENT_LOG_OFFSET = 6.0  # nats taken off the sampler's log-prob of an incident token


def _floats(x: torch.Tensor) -> list:
    return x.to(torch.float32).tolist()


def _records(batch: Batch, envs: list[str], step: int, rank: int, schema: str, prompt_len: int,
             g: torch.Generator) -> tuple[list[dict], torch.Tensor]:
    """prime-rl records for a batch's rollouts, and the (B, T) mask of rl tokens a reader must find."""
    B, T = batch.shape
    lengths = batch.loss_mask.sum(1).tolist()
    rl = batch.loss_mask.clone()  # (B, T)
    records = []
    for i in range(B):
        n, L = lengths[i], prompt_len + lengths[i]
        trainer = torch.cat([-torch.rand(prompt_len, generator=g) * 4, batch.trainer_logprobs[i, :n]])  # (L,)
        inference = torch.cat([torch.zeros(prompt_len), batch.inference_logprobs[i, :n]])  # (L,)
        mask = [False] * prompt_len + [True] * n
        adv = float(batch.advantages[i])
        log_ratio = (trainer - inference).to(torch.float32)
        prob_delta = trainer.exp() - inference.exp()
        masked = [m and (d > 0.2 if adv > 0 else d < -0.2) for m, d in zip(mask, prob_delta.tolist())]
        trainer_json = _floats(trainer)
        trainer_json[0] = None  # a non-finite value, as prime-rl writes it
        rec = {"schema_version": 1, "step": step}
        if schema == "losses":
            rec["export_step"], rec["run_id"] = step, None
        rec.update({
            "rank": rank, "micro_step": i // 4, "micro_sequence_idx": i % 4, "export_sequence_idx": i,
            "env_name": envs[i], "token_ids": torch.randint(0, 32000, (L,), generator=g).tolist(),
            "position_ids": list(range(L)), "loss_mask": mask, "advantages": [adv] * L,
        })
        if schema == "losses":
            ce = [t == prompt_len - 1 for t in range(L)]
            rec["loss_mask"] = [m or c for m, c in zip(mask, ce)]
            rec["losses"] = [{"rl": {"advantage": adv, "mask": m}} | ({"ce": {"advantage": 0.0, "mask": True}} if c
                                                                       else {}) for m, c in zip(mask, ce)]
        if schema in ("plain", "losses"):
            rec["rewards"] = [float(batch.metadata["reward"][i])] * L
        rec.update({
            "inference_logprobs": _floats(inference), "trainer_logprobs": trainer_json,
            "entropy": _floats(torch.rand(L, generator=g) * 2),
            "mismatch_kl": _floats(log_ratio.exp() - log_ratio - 1), "log_importance_ratio": _floats(log_ratio),
            "importance_ratio": _floats(log_ratio.exp()), "prob_delta": _floats(prob_delta),
            "is_masked": masked, "is_masked_high": masked, "is_masked_low": [False] * L,
        })
        if schema == "weights":
            weights = [None] * L
            if i % 4 == 3:  # an explicit rl stream: the last token is not trained by the rl loss
                weights = [1.0] * (L - 1) + [0.0]
                rl[i, n - 1] = False
            rec.update({"rl_weights": weights, "ce_weights": [None] * L, "ref_kl_weights": [None] * L})
        records.append(rec)
    return records, rl


def write_prime_rl_run(root, *, steps: int = 6, ranks: int | Sequence[int] = 2, rollouts_per_rank: int = 8,
                       envs: Sequence[str] = ("math", "code"), max_len: int = 48, prompt_len: int = 8,
                       incident: tuple[int, str] | None = (3, "code"), schema: str = "weights", seed: int = 0,
                       stable: bool = True) -> dict[int, Batch]:
    """Write `root/step_N/rank_R.jsonl` for N in 0..steps-1 (and STABLE markers), and return each step's
    rollouts as a reader must give them back: ranks in order, loss tokens only (the rl channel's), with
    the metadata env_name, rank and step."""
    if schema not in SCHEMAS:
        raise ValueError(f"schema must be one of {', '.join(SCHEMAS)}, got {schema!r}")
    root = Path(root)
    rank_ids = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
    truth = {}
    for step in range(steps):
        step_dir = root / f"step_{step}"
        step_dir.mkdir(parents=True, exist_ok=True)
        parts = []
        for rank in rank_ids:
            g = torch.Generator().manual_seed(seed * 1_000_003 + step * 1009 + rank)
            b = make_batch("gaussian", seed=int(torch.randint(2**31, (1,), generator=g)), n_rollouts=rollouts_per_rank,
                           lengths="uniform", min_len=4, max_len=max_len, group_size=4, s=0.03,
                           head_k=0)  # the example run's files as before heads (no sampler head saved)
            env = [envs[i % len(envs)] for i in range(rollouts_per_rank)]
            if incident is not None and step == incident[0]:
                hit = torch.tensor([e == incident[1] for e in env])[:, None] & b.loss_mask  # (B, T)
                bad = hit & (torch.rand(b.shape, generator=g) < 0.05)
                bad |= hit & (b.loss_mask.cumsum(1) == 1) & ~bad.any(1, keepdim=True)  # one per rollout at least
                b.inference_logprobs[bad] -= INCIDENT_LOG_OFFSET
            records, rl = _records(b, env, step, rank, schema, prompt_len, g)
            text = "".join(json.dumps(r, separators=(",", ":"), allow_nan=False) + "\n" for r in records)
            (step_dir / f"rank_{rank}.jsonl").write_text(text, encoding="utf-8")
            meta = {"env_name": env, "rank": [rank] * len(env), "step": [step] * len(env)}
            parts.append(Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, rl, meta))
        if stable:
            (step_dir / "STABLE").touch()
        truth[step] = concat(parts)
    return truth
