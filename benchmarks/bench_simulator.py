"""Benchmark of the simulator engine: lower + simulate large pipeline schedules, report wall time.

Usage:
    python benchmarks/bench_simulator.py [--ranks 32] [--microbatches 256] [--repeat 3]

Schedules come from ``simulator.schedules.generate``. Costs are uniform and made up
for timing the engine only: F 1 ms, B 2 ms, boundary transfers 0.1 ms over one link per adjacent
mesh pair (shared by both directions), residuals 1 MB per fragment.
Prints a Markdown table (wall time of lowering and of simulation, simulated events per second).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from ir import FragmentRef  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule  # noqa: E402
from simulator.schedules import generate  # noqa: E402


def bench(name: str, P: int, M: int, repeat: int) -> dict:
    table = generate(name, P, M)
    meshes = tuple(f"m{r}" for r in range(P))

    def fragment(r: int, f: FragmentRef) -> FragmentCost:
        d = 1e-3 if f.kind == "F" else 2e-3
        return FragmentCost(duration_s=d, flops=d * 1e14, residual_bytes=1e6)

    def boundary(a: int, b: int, f: FragmentRef) -> BoundaryCost:
        ra, rb = sorted((table.stage_rank[a], table.stage_rank[b]))
        return BoundaryCost(link=f"m{ra}<->m{rb}", bytes=1e7, duration_s=1e-4)

    def tail(mesh: str) -> tuple[TailOp, ...]:
        return (TailOp("allreduce", 5e-3), TailOp("optimizer", 1e-3))

    best_lower = best_sim = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        prog = lower_schedule(table, meshes, fragment, boundary, tail,
                              baseline_bytes={m: 1e9 for m in meshes},
                              capacity_bytes={m: 80e9 for m in meshes}, peak_flops=1e14 * P)
        t1 = time.perf_counter()
        res = simulate(prog)
        t2 = time.perf_counter()
        best_lower, best_sim = min(best_lower, t1 - t0), min(best_sim, t2 - t1)
    return {"schedule": name, "ranks": P, "microbatches": M,
            "ops": len(prog.ops), "transfers": len(prog.transfers),
            "events": len(res.timeline.events), "lower_s": best_lower, "sim_s": best_sim,
            "events_per_s": len(res.timeline.events) / best_sim, "step_s": res.step_time_s,
            "bubble": sum(res.bubble.values()) / len(res.bubble)}


def markdown(ranks: int = 32, microbatches: int = 256, repeat: int = 3) -> str:
    """The benchmark as a Markdown section."""
    rows = [bench(n, ranks, microbatches, repeat) for n in ("1f1b", "interleaved-1f1b")]
    lines = [f"Simulator engine: {ranks} stages x {microbatches} microbatches, uniform made-up costs "
             f"(best of {repeat})",
             "",
             "| schedule | ranks | microbatches | ops | transfers | timeline events "
             "| lower (s) | simulate (s) | events/s | simulated step (s) | mean bubble |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['ranks']} | {r['microbatches']} "
                     f"| {r['ops']} | {r['transfers']} | {r['events']} | {r['lower_s']:.3f} "
                     f"| {r['sim_s']:.3f} | {r['events_per_s']:,.0f} | {r['step_s']:.4f} "
                     f"| {r['bubble']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="runs per schedule; the best is reported")
    a = ap.parse_args()
    print(markdown(a.ranks, a.microbatches, a.repeat))


if __name__ == "__main__":
    main()
