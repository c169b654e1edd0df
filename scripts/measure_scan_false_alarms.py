"""How often `diagnose(batch)`'s scan of the metadata columns raises a false alarm on clean batches.

Clean batches of the four generators (seqis.samplers.generators, the power table's four clean precisions: bf16
logits, the whole model in bf16, bf16 probabilities, fp16 logits), each given four more columns beside its own
(group_id, reward, length, ...): `env` (4 values, by prompt), `turn` (2, at random), `rank` (4, rollout mod 4)
and `bucket` (32, at random; its groups are below MIN_GROUP_ROLLOUTS, so it is tried and tests nothing). Counts
the batches with any finding of a group (a false alarm of the scan) and with any whole-batch alarm (a warn / bad,
or a kind but precision_noise / healthy), and the largest z each test reached in any scanned group against the
level the scan tested it at (docs/diagnose.md, "The scan of the metadata columns").

    .venv/bin/python scripts/measure_scan_false_alarms.py --seeds 13      # 4 x 4 x 13 = 208 batches
"""

from __future__ import annotations

import argparse
import collections
import time

import torch

from seqis import diagnose
from seqis.diagnosis.causes import _diagnose, scan_z, scanned_groups
from seqis.diagnosis.power import CLEAN
from seqis.samplers.generators import GENERATORS, make


def with_columns(batch, seed: int):
    """The batch with env (by prompt), turn, rank and bucket columns added."""
    g = torch.Generator().manual_seed(seed)
    B = batch.shape[0]
    prompts = batch.metadata["group_id"]
    n_prompts = max(prompts) + 1
    envs = ("math", "code", "chat", "tool")[: 4 if n_prompts >= 8 else 2]
    batch.metadata["env"] = [envs[p * len(envs) // n_prompts] for p in prompts]
    batch.metadata["turn"] = torch.randint(2, (B,), generator=g).tolist()
    batch.metadata["rank"] = [i % 4 for i in range(B)]
    batch.metadata["bucket"] = torch.randint(32, (B,), generator=g).tolist()
    return batch


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=13)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    n = scan_alarms = whole_alarms = groups_tested = 0
    kinds: collections.Counter = collections.Counter()
    largest: dict[str, tuple[float, float]] = {}  # test -> (largest z / the scan's level, that z)
    for label, knobs in CLEAN.items():
        for gen in GENERATORS:
            for seed in range(args.seeds):
                b = with_columns(make(gen, seed=200 + seed, **knobs), seed)
                found = diagnose(b)
                n += 1
                scan = [f for f in found if f.group is not None]
                scan_alarms += bool(scan)
                kinds.update(f"{f.kind} [{f.evidence['by']} = {f.group}]" for f in scan)
                whole_alarms += any(f.severity != "ok" or f.kind not in ("precision_noise", "healthy")
                                    for f in found if f.group is None)
                columns = scanned_groups(b)
                m = sum(len(g) for g in columns.values())
                z = scan_z(m)
                for g in columns.values():
                    for value, rows in g.items():
                        groups_tested += 1
                        for f in _diagnose(b.select(rows), value, z):
                            for test, t in f.evidence.get("tests", {}).items():  # one-sided tests: signed
                                zt = t.get("z", 0.0) if test in ("truncation", "lag") else abs(t.get("z", 0.0))
                                if zt / z > largest.get(test, (-1.0, 0.0))[0]:
                                    largest[test] = (zt / z, zt)
        print(f"{label}: {n} batches, {time.perf_counter() - t0:.0f} s", flush=True)
    print(f"{n} clean batches, {groups_tested} group tests ({groups_tested / n:.1f} per batch), "
          f"{time.perf_counter() - t0:.0f} s")
    print(f"scan false alarms: {scan_alarms}/{n} batches ({scan_alarms / n:.3f}) {dict(kinds)}")
    print(f"whole-batch alarms: {whole_alarms}/{n}")
    for test, (ratio, zt) in sorted(largest.items()):
        print(f"  largest {test} z in a scanned group: {zt:.2f} ({ratio:.2f} of the scan's level)")


if __name__ == "__main__":
    main()
