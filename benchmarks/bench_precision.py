"""NVIDIA's published training tables in the model: each run as published, its layout replayed,
and the planner's own plan in the same precision.

Usage:
    python benchmarks/bench_precision.py [--time-limit 90] [--moe]

Rows of ``reports/validation/published_training.csv`` from NVIDIA's tables (DGX Cloud benchmarking
recipes and NeMo performance summaries, sources in ``reports/validation/README.md``), in BF16 and
in their low-precision recipes (``precision`` column). Per run: the published throughput (tokens
per second per GPU), the published layout's in the project's model (what ``mpmd validate``
predicts for the row, in its recipe), and ``mpmd plan`` on the same hardware, model, batch and
recipe (``benchmarks/bench_fixtures.node_groups``: the row's device in nodes of its size). ``plan /
published`` above 1.2 is a gain over NVIDIA's tuned recipe that the model claims; the section's
notes say why it is real or what the model still lacks.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench_fixtures import CSV  # noqa: E402
from bench_fixtures import node_groups as dgx_node_groups  # noqa: E402
from hardware_profiles.loader import load_device  # noqa: E402
from mpmd.cli.validate import model_fill, predict_step, workload_for  # noqa: E402
from planner import PlanOptions, plan  # noqa: E402
from planner.predict import predict  # noqa: E402
from simulator import validate as V  # noqa: E402
from simulator.validation_setup import build_cluster, node_devices  # noqa: E402

RUNS = (("dgxc-h100", "llama3.1-8B", 128), ("dgxc-h100", "llama3.1-70B", 64),
        ("dgxc-h100", "llama3.1-405B", 512), ("dgxc-h100", "gpt3-175B", 128),
        ("dgxc-h100", "nemotron4-15B", 128), ("dgxc-h100", "nemotron4-340B", 128),
        ("nemo-25.11", "llama3-8b", 8), ("nemo-25.11", "llama3-70b", 64),
        ("nemo-25.11", "llama3.1-405b", 128), ("nemo-25.11", "llama3.1-405b", 256),
        ("nemo-25.11", "llama3.1-405b", 1024),
        ("dgxc-gb200", "llama3.1-405b", 128), ("dgxc-gb200", "nemotron4-340b", 128))
"""(source, model, devices) of each run; every recipe the CSV holds for it is taken."""

MOE_RUNS = (("nemo-25.11", "deepseek-v3", 256), ("nemo-25.09", "deepseek-v3", 256),
            ("nemo-25.09", "deepseek-v3", 1024), ("nemo-25.11", "qwen3-235b-a22b", 256),
            ("nemo-25.09", "qwen3-235b-a22b", 64), ("nemo-25.09", "qwen3-30b-a3b", 8),
            ("nemo-25.11", "gpt-oss-120b", 64))
"""NVIDIA's mixture-of-experts runs, the same way (``python benchmarks/run.py --only
moe-precision``)."""


def layout_text(row) -> str:
    """The published layout: degrees (context parallel and virtual stages where published), FSDP,
    schedule and recomputation."""
    return (f"tp{row.tp} pp{row.pp}" + (f" cp{row.cp}" if row.cp > 1 else "")
            + (f" vp{row.vp}" if row.vp else "") + f" dp{row.dp}" + (" fsdp" if row.fsdp else "")
            + (f" ep{row.ep}" if row.ep > 1 else "")
            + (f" etp{row.etp}" if row.ep > 1 and row.etp is not None else "")
            + (f" {row.recompute} recompute" if row.recompute and row.recompute != "none" else ""))


def node_groups(row, device):
    """The row's hardware as node groups: DGX nodes of the row's size, or, where the row's NVLink
    domain holds several hosts (a GB200 NVL72 rack: ``scale_up_domain`` or ``devices_per_node`` 72,
    else the profile's, :func:`simulator.validation_setup.node_devices`; hosts of 4), hosts
    of the device's ``lockstep_devices`` joined by a ``scale_up_domain`` of the row's size."""
    row = replace(row, scale_up_domain=node_devices(row, device))   # the profile's when blank
    c = dgx_node_groups(row, device)
    host = device.lockstep_devices
    if row.node_size <= host or row.node_size % host or row.gpus % host:
        return c
    g = c.groups["g"]
    return replace(c, groups={"g": replace(g, nodes=row.gpus // host, devices_per_node=host,
                                           scale_up_domain=min(row.node_size, row.gpus))})


def tokens_per_gpu(r, step: float) -> float:
    return r.global_batch * r.seq_len / step / r.gpus


def markdown(time_limit: float = 90.0, runs: tuple = RUNS) -> str:
    """The section's table for ``runs`` ((source, model, devices) of CSV rows). ``time_limit``: the
    planner's budget, s; the 256- to 1,024-GPU searches take 10-50 s on a 2-core machine, and at
    20 s the budget cut several short (their plans then depended on the machine's speed;
    2026-11-30)."""
    rows = [r for r in V.load_rows_lenient(CSV, fill=model_fill(CSV))[0]
            if (r.source, r.model, r.gpus) in runs]
    lines = [f"NVIDIA's published runs in their recipes: the published throughput, the published "
             f"layout in the project's model (as `mpmd validate` replays it) and `mpmd plan` on the "
             f"same hardware, model, batch and recipe (its precision, loss, attention kernel and Adam "
             f"state: `--optimizer-state`), `--time-limit {time_limit:g}`; tokens per "
             f"second per GPU", "",
             "| source | model | devices | batch | precision | published layout | published | layout in "
             "model | error | layout peak memory (GB) | plan | plan / published | wall (s) | plan |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for row in sorted(rows, key=lambda r: (runs.index((r.source, r.model, r.gpus)), r.device,
                                           r.precision, r.global_batch)):
        dev = load_device(row.device)
        setups, bad = V.row_setups([row], workload_for, step_fn=predict_step,
                                   devices={row.device: dev})
        res, bad2 = V.evaluate_rows(setups, {row.device: dev}, predict_step)
        if not res:
            lines.append(f"| {row.source} | {row.model} | {row.gpus} {row.device} | "
                         f"{row.global_batch} | {row.precision} | "
                         f"{layout_text(row)} | - | not simulated ({(bad + bad2)[0].reason}) | "
                         f"- | - | - | - | - | - |")
            continue
        measured = row.value if row.metric == "iteration_s" else None
        step_m = measured if measured is not None else res[0].step_s * res[0].predicted / row.value
        pr = predict(setups[0].plan, setups[0].workload, build_cluster(row, dev))
        mem = f"{max(pr.peak_memory_bytes.values()) / 1e9:.0f} / {dev.memory_bytes / 1e9:.0f}"
        w = replace(workload_for(row), precision=row.precision)
        t0 = time.perf_counter()
        # the recipe's Adam state too (the row's optimizer_state): the plan keeps what the run kept
        r = plan(w, node_groups(row, dev), PlanOptions(time_limit_s=time_limit,
                                                      optimizer_state=row.optimizer_state))
        wall = time.perf_counter() - t0
        p = r.plan
        lays = "/".join(sorted({str(x) for x in p.layouts.values()}))
        pub, lay = tokens_per_gpu(row, step_m), tokens_per_gpu(row, res[0].step_s)
        mine = tokens_per_gpu(row, r.prediction.step_time_s)
        lines.append(f"| {row.source} | {row.model} | {row.gpus} {row.device} | "
                     f"{row.global_batch} | {row.precision} | "
                     f"{layout_text(row)} | {pub:,.0f} | {lay:,.0f} | {(lay / pub - 1) * 100:+.1f}% | "
                     f"{mem} | {mine:,.0f} | {mine / pub:.2f}x | {wall:.1f} | "
                     f"{len(p.stages)} stage(s) {lays}, {p.schedule.name} x {p.microbatches} |")
    return "\n".join(lines) + "\n"


def moe_markdown(time_limit: float = 90.0) -> str:
    """:func:`markdown` for :data:`MOE_RUNS`."""
    return markdown(time_limit, MOE_RUNS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=90.0)
    ap.add_argument("--moe", action="store_true", help="the mixture-of-experts runs instead")
    a = ap.parse_args()
    print(markdown(a.time_limit, MOE_RUNS if a.moe else RUNS))


if __name__ == "__main__":
    main()
