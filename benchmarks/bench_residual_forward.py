"""What a training forward costs on XLA:CPU beside the plain forward.

``mpmd run``'s training forward is the forward that keeps its residuals for the backward (a
``jax.vjp`` forward), which is what ``mpmd calibrate`` times; until stop 36 it timed the plain
forward (``jax.jit(fn)``). This times both, and the backward on the kept residuals, for one
decoder block of the tiny mixture of experts (``zoo/configs/tiny-moe.yaml``) and of the same
block with a dense SwiGLU MLP, on 2 CPU devices as data parallel 2 and (the MoE) expert parallel
2: the gap that kept ``mpmd run``'s MoE step over its simulation while calibrate timed the plain
forward (issue 22's step-time figure).

    python benchmarks/bench_residual_forward.py

Each figure is the median of ``repeats`` calls after two warm-up calls, in milliseconds; timings
depend on the machine and its load, so nothing here is asserted by the test suite beyond the
table's shape.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

ROOT = Path(__file__).resolve().parents[1]
MOE_MODEL = ROOT / "zoo" / "configs" / "tiny-moe.yaml"


def rows(samples: int = 2, repeats: int = 31) -> list[tuple[str, str, float, float, float, float]]:
    """(block, layout, plain forward ms, forward keeping residuals ms, backward ms, residual KB
    per sample) for the dense and the MoE block."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding

    from ir import Layout
    from runtime.calibration.timing import placed_params, time_call
    from runtime.train.layouts import batch_spec, layout_mesh
    from zoo import workload
    from zoo.config import get_config
    from zoo.decoder import block_fn, block_shapes
    from zoo.model_files import load_model_file

    if len(jax.devices()) < 2:
        raise SystemExit("bench_residual_forward: needs 2 JAX devices; run it where "
                         "jax_num_cpu_devices >= 2 (this script sets it before JAX starts)")
    moe = load_model_file(MOE_MODEL)
    dense = get_config(moe, experts=0, experts_per_token=0, expert_ffn=0)   # the same block, dense
    out = []
    for name, cfg, layouts in (("dense", dense, (Layout(2, 1),)),
                               ("moe", moe, (Layout(2, 1), Layout(2, 1, expert=2)))):
        resid = workload(cfg, samples).costs["decoder_block"].residual_bytes_per_sample / 1e3
        for lay in layouts:
            mesh = layout_mesh(jax.devices()[:2], lay)
            p = placed_params(cfg, block_shapes(cfg), mesh, lay, jax.random.PRNGKey(0))
            fwd = jax.jit(lambda p, h, cfg=cfg: block_fn(cfg)(p, h))
            keep = jax.jit(lambda p, h, cfg=cfg: jax.vjp(lambda p, h: block_fn(cfg)(p, h), p, h))
            bwd = jax.jit(lambda f, c: f(c))
            x = jax.device_put(jnp.ones((samples, cfg.seq_len, cfg.hidden), cfg.jnp_dtype) * 0.1,
                               NamedSharding(mesh, batch_spec(lay)))
            y, vjp_fn = keep(p, x)
            out.append((name, str(lay), time_call(fwd, p, x, repeats=repeats) * 1e3,
                        time_call(keep, p, x, repeats=repeats) * 1e3,
                        time_call(bwd, vjp_fn, jnp.ones_like(y), repeats=repeats) * 1e3, resid))
    return out


def markdown(samples: int = 2, repeats: int = 31) -> str:
    """The table, measured in a fresh process (its JAX gets 8 CPU devices whatever this process's
    JAX already started with)."""
    import subprocess

    r = subprocess.run([sys.executable, __file__, "--samples", str(samples), "--repeats",
                        str(repeats)], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 0:
        raise RuntimeError(f"bench_residual_forward failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def _table(samples: int, repeats: int) -> str:
    lines = [f"One decoder block of `zoo/configs/tiny-moe.yaml` (and the same block with a dense "
             f"MLP), {samples} samples on 2 CPU devices, median of {repeats} calls: the plain "
             "forward against the forward that keeps its residuals, which `mpmd calibrate` times and "
             "`mpmd run` executes. `python benchmarks/bench_residual_forward.py`", "",
             "| block | layout | plain forward (ms) | forward keeping residuals (ms) | ratio | "
             "backward (ms) | residuals (KB per sample) |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, lay, f, k, b, r in rows(samples, repeats):
        lines.append(f"| {name} | {lay} | {f:.3f} | {k:.3f} | {k / f:.2f} | {b:.3f} | {r:,.0f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=31)
    args = ap.parse_args(argv)
    print(_table(args.samples, args.repeats), end="")


if __name__ == "__main__":
    import jax

    jax.config.update("jax_num_cpu_devices", 8)
    main()
