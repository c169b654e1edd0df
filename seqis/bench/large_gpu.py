"""Section `large-gpu`: a 1e8-token batch on CUDA (skipped on a CPU)."""

from __future__ import annotations

import torch

from ..diagnosis.statistics import diagnostics
from ..estimators import SEED_ESTIMATORS
from .timing import floor_pass, median_time, ragged_batch, step_many

ORDER = 20


def run(device: str, quick: bool) -> None:
    """A 1e8-token batch on CUDA: the four seed estimators and diagnostics."""
    if torch.device(device).type != "cuda":
        return
    B, T = 12_208, 8_192  # 1.0e8 positions
    batch = ragged_batch(B, T, device=device)
    floor = median_time(lambda: floor_pass(batch), device=device, repeats=5)
    t4 = median_time(lambda: step_many(list(SEED_ESTIMATORS), batch), device=device, repeats=5)
    t_diag = median_time(lambda: diagnostics(batch), device=device, repeats=3)
    print(f"\n## 1e8 positions on {torch.cuda.get_device_name()}: {B} x {T}")
    print(f"floor {floor * 1e3:.1f} ms; four seed estimators (fwd+bwd+metrics) {t4 * 1e3:.1f} ms "
          f"({t4 / floor:.1f}x floor); diagnostics {t_diag * 1e3:.1f} ms")
