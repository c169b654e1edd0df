"""Make the example batches in assets/ (each under 5 MB); assets/README.md says what each one shows.

    .venv/bin/python scripts/make_assets.py             # all of them (about two minutes on 2 CPU cores)
    .venv/bin/python scripts/make_assets.py --only gaussian catastrophic

Everything is seeded: running it again writes the same batches (the tiny transformer's training is
deterministic on the CPU for a fixed thread count; the script pins 2 threads). The tiny transformer's batches
use its shipped weights (assets/models/tiny_lm_seed0.safetensors); `--only tiny_lm_weights` retrains them
(four minutes on a busy 2-core machine).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from seqis import Batch, diagnostics
from seqis.io import ASSETS_DIR, VERL_NAMES, load_batch, save_batch
from seqis.samplers.scenarios import make_batch


def precision_tiny_lm() -> tuple[Batch, dict]:
    """Genuine bf16-vs-fp32 mismatch: the tiny transformer samples in bf16 and is rescored in fp32."""
    return make_batch("tiny_lm", seed=0), {}


def tiny_lm_fault(**fault):
    """The tiny transformer (its shipped weights) sampled through one sampler fault (seqis.samplers.faults)."""
    return lambda: (make_batch("tiny_lm", seed=0, **fault), {})


def one_env_temperature() -> tuple[Batch, dict]:
    """Three environments, only math's sampler at temperature 0.7 (4 prompts x 8 rollouts, seed 0); code and chat
    clean (12 prompts, seed 1): the whole batch reads as precision noise, `diagnose`'s scan names env = math."""
    from seqis.runs.run import concat

    hot = make_batch("tiny_lm", seed=0, n_prompts=4, temperature=0.7)  # (32, T)
    rest = make_batch("tiny_lm", seed=1, n_prompts=12)  # (96, T)
    rest.metadata["group_id"] = [g + 4 for g in rest.metadata["group_id"]]
    b = concat([hot, rest])
    b.metadata["env"] = ["math"] * 32 + [("code", "chat")[(g - 4) % 2] for g in rest.metadata["group_id"]]
    return b, {}


def tiny_lm_weights(out: Path) -> None:
    """The tiny transformer's weights (assets/models/): `train(TinyLMConfig(), seed=0)` on 2 CPU threads."""
    from safetensors.torch import save_file

    from seqis.samplers.tiny_lm import WEIGHTS, TinyLMConfig, train

    t = time.perf_counter()
    lm, _ = train(TinyLMConfig(), seed=0)
    path = out / WEIGHTS.relative_to(ASSETS_DIR)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in lm.state_dict().items()}, str(path))
    print(f"{path.name}: trained in {time.perf_counter() - t:.0f} s, {path.stat().st_size / 2**20:.2f} MB")


def gaussian() -> tuple[Batch, dict]:
    return make_batch("gaussian", seed=0, s=0.05), {}


def catastrophic() -> tuple[Batch, dict]:
    return make_batch("catastrophic", seed=0, n_rollouts=64, max_len=512, cat_frac=2e-3), {}


def policy_lag_verl() -> tuple[Batch, dict]:
    b = make_batch("policy_lag", seed=0, lag=8, n_rollouts=128, max_len=512)
    per_token = torch.where(b.loss_mask, b.advantages[:, None], 0.0)  # (B, T): verl stores token-level advantages
    return Batch(b.trainer_logprobs, b.inference_logprobs, per_token, b.loss_mask, b.metadata), dict(
        columns=VERL_NAMES, compress=True)


def long_context_prime_rl() -> tuple[Batch, dict]:
    b = make_batch("precision", seed=0, preset="bf16", n_rollouts=8, group_size=4, lengths="fixed", max_len=16384,
                   head_k=0)  # a packed layout carries no head
    return b, dict(layout="packed", split_by="position_ids")


ASSETS = {  # name -> (file, maker)
    "precision_tiny_lm": ("precision_tiny_lm_bf16.parquet", precision_tiny_lm),
    "gaussian": ("gaussian_s0.05.parquet", gaussian),
    "catastrophic": ("catastrophic.jsonl", catastrophic),
    "policy_lag": ("policy_lag_k8_verl.npz", policy_lag_verl),
    "long_context": ("long_context_16k_prime_rl.safetensors", long_context_prime_rl),
    # the tiny transformer's sampler faults, the truth in the metadata (kept_log_mass, bug_tokens)
    "tiny_lm_top_p": ("tiny_lm_top_p0.9.parquet", tiny_lm_fault(top_p=0.9)),
    "tiny_lm_top_k": ("tiny_lm_top_k20.parquet", tiny_lm_fault(top_k=20)),
    "tiny_lm_temperature": ("tiny_lm_temperature0.7.parquet", tiny_lm_fault(temperature=0.7)),
    "tiny_lm_off_by_one": ("tiny_lm_off_by_one.parquet", tiny_lm_fault(shift=1)),
    "tiny_lm_kernel_bug": ("tiny_lm_kernel_bug.parquet", tiny_lm_fault(bug_rate=0.005)),
    "tiny_lm_fp16": ("tiny_lm_fp16.parquet", tiny_lm_fault(sampler_dtype="fp16")),
    # only one environment's sampler is faulty: what diagnose's scan of the metadata columns finds (issue 43)
    "tiny_lm_math_temperature": ("tiny_lm_math_temperature0.7.parquet", one_env_temperature),
}


def prime_rl_run(out: Path) -> None:
    """A small prime-rl token export run with an incident: assets/runs/prime_rl_example (the Run page's
    example). Written as prime-rl writes it; scanned once to print what it shows."""
    import shutil

    from seqis.runs import incidents, scan
    from seqis.runs.example import write_prime_rl_run

    root = out / RUN_DIR
    shutil.rmtree(root, ignore_errors=True)
    write_prime_rl_run(root / "token_exports", **EXAMPLE_RUN)
    size = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    df = scan(root, by="env_name", workers=1)
    top = incidents(df).iloc[0]
    print(f"{RUN_DIR}: {len(df['step'].unique())} steps, {size / 2**10:.0f} KB; worst: step {top['step']}, "
          f"{top['group']}, kl_k3 {top['kl_k3']:.3g}")


RUN_DIR = "runs/prime_rl_example"
EXAMPLE_RUN = dict(steps=8, ranks=2, rollouts_per_rank=6, envs=("math", "code", "chat"), max_len=20, prompt_len=4,
                   incident=(5, "code"), schema="weights", seed=0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="+", choices=[*ASSETS, "prime_rl_run", "tiny_lm_weights"],
                    help="make only these")
    ap.add_argument("--out", type=Path, default=ASSETS_DIR)
    args = ap.parse_args()
    torch.set_num_threads(2)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only is not None and "tiny_lm_weights" in args.only:  # minutes: only when asked for by name
        tiny_lm_weights(args.out)
    if args.only is None or "prime_rl_run" in args.only:
        prime_rl_run(args.out)
    for name in args.only or ASSETS:
        if name not in ASSETS:
            continue
        file, maker = ASSETS[name]
        batch, options = maker()
        path = args.out / file
        save_batch(batch, path, **options)
        back = load_batch(path)
        d = diagnostics(back)
        print(f"{file}: {back.shape[0]} x {back.shape[1]}, {d['n_tokens']} loss tokens, "
              f"{path.stat().st_size / 2**20:.2f} MB, kl_k3 {d['kl_k3']:.2e}, |l| p99 {d['abs_log_ratio_p99']:.3g}, "
              f"max {d['abs_log_ratio_max']:.3g}")


if __name__ == "__main__":
    main()
