"""Section `diagnose-power`: what each detector of seqis.diagnosis.causes can see, on samplers it was not tuned on.

Detection rate against each fault's magnitude (top-p 0.8-0.99, top-k 5-200, temperature 0.7-1.3, raw log-probs,
catastrophic share, policy lag) at two batch sizes, pooled over every generator of seqis.samplers.generators (never
tiny_lm), and the false-alarm rate over clean batches (seqis.diagnosis.power). A full run writes
assets/bench/diagnose_power.json for the Diagnose page; --quick runs two generators, one seed and each fault's
mildest and strongest magnitude, and writes nothing. Prints counts and rates, no timings.
"""

from __future__ import annotations

import sys

from ..diagnosis.power import FAULTS, POWER_TABLE, SIZES, measure, write

ORDER = 16


def run(device: str, quick: bool, out=None) -> dict:
    """Simulate, print the tables, and (a full run, or `out` given) write the power table as JSON."""
    if quick:
        table = measure(("lm_byte256", "lm_mixed1k"), seeds=1, clean_seeds=1,
                        values=lambda f: (f.values[0], f.values[-1]))
    else:
        table = measure(log=lambda m: print(f"  ... {m}", file=sys.stderr, flush=True))
    sizes = " | ".join(f"{s} (~{table['sizes'][s]['tokens_median']:,} tokens)" for s in SIZES)
    print(f"\n## diagnose-power: detection rate against magnitude, generators {', '.join(table['generators'])}, "
          f"{table['seeds']} seed(s) each (a quarter: four disjoint quarters of each draw)\n")
    for name, fault in table["faults"].items():
        print(f"### {name} ({fault['kind']}; x: {fault['label']})\n")
        acc = f" | estimate within {fault['tolerance']:.0%} (of detected)" if fault["tolerance"] else ""
        print(f"| {FAULTS[name].knob} | truth | {sizes}{acc} |")
        print("|---:|---:|" + "---:|" * len(SIZES) + ("---:|" if acc else ""))
        by_value = {}
        for c in fault["cells"]:
            by_value.setdefault(c["value"], {})[c["size"]] = c
        for value, cells in by_value.items():
            truth = cells.get("whole", next(iter(cells.values())))["truth"]
            rates = " | ".join(f"{cells[s]['rate']:.2f} ({cells[s]['n']})" if s in cells else "-" for s in SIZES)
            whole = cells.get("whole")
            accuracy = ""
            if acc:
                a = whole["accurate"] if whole else None
                accuracy = f" | {a:.2f}" if a is not None else " | -"
            print(f"| {value} | {truth:.4g} | {rates}{accuracy} |")
        print()
    print("### false alarms on clean batches (any warn / bad, or any kind but precision_noise / healthy)\n")
    print(f"precisions: {', '.join(table['clean_precisions'])}; {table['clean_seeds']} seed(s) each\n")
    print("| size | batches | tokens (median) | false alarms | rate |")
    print("|---|---:|---:|---:|---:|")
    for size, fa in table["false_alarms"].items():
        rate = fa["alarms"] / max(fa["batches"], 1)
        print(f"| {size} | {fa['batches']} | {fa['tokens']:,} | {fa['alarms']} | {rate:.3f} |")
    seen = sorted({e for fa in table["false_alarms"].values() for e in fa["examples"]})
    if seen:
        print("\nalarms seen: " + ", ".join(seen))
    target = out if out is not None else (None if quick else POWER_TABLE)
    if target is not None:
        write(table, target)
        print(f"\nwrote {target}")
    return table
