"""Benchmark of the simulator engine: lower + simulate large pipeline schedules, report wall time.

Usage:
    python benchmarks/bench_simulator.py [--ranks 32] [--microbatches 256] [--repeat 3] [--out FILE]

Schedules come from ``simulator.schedules.generate`` when it exists; otherwise from the local
reference generators below (1F1B and Megatron's interleaved 1F1B). Costs are uniform and made up
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

from compiler.ir import FragmentRef, ScheduleTable  # noqa: E402
from simulator.engine import simulate  # noqa: E402
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule  # noqa: E402


def local_1f1b(P: int, M: int) -> ScheduleTable:
    """1F1B (PipeDream-flush): rank r warms up with P-r-1 forwards, then alternates F and B."""
    order = []
    for r in range(P):
        w = min(P - r - 1, M)
        o = [FragmentRef("F", r, m) for m in range(w)]
        for i in range(M - w):
            o += [FragmentRef("F", r, w + i), FragmentRef("B", r, i)]
        o += [FragmentRef("B", r, m) for m in range(M - w, M)]
        order.append(tuple(o))
    return ScheduleTable("1f1b", P, P, M, tuple(range(P)), tuple(order))


def local_interleaved(P: int, M: int, v: int = 2) -> ScheduleTable:
    """Megatron-LM interleaved 1F1B with ``v`` chunks per rank (stage c*P + r on rank r); P | M."""
    if M % P:
        raise ValueError(f"interleaved 1F1B needs microbatches ({M}) divisible by ranks ({P})")
    total = v * M

    def ref(kind: str, r: int, k: int) -> FragmentRef:
        chunk = (k // P) % v
        if kind == "B":
            chunk = v - 1 - chunk
        return FragmentRef(kind, chunk * P + r, (k // (P * v)) * P + k % P)

    order = []
    for r in range(P):
        w = min((P - r - 1) * 2 + (v - 1) * P, total)
        o = [ref("F", r, k) for k in range(w)]
        for i in range(total - w):
            o += [ref("F", r, w + i), ref("B", r, i)]
        o += [ref("B", r, k) for k in range(total - w, total)]
        order.append(tuple(o))
    return ScheduleTable("interleaved-1f1b", P, P * v, M, tuple(s % P for s in range(P * v)),
                         tuple(order))


def make_table(name: str, P: int, M: int) -> tuple[ScheduleTable, str]:
    try:
        from simulator.schedules import generate  # type: ignore[attr-defined]
        return generate(name, P, M), "simulator.schedules.generate"
    except (ImportError, AttributeError):
        return (local_1f1b(P, M) if name == "1f1b" else local_interleaved(P, M)), "local generator"


def bench(name: str, P: int, M: int, repeat: int) -> dict:
    table, source = make_table(name, P, M)
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
    return {"schedule": name, "source": source, "ranks": P, "microbatches": M,
            "ops": len(prog.ops), "transfers": len(prog.transfers),
            "events": len(res.timeline.events), "lower_s": best_lower, "sim_s": best_sim,
            "events_per_s": len(res.timeline.events) / best_sim, "step_s": res.step_time_s,
            "bubble": sum(res.bubble.values()) / len(res.bubble)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=32)
    ap.add_argument("--microbatches", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3, help="runs per schedule; the best is reported")
    ap.add_argument("--out", help="also write the Markdown table to this file")
    a = ap.parse_args()
    rows = [bench(n, a.ranks, a.microbatches, a.repeat) for n in ("1f1b", "interleaved-1f1b")]
    cmd = "python benchmarks/bench_simulator.py " + " ".join(sys.argv[1:])
    lines = [f"Simulator engine benchmark (`{cmd.strip()}`, best of {a.repeat}, {os.cpu_count()} CPUs)",
             "",
             "| schedule | generator | ranks | microbatches | ops | transfers | timeline events "
             "| lower (s) | simulate (s) | events/s | simulated step (s) | mean bubble |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['schedule']} | {r['source']} | {r['ranks']} | {r['microbatches']} "
                     f"| {r['ops']} | {r['transfers']} | {r['events']} | {r['lower_s']:.3f} "
                     f"| {r['sim_s']:.3f} | {r['events_per_s']:,.0f} | {r['step_s']:.4f} "
                     f"| {r['bubble']:.3f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, a.out)


if __name__ == "__main__":
    main()
