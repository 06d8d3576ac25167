"""A random sweep of plans (models x clusters x batch x sequence), each checked end to end.

Usage:
    python benchmarks/bench_sweep.py [--cases 500] [--time-limit 1] [--seed 0] [--runs 3]

Each case draws a zoo model (dense, grouped-query, multi-head, mixture-of-experts, MLA, hybrid
Mamba; head counts 1-128), a bundled training cluster (one kind, node groups, mesh listings, two
and three kinds, 8 to 2,048 devices), a global batch and a sequence length, and runs the user's
path in-process (``mpmd plan ... --out``, then ``mpmd export --to`` every target). A case passes
when:

- the plan is written, or refused in one line with exit status 2 (too little memory for the
  batch: the reason is counted);
- every mesh's layout can run the model (:func:`ir.layouts_problem` on the model's
  :func:`zoo.shard_dims`: tensor parallel divides the heads and widths, expert parallel the
  experts, context parallel the sequence);
- the plan's predicted step equals the discrete-event replay of its written JSON (what ``mpmd
  simulate`` prints) within 1%;
- its MFU is in (0, 1] and its roofline bound (model FLOP over the devices' peak for the plan's
  precision) is no longer than the step;
- every export target writes the file or refuses in one line (exit 2); nothing raises.

``--runs K`` also plans K tiny models (llama-tiny, tiny-moe, tiny-mla-moe, tiny-hybrid,
tiny-llama) on the CPU clusters with random batch and sequence, and runs each ``mpmd run --steps
1`` (compiled, checked against jax.jit): the compiler half of "every plan runs".

The search is governed by its nominal work budget (``--time-limit`` seconds of the reference
machine's work), so the cases' plans do not depend on this machine's load.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from click.testing import CliRunner  # noqa: E402

from ir import DataParallelPlan, Prediction, layouts_problem  # noqa: E402
from ir.vocab import EXPORT_TARGETS  # noqa: E402
from mpmd.cli.main import main as cli  # noqa: E402
from mpmd.cli.simulate import load_plan_inputs  # noqa: E402
from simulator.plan_sim import plan_cluster, simulate_any  # noqa: E402
from zoo.config import get_config, shard_dims  # noqa: E402
from zoo.model_files import plan_model  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "opt-350m", "grok-1-314b",
          "deepseek-v3", "gemma-2-9b", "gemma-3-1b-pt", "gpt-neox-20b", "gpt-oss-120b", "gpt2",
          "llama-3.2-1b-instruct", "llama-3.2-3b-instruct", "mistral-7b-v0.1", "mixtral-8x22b-v0.1",
          "nemotron-3-nano-30b-a3b", "opt-1.3b", "qwen2.5-7b", "qwen3-235b-a22b", "qwen3-30b-a3b",
          "qwen3-8b")
"""Training models of the zoo and its shipped configs (``mpmd models``)."""
CLUSTERS = ("a100x32_gcp_nodes", "a100x80_gcp_nodes", "a100x128_gcp_nodes", "a100x1024_nodes",
            "a100x32_v100x96_nodes", "a100x80_v100x240_nodes", "a100x128_v100x384_nodes",
            "gb200x72_nodes", "gb200x256_nodes", "gb300x72_nodes", "h100x64", "h100x64_nodes",
            "h100x128", "h100x128_nodes", "h100x256_nodes", "h100x512_nodes", "h100x2048_nodes",
            "h100x16_p150bx32", "h100x32_p150bx128_nodes", "mixed512_nodes", "mixed512_chain",
            "p150bx256_nodes", "tpuv5e256", "tpuv6e128", "tpuv5e256_h100x16", "quietbox_p150x4",
            "loudbox_p150bx8")
"""Bundled training clusters, 4 to 2,048 devices (the 4,096 and 16,384-device files are left to
the planner-at-scale section)."""
BATCHES = (8, 16, 32, 64, 128, 256, 512, 1024)
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
TINY = ("llama-tiny", "tiny-moe", "tiny-mla-moe", "tiny-hybrid", "tiny-llama")
CPU_CLUSTERS = ("cpu4x2", "cpu4x2_nodes", "cpu_uneven")


def draw(n: int, seed: int) -> list[tuple[str, str, int, int]]:
    """``n`` cases (model, cluster file stem, global batch, sequence length), reproducible."""
    rng = random.Random(seed)
    return [(rng.choice(MODELS), rng.choice(CLUSTERS), rng.choice(BATCHES), rng.choice(SEQS))
            for _ in range(n)]


def _first_line(text: str) -> str:
    """The error line of a CLI's output (``error: ...``), else its last non-blank line."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.lower().startswith("error")]
    return (errs or lines or [""])[-1]


