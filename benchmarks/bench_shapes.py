"""Benchmark of the planner at scale: node-group clusters of 64 to 1024 devices.

Usage:
    python benchmarks/bench_shapes.py [--time-limit 30] [--only homogeneous|mixed]

Homogeneous rows plan llama3-70b (global batch 256, sequence 8192) and gpt3-175b (1536, 2048) on
64-512 H100, and both on 4,096 and 16,384 H100 at larger batches (:data:`LARGE`), described as DGX nodes (``hardware_profiles/clusters/h100xN_nodes.yaml``) and compare
the plan with the best Megatron-style hand configuration (:mod:`planner.baseline`: tensor parallel 8
in a node, the shortest pipeline that fits, data parallel over the rest, 1 or 2 samples per
microbatch, 1F1B or interleaved) and with the best point of the practitioners' grid
(:mod:`planner.grid`: tensor parallel 1-8, every pipeline depth, virtual stages 1-4, micro-batch
1-8, recomputation only where needed, distributed optimizer or FSDP), both evaluated by the same
cost model. Three-kind rows plan llama3-70b
(512, 8192) on 512 and 1024 devices of H100, TPU v5e and p150b, and (2048, 8192) on 4,096, and compare with each kind planned
alone on the same batch: the plan's throughput over the sum of the kinds' separate throughputs.

Columns: wall = trace + search seconds on this machine; gap = (step - proven lower bound) / step;
stopped = why the search ended (complete / work budget / time limit); step at 2x limit = the same
plan() with twice the --time-limit, and its change against the step; step/roofline = step over
the model FLOP at the used devices' dense peak.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zoo.costing import workload  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner import PlanOptions, plan  # noqa: E402
from planner.baseline import best_megatron  # noqa: E402
from planner.grid import grid_sweep  # noqa: E402

HOMOGENEOUS = [("llama3-70b", 256, 8192), ("gpt3-175b", 1536, 2048)]
SIZES = (64, 128, 256, 512)
LARGE = [("llama3-70b", 1024, 8192, "h100x4096_nodes"), ("gpt3-175b", 1536, 2048, "h100x4096_nodes"),
         ("llama3-70b", 2048, 8192, "h100x16384_nodes"), ("gpt3-175b", 2048, 2048, "h100x16384_nodes")]
"""The 4,096-H100 (512 DGX nodes) and 16,384-H100 cases (2,048 DGX nodes, the Llama 3 405B run's
size), on larger global batches."""
MIXED = [("llama3-70b", 512, 8192, "mixed512_nodes"), ("llama3-70b", 512, 8192, "mixed1024_nodes"),
         ("llama3-70b", 2048, 8192, "mixed4096_nodes")]


def shape_text(p) -> str:
    """E.g. ``h100 2 x (8 nodes x 8), 1f1b x 32`` or, for data-parallel parts, one per part."""
    parts = getattr(p, "parts", None) or (p,)
    out = []
    for q in parts:
        c = ", ".join(f"{s['group']} {s['nodes'] // s['nodes_per_mesh'] * s['meshes_per_node']} x "
                      f"({s['nodes_per_mesh']} node{'s' * (s['nodes_per_mesh'] > 1)}"
                      + (f", {s['meshes_per_node']} per node" if s['meshes_per_node'] > 1 else "") + ")"
                      for s in q.carving)
        lays = sorted({str(l) for l in q.layouts.values()})
        out.append(f"{c} {'/'.join(lays)}, {q.schedule.name} x {q.microbatches}"
                   + (f", batch {q.global_batch}" if len(parts) > 1 else ""))
    return "; ".join(out)


def homogeneous(time_limit: float) -> list[dict]:
    rows = []
    cases = [(model, batch, seq, f"h100x{n}_nodes") for model, batch, seq in HOMOGENEOUS for n in SIZES]
    traced = {}
    for model, batch, seq, name in cases + LARGE:
        t = time.perf_counter()
        w = traced.get((model, batch, seq)) or workload(model, batch, seq)
        traced[(model, batch, seq)] = w
        trace = time.perf_counter() - t
        c = load_cluster(f"hardware_profiles/clusters/{name}.yaml")
        n = c.num_devices
        t = time.perf_counter()
        r = plan(w, c, PlanOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - t + trace
        twice = plan(w, c, PlanOptions(time_limit_s=2 * time_limit)).prediction.step_time_s
        hand = best_megatron(w, c, "h100")
        grid = grid_sweep(w, c, "h100").best
        rows.append({"model": model, "devices": n, "batch": batch, "wall": wall, "step": r.prediction.step_time_s,
                     "mfu": r.prediction.mfu, "gap": r.search_gap, "twice": twice,
                     "stopped": r.plan.search.stopped,
                     "roof": r.prediction.step_time_s / r.prediction.roofline_step_time_s,
                     "shape": shape_text(r.plan),
                     "hand": hand.prediction.step_time_s if hand else None,
                     "hand_label": hand.label if hand else "none fits",
                     "hand_mfu": hand.prediction.mfu if hand else None,
                     "grid": grid.prediction.step_time_s if grid else None,
                     "grid_label": grid.label if grid else "none fits"})
    return rows


def mixed(time_limit: float) -> list[dict]:
    rows = []
    for model, batch, seq, name in MIXED:
        w = workload(model, batch, seq)
        c = load_cluster(f"hardware_profiles/clusters/{name}.yaml")
        t = time.perf_counter()
        r = plan(w, c, PlanOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - t
        twice = plan(w, c, PlanOptions(time_limit_s=2 * time_limit)).prediction.step_time_s
        alone = {}
        for g in c.groups:
            sub = replace(c, groups={g: c.groups[g]}, group_links=())
            a = plan(w, sub, PlanOptions(time_limit_s=time_limit))
            alone[g] = a.prediction.step_time_s
        rate = batch / r.prediction.step_time_s
        total = sum(batch / s for s in alone.values())
        rows.append({"cluster": name, "devices": c.num_devices, "batch": batch, "wall": wall,
                     "step": r.prediction.step_time_s, "mfu": r.prediction.mfu, "gap": r.search_gap,
                     "twice": twice, "stopped": r.plan.search.stopped, "alone": alone,
                     "share": rate / total, "best_alone": min(alone.values()),
                     "shape": shape_text(r.plan), "reason": r.plan.search.reason})
    return rows


ZERO_BUBBLE = ("gpt3-175b", 1536, 2048, "h100x512_nodes")


def zero_bubble(time_limit: float) -> list[str]:
    """The planner's pick (all schedules) against the same search restricted to 1F1B, both
    replayed in the discrete-event simulator on the carved cluster."""
    from simulator.plan_sim import plan_cluster, simulate_any

    model, batch, seq, name = ZERO_BUBBLE
    w = workload(model, batch, seq)
    c = load_cluster(f"hardware_profiles/clusters/{name}.yaml")
    rows = [f"Zero-bubble pick: {model} (global batch {batch}, sequence {seq}) on {name}, all schedules "
            f"against 1F1B only, each plan simulated", "",
            "| schedules | picked | shape | predicted (s) | simulated (s) |", "|---|---|---|---:|---:|"]
    for label, scheds in (("all", None), ("1f1b only", ("1f1b",))):
        r = plan(w, c, PlanOptions(time_limit_s=time_limit, schedules=scheds))
        sim = simulate_any(r.plan, w, plan_cluster(r.plan, c))
        rows.append(f"| {label} | {r.plan.schedule.name} x {r.plan.microbatches} | {shape_text(r.plan)} | "
                    f"{r.prediction.step_time_s:.3f} | {sim.step_time_s:.3f} |")
    return rows + [""]


def markdown(time_limit: float = 30.0, only: str | None = None) -> str:
    lines = []
    if only in (None, "homogeneous"):
        rows = homogeneous(time_limit)
        lines += [f"Planner at scale, homogeneous: `plan()` with --time-limit {time_limit:g} s on H100 DGX "
                  f"node groups, against the best Megatron-style hand configuration (shortest pipeline "
                  f"that fits) and the best point of the practitioners' grid (same cost model)", "",
                  "| model | H100 | batch | wall (s) | step (s) | MFU | gap | stopped | step at 2x limit (s) "
                  "| change | step/roofline | hand step (s) | hand MFU "
                  "| plan/hand | grid step (s) | plan/grid | plan | hand | grid |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
        for r in rows:
            hand = f"{r['hand']:.2f}" if r["hand"] else "-"
            ratio = f"{r['step'] / r['hand']:.3f}" if r["hand"] else "-"
            hmfu = f"{r['hand_mfu'] * 100:.1f}%" if r["hand_mfu"] else "-"
            grid = f"{r['grid']:.2f}" if r["grid"] else "-"
            gratio = f"{r['step'] / r['grid']:.3f}" if r["grid"] else "-"
            gap = f"{r['gap'] * 100:.1f}%" if r["gap"] is not None else "unknown"
            lines.append(f"| {r['model']} | {r['devices']} | {r['batch']} | {r['wall']:.1f} | {r['step']:.2f} | "
                         f"{r['mfu'] * 100:.1f}% | {gap} | {r['stopped']} | {r['twice']:.2f} | "
                         f"{(r['twice'] / r['step'] - 1) * 100:+.1f}% | {r['roof']:.2f} | {hand} | {hmfu} | {ratio} "
                         f"| {grid} | {gratio} | {r['shape']} | {r['hand_label']} | {r['grid_label']} |")
        lines.append("")
        lines += zero_bubble(time_limit)
    if only in (None, "mixed"):
        rows = mixed(time_limit)
        lines += [f"Planner at scale, three kinds: llama3-70b, sequence 8192, --time-limit "
                  f"{time_limit:g} s; each kind alone planned on the same batch", "",
                  "| cluster | devices | batch | wall (s) | step (s) | MFU | gap | stopped | step at 2x limit (s) "
                  "| change | H100 alone (s) | TPU v5e alone (s) "
                  "| p150b alone (s) | throughput / sum of kinds' | plan |",
                  "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
        for r in rows:
            a = r["alone"]
            lines.append(f"| {r['cluster']} | {r['devices']} | {r['batch']} | {r['wall']:.1f} | {r['step']:.2f} | "
                         f"{r['mfu'] * 100:.1f}% | {r['gap'] * 100:.1f}% | {r['stopped']} | {r['twice']:.2f} | "
                         f"{(r['twice'] / r['step'] - 1) * 100:+.1f}% | {a.get('h100', 0):.2f} | "
                         f"{a.get('tpu', 0):.2f} | {a.get('p150b', 0):.2f} | {r['share'] * 100:.1f}% | "
                         f"{r['shape']} |")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--only", choices=("homogeneous", "mixed"), default=None)
    a = ap.parse_args()
    print(markdown(a.time_limit, a.only))


if __name__ == "__main__":
    main()
