"""Benchmarks that print ratios, not timed tests: `python -m seqis.bench [--device cuda] [--quick]`.

Each section prints a table of medians and a ratio to a floor measured in the same run, so the numbers
mean something on a busy machine too. Sections: estimators (each alone, and all through run_many),
diagnostics, then any section added to SECTIONS below (the lab, an Explore rerun).
"""

from __future__ import annotations

import argparse
import ctypes
import math
import statistics
import time
from collections.abc import Callable

import torch

from .diagnostics import diagnostics
from .estimators import ESTIMATORS, SEED_ESTIMATORS
from .metrics import run, run_many
from .types import Batch


def median_time(fn: Callable[[], object], *, repeats: int = 7, warmup: int = 2, device=None) -> float:
    """Median wall time of fn() in seconds (synchronising CUDA around each call)."""
    sync = torch.cuda.synchronize if device is not None and torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ragged_batch(B: int, T: int, *, device="cpu", seed: int = 0, s: float = 0.05) -> Batch:
    """A B x T fp32 batch with ragged lengths (uniform in [T/8, T]), valid-IS noise of scale s and
    -inf padding; trainer_logprobs requires grad."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 8, T + 1, (B,), generator=g)  # (B,)
    mask = torch.arange(T)[None, :] < lengths[:, None]  # (B, T)
    inference = -torch.rand(B, T, generator=g).pow(4) * 4  # (B, T) mostly near 0
    noise = torch.randn(B, T, generator=g) * s - s * s / 2
    trainer = torch.where(mask, inference + noise, torch.tensor(-torch.inf))
    adv = torch.randn(B, generator=g)
    return Batch(trainer.to(device).requires_grad_(), inference.to(device), adv.to(device), mask.to(device))


def with_catastrophic_tokens(batch: Batch, every: int) -> Batch:
    """The batch with one token of every `every`-th rollout given ratio e^3 (outside any sane token band)."""
    trainer = batch.trainer_logprobs.detach().clone()
    trainer[::every, 0] = batch.inference_logprobs[::every, 0] + 3.0
    return Batch(trainer.requires_grad_(), batch.inference_logprobs, batch.advantages, batch.loss_mask)


def floor_pass(batch: Batch) -> torch.Tensor:
    """The floor: one masked elementwise pass over the same inputs."""
    t, i = batch.trainer_logprobs.detach(), batch.inference_logprobs
    return torch.where(batch.loss_mask, t - i, 0).sum(-1)


def _step(name: str, batch: Batch):
    out = run(name, batch)
    (grad,) = torch.autograd.grad(out.loss, batch.trainer_logprobs)
    return out.scalars(), grad


def _step_many(names, batch: Batch):
    outs = run_many(names, batch)
    grads = [torch.autograd.grad(o.loss, batch.trainer_logprobs) for o in outs.values()]
    return [o.scalars() for o in outs.values()], grads


def paired(fn: Callable[[], object], floor_fn: Callable[[], object], *, rounds: int = 7, device=None):
    """fn and the floor timed in alternating blocks (each a warm-up call and a median of three), so a busy
    machine slows both alike and each is timed in its steady state. Returns (median fn seconds, median
    floor seconds, median of the per-block ratios): the ratio pairs each fn block with its own floor."""
    t_fn, t_floor = [], []
    for _ in range(rounds):
        t_floor.append(median_time(floor_fn, repeats=3, warmup=1, device=device))
        t_fn.append(median_time(fn, repeats=3, warmup=1, device=device))
    ratio = statistics.median(a / b for a, b in zip(t_fn, t_floor))
    return statistics.median(t_fn), statistics.median(t_floor), ratio


def bench_estimators(device: str, quick: bool) -> dict[str, tuple[float, float, float]]:
    """Each estimator alone, all through run_many, diagnostics: prints the table and returns its rows,
    label -> (median seconds, floor seconds, x floor); the run_many / slowest-single ratio under "run_many"."""
    B, T = (64, 1024) if quick else (256, 4096)
    batch = ragged_batch(B, T, device=device)
    floor_fn = lambda: floor_pass(batch)
    print(f"\n## Estimators: forward + backward + metrics, {B} x {T} fp32, ragged, {device}")
    print("floor: torch.where(mask, t - i, 0).sum(-1), measured alternately with each row; x floor is the "
          "median of per-block ratios\n")
    print("| estimator | median ms | floor ms | x floor |")
    print("|---|---:|---:|---:|")
    rows = {}

    def row(label: str, fn: Callable[[], object]) -> None:
        rows[label] = t, f, x = paired(fn, floor_fn, device=device)
        print(f"| {label} | {t * 1e3:.2f} | {f * 1e3:.2f} | {x:.1f} |")

    for name in ESTIMATORS:
        row(f"{name} (seed)" if name in SEED_ESTIMATORS else name, lambda n=name: _step(n, batch))
    # this batch has no token outside mis_po's token band; a real one may have a catastrophic token in many
    # rollouts, and then mis_po takes its dense form (Correction.kept) instead of the sparse one
    spiked = with_catastrophic_tokens(batch, every=4)
    row("mis_po, a catastrophic token in 1 of 4 rollouts", lambda: _step("mis_po", spiked))
    all_names = list(ESTIMATORS)
    row(f"all {len(all_names)} through run_many", lambda: _step_many(all_names, batch))
    row("four seed estimators through run_many", lambda: _step_many(list(SEED_ESTIMATORS), batch))
    row("diagnostics(batch)", lambda: diagnostics(batch))
    slowest = max(ESTIMATORS, key=lambda n: rows[f"{n} (seed)" if n in SEED_ESTIMATORS else n][0])
    # timed against each other in alternating blocks, like every row against the floor
    rows["run_many"] = paired(lambda: _step_many(all_names, batch), lambda: _step(slowest, batch), device=device)
    print(f"\nall {len(all_names)} through run_many / slowest single ({slowest}): {rows['run_many'][2]:.2f}x "
          f"(target: at most 4x)")
    return rows


def summarise_repeats(runs: list[dict[str, tuple[float, float, float]]]) -> None:
    """The median and range of each row's ratio over repeated runs of the estimators section (on a shared
    machine a whole run's ratios move together: one run is one draw)."""
    print(f"\n## Estimators over {len(runs)} runs: median (min-max) of each run's ratio\n")
    print("| estimator | median ms | x floor | range |")
    print("|---|---:|---:|---:|")
    for label in runs[0]:
        ms = statistics.median(r[label][0] for r in runs) * 1e3
        xs = [r[label][2] for r in runs]
        name = "all through run_many / the slowest single one" if label == "run_many" else label
        print(f"| {name} | {ms:.2f} | {statistics.median(xs):.1f} | {min(xs):.1f}-{max(xs):.1f} |")