def check_plan(path: Path, model: str) -> list[str]:
    """The defects of the plan written at ``path`` (empty: none): an invalid layout, a prediction
    off the replay by more than 1%, MFU outside (0, 1], a roofline bound above the step."""
    plan, w, cluster = load_plan_inputs(str(path))
    doc = json.loads(path.read_text())
    bad = []
    dims = shard_dims(get_config(plan_model(plan.model, plan.model_config)))
    parts = plan.parts if isinstance(plan, DataParallelPlan) else (plan,)
    for part in parts:
        why = layouts_problem(dims, part.layouts)
        if why:
            bad.append(f"invalid layout: {why}")
    pred = Prediction.from_json(doc["predicted"]) if doc.get("predicted") else None
    if pred is None:
        return bad + ["no prediction in the plan file"]
    sim = simulate_any(plan, w, plan_cluster(plan, cluster))
    err = abs(sim.step_time_s - pred.step_time_s) / sim.step_time_s
    if err > 0.01:
        bad.append(f"predicted {pred.step_time_s:.4g} s vs replayed {sim.step_time_s:.4g} s "
                   f"({err:+.1%})")
    if not 0 < pred.mfu <= 1:
        bad.append(f"MFU {pred.mfu:.3f} outside (0, 1]")
    bound = pred.roofline_step_time_s
    if bound and bound > pred.step_time_s * 1.0001:
        bad.append(f"roofline bound {bound:.4g} s above the step {pred.step_time_s:.4g} s")
    return bad


def run_case(runner: CliRunner, tmp: Path, model: str, cluster: str, batch: int, seq: int,
             time_limit: float) -> dict:
    """One case through plan, replay and export; a dict with ``status`` (planned / refused /
    defect), ``why`` and, when planned, ``step_s`` and the export outcomes."""
    out = tmp / "plan.json"
    out.unlink(missing_ok=True)
    args = ["plan", "--model", model, "--cluster", str(ROOT / "hardware_profiles" / "clusters" /
                                                       f"{cluster}.yaml"),
            "--global-batch", str(batch), "--seq-len", str(seq), "--time-limit", str(time_limit),
            "--out", str(out)]
    t0 = time.perf_counter()
    r = runner.invoke(cli, args, catch_exceptions=True)
    wall = time.perf_counter() - t0
    case = {"model": model, "cluster": cluster, "batch": batch, "seq": seq, "wall": wall}
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        tb = "".join(traceback.format_exception(r.exception)).strip().splitlines()[-1]
        return {**case, "status": "defect", "why": f"plan raised: {tb}"}
    if r.exit_code != 0:
        text = (r.stderr if r.stderr_bytes is not None else "") or r.output
        line = _first_line(text)
        status = "refused" if r.exit_code == 2 and "Traceback" not in text else "defect"
        return {**case, "status": status, "why": line}
    try:
        bad = check_plan(out, model)
    except Exception as e:  # noqa: BLE001: a defect to report, not to stop the sweep on
        bad = [f"replay raised {type(e).__name__}: {e}"]
    exports = {}
    for target in EXPORT_TARGETS:
        dest = tmp / f"export-{target.replace('@', '-')}"
        e = runner.invoke(cli, ["export", str(out), "--to", target, "--out", str(dest)],
                          catch_exceptions=True)
        if e.exception is not None and not isinstance(e.exception, SystemExit):
            bad.append(f"export --to {target} raised {type(e.exception).__name__}: {e.exception}")
            exports[target] = "raised"
        elif e.exit_code == 0:
            exports[target] = "written"
        elif e.exit_code == 2:
            exports[target] = "refused"
        else:
            bad.append(f"export --to {target} exit {e.exit_code}: {_first_line(e.output)}")
            exports[target] = "failed"
    step = (json.loads(out.read_text()).get("predicted") or {}).get("step_time_s")
    return {**case, "status": "defect" if bad else "planned", "why": "; ".join(bad),
            "step_s": step, "exports": exports}


