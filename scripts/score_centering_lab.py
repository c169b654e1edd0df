"""Regenerate docs/score-centering.md's tables: the drift under a constant reward, training along exact expected
gradients under a biased and a lagging sampler, and the gradient's error by head size (Marin's table).

    PYTHONPATH=. python scripts/score_centering_lab.py          # prints the three tables as markdown (~2 minutes)

Everything is exact (sums over counts on the bit chain, whole-vocabulary sums on the generator) and seeded: the
same tables come out on any machine, to the digits printed.
"""

from __future__ import annotations

import time

import torch

from seqis.lab.centering import CORRECTIONS, drift_path, sc_drift, sc_training
from seqis.lab.head_lm import SC, TIS_SC, HeadLM, head_error_table


def markdown(df, floats: str = "{:.4g}") -> str:
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in df.itertuples(index=False):
        cells = [("-" if v is None or v != v else floats.format(v)) if isinstance(v, float) or v is None else str(v)
                 for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(1)  # a shared machine: one thread is faster than two fighting for a core
    start = time.perf_counter()
    drift = sc_drift(CORRECTIONS, p=[0.3, 0.3, 0.3, 0.5, 0.9], q=[0.1, 0.4, 0.9, 0.2, 0.6], horizon=8)
    table = drift.pivot_table(index=["p", "q"], columns="correction", values="drift", sort=False).reset_index()
    print("## drift under a constant reward (r = 1, H = 8, per position)\n")
    print(markdown(table[["p", "q", *CORRECTIONS]]))
    path = drift_path(p0=0.5, logit_bias=-1.0, steps=100, lr=1.0)
    path = path[path.step.isin([0, 10, 50, 100])].pivot(index="step", columns="correction", values="p").reset_index()
    print("\n## P(1) under a constant reward, b = -1, lr 1\n")
    print(markdown(path[["step", *CORRECTIONS]]))
    print("\n## training along exact expected gradients (H = 32, k = 21, p0 = 0.5, lr 10, 300 updates)\n")
    print(markdown(sc_training()))
    for name, corr in (("SC (f = 1)", SC), ("SC + TIS (cap 2)", TIS_SC)):
        print(f"\n## head size: {name}, V = 1024, 32 x 32 tokens, logit noise sd 0.016, seeds 0-1\n")
        print(markdown(head_error_table(HeadLM(), correction=corr, seeds=(0, 1))))
    print(f"\n({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
