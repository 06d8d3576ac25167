"""Benchmark: mixtures of experts planned from their published configs, and DeepSeek-V3's
published layout in the same model.

Usage:
    python benchmarks/bench_moe.py [--time-limit 30]

Three MoE models (``zoo/configs/``) on H100 DGX node groups, each with ``plan()`` at the given
``--time-limit`` (work budget, reference 2-core seconds): Mixtral 8x22B on 128 H100, Qwen3-235B-A22B
on 512 and DeepSeek-V3 on 2,048, as H100 (``h100x2048_nodes.yaml``: 256 DGX H100) and as the
H800 its run used (``h800x2048_nodes.yaml``: the H100's compute with NVLink at 200 GB/s per
direction; a prior profile). DeepSeek-V3's own layout, replayed in the same model: "16-way Pipeline
Parallelism (PP), 64-way Expert Parallelism (EP) spanning 8 nodes, and ZeRO-1 Data Parallelism"
on 2,048 H800, no tensor parallelism, batch 15,360 sequences of 4,096 tokens (DeepSeek-AI,
"DeepSeek-V3 Technical Report", 2024, Sec. 3.2 and 4.2), replayed with DualPipeV (the V
half of DualPipe, whose overlapped forward-backward pairs hide the all-to-alls:
``ScheduleKind.hides_alltoall``), micro-batch 1, with and without full recomputation, and with
1F1B for contrast. The model has no FP8 and cannot express DeepSeek's selective recomputation
(RMSNorm and the MLA up-projections, Sec. 3.2.3); H100 stands in for the H800 (same tensor
cores, NVLink 900 vs 400 GB/s) in one replay and the H800 profile in the other.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hardware_profiles import load_cluster  # noqa: E402
from planner import PlanOptions, plan  # noqa: E402
from planner.baseline import HandLayout, hand_plan  # noqa: E402
from zoo.costing import workload  # noqa: E402
from zoo.model_files import load_model_file  # noqa: E402

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
CASES = (("Mixtral-8x22B-v0.1.json", "h100x128_nodes.yaml", 256, 4096, 1),
         ("Qwen3-235B-A22B.json", "h100x512_nodes.yaml", 512, 4096, 1),
         ("DeepSeek-V3.json", "h100x2048_nodes.yaml", 15360, 4096, 4),
         ("DeepSeek-V3.json", "h800x2048_nodes.yaml", 15360, 4096, 4))
"""(config, cluster, global batch, sequence, budgets): each case is planned at the time limit
and, for the last, also at 4x it (its first candidate alone costs a third of the default
budget at 2,048 GPUs and 1,920 microbatches per replica)."""

DEEPSEEK_V3 = (HandLayout(tensor=1, pipeline=16, data=128, expert=64, micro_batch=1,
                          virtual_stages=2, pipeline_schedule="dualpipe-v",
                          expert_dispatch="deepep"),
               HandLayout(tensor=1, pipeline=16, data=128, expert=64, micro_batch=1,
                          virtual_stages=2, pipeline_schedule="dualpipe-v", recompute="full",
                          expert_dispatch="deepep"),
               HandLayout(tensor=1, pipeline=16, data=128, expert=64, micro_batch=1,
                          recompute="full", expert_dispatch="deepep"))
"""DeepSeek-V3's published layout on 2,048 GPUs (module docstring): with DualPipe (the model's
DualPipeV, which hides the expert all-to-alls under another microbatch's compute) without and
with full recomputation, and with 1F1B (the all-to-alls exposed) for contrast; its tokens go in
two hops (``expert_dispatch="deepep"``: DeepSeek-V3 Technical Report, Sec. 3.2.2, each token over
InfiniBand once to the GPU of the same in-node index on each target node, then over NVLink; the
kernels DeepSeek released as DeepEP)."""


def _layout(p) -> str:
    lays = list(dict.fromkeys(str(p.layouts[m]) for m in p.rank_mesh))
    return (f"{len(p.stages)} stages, {'/'.join(lays)}, {p.schedule.name} x "
            f"{p.schedule.microbatches}")


def rows(time_limit: float) -> list[dict]:
    out = []
    for cfg_file, cluster_file, batch, seq, budgets in CASES:
        cfg = load_model_file(os.path.join(ROOT, "zoo", "configs", cfg_file))
        w = workload(cfg, batch, seq_len=seq)
        cluster = load_cluster(os.path.join(ROOT, "hardware_profiles", "clusters", cluster_file))
        devices = sum(g.num_devices for g in cluster.groups.values())
        for limit in sorted({time_limit, time_limit * budgets}):
            t0 = time.perf_counter()
            p = plan(w, cluster, PlanOptions(time_limit_s=limit)).plan
            wall = time.perf_counter() - t0
            pred = p.predicted
            assert pred is not None                     # the planner's plans carry their replay
            gap = p.search.search_gap
            out.append({"model": cfg.name, "cluster": cluster.name, "devices": devices, "batch": batch,
                        "what": f"plan, --time-limit {limit:g}", "wall": wall,
                        "step": pred.step_time_s, "mfu": pred.mfu,
                        "tok_gpu": pred.tokens_per_s / devices, "fits": True,
                        "layout": _layout(p) + (f"; proven gap {100 * gap:.1f}%" if gap is not None else "")})
        if cfg.name == "DeepSeek-V3":
            for hl in DEEPSEEK_V3:
                h = hand_plan(w, cluster, hl)
                peak = max(h.prediction.peak_memory_bytes.values()) / 1e9
                out.append({"model": cfg.name, "cluster": cluster.name, "devices": devices,
                            "batch": batch,
                            "what": f"DeepSeek's layout, {hl.schedule}"
                                    + (", full recompute" if hl.recompute == "full" else ""),
                            "wall": 0.0,
                            "step": h.prediction.step_time_s, "mfu": h.prediction.mfu,
                            "tok_gpu": h.prediction.tokens_per_s / devices,
                            "fits": h.prediction.fits,
                            "layout": f"{hl.label} (peak {peak:.0f} GB)"})
    return out


def markdown(time_limit: float = 30.0) -> str:
    lines = [f"Mixtures of experts from their published configs (`zoo/configs/`), `plan()` with "
             f"--time-limit {time_limit:g} s on H100 / H800 node groups; DeepSeek-V3's published "
             f"layout (PP16 x EP64 x DP128, no TP; DeepSeek-V3 Technical Report, Sec. 3.2) "
             f"replayed in the same model with DualPipeV (all-to-alls hidden) and with 1F1B (no FP8 in "
             f"the model). "
             f"`python benchmarks/bench_moe.py`", "",
             "| model | cluster | GPUs | batch | what | wall (s) | step (s) | MFU | tokens/s/GPU | fits | layout |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rows(time_limit):
        lines.append(f"| {r['model']} | {r['cluster']} | {r['devices']} | {r['batch']} | {r['what']} | "
                     f"{r['wall']:.1f} | {r['step']:.2f} | {100 * r['mfu']:.1f}% | "
                     f"{r['tok_gpu']:,.0f} | {'yes' if r['fits'] else 'no'} | {r['layout']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0)
    print(markdown(ap.parse_args().time_limit))


if __name__ == "__main__":
    main()
