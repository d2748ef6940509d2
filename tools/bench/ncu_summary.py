#!/usr/bin/env python3
"""Sums an ncu --csv gpu__time_duration.sum report by kernel over its last third of launches (one
decode step of bench_cuda_model --profile): where the time of a step goes."""
import csv, sys, collections
rows = list(csv.DictReader(open(sys.argv[1])))
rows = [r for r in rows if r.get("Metric Name") == "gpu__time_duration.sum"]
n = len(rows)
last = rows[-n // 3:]
agg = collections.defaultdict(lambda: [0, 0.0])
for r in last:
    name = r["Kernel Name"][:70]
    agg[name][0] += 1
    agg[name][1] += float(r["Metric Value"])
tot = sum(v[1] for v in agg.values())
print(f"{sys.argv[1]}: {n} kernels profiled; last third: {len(last)} kernels, {tot/1e6:.3f} ms of kernel time")
for k, (c, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:14]:
    print(f"  {t/1e6:8.3f} ms {c:5d}x {t/c/1e3:8.1f} us  {k}")
