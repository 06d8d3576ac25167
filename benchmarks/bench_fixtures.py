"""Benchmark against the layouts experts published: each fixture run replayed, and planned.

Usage:
    python benchmarks/bench_fixtures.py [--time-limit 30]

A fixture is a published training run of ``reports/validation/published_training.csv`` (sources in
``reports/validation/README.md``): Megatron-LM SC'21 (145.6B and 1T on A100), Meta's Llama 3 405B
on 16,384 H100 (TP8 x PP16 x DP128), NVIDIA DGX Cloud's NeMo recipes (Llama 3.1 70B on 512 H100),
MosaicML llm-foundry (MPT-70B, FSDP, 512 H100), torchtitan (Llama 3.1 8B, FSDP2, 128 H100) and
MaxText on TPU v5p (128B, 256 chips). Per run: the measured step, the published layout's step in
the project's model (what ``mpmd validate`` predicts for the row: its own schedule, recomputation
and power cap), and ``mpmd plan`` on the same hardware (the row's device as its hosts ran it,
nodes of the row's size, the row's scale-out bandwidth), model, global batch and sequence, with
the default ``--time-limit``. ``plan / layout`` below 1 is the planner finding a faster layout in
the same model; the measured step says how far that model is from the run; the layout's peak
memory in the model, against the device's, says whether the planner (which keeps 10% headroom)
could have picked it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hardware_profiles.loader import load_device  # noqa: E402
from hardware_profiles.types import Cluster, Link, NodeGroup  # noqa: E402
from mpmd.cli.validate import predict_step, workload_for  # noqa: E402
from planner import PlanOptions, plan  # noqa: E402
from planner.predict import predict  # noqa: E402
from simulator.validation_setup import build_cluster  # noqa: E402
from simulator import validate as V  # noqa: E402
from simulator.validation_setup import SCALE_OUT_LATENCY_S, row_device  # noqa: E402

CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reports", "validation",
                   "published_training.csv")
FIXTURES = (("narayanan", "145.6B", 1536), ("narayanan", "1008B", 3072),
            ("llama3-405b", "llama3-405B", 16384), ("dgxc-h100", "llama3.1-70B", 512),
            ("llm-foundry", "mpt-70b", 512), ("torchtitan-h100", "llama3.1-8B", 128),
            ("maxtext-v5p", "128B", 256))
"""(source, model, devices) of each fixture row."""


def node_groups(row, device) -> Cluster:
    """The row's hardware as one node group: its device as the row's hosts ran it, nodes of the
    row's size, the row's scale-out bandwidth per device (else the profile's)."""
    dev = row_device(row, device)
    node = row.node_size
    out = (row.scale_out_gbit_per_device * 1e9 / 8 if row.scale_out_gbit_per_device is not None
           else dev.scale_out_bandwidth)
    g = NodeGroup("g", dev, row.gpus // node, node,
                  Link(dev.scale_up_bandwidth, dev.scale_up_latency, "profile"),
                  Link(out, SCALE_OUT_LATENCY_S, "the row's"))
    return Cluster(f"{row.source}-{row.model}", {}, (), None, groups={"g": g})


def measured_step(r) -> float:
    """The run's published step in seconds (a throughput, FLOP rate or MFU scales inversely)."""
    return r.row.value if r.row.metric == "iteration_s" else r.step_s * r.predicted / r.row.value


def layout_text(row) -> str:
    return (f"tp{row.tp} pp{row.pp}" + (f" cp{row.cp}" if row.cp > 1 else "") + f" dp{row.dp}"
            + (" fsdp" if row.fsdp else "")
            + (f" {row.schedule}" if row.schedule else "")
            + (f" {row.recompute} recompute" if row.recompute and row.recompute != "none" else ""))


def markdown(time_limit: float = 30.0) -> str:
    # the BF16 run of each key (the CSV also holds FP8 twins of some runs; the planner here plans
    # BF16, as the fixtures were recorded)
    rows = {(r.source, r.model, r.gpus): r for r in V.load_rows_lenient(CSV)[0]
            if r.precision == "bf16"}
    lines = [f"Published layouts as fixtures: each run's layout replayed in the project's model (as "
             f"`mpmd validate` does) and `mpmd plan` on the same hardware, model and batch, "
             f"`--time-limit {time_limit:g}`", "",
             "| run | model | devices | batch | published layout | measured (s) | layout in model (s) "
             "| layout peak memory (GB) | plan (s) | plan / layout | wall (s) | plan |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for key in FIXTURES:
        row = rows[key]
        dev = load_device(row.device)
        setups, bad = V.row_setups([row], workload_for, step_fn=predict_step, devices={row.device: dev})
        res, bad2 = V.evaluate_rows(setups, {row.device: dev}, predict_step)
        layout = f"{res[0].step_s:.2f}" if res else f"not simulated ({(bad + bad2)[0].reason})"
        mem = "-"
        if res:       # the published layout's peak memory in the model, against the device's
            pr = predict(setups[0].plan, setups[0].workload, build_cluster(row, dev))
            mem = f"{max(pr.peak_memory_bytes.values()) / 1e9:.0f} / {dev.memory_bytes / 1e9:.0f}"
        w = workload_for(row)
        t0 = time.perf_counter()
        r = plan(w, node_groups(row, dev), PlanOptions(time_limit_s=time_limit))
        wall = time.perf_counter() - t0
        p = r.plan
        shape = ", ".join(f"{s['nodes'] // s['nodes_per_mesh'] * s['meshes_per_node']} x "
                          f"{s['nodes_per_mesh']} node(s)" for s in p.carving)
        lays = "/".join(sorted({str(x) for x in p.layouts.values()}))
        ratio = f"{r.prediction.step_time_s / res[0].step_s:.3f}" if res else "-"
        lines.append(f"| {row.source} | {row.model} | {row.gpus} | {row.global_batch} | {layout_text(row)} | "
                     f"{measured_step(res[0]):.2f} | {layout} | {mem} | {r.prediction.step_time_s:.2f} | {ratio} | "
                     f"{wall:.1f} | {shape} {lays}, {p.schedule.name} x {p.microbatches} |"
                     if res else
                     f"| {row.source} | {row.model} | {row.gpus} | {row.global_batch} | {layout_text(row)} | - | "
                     f"{layout} | - | {r.prediction.step_time_s:.2f} | - | {wall:.1f} | {shape} {lays} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    a = ap.parse_args()
    print(markdown(a.time_limit))


if __name__ == "__main__":
    main()
