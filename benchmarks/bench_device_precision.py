"""Time GEMMs in every precision this machine's accelerator runs, and the casts low precision needs.

What a device profile's per-format efficiency is checked against (``efficiency.matmul_<format>``),
below the level of a published run. Run on a machine whose JAX (and, where installed, PyTorch)
sees a GPU:

    PYTHONPATH=. python benchmarks/bench_device_precision.py --out device_precision.csv

One CSV row per measurement (``COLUMNS``), flushed as it goes so a run stopped at ``--budget-s``
keeps what it measured. ``item``:

- ``gemm``: ``[m, k] @ [k, n]`` with bf16 output. ``precision``: ``bf16`` (both operands bf16),
  ``fp8`` (both float8_e4m3fn, one scale per tensor: Transformer Engine's delayed / current
  scaling), ``fp8-e5m2`` (the gradient operand float8_e5m2, the other e4m3: the backward GEMMs of
  the hybrid format), ``fp8-rowwise`` (one scale per row of A and per column of B) and
  ``fp8-blockwise`` (1 x 128 scales on A, 128 x 128 on B: DeepSeek-V3's recipe), where the library
  has them. ``impl``: ``jax`` (XLA's cuBLASLt rewrite of a float8 ``dot_general``) or ``torch``
  (``torch._scaled_mm``).
- ``quantize``: a bf16 ``[m, k]`` tensor to float8_e4m3fn with a per-tensor scale (absolute
  maximum, scale, cast: what current scaling adds before each GEMM), ``nbytes`` = bytes read and
  written by the minimal fused kernel (2 read for the maximum, 2 read + 1 written for the cast).
- ``copy``: ``a + 1`` over a bf16 array (HBM bytes read and written), the memory-rate baseline.

Each time is the median of ``repeats`` timed calls after warm-up (each timed call is ``inner``
back-to-back runs, synchronised once, divided by ``inner``), in seconds. ``--quick`` runs three
small shapes on any backend (CPU included): the smoke test; without it a CPU backend is refused.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_device_layers import FULL_BLOCKS, gemm_shapes  # noqa: E402

COLUMNS = ("device_kind", "backend", "jax_version", "torch_version", "item", "impl", "precision",
           "m", "k", "n", "seconds", "repeats", "nbytes", "error")

EXTRA_SHAPES = (   # square, long-K and the narrow expert GEMMs of fine-grained mixtures of experts
    (8192, 8192, 8192), (16384, 4096, 14336), (4096, 7168, 2048), (4096, 2048, 7168),
    (1024, 7168, 2048), (2048, 4096, 1536), (512, 4096, 1536))
QUICK_SHAPES = ((128, 256, 512), (256, 128, 384), (64, 512, 128))
F8 = jnp.float8_e4m3fn
E5 = jnp.float8_e5m2


def _time(fn, *args, sync, repeats: int, min_s: float = 0.02) -> float:
    """Median seconds of one ``fn(*args)`` call (after two warm-up calls)."""
    for _ in range(2):
        sync(fn(*args))
    t0 = time.perf_counter()
    sync(fn(*args))
    once = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, min(50, int(min_s / once)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        sync(out)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def _jsync(x):
    return jax.block_until_ready(x)


def jax_rows(m: int, k: int, n: int, repeats: int, fp8: bool = True):
    """bf16 and float8 GEMMs through XLA (``fp8=False``: bf16 only)."""
    key = jax.random.split(jax.random.PRNGKey(m * 7 + k * 3 + n), 2)
    a = jax.random.normal(key[0], (m, k), jnp.bfloat16)
    b = jax.random.normal(key[1], (k, n), jnp.bfloat16)
    base = dict(item="gemm", impl="jax", m=m, k=k, n=n)
    yield dict(base, precision="bf16", seconds=_time(jax.jit(jnp.matmul), a, b, sync=_jsync,
                                                     repeats=repeats))
    if not fp8:
        return
    sa, sb = jnp.float32(0.5), jnp.float32(0.25)

    def scaled(a8, b8, sa, sb):   # the pattern XLA's GEMM rewriter turns into one FP8 cuBLASLt call
        return jnp.matmul(a8.astype(jnp.bfloat16) * sa.astype(jnp.bfloat16),
                          b8.astype(jnp.bfloat16) * sb.astype(jnp.bfloat16),
                          preferred_element_type=jnp.bfloat16)

    def direct(a8, b8):
        return jax.lax.dot_general(a8, b8, (((1,), (0,)), ((), ())),
                                   preferred_element_type=jnp.bfloat16)

    for prec, ta, tb in (("fp8", F8, F8), ("fp8-e5m2", E5, F8)):
        a8, b8 = a.astype(ta), b.astype(tb)
        for impl, fn, args in (("jax", jax.jit(scaled), (a8, b8, sa, sb)),
                               ("jax-direct", jax.jit(direct), (a8, b8))):
            try:
                yield dict(base, impl=impl, precision=prec,
                           seconds=_time(fn, *args, sync=_jsync, repeats=repeats))
            except Exception as e:  # noqa: BLE001  (a format this XLA cannot lower: recorded)
                yield dict(base, impl=impl, precision=prec, error=type(e).__name__)

    def quantize(x):
        amax = jnp.max(jnp.abs(x)).astype(jnp.float32)
        scale = 448.0 / jnp.maximum(amax, 1e-12)
        return (x.astype(jnp.float32) * scale).astype(F8), scale

    yield dict(item="quantize", impl="jax", precision="fp8", m=m, k=k, nbytes=5 * m * k,
               seconds=_time(jax.jit(quantize), a, sync=_jsync, repeats=repeats))


def torch_rows(m: int, k: int, n: int, repeats: int):
    """bf16 and float8 GEMMs through ``torch._scaled_mm`` (cuBLASLt), where PyTorch sees a GPU."""
    import torch

    dev = "cuda"
    sync = lambda _: torch.cuda.synchronize()  # noqa: E731
    g = torch.Generator(device=dev).manual_seed(m + k + n)
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device=dev, dtype=torch.bfloat16, generator=g)   # B^T, row-major
    base = dict(item="gemm", impl="torch", m=m, k=k, n=n)
    yield dict(base, precision="bf16",
               seconds=_time(lambda x, y: x @ y.t(), a, b, sync=sync, repeats=repeats))
    one = torch.tensor(1.0, device=dev)
    cases = [("fp8", torch.float8_e4m3fn, torch.float8_e4m3fn, one, one),
             ("fp8-e5m2", torch.float8_e5m2, torch.float8_e4m3fn, one, one),
             ("fp8-rowwise", torch.float8_e4m3fn, torch.float8_e4m3fn,
              torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev))]
    for prec, ta, tb, s_a, s_b in cases:
        a8, b8 = a.to(ta), b.to(tb)
        try:
            fn = lambda x, y, s_a=s_a, s_b=s_b: torch._scaled_mm(  # noqa: E731
                x, y.t(), scale_a=s_a, scale_b=s_b, out_dtype=torch.bfloat16)
            yield dict(base, precision=prec, seconds=_time(fn, a8, b8, sync=sync,
                                                           repeats=repeats))
        except Exception as e:  # noqa: BLE001
            yield dict(base, precision=prec, error=f"{type(e).__name__}: {str(e)[:120]}")
    try:   # DeepSeek-V3's blockwise scaling: 1 x 128 on A (per row, per 128 of K), 128 x 128 on B
        import torch.nn.functional as F
        from torch.nn.functional import ScalingType, SwizzleType

        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        s_a = torch.ones(m, k // 128, device=dev).t().contiguous().t()
        s_b = torch.ones(n // 128, k // 128, device=dev)
        fn = lambda x, y: F.scaled_mm(  # noqa: E731
            x, y.t(), s_a, ScalingType.BlockWise1x128, s_b.t(), ScalingType.BlockWise128x128,
            swizzle_a=SwizzleType.NO_SWIZZLE, swizzle_b=SwizzleType.NO_SWIZZLE,
            output_dtype=torch.bfloat16)
        yield dict(base, precision="fp8-blockwise",
                   seconds=_time(fn, a8, b8, sync=sync, repeats=repeats))
    except Exception as e:  # noqa: BLE001
        yield dict(base, precision="fp8-blockwise", error=f"{type(e).__name__}: {str(e)[:120]}")

    def quantize(x):
        scale = 448.0 / x.abs().amax().float().clamp(min=1e-12)
        return (x.float() * scale).to(torch.float8_e4m3fn), scale

    yield dict(item="quantize", impl="torch", precision="fp8", m=m, k=k, nbytes=5 * m * k,
               seconds=_time(quantize, a, sync=sync, repeats=repeats))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting measurements after this many seconds")
    ap.add_argument("--quick", action="store_true", help="three tiny shapes, any backend")
    ap.add_argument("--min-m", type=int, default=0, help="only shapes of at least this many rows")
    ap.add_argument("--bf16-only-jax", action="store_true",
                    help="time XLA's bf16 GEMM only (its float8 rewrite is the slow part)")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    if backend == "cpu" and not args.quick:
        print("bench_device_precision: JAX sees no accelerator; run on a GPU machine "
              "(or pass --quick for the smoke test)", file=sys.stderr)
        return 2
    try:
        import torch
        torch_version = torch.__version__ if torch.cuda.is_available() else ""
    except ImportError:
        torch_version = ""
    shapes = QUICK_SHAPES if args.quick else sorted(set(gemm_shapes(FULL_BLOCKS))
                                                    | set(EXTRA_SHAPES))
    common = dict(device_kind=jax.devices()[0].device_kind, backend=backend,
                  jax_version=jax.__version__, torch_version=torch_version)
    t_start = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        if not args.quick:
            a = jnp.zeros((2 ** 31 // 2,), jnp.bfloat16)
            w.writerow(dict(common, item="copy", impl="jax", precision="bf16", nbytes=2 ** 32,
                            repeats=args.repeats,
                            seconds=_time(jax.jit(lambda a: a + 1), a, sync=_jsync,
                                          repeats=args.repeats)))
            del a
        for m, k, n in shapes:
            if time.perf_counter() - t_start > args.budget_s:
                print(f"budget spent before {m}x{k}x{n}", file=sys.stderr)
                break
            if m < args.min_m:
                continue
            gens = [jax_rows(m, k, n, args.repeats, fp8=not args.bf16_only_jax)]
            if torch_version:
                gens.append(torch_rows(m, k, n, args.repeats))
            for gen in gens:
                for row in gen:
                    w.writerow(dict(common, repeats=args.repeats, **row))
                    f.flush()
            print(f"{m}x{k}x{n} done at {time.perf_counter() - t_start:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
