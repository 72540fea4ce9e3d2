"""Summarizes the last decode step of an Nsight Compute CSV, kernel by kernel.

Reads `ncu --csv --metrics gpu__time_duration.sum` output of a `pagewise bench latency` run (any
lines that are not CSV rows are skipped), takes the last decode step (the kernels after one
sampling kernel up to the next, its sampling included, with no prefill attention among them) and
prints their total and, per kernel name and grid, the time, count and time per launch.

    python3 scripts/gpu/ncu_step.py ncu.csv
"""

import collections
import csv
import sys


def main(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if not rows:
        sys.exit(f"{path}: no ncu CSV rows")
    head, rows = rows[0], rows[1:]
    name, value, grid = (head.index(k) for k in ("Kernel Name", "Metric Value", "Grid Size"))
    kernels = [(r[name], float(r[value].replace(",", "")), r[grid]) for r in rows]
    picks = [i for i, k in enumerate(kernels) if "sample_kernel" in k[0] or k[0].startswith("pick")]
    steps = [kernels[a + 1 : b + 1] for a, b in zip(picks, picks[1:])]
    steps = [s for s in steps if not any("prefill" in k[0] for k in s)]
    if not steps:
        sys.exit(f"{path}: no decode step between two sampling kernels ({len(picks)} found)")
    step = steps[-1]
    print(f"{len(step)} kernels, {sum(k[1] for k in step) / 1e3:.1f} us in all")
    by = collections.defaultdict(lambda: [0, 0.0])
    for kname, ns, g in step:
        key = kname.replace("<unnamed>::", "").split("(")[0][:70] + " " + g
        by[key][0] += 1
        by[key][1] += ns
    for key, (n, ns) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"{ns / 1e3:9.1f} us {n:4d} x {ns / n / 1e3:7.2f}  {key}")


if __name__ == "__main__":
    main(sys.argv[1])
