"""Compiled runs on this machine's CPU devices against the simulation, after ``mpmd calibrate``.

Runs the README's commands as written, in a temporary directory, ``--repeats`` times (each time a
fresh calibration, so the spread over repeats is the machine's): ``mpmd calibrate``, then the
decoder's plan and ``mpmd run`` (greedy decoding with a KV cache: the decode step and the prefill
measured against the simulator's forward of the plan) and the training plan and ``mpmd run
--steps 50`` (the measured step against the simulated one). Prints a Markdown table; each row
gives the measured and simulated times and the simulation's error relative to the measurement.

Usage:
    python benchmarks/bench_run_check.py [--repeats 3]
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECODE_MODEL = ROOT / "zoo" / "configs" / "llama-tiny-decode.yaml"
MOE_MODEL = ROOT / "zoo" / "configs" / "tiny-moe.yaml"

DECODE_RE = re.compile(r"decode step measured / simulated.*?([\d.]+) / ([\d.]+) ms", re.S)
PREFILL_RE = re.compile(r"prefill measured / simulated.*?([\d.]+) / ([\d.]+) ms", re.S)
TRAIN_RE = re.compile(r"step time measured / simulated.*?([\d.]+) / ([\d.]+) ms", re.S)
OVERHEAD_RE = re.compile(r"decode layer overhead ([\d.]+) us")
STREAM_RE = re.compile(r"stream\s+weights at ([\d.]+) GB/s")


def _mpmd(args: list[str], cwd: str) -> str:
    """Run ``mpmd ARGS`` in ``cwd``; its stdout and stderr (wide, so rich does not wrap figures)."""
    env = dict(os.environ, COLUMNS="250")
    done = subprocess.run([sys.executable, "-m", "mpmd", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"mpmd {' '.join(args)} exited {done.returncode}: "
                           f"{(done.stdout + done.stderr)[-2000:]}")
    return done.stdout + done.stderr


def _pair(rx: re.Pattern, text: str, what: str) -> tuple[float, float]:
    m = rx.search(" ".join(text.split()))
    if m is None:
        raise RuntimeError(f"no '{what}' figure in the output:\n{text[-2000:]}")
    return float(m.group(1)), float(m.group(2))


def one_repeat() -> dict[str, float]:
    """One calibration and the decode and training checks on it (milliseconds, GB/s, us)."""
    with tempfile.TemporaryDirectory() as d:
        cal = " ".join(_mpmd(["calibrate", "--out", "calibrated"], d).split())
        _mpmd(["plan", "--model", str(DECODE_MODEL), "--cluster", "calibrated/cpu4x2.yaml",
               "--global-batch", "4", "--seq-len", "1", "--out", "decode.json"], d)
        dec = _mpmd(["run", "decode.json"], d)
        _mpmd(["plan", "--model", "llama-tiny", "--cluster", "calibrated/cpu4x2.yaml",
               "--global-batch", "8", "--out", "tiny.json"], d)
        train = _mpmd(["run", "tiny.json", "--steps", "50"], d)
        write_moe_plan(Path(d) / "moe.json", "calibrated/cpu4x2.yaml")
        moe = _mpmd(["run", "moe.json", "--steps", "20", "--check-every", "10"], d)
    out: dict[str, float] = {}
    out["moe_measured"], out["moe_simulated"] = _pair(TRAIN_RE, moe, "MoE training step")
    out["decode_measured"], out["decode_simulated"] = _pair(DECODE_RE, dec, "decode step")
    out["prefill_measured"], out["prefill_simulated"] = _pair(PREFILL_RE, dec, "prefill")
    out["train_measured"], out["train_simulated"] = _pair(TRAIN_RE, train, "training step")
    m = OVERHEAD_RE.search(cal)
    out["decode_layer_overhead_us"] = float(m.group(1)) if m else float("nan")
    m = STREAM_RE.search(cal)
    out["weight_stream_gb_s"] = float(m.group(1)) if m else float("nan")
    return out


def write_moe_plan(path: Path, cluster: str) -> None:
    """The tiny mixture of experts (``zoo/configs/tiny-moe.yaml``: 4 experts, top 2) as expert
    parallel 2 x pipeline 2: two meshes of 2 CPU devices, each ``dp2-ep2``, a 2-stage 1F1B over 4
    microbatches of 2 samples, written as a plan file for ``mpmd run``."""
    import dataclasses
    import json

    from ir import Layout, Plan, StagePlan, any_plan_to_json
    from simulator.schedules import generate
    from zoo.model_files import load_model_file

    cfg = load_model_file(MOE_MODEL)
    lay = Layout(2, 1, expert=2)
    plan = Plan(model=cfg.name, cluster="cpu4x2",
                stages=(StagePlan(0, 0, 3, "m0"), StagePlan(1, 3, 6, "m1")),
                layouts={"m0": lay, "m1": lay}, schedule=generate("1f1b", 2, 4),
                rank_mesh=("m0", "m1"), merge_last_stage=False, global_batch=8,
                seq_len=cfg.seq_len, cluster_path=cluster, model_config=dataclasses.asdict(cfg))
    path.write_text(json.dumps(any_plan_to_json(plan), indent=1))


def _err(measured: float, simulated: float) -> float:
    return (simulated - measured) / measured * 100.0


def markdown(repeats: int = 3) -> str:
    rows = [one_repeat() for _ in range(repeats)]
    lines = [
        f"The README's CPU commands, {repeats} times, each on a fresh `mpmd calibrate`: "
        "`mpmd run decode.json` (greedy decoding of `zoo/configs/llama-tiny-decode.yaml`, 4 meshes "
        "of 2 CPU devices, tensor parallel 2, 4 microbatches of one sequence) and "
        "`mpmd run tiny.json --steps 50` (training llama-tiny), and a tiny mixture of experts "
        "(`zoo/configs/tiny-moe.yaml`, 4 experts, top 2) as expert parallel 2 x pipeline 2 "
        "(`write_moe_plan`, `mpmd run moe.json --steps 20`). Error: simulated against measured. "
        "`python benchmarks/bench_run_check.py`",
        "",
        "| repeat | weights streamed (GB/s/device) | decode layer overhead (us) | decode step measured / "
        "simulated (ms) | error | prefill measured / simulated (ms) | error | training step "
        "measured / simulated (ms) | error | MoE EP2 x PP2 step measured / simulated (ms) | error |",
        "|---:|---:|---:|---|---:|---|---:|---|---:|---|---:|",
    ]
    for i, r in enumerate(rows, 1):
        lines.append(
            f"| {i} | {r['weight_stream_gb_s']:.2f} | {r['decode_layer_overhead_us']:.0f} | "
            f"{r['decode_measured']:.1f} / {r['decode_simulated']:.1f} | "
            f"{_err(r['decode_measured'], r['decode_simulated']):+.1f}% | "
            f"{r['prefill_measured']:.1f} / {r['prefill_simulated']:.1f} | "
            f"{_err(r['prefill_measured'], r['prefill_simulated']):+.1f}% | "
            f"{r['train_measured']:.1f} / {r['train_simulated']:.1f} | "
            f"{_err(r['train_measured'], r['train_simulated']):+.1f}% | "
            f"{r['moe_measured']:.1f} / {r['moe_simulated']:.1f} | "
            f"{_err(r['moe_measured'], r['moe_simulated']):+.1f}% |")
    worst = max(abs(_err(r["decode_measured"], r["decode_simulated"])) for r in rows)
    mean = statistics.mean(abs(_err(r["decode_measured"], r["decode_simulated"])) for r in rows)
    moe = [abs(_err(r["moe_measured"], r["moe_simulated"])) for r in rows]
    lines += ["", f"Decode step: mean absolute error {mean:.1f}%, worst {worst:.1f}% over "
                  f"{repeats} calibrations. MoE training step: mean absolute error "
                  f"{statistics.mean(moe):.1f}%, worst {max(moe):.1f}%."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    print(markdown(args.repeats))


if __name__ == "__main__":
    main()
