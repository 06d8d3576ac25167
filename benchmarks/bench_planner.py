"""Benchmark of the planner: wall time of ``plan()`` for models x clusters, with what it found.

Usage:
    python benchmarks/bench_planner.py [--time-limit 30]

Each row traces the model (XLA cost analysis), then searches (CP-SAT per schedule and microbatch
count, then the exact replay) with the CLI's defaults (global batch 256 for training, one video
for Mochi).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from mpmd.cli.plan import _workload  # noqa: E402
from zoo import get_config  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner import InfeasibleError, PlanOptions, plan  # noqa: E402

CASES = [
    ("llama3-8b", "h100x64"),
    ("llama3-70b", "h100x64"),
    ("llama3-70b", "h100x16_p150bx32"),
    ("llama3-70b", "tpuv5e256_h100x16"),
    ("gpt3-175b", "h100x128"),
    ("mochi-dit-10b", "quietbox_p150x4"),
    ("mochi-dit-10b", "loudbox_p150bx8"),
]


def bench(model: str, cluster: str, time_limit: float) -> dict:
    t0 = time.perf_counter()
    w = _workload(get_config(model), None, None)
    t1 = time.perf_counter()
    c = load_cluster(cluster)
    try:
        r = plan(w, c, PlanOptions(time_limit_s=time_limit))
        found = (f"{r.plan.schedule.name} x {r.plan.microbatches}, {len(r.plan.stages)} stages, "
                 f"step {r.prediction.step_time_s:.2f} s, MFU {r.prediction.mfu * 100:.1f}%, "
                 f"{r.plan.search.status} gap {(r.plan.search.gap or 0.0) * 100:.1f}%")
    except InfeasibleError as e:
        found = f"infeasible: {e}"
    t2 = time.perf_counter()
    return {"model": model, "cluster": cluster, "trace_s": t1 - t0, "search_s": t2 - t1,
            "found": found}


def markdown(time_limit: float = 30.0) -> str:
    rows = [bench(m, c, time_limit) for m, c in CASES]
    lines = [f"Planner: `mpmd plan` defaults, --time-limit {time_limit:g} s", "",
             "| model | cluster | trace + cost (s) | search (s) | total (s) | best plan |",
             "|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['cluster']} | {r['trace_s']:.1f} | {r['search_s']:.1f} "
                     f"| {r['trace_s'] + r['search_s']:.1f} | {r['found']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    print(markdown(ap.parse_args().time_limit))


if __name__ == "__main__":
    main()