def run_tiny(runner: CliRunner, tmp: Path, k: int, seed: int) -> list[dict]:
    """``k`` tiny plans on the CPU clusters, each run ``mpmd run --steps 1``."""
    rng = random.Random(seed + 1)
    rows = []
    for _ in range(k):
        model, cluster = rng.choice(TINY), rng.choice(CPU_CLUSTERS)
        batch, seq = rng.choice((8, 16, 32)), rng.choice((32, 64, 128))
        out = tmp / "tiny.json"
        out.unlink(missing_ok=True)
        r = runner.invoke(cli, ["plan", "--model", model, "--cluster",
                                str(ROOT / "hardware_profiles" / "clusters" / f"{cluster}.yaml"),
                                "--global-batch", str(batch), "--seq-len", str(seq),
                                "--time-limit", "2", "--out", str(out)], catch_exceptions=True)
        row = {"model": model, "cluster": cluster, "batch": batch, "seq": seq}
        if r.exit_code != 0:
            rows.append({**row, "status": "refused" if r.exit_code == 2 else "defect",
                         "why": _first_line(r.output)})
            continue
        t0 = time.perf_counter()     # its own process: the CPU meshes' device count is set
        run = subprocess.run([sys.executable, "-m", "mpmd.cli.main", "run", str(out), "--steps", "1"],
                             capture_output=True, text=True, cwd=tmp)   # before JAX starts
        ok = run.returncode == 0 and "(a) max rel error" in run.stdout
        rows.append({**row, "status": "ran" if ok else "defect", "wall": time.perf_counter() - t0,
                     "why": "" if ok else _first_line(run.stderr or run.stdout)})
    return rows


def sweep(cases: int, time_limit: float, seed: int, runs: int) -> tuple[list[dict], list[dict]]:
    runner = CliRunner()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = []
        for i, (model, cluster, batch, seq) in enumerate(draw(cases, seed)):
            rows.append(run_case(runner, tmp, model, cluster, batch, seq, time_limit))
            r = rows[-1]
            print(f"[{i + 1}/{cases}] {model} on {cluster} b{batch} s{seq}: {r['status']} "
                  f"{r.get('why', '')[:160]} ({r['wall']:.1f} s)", file=sys.stderr, flush=True)
        tiny = run_tiny(runner, tmp, runs, seed)
    return rows, tiny


def markdown(cases: int = 500, time_limit: float = 1.0, seed: int = 0, runs: int = 3) -> str:
    t0 = time.perf_counter()
    rows, tiny = sweep(cases, time_limit, seed, runs)
    wall = time.perf_counter() - t0
    count = collections.Counter(r["status"] for r in rows)
    reasons = collections.Counter(r["why"].removeprefix("error: ")[:100] for r in rows
                                  if r["status"] == "refused")
    exports = collections.Counter((t, o) for r in rows for t, o in r.get("exports", {}).items())
    lines = [f"`python benchmarks/bench_sweep.py --cases {cases} --time-limit {time_limit:g} "
             f"--seed {seed} --runs {runs}`: {cases} random cases (model x cluster x batch x "
             f"sequence), each planned, replayed from its JSON and exported; {wall / 60:.0f} min.",
             "", "| outcome | cases |", "|---|---:|"]
    lines += [f"| {k} | {count.get(k, 0)} |" for k in ("planned", "refused", "defect")]
    lines += ["", "Checks on every planned case: each mesh's layout runs the model "
              "(`ir.layouts_problem`), predicted = replayed within 1%, MFU in (0, 1], roofline "
              "bound <= step; export to every target written or refused in one line.", "",
              "| export target | written | refused |", "|---|---:|---:|"]
    lines += [f"| {t} | {exports.get((t, 'written'), 0)} | {exports.get((t, 'refused'), 0)} |"
              for t in EXPORT_TARGETS]
    if reasons:
        lines += ["", "Refusals (no plan; first words of the one-line reason):", ""]
        lines += [f"- {n} x {why}" for why, n in reasons.most_common(8)]
    defects = [r for r in rows if r["status"] == "defect"] + [t for t in tiny if t["status"] == "defect"]
    lines += ["", f"Defects: {len(defects)}."]
    lines += [f"- {r['model']} on {r['cluster']} b{r['batch']} s{r['seq']}: {r['why']}"
              for r in defects[:20]]
    ran = sum(t["status"] == "ran" for t in tiny)
    lines += ["", f"Scaled down and run (`mpmd run --steps 1` on the CPU meshes, checked against "
              f"jax.jit): {ran} of {len(tiny)} tiny plans ran "
              + "(" + ", ".join(f"{t['model']} on {t['cluster']} b{t['batch']} s{t['seq']}: "
                                f"{t['status']}" for t in tiny) + ")."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=500)
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    print(markdown(a.cases, a.time_limit, a.seed, a.runs))
