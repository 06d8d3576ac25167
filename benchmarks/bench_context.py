"""Benchmark: long sequences planned with and without context parallelism.

Usage:
    python benchmarks/bench_context.py [--time-limit 30]

Llama 3 405B at 131,072 tokens on 16,384 H100 (``h100x16384_nodes.yaml``, global batch 128: Meta's
long-context stage ran 128K tokens on 16K GPUs, Dubey et al. 2024, "The Llama 3 Herd of Models",
Table 4: TP 8, CP 16, PP 16, DP 8) and Llama 3 70B at 131,072 tokens on 128 H100
(``h100x128_nodes.yaml``, global batch 64), each planned by ``mpmd plan`` at its default (context
parallelism searched, ``PlanOptions.context`` 0) and with ``--context-parallel off``: the step
(the plan's replay), MFU, the stage layout and the peak memory of its busiest stage.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zoo.costing import workload  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner import PlanOptions, plan  # noqa: E402
from planner.errors import InfeasibleError  # noqa: E402

CASES = (("llama3-405b", "h100x16384_nodes", 128, 131072),
         ("llama3-70b", "h100x128_nodes", 64, 131072))
"""(model, cluster, global batch, sequence length) of each row."""


def _layouts(p) -> str:
    return "/".join(dict.fromkeys(str(lay) for lay in p.layouts.values()))


def markdown(time_limit: float = 30.0) -> str:
    lines = ["Long sequences: `mpmd plan` with context parallelism searched (the default) and with "
             f"`--context-parallel off`, `--time-limit {time_limit:g}`; step = the plan's replay",
             "",
             "| model | cluster | batch x tokens | context parallel | step (s) | MFU | stages | "
             "layout | schedule | proven gap | wall (s) |",
             "|---|---|---|---|---:|---:|---:|---|---|---:|---:|"]
    for model, cluster_name, batch, seq in CASES:
        w = workload(model, batch, seq)
        cluster = load_cluster(cluster_name)
        for label, context in (("searched", 0), ("off", 1)):
            t0 = time.perf_counter()
            try:
                r = plan(w, cluster, PlanOptions(time_limit_s=time_limit, context=context))
            except InfeasibleError:
                lines.append(f"| {model} | {cluster_name} | {batch} x {seq:,} | {label} | - | - | "
                             f"- | no plan fits memory | - | - | "
                             f"{time.perf_counter() - t0:.1f} |")
                continue
            wall = time.perf_counter() - t0
            p, pred = r.plan, r.prediction
            gap = p.search.search_gap
            lines.append(
                f"| {model} | {cluster_name} | {batch} x {seq:,} | {label} | "
                f"{pred.step_time_s:.2f} | {pred.mfu * 100:.1f}% | {len(p.stages)} | "
                f"{_layouts(p)} | {p.schedule.name} x {p.schedule.microbatches} | "
                f"{'-' if gap is None else f'{gap * 100:.1f}%'} | {wall:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    print(markdown(ap.parse_args().time_limit))


if __name__ == "__main__":
    main()
