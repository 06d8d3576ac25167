"""Benchmark against a peer planner's published case: Sailor's 320 GPUs of two kinds.

Usage:
    python benchmarks/bench_peer.py [--time-limit 30]

Sailor (Strati et al., SOSP 2025, arXiv:2504.17096) plans OPT-350M (global batch 1024, sequence
2048) on 80 A100-40GB + 240 V100-16GB in one Google Cloud zone
(``hardware_profiles/clusters/a100x80_v100x240_nodes.yaml``). Rows, all in ``mpmd``'s own cost
model: Sailor's plan as described (:data:`planner.baseline.SAILOR_OPT_350M`, layers balanced by
:func:`planner.baseline.hand_pipeline`); ``mpmd plan`` at its default goal (shortest step), on
every schedule and on 1F1B only (Sailor's runtime, Megatron-DeepSpeed, runs 1F1B); and ``mpmd plan
--objective cost --min-throughput 2000000`` (tokens per second, about half the fastest plan's),
which may use part of the cluster. Cost = the used devices at the cluster file's on-demand prices x step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from zoo.costing import workload  # noqa: E402
from hardware_profiles import load_cluster  # noqa: E402
from planner import Goal, PlanOptions, plan  # noqa: E402
from hardware_profiles.carve import GroupShape  # noqa: E402
from planner.baseline import SAILOR_OPT_350M, hand_pipeline  # noqa: E402
from planner.objective import usd_per_hour, used_devices  # noqa: E402

CLUSTER = "a100x80_v100x240_nodes"
MODEL, BATCH, SEQ = "opt-350m", 1024, 2048
FLOOR = 2_000_000
"""The cost row's throughput floor, tokens per second (README's command; about half the fastest
plan's)."""


def _devices(plan, cluster) -> str:
    return ", ".join(f"{n} {g}" for g, n in used_devices(plan, cluster).items())


def markdown(time_limit: float = 30.0) -> str:
    cluster = load_cluster(CLUSTER)
    w = workload(MODEL, BATCH, SEQ)
    tokens = BATCH * SEQ
    rows = []

    def add(what, plan, pred, wall):
        usd_h = usd_per_hour(plan, cluster)
        rows.append(f"| {what} | {_devices(plan, cluster)} | {pred.step_time_s:.3f} | "
                    f"{tokens / pred.step_time_s:,.0f} | {pred.mfu * 100:.1f}% | "
                    f"{usd_h * pred.step_time_s / 3600:.4f} | {wall} |")

    t0 = time.perf_counter()
    peer = hand_pipeline(w, cluster, SAILOR_OPT_350M)
    add("Sailor's plan (7 stages, V100 tp4 around A100 tp1, dp20, 1f1b), replayed", peer.plan,
        peer.prediction, f"{time.perf_counter() - t0:.1f}")
    for what, opts in (("mpmd plan (every schedule)", PlanOptions(time_limit_s=time_limit)),
                       ("mpmd plan --schedule 1f1b", PlanOptions(time_limit_s=time_limit, schedules=("1f1b",)))):
        t0 = time.perf_counter()
        r = plan(w, cluster, opts)
        add(what, r.plan, r.prediction, f"{time.perf_counter() - t0:.1f}")
    floor = FLOOR
    t0 = time.perf_counter()
    r = plan(w, cluster, PlanOptions(time_limit_s=time_limit), goal=Goal("cost", min_tokens_per_s=floor))
    add(f"mpmd plan --objective cost --min-throughput {floor:.0f}", r.plan, r.prediction,
        f"{time.perf_counter() - t0:.1f}")
    head = (f"OPT-350M, global batch {BATCH}, sequence {SEQ}, on `{CLUSTER}` (80 A100-40GB + 240 "
            f"V100-16GB, Google Cloud prices), `--time-limit {time_limit:g}`:\n\n"
            "| plan | devices used | step (s) | tokens/s | MFU | USD per step | wall (s) |\n"
            "|---|---|---|---|---|---|---|")
    return head + "\n" + "\n".join(rows) + "\n" + scaled(time_limit) + sailor_rows(time_limit)


SAILOR_PLANS = json.loads(open(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                            "sailor_opt350_plans.json")).read())
"""Sailor's own plans for OPT-350M on the three A100-40GB + V100-16GB sizes, from its planner
(eth-easl/sailor cf2c8e3, run on CPU on 2026-11-28: the file's ``source`` and ``command``), with
its simulator's iteration time for each."""

