"""The batch size at which `diagnose` finds each sampler fault 90% of the time under bf16 rounding, and the false-alarm
rate beside it (docs/diagnose.md, "Under bf16 rounding"; issue 45).

Two generators the detectors were not tuned on: the project's own `lm_byte256` (seqis.samplers.generators: a
recurrent LM, bf16 logits) and `random_next_token` (seqis.samplers.random_next_token: random next-token models with
LLM-like peaked distributions, 50-400 tokens per rollout, a vocabulary of 256, bf16 logits). For each fault and seed
one batch of the largest size is drawn and diagnosed on its first R rollouts for each R in SIZES (nested subsets). A
fault is found when `diagnose(batch)` (the trainer's entropy dropped: the common dump) names its kind; the smallest R
found in 90% of the seeds is reported with its median loss tokens. False alarms: clean bf16 batches at each size (any
sampler-side kind), and, cheaply over many seeds, clean bf16 / fp16 / fp32 / fp8-like samplers with and without the
entropy.

    PYTHONPATH=. python scripts/measure_power_bf16.py --seeds 3 --clean-seeds 20     # prints markdown tables
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from seqis import Batch, diagnose
from seqis.samplers.generators import make
from seqis.samplers.random_next_token import RandomNextToken

SIZES = (4, 8, 16, 32, 64, 96, 200, 400)  # from 4: over 1-2 rollouts a clustered se has no spread to read
FAULTS = {  # name -> (kind found, generator knobs): each kind from strong to where it gets hard (a temperature within
    # 2% of 1 and a deficit under 1e-4 are never reported: MIN_TEMPERATURE_SHIFT, MIN_DEFICIT)
    "temperature 0.7": ("temperature_mismatch", {"temperature": 0.7}),
    "temperature 0.9": ("temperature_mismatch", {"temperature": 0.9}),
    "temperature 0.95": ("temperature_mismatch", {"temperature": 0.95}),
    "temperature 0.98": ("temperature_mismatch", {"temperature": 0.98}),
    "temperature 1.02": ("temperature_mismatch", {"temperature": 1.02}),
    "temperature 1.05": ("temperature_mismatch", {"temperature": 1.05}),
    "temperature 1.1": ("temperature_mismatch", {"temperature": 1.1}),
    "temperature 1.3": ("temperature_mismatch", {"temperature": 1.3}),
    "top-p 0.9": ("sampler_truncation", {"top_p": 0.9}),
    "top-p 0.95": ("sampler_truncation", {"top_p": 0.95}),
    "top-p 0.99": ("sampler_truncation", {"top_p": 0.99}),
    "top-p 0.999": ("sampler_truncation", {"top_p": 0.999}),
    "top-k 64": ("sampler_truncation", {"top_k": 64}),
    "top-k 128": ("sampler_truncation", {"top_k": 128}),
    "top-k 200": ("sampler_truncation", {"top_k": 200}),
}
SAMPLER_SIDE = {"temperature_mismatch", "sampler_truncation", "raw_logprobs", "token_misalignment"}


def draw(generator: str, seed: int, n: int, **knobs) -> Batch:
    """n rollouts of the generator under bf16 rounding, without the trainer's entropy."""
    if generator == "lm_byte256":
        b = make("lm_byte256", seed=seed, n_prompts=n // 8, **knobs)
    else:
        b = RandomNextToken(vocab=256, n_rollouts=n, **knobs).make(seed)
    return Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask, b.metadata, {})


def found_at_sizes(b: Batch, kind: str, sizes=SIZES) -> list[tuple[bool, int]]:
    """(found, loss tokens) on the first R rollouts, for each R in sizes."""
    out = []
    for r in sizes:
        sub = b.select(list(range(r)))
        out.append((any(f.kind == kind for f in diagnose(sub)), int(sub.loss_mask.sum())))
    return out


def any_alarm(b: Batch) -> bool:
    return any(f.kind in SAMPLER_SIDE for f in diagnose(b))


def found_90(sizes, rates, tokens) -> tuple[int, int] | None:
    """(rollouts, median tokens) of the smallest size from which every larger size is found in >= 90% of the seeds
    (one rollout can be found by chance where two are not: a single cluster has no spread), None if none."""
    at = None
    for i in reversed(range(len(sizes))):
        if rates[i] < 0.9:
            break
        at = (sizes[i], int(tokens[i]))
    return at


def power_table(generator: str, seeds: int, sizes=SIZES, faults=FAULTS) -> list[str]:
    """The markdown rows: per fault the smallest size from which it is found in >= 90% of the seeds (rollouts, median
    loss tokens), the rate at every size, and the false alarms of as many clean batches of the generator at every
    size; the last row the clean batches' median loss tokens at each size."""
    rows = [f"| fault | found 90% at (rollouts, tokens) | rate at {' / '.join(map(str, sizes))} rollouts "
            "| false alarms (clean) |",
            "|---|---|---|---|"]
    clean = [draw(generator, 100 + s, max(sizes)) for s in range(seeds)]
    alarms = sum(any_alarm(b.select(list(range(r)))) for b in clean for r in sizes)
    for name, (kind, knobs) in faults.items():
        per_seed = [found_at_sizes(draw(generator, s, max(sizes), **knobs), kind, sizes) for s in range(seeds)]
        rates = [sum(ps[i][0] for ps in per_seed) / seeds for i in range(len(sizes))]
        tokens = [statistics.median(ps[i][1] for ps in per_seed) for i in range(len(sizes))]
        at = found_90(sizes, rates, tokens)
        said = f"{at[0]}, {at[1]:,}" if at else f"beyond {sizes[-1]}"
        rows.append(f"| {name} | {said} | {' / '.join(f'{r:.2f}' for r in rates)} | "
                    f"{alarms} of {seeds * len(sizes)} |")
    toks = [statistics.median(int(b.loss_mask[:r].sum()) for b in clean) for r in sizes]
    rows.append(f"| (loss tokens, median) | | {' / '.join(f'{int(t):,}' for t in toks)} | |")
    return rows


def clean_rate(seeds: int) -> list[str]:
    rows = ["| sampler | batches (with / without entropy) | false alarms |", "|---|---:|---:|"]
    for fmt in ("bf16", "fp16", "fp32", "fp8"):
        n = alarms = 0
        for s in range(seeds):
            b = RandomNextToken(vocab=256, n_rollouts=32, max_len=150, sampler_format=fmt).make(1000 + s)
            for batch in (b, Batch(b.trainer_logprobs, b.inference_logprobs, b.advantages, b.loss_mask, b.metadata,
                                   {})):
                n += 1
                alarms += any_alarm(batch)
        rows.append(f"| {fmt} | {n} | {alarms} |")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per fault and generator")
    ap.add_argument("--generators", default="lm_byte256,random_next_token", help="comma-separated")
    ap.add_argument("--max-rollouts", type=int, default=max(SIZES), help="the largest size measured")
    ap.add_argument("--clean-seeds", type=int, default=20, help="seeds per format for the cheap false-alarm rate")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.time()
    sizes = tuple(r for r in SIZES if r <= args.max_rollouts)
    for generator in args.generators.split(","):
        t1 = time.time()
        print(f"\n### {generator} ({args.seeds} seeds per fault)\n")
        print("\n".join(power_table(generator, args.seeds, sizes)), flush=True)
        print(f"\n({time.time() - t1:.0f} s)", flush=True)
    print(f"\n### clean samplers, random_next_token, 32 rollouts ({args.clean_seeds} seeds per format)\n")
    print("\n".join(clean_rate(args.clean_seeds)))
    print(f"\n({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