def bench_large_gpu(device: str, quick: bool) -> None:
    """A 1e8-token batch on CUDA: the four seed estimators and diagnostics."""
    if torch.device(device).type != "cuda":
        return
    B, T = 12_208, 8_192  # 1.0e8 positions
    batch = ragged_batch(B, T, device=device)
    floor = median_time(lambda: floor_pass(batch), device=device, repeats=5)
    t4 = median_time(lambda: _step_many(list(SEED_ESTIMATORS), batch), device=device, repeats=5)
    t_diag = median_time(lambda: diagnostics(batch), device=device, repeats=3)
    print(f"\n## 1e8 positions on {torch.cuda.get_device_name()}: {B} x {T}")
    print(f"floor {floor * 1e3:.1f} ms; four seed estimators (fwd+bwd+metrics) {t4 * 1e3:.1f} ms "
          f"({t4 / floor:.1f}x floor); diagnostics {t_diag * 1e3:.1f} ms")


def bench_lab(device: str, quick: bool) -> None:
    """The lab: three estimators x 400 batches x 256 rollouts x H = 64 on the bit chain, through
    lab.monte_carlo_many (one draw, shared log-ratios), as rollouts per second and a ratio to merely drawing
    the same random numbers. Always on the CPU (target: <= 3 s on 2 cores); on CUDA also 100x larger."""
    import math

    from .lab import BitChain, monte_carlo_many

    chain = BitChain(64, 40, 0.6, 0.55)
    names = ["seq_is", ("token_tis", ESTIMATORS["token_tis"].config(token_clip=math.inf)), "seq_tis"]
    B, H = 256, 64
    runs = [("cpu", 40 if quick else 400, 64 << 20)]
    if torch.device(device).type == "cuda":
        runs += [(device, 400, 1 << 30), (device, 4_000 if quick else 40_000, 4 << 30)]
    print(f"\n## Lab: {len(names)} estimators (seq_is, token IS, seq_tis) on BitChain(H={H}), batches of {B}")
    print("floor: torch.rand of the same rollouts' uniforms (float64), measured alternately\n")
    print("| device | batches | rollouts | seconds | rollouts/s | RNG ms | x RNG |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for dev, n_batches, budget in runs:
        N = n_batches * B
        gen = torch.Generator(device=dev).manual_seed(0)
        draw = lambda N=N, dev=dev, gen=gen: torch.rand(N, H, generator=gen, device=dev, dtype=torch.float64)
        mc = lambda n_batches=n_batches, dev=dev, budget=budget: monte_carlo_many(
            chain, names, batch_size=B, n_batches=n_batches, seed=0, device=dev, memory_budget=budget)
        t, f, x = paired(mc, draw, rounds=3 if n_batches > 400 else 5, device=dev)
        print(f"| {dev} | {n_batches:,} | {N:,} | {t:.3f} | {N / t:,.0f} | {f * 1e3:.2f} | {x:.1f} |")


def bench_explore(device: str, quick: bool) -> None:
    """The explorer's Explore page through Streamlit's AppTest: the four seed estimators on a 256 x 4096
    synthetic batch, the wall time of a rerun after moving one slider (seq_tis's seq_clip to a value not
    seen before, so that estimator really recomputes), against a rerun where nothing changed. Target: a
    median of at most 300 ms on 2 CPU cores. Runs on the CPU or CUDA, whichever the app picks."""
    try:
        from streamlit.testing.v1 import AppTest
    except ImportError:
        print("\n## Explore rerun: skipped (streamlit is not installed: pip install -e '.[app]')")
        return
    from pathlib import Path

    app = Path(__file__).resolve().parent.parent / "app" / "streamlit_app.py"
    if not app.exists():
        print(f"\n## Explore rerun: skipped (no {app})")
        return
    values = [2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 15.0, 20.0, 25.0, 30.0, 40.0, 50.0, 60.0]
    n = 5 if quick else len(values)
    print("\n## Explore rerun after moving one slider (AppTest), four seed estimators, 256 rollouts x 4096")
    print("floor: a rerun where nothing changed (every cache hit)\n")
    print("| lengths | loss tokens | slider move: median ms | p90 ms | floor ms | x floor |")
    print("|---|---:|---:|---:|---:|---:|")
    for lengths in ("long_tail", "fixed"):
        at = AppTest.from_file(str(app), default_timeout=300)
        at.query_params.update({"ex.sc.gaussian.n_rollouts": "256", "ex.sc.gaussian.max_len": "4096",
                                "ex.sc.gaussian.lengths": lengths})
        at.run()
        if at.exception:
            print(f"| {lengths} | the page raised: {at.exception[0].value} |")
            continue
        key = "ex.seq_tis.seq_clip"
        at.select_slider(key=key).set_value(values[-1]).run()  # warm every path once
        moves, still = [], []
        for v in values[:n]:
            t0 = time.perf_counter()
            at.select_slider(key=key).set_value(v).run()
            moves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            at.run()
            still.append(time.perf_counter() - t0)
        tokens = int(str(at.dataframe[1].value.loc["tokens_kept", "seq_tis"]).replace(",", ""))
        med, floor = statistics.median(moves), statistics.median(still)
        p90 = sorted(moves)[max(0, math.ceil(0.9 * len(moves)) - 1)]
        print(f"| {lengths} | {tokens:,} | {med * 1e3:.0f} | {p90 * 1e3:.0f} | {floor * 1e3:.0f} | {med / floor:.1f} |")


def keep_freed_memory() -> str:
    """Ask glibc to keep freed memory for reuse instead of returning it to the OS (as a long-running CPU
    trainer with jemalloc or tcmalloc does, and as torch's CUDA allocator does on a GPU): on these CPUs
    the page faults of each fresh (B, T) tensor otherwise cost as much as the arithmetic on it."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return "defaults (not glibc)"
    M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
    ok = libc.mallopt(M_TRIM_THRESHOLD, 1 << 30) and libc.mallopt(M_MMAP_THRESHOLD, 32 << 20)
    return "freed memory kept for reuse (mallopt: trim 1 GiB, mmap 32 MiB)" if ok else "defaults (mallopt refused)"


# (name, function(device, quick)); sections print their own tables
SECTIONS: list[tuple[str, Callable[[str, bool], None]]] = [
    ("estimators", bench_estimators),
    ("large-gpu", bench_large_gpu),
    ("lab", bench_lab),
    ("explore", bench_explore),
]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--glibc-defaults", action="store_true", help="leave glibc's malloc as it is")
    ap.add_argument("--only", nargs="*", help=f"sections to run, from {[n for n, _ in SECTIONS]}")
    ap.add_argument("--repeat", type=int, default=1, help="run the estimators section this many times, "
                    "--pause seconds apart, and end with the median and range of each ratio")
    ap.add_argument("--pause", type=float, default=20.0)
    args = ap.parse_args(argv)
    print(f"# seqis benchmark: torch {torch.__version__}, {torch.get_num_threads()} CPU threads, device {args.device}")
    print(f"# glibc malloc: {keep_freed_memory() if not args.glibc_defaults else 'defaults'}")
    for name, fn in SECTIONS:
        if args.only and name not in args.only:
            continue
        if name == "estimators" and args.repeat > 1:
            runs = []
            for i in range(args.repeat):
                time.sleep(args.pause if i else 0)
                runs.append(fn(args.device, args.quick))
            summarise_repeats(runs)
        else:
            fn(args.device, args.quick)


if __name__ == "__main__":
    main()
