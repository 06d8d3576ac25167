"""Time a mixture-of-experts layer's parts on this machine's accelerator: what the expert matmuls
cost at each number of tokens per expert, apart from the routing around them.

Run on a machine whose JAX sees a GPU or TPU:

    PYTHONPATH=. python benchmarks/bench_device_experts.py --out device_experts.csv

One CSV row per measurement (:data:`COLUMNS`), bf16, each the median of ``repeats`` timed calls
after warm-up (the timing of ``bench_device_layers.py``):

- ``experts``: the SwiGLU experts alone as ``zoo.layers.moe_swiglu`` runs them: three batched
  einsums over ``[E, C, h]`` tokens (``C`` tokens per expert) and ``[E, h, f]`` weights, forward
  (``F``) and forward plus backward to the weights and the tokens (``FB``);
- ``moe``: the whole ``moe_swiglu`` on one sample of ``seq_len`` tokens (routing, dispatch,
  experts, combine), ``F`` and ``FB``; ``C`` is then :func:`zoo.layers.expert_capacity`'s.

``--combine`` writes (to ``--out``) and prints a Markdown table instead: the whole layer with the
combine's backward as JAX differentiates it (a scatter-add) against ``zoo.layers._combine``'s
written-out one, F and FB, at 1 and 4 samples.

``--quick`` runs tiny shapes on any backend (the smoke test the suite runs).
``mpmd validate --layers CSV`` compares a CSV with the cost model
(``runtime.calibration.device_layers``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_device_layers import (COLUMNS as BLOCK_COLUMNS, _time,  # noqa: E402
                                            write_rows)
from ir.files import write_atomic  # noqa: E402
from zoo.layers import _silu_mul, expert_capacity, moe_swiglu  # noqa: E402

COLUMNS = BLOCK_COLUMNS + ("experts", "top_k")
"""``bench_device_layers.py``'s columns (``m``: tokens per expert, ``k``: the model width, ``n``:
the expert width) and the experts and experts per token."""

# (experts, hidden, expert_ffn, top_k): Qwen3-235B-A22B's, Mixtral 8x22B's and DeepSeek-V3's
# expert shapes (zoo/configs/)
FULL_SHAPES = ((128, 4096, 1536, 8), (8, 6144, 16384, 2), (32, 7168, 2048, 8))
FULL_CAPACITY = (64, 128, 256, 512, 1024, 2048)
FULL_SEQ = 4096
QUICK_SHAPES = ((4, 64, 32, 2),)
QUICK_CAPACITY = (8, 32)
QUICK_SEQ = 64


def _bf16(key, shape):
    return (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(jnp.bfloat16)


def expert_rows(E: int, h: int, f: int, C: int, repeats: int):
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    x = _bf16(ks[0], (E, C, h)) * 50
    wg, wu, wd = _bf16(ks[1], (E, h, f)), _bf16(ks[2], (E, h, f)), _bf16(ks[3], (E, f, h))
    dy = _bf16(ks[4], (E, C, h))

    def experts(w, x):
        g = jnp.einsum("ech,ehf->ecf", x, w[0])
        u = jnp.einsum("ech,ehf->ecf", x, w[1])
        return jnp.einsum("ecf,efh->ech", _silu_mul(g, u), w[2])

    fwd = jax.jit(experts)
    fb = jax.jit(jax.grad(lambda w, x: jnp.vdot(experts(w, x).astype(jnp.float32),
                                                 dy.astype(jnp.float32)), argnums=(0, 1)))
    base = dict(item="experts", experts=E, m=C, k=h, n=f)
    w = (wg, wu, wd)
    yield dict(base, **{"pass": "F", "seconds": _time(fwd, w, x, repeats=repeats)})
    yield dict(base, **{"pass": "FB", "seconds": _time(fb, w, x, repeats=repeats)})


def moe_rows(E: int, h: int, f: int, k: int, seq_len: int, repeats: int):
    ks = jax.random.split(jax.random.PRNGKey(1), 6)
    x = _bf16(ks[0], (1, seq_len, h)) * 50
    w = (_bf16(ks[1], (h, E)), _bf16(ks[2], (E, h, f)), _bf16(ks[3], (E, h, f)),
         _bf16(ks[4], (E, f, h)))
    dy = _bf16(ks[5], x.shape)

    def layer(w, x):
        return moe_swiglu(x, *w, top_k=k, capacity_factor=1.0)

    fwd = jax.jit(layer)
    fb = jax.jit(jax.grad(lambda w, x: jnp.vdot(layer(w, x).astype(jnp.float32),
                                                 dy.astype(jnp.float32)), argnums=(0, 1)))
    base = dict(item="moe", experts=E, top_k=k, k=h, n=f, seq_len=seq_len, samples=1,
                m=expert_capacity(seq_len, k, E, 1.0))
    yield dict(base, **{"pass": "F", "seconds": _time(fwd, w, x, repeats=repeats)})
    yield dict(base, **{"pass": "FB", "seconds": _time(fb, w, x, repeats=repeats)})


def _autodiff_combine(y, index, inverse, gates):
    """``zoo.layers._combine`` as it was before its backward was written out: the gather and
    gated sum, differentiated by JAX (the gather's transpose is a scatter-add)."""
    return jnp.einsum("tkh,tk->th", jnp.take(y, index, axis=0, mode="fill", fill_value=0), gates)


def combine_lines(shapes, seq_len: int, samples: tuple[int, ...], repeats: int):
    """Markdown lines: the whole ``moe_swiglu`` (F and FB, ``samples`` samples of ``seq_len``
    tokens) with its combine differentiated by JAX against ``zoo.layers._combine``'s written-out
    backward, and the largest difference of their gradients."""
    import zoo.layers as layers

    yield ("| experts | width | top k | samples | F autodiff / written-out (ms) "
           "| FB autodiff / written-out (ms) | gradient max difference |")
    yield "|---|---|---|---|---|---|---|"
    ours = layers._combine
    for E, h, f, k in shapes:
        ks = jax.random.split(jax.random.PRNGKey(3), 6)
        w = (_bf16(ks[1], (h, E)), _bf16(ks[2], (E, h, f)), _bf16(ks[3], (E, h, f)),
             _bf16(ks[4], (E, f, h)))
        for b in samples:
            x = _bf16(ks[0], (b, seq_len, h)) * 50
            dy = _bf16(ks[5], x.shape)
            got = {}
            try:
                for name, comb in (("autodiff", _autodiff_combine), ("ours", ours)):
                    layers._combine = comb      # moe_swiglu looks it up when traced

                    def layer(w, x):
                        return moe_swiglu(x, *w, top_k=k, capacity_factor=1.0)

                    fb = jax.jit(jax.grad(lambda w, x: jnp.vdot(
                        layer(w, x).astype(jnp.float32), dy.astype(jnp.float32)), argnums=(0, 1)))
                    got[name] = (_time(jax.jit(layer), w, x, repeats=repeats),
                                 _time(fb, w, x, repeats=repeats), fb(w, x))
            finally:
                layers._combine = ours
            diff = max(float(jnp.abs(a.astype(jnp.float32) - c.astype(jnp.float32)).max())
                       for a, c in zip(jax.tree.leaves(got["autodiff"][2]),
                                       jax.tree.leaves(got["ours"][2])))
            (fa, fba, _), (fo, fbo, _) = got["autodiff"], got["ours"]
            yield (f"| {E} | {h} | {k} | {b} | {fa * 1e3:.2f} / {fo * 1e3:.2f} "
                   f"| {fba * 1e3:.2f} / {fbo * 1e3:.2f} | {diff:.3g} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV (Markdown with --combine) to write")
    ap.add_argument("--quick", action="store_true", help="tiny shapes on any backend (smoke test)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--moe-only", action="store_true", help="only the whole-layer (moe) rows")
    ap.add_argument("--combine", action="store_true",
                    help="print the layer with its combine differentiated by JAX against the "
                         "written-out backward (zoo.layers._combine), instead of the CSV")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop starting new measurements after this many seconds")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    if backend == "cpu" and not args.quick:
        print("bench_device_experts: JAX's backend is cpu; run it where JAX sees a GPU or TPU, "
              "or pass --quick for the CPU smoke run", file=sys.stderr)
        return 2
    shapes, caps, seq = ((QUICK_SHAPES, QUICK_CAPACITY, QUICK_SEQ) if args.quick
                         else (FULL_SHAPES, FULL_CAPACITY, FULL_SEQ))
    if args.combine:
        text = "\n".join(combine_lines(shapes, seq, (1, 4), args.repeats)) + "\n"
        write_atomic(Path(args.out), text)
        print(text, end="")
        return 0
    jobs = [lambda a=(E, h, f, k): list(moe_rows(*a, seq, args.repeats)) for E, h, f, k in shapes]
    jobs += [lambda a=(E, h, f, C): list(expert_rows(*a, args.repeats))
             for E, h, f, _ in shapes for C in (() if args.moe_only else caps)]
    write_rows(jobs, Path(args.out), COLUMNS, args.repeats, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