SAILOR_REPLAYS = {
    "a100x80_v100x240_nodes": SAILOR_OPT_350M,
    "a100x128_v100x384_nodes": dataclasses.replace(
        SAILOR_OPT_350M, shapes=(GroupShape("a100", 32, 32, 4), GroupShape("v100", 96, 32, 1)),
        orders=SAILOR_OPT_350M.orders[:1], microbatches=(32,),
        label="Sailor's plan: 7 stages, V100 tp4 around A100 tp1, dp32, 1f1b")}
"""Sailor's plans as :class:`planner.baseline.HandPipeline` (its planner's stage order, the first
of ``SAILOR_OPT_350M.orders``; layers balanced in the model, since a hand pipeline does not fix
them: Sailor's split is 3/3/4/4/4/4/4 of its 26 layers). Its 32+96 plan is not replayed: its
first stage mixes A100 and V100 replicas (3 A100 tp1 beside 24 V100 tp4 at dp 27), which a mesh
of one device kind cannot express."""

SAILOR_SIZES = {"a100x32_v100x96_nodes": 0, "a100x80_v100x240_nodes": 1,
                "a100x128_v100x384_nodes": 2}
"""Cluster file -> its plan in :data:`SAILOR_PLANS`."""


def sailor_rows(time_limit: float = 30.0) -> str:
    """Sailor's plan per mixed size beside mpmd's replay of it (where a mesh can express it)."""
    w = workload(MODEL, BATCH, SEQ)
    rows = []
    for name, i in SAILOR_SIZES.items():
        sp = SAILOR_PLANS["plans"][i]
        pipe = sp["pipelines"][0]
        stages = "; ".join(f"layers {s['layers'][0]}-{s['layers'][1]}: " + " + ".join(
            f"{n} x {k}" for k, n in s["replicas"].items()) for s in pipe["stages"])
        hp = SAILOR_REPLAYS.get(name)
        if hp is None:
            ours = "not expressible (a stage mixes A100 and V100 replicas)"
        else:
            r = hand_pipeline(w, load_cluster(name), hp)
            ours = f"{r.prediction.step_time_s:.3f}"
        rows.append(f"| `{name}` | {pipe['num_stages']} stages, dp {pipe['dp'][0]}, micro batch "
                    f"{sp['mbs']}: {stages} | {sp['sailor_iter_time_s']:.2f} | {ours} |")
    return ("\nSailor's own plans (its planner run on CPU: `benchmarks/sailor_opt350_plans.json`, "
            "eth-easl/sailor cf2c8e3) with its simulator's iteration time, and the same plan "
            "replayed in mpmd's model (layers balanced, 1F1B):\n\n"
            "| cluster | Sailor's plan | Sailor's simulator (s) | mpmd replay (s) |\n"
            "|---|---|---|---|\n" + "\n".join(rows) + "\n")


SCALED = ("a100x32_v100x96_nodes", "a100x128_v100x384_nodes", "a100x32_gcp_nodes", "a100x80_gcp_nodes",
          "a100x128_gcp_nodes")
"""Sailor's other sizes of the same Google Cloud hardware (the 1:3 A100-40GB : V100-16GB mix at 128 and
512 GPUs, and 32/80/128 A100-40GB alone), bundled with the 80+240 file's VM types, links and prices.
Sailor's own plans for the mixed sizes are :data:`SAILOR_PLANS` (below the table); its scripts
cover no A100-only size.""" 


def scaled(time_limit: float = 30.0) -> str:
    """``mpmd plan`` (every schedule, shortest step) of the same workload on :data:`SCALED`."""
    w = workload(MODEL, BATCH, SEQ)
    tokens = BATCH * SEQ
    rows = []
    for name in SCALED:
        cluster = load_cluster(name)
        t0 = time.perf_counter()
        r = plan(w, cluster, PlanOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - t0
        p = r.prediction
        rows.append(f"| `{name}` | {_devices(r.plan, cluster)} | {p.step_time_s:.3f} | "
                    f"{tokens / p.step_time_s:,.0f} | {p.mfu * 100:.1f}% | "
                    f"{usd_per_hour(r.plan, cluster) * p.step_time_s / 3600:.4f} | {wall:.1f} |")
    return ("\nThe same workload on Sailor's other cluster sizes (`mpmd plan`, every schedule; Sailor's plans for "
            "the A100-only sizes are not in its scripts; its mixed plans follow):\n\n| cluster | devices used | step (s) | tokens/s | MFU | USD per step | wall (s) |\n"
            "|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    a = ap.parse_args()
    print(markdown(a.time_limit))


if __name__ == "__main__":
    main()
