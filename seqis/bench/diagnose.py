"""Section `diagnose`: `diagnose` on 256 x 4096 batches, as a ratio to a floor (target: under 1 s on CPU)."""

from __future__ import annotations

from ..diagnosis.causes import diagnose
from ..samplers.scenarios import make_batch
from .timing import floor_pass, paired, ragged_batch, with_catastrophic_tokens

ORDER = 15


def run(device: str, quick: bool) -> None:
    """Three batches: valid-IS noise on ragged lengths, the same with a catastrophic token in every 4th
    rollout, and LLM-like precision noise on full-length rollouts (the most loss tokens)."""
    B, T = (64, 1024) if quick else (256, 4096)
    batches = {
        "ragged, valid-IS noise": ragged_batch(B, T, device=device),
        "ragged, catastrophic tokens": with_catastrophic_tokens(ragged_batch(B, T, device=device), every=4),
        "full length, bf16-like noise": make_batch("precision", seed=0, n_rollouts=B, lengths="fixed", max_len=T,
                                                   device=device),
    }
    print(f"\n## diagnose: {B} x {T} fp32, {device}")
    print("floor: torch.where(mask, t - i, 0).sum(-1), measured alternately; x floor is the median of per-block "
          "ratios\n")
    print("| batch | loss tokens | findings | median ms | floor ms | x floor |")
    print("|---|---:|---|---:|---:|---:|")
    for label, batch in batches.items():
        kinds = ", ".join(f"{f.kind} ({f.severity})" for f in diagnose(batch))
        med, floor, ratio = paired(lambda b=batch: diagnose(b), lambda b=batch: floor_pass(b), rounds=5,
                                   device=device)
        print(f"| {label} | {int(batch.loss_mask.sum()):,} | {kinds} | {med * 1e3:.0f} | {floor * 1e3:.1f} | "
              f"{ratio:.0f} |")
