"""Time the zoo's layers on this machine's accelerator: the measurements a device profile is fitted on.

Run on a machine whose JAX sees a GPU or TPU (it needs nothing of this project but ``zoo``'s
config and layers, and JAX):

    PYTHONPATH=. python benchmarks/bench_device_layers.py --out device_layers.csv

It writes one CSV row per measurement (``runtime.calibration.device_layers.COLUMNS``), flushed as it
goes so a run stopped at ``--budget-s`` keeps what it measured:

- ``gemm``: one bf16 matrix product ``[m, k] @ [k, n]`` (the shapes of the blocks below);
- ``copy``: an elementwise ``a + 1`` over a bf16 array (HBM bytes read and written);
- ``h2d`` / ``d2h``: a host-to-device and a device-to-host copy (the host link);
- ``block``: one decoder block of a zoo model, forward (``F``) and forward plus backward (``FB``)
  with respect to parameters and input, bf16, attention through ``jax.nn.dot_product_attention``
  (cuDNN's fused flash attention on NVIDIA GPUs). ``tensor`` = t runs one tensor-parallel shard
  of the block as Megatron splits it (heads, key/value heads and MLP width divided by t; the
  all-reduces are not run: one device has no peer), so the row times what one device of a TP-t
  layout computes. ``--moe`` adds mixture-of-experts blocks of shipped configs (``MOE_BLOCKS``),
  whole: one device of an expert-parallel layout routes its own tokens and runs every expert's
  share of them (the same FLOP as its experts' shard of every device's tokens).

Each time is the median of ``repeats`` timed calls after warm-up (each timed call is ``inner``
back-to-back runs, synchronised once, divided by ``inner``), in seconds. Nothing here predicts:
``python -m runtime.calibration.device_layers`` compares a CSV with the cost model.

``--quick`` runs a tiny model on any backend (CPU included) in seconds: the smoke test the suite
runs; without it the script refuses a CPU backend.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zoo import decoder  # noqa: E402  (the zoo's JAX layers; imports no other package)
from zoo.config import ModelConfig, get_config, tensor_shard  # noqa: E402
from zoo.model_files import resolve_model  # noqa: E402

COLUMNS = ("device_kind", "backend", "jax_version", "item", "model", "tensor", "samples",
           "seq_len", "m", "k", "n", "pass", "seconds", "repeats", "nbytes", "attention",
           "heads", "kv_heads", "head_dim")

FULL_BLOCKS = (   # (model, seq_len, tensor degrees, samples): what production layouts run per device
    ("llama3-8b", 8192, (1, 2, 4, 8), (1,)),
    ("llama3-8b", 8192, (1, 8), (2,)),
    ("llama3-70b", 8192, (2, 4, 8), (1,)),
    ("gpt3-175b", 2048, (4, 8), (1, 2)),
    ("opt-350m", 2048, (1,), (8, 16)),      # a small model: 16 heads of width 64 at 2k tokens
)
QUICK_BLOCKS = (("llama-tiny", 64, (1, 2), (1, 2)),)
MOE_BLOCKS = (    # (shipped config, seq_len, tensor degrees, samples): one mixture-of-experts block,
    ("mixtral-8x22b-v0.1", 4096, (1,), (1, 2)),    # whole, as one device of an expert-parallel
    ("qwen3-235b-a22b", 4096, (1,), (1, 2)),       # layout computes it (its tokens, every expert)
    ("deepseek-v3", 2048, (1,), (1,)),             # MLA: scores materialized (xla rows)
)
QUICK_MOE_BLOCKS = (("tiny-moe", 64, (1,), (1, 2)), ("tiny-mla-moe", 64, (1,), (1,)))
FULL_ATTENTION = (  # (heads, kv_heads, head_dim, seq_len, samples): cores of the blocks above, MPT's
    (16, 16, 128, 2048, 8),     # a 2048-wide multi-head model (MPT-1B's core), 16k tokens
    (32, 32, 128, 2048, 4),     # 4096-wide multi-head (MPT-7B), 8k tokens
    (56, 56, 128, 2048, 2),     # 7168-wide multi-head (MPT-30B)
    (32, 8, 128, 8192, 1),      # Llama 3 8B, whole
    (8, 1, 128, 8192, 1),       # Llama 3 70B, one TP8 shard
    (12, 12, 128, 2048, 4),     # GPT-3 175B, one TP8 shard
    (16, 16, 64, 2048, 8),      # head_dim 64
    (32, 8, 128, 2048, 4),      # Llama 3 8B core at 2k tokens
    (32, 8, 128, 16384, 1),     # ... and at 16k
)
QUICK_ATTENTION = ((4, 2, 32, 64, 2),)


def shard(cfg: ModelConfig, tensor: int, seq_len: int) -> ModelConfig:
    """One tensor-parallel shard of ``cfg`` (:func:`zoo.config.tensor_shard`) at ``seq_len`` tokens,
    bf16, attention through ``jax.nn.dot_product_attention`` (multi-head latent attention, whose
    values are narrower than its queries and keys, through the zoo's plain attention: scores
    materialized, the ``xla`` rows)."""
    return dataclasses.replace(tensor_shard(cfg, tensor), seq_len=seq_len, dtype="bfloat16",
                               attention="plain" if cfg.mla else "fused")


def _time(fn, *args, repeats: int, min_s: float = 0.02) -> float:
    """Median seconds of one ``fn(*args)`` call (after two warm-up calls)."""
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    once = max(time.perf_counter() - t0, 1e-6)
    inner = max(1, min(50, int(min_s / once)))
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            out = fn(*args)
        jax.block_until_ready(out)
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def _init(shapes: dict, key) -> dict:
    keys = jax.random.split(key, len(shapes))
    return {name: (0.02 * jax.random.normal(kk, s, jnp.float32)).astype(jnp.bfloat16)
            for kk, (name, s) in zip(keys, sorted(shapes.items()))}


def block_rows(model: str, seq_len: int, tensor: int, samples: int, repeats: int):
    cfg = shard(resolve_model(model), tensor, seq_len)
    block = decoder.block_fn(cfg)
    p = _init(decoder.block_shapes(cfg), jax.random.PRNGKey(0))
    x = jax.random.normal(jax.random.PRNGKey(1), (samples, seq_len, cfg.hidden), jnp.bfloat16)
    dy = jax.random.normal(jax.random.PRNGKey(2), x.shape, jnp.bfloat16)
    fwd = jax.jit(block)
    fb = jax.jit(jax.value_and_grad(
        lambda p, x: jnp.vdot(block(p, x).astype(jnp.float32), dy.astype(jnp.float32)),
        argnums=(0, 1)))
    base = dict(item="block", model=model, tensor=tensor, samples=samples, seq_len=seq_len,
                attention="cudnn" if jax.default_backend() == "gpu" and cfg.attention == "fused"
                else "xla")
    yield dict(base, **{"pass": "F", "seconds": _time(fwd, p, x, repeats=repeats)})
    yield dict(base, **{"pass": "FB", "seconds": _time(fb, p, x, repeats=repeats)})


def attention_rows(heads: int, kv_heads: int, head_dim: int, seq_len: int, samples: int,
                   repeats: int):
    """The causal attention core alone, ``[samples, seq_len, heads, head_dim]`` queries against
    ``kv_heads`` key/value heads, through ``jax.nn.dot_product_attention`` (cuDNN's fused flash
    attention on an NVIDIA GPU, XLA's lowering elsewhere): forward (``F``) and forward plus the
    backward to q, k and v (``FB``)."""
    ks = jax.random.split(jax.random.PRNGKey(5), 4)
    q = jax.random.normal(ks[0], (samples, seq_len, heads, head_dim), jnp.bfloat16)
    k = jax.random.normal(ks[1], (samples, seq_len, kv_heads, head_dim), jnp.bfloat16)
    v = jax.random.normal(ks[2], k.shape, jnp.bfloat16)
    do = jax.random.normal(ks[3], q.shape, jnp.bfloat16)
    impl = "cudnn" if jax.default_backend() == "gpu" else None
    core = functools.partial(jax.nn.dot_product_attention, is_causal=True, implementation=impl)
    fwd = jax.jit(core)
    fb = jax.jit(jax.grad(lambda q, k, v: jnp.vdot(core(q, k, v).astype(jnp.float32),
                                                    do.astype(jnp.float32)), argnums=(0, 1, 2)))
    base = dict(item="attention", samples=samples, seq_len=seq_len, heads=heads,
                kv_heads=kv_heads, head_dim=head_dim, attention=impl or "xla")
    yield dict(base, **{"pass": "F", "seconds": _time(fwd, q, k, v, repeats=repeats)})
    yield dict(base, **{"pass": "FB", "seconds": _time(fb, q, k, v, repeats=repeats)})


def gemm_shapes(blocks) -> list[tuple[int, int, int]]:
    """The forward GEMMs of the blocks' shards: ``[tokens, h] @ [h, n]`` and back."""
    out = set()
    for model, seq_len, tensors, samples in blocks:
        cfg = get_config(model)
        for t in tensors:
            for b in samples:
                tok, h, f = b * seq_len, cfg.hidden, cfg.ffn // t
                qkv = (cfg.heads + 2 * cfg.kv_heads) * cfg.head_dim // t
                out |= {(tok, h, f), (tok, f, h), (tok, h, qkv)}
    return sorted(out)


def gemm_row(m: int, k: int, n: int, repeats: int) -> dict:
    a = jax.random.normal(jax.random.PRNGKey(3), (m, k), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(4), (k, n), jnp.bfloat16)
    s = _time(jax.jit(jnp.matmul), a, b, repeats=repeats)
    return dict(item="gemm", m=m, k=k, n=n, seconds=s, nbytes=2 * (m * k + k * n + m * n))


def copy_row(nbytes: int, repeats: int) -> dict:
    a = jnp.zeros((nbytes // 2,), jnp.bfloat16)
    s = _time(jax.jit(lambda a: a + 1), a, repeats=repeats)
    return dict(item="copy", seconds=s, nbytes=2 * nbytes)


def host_rows(nbytes: int, repeats: int):
    host = np.ones((nbytes // 4,), np.float32)
    dev = jax.devices()[0]
    yield dict(item="h2d", nbytes=nbytes,
               seconds=_time(lambda h: jax.device_put(h, dev), host, repeats=repeats, min_s=0))
    # a fresh device array per copy: a jax.Array caches its host copy after the first transfer
    arrays = [jax.block_until_ready(jax.device_put(host, dev) + i) for i in range(repeats + 1)]
    np.asarray(arrays.pop())
    times = []
    for a in arrays:
        t0 = time.perf_counter()
        np.asarray(a)
        times.append(time.perf_counter() - t0)
    yield dict(item="d2h", nbytes=nbytes, seconds=statistics.median(times))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--quick", action="store_true", help="a tiny model on any backend (smoke test)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--blocks-only", action="store_true", help="skip the GEMM, copy and host rows")
    ap.add_argument("--models", default="", help="comma-separated: only these models' blocks")
    ap.add_argument("--moe", action="store_true",
                    help="also time mixture-of-experts blocks of shipped configs (MOE_BLOCKS)")
    ap.add_argument("--no-attention", action="store_true", help="skip the attention cores")
    ap.add_argument("--attention-first", action="store_true",
                    help="time the attention cores before everything else")
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop starting new measurements after this many seconds")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    if backend == "cpu" and not args.quick:
        print("bench_device_layers: JAX's backend is cpu; run it where JAX sees a GPU or TPU, "
              "or pass --quick for the CPU smoke run", file=sys.stderr)
        return 2
    blocks = QUICK_BLOCKS if args.quick else FULL_BLOCKS
    moe = (QUICK_MOE_BLOCKS if args.quick else MOE_BLOCKS) if args.moe else ()
    if args.models:
        blocks = tuple(b for b in blocks if b[0] in args.models.split(","))
        moe = tuple(b for b in moe if b[0] in args.models.split(","))
    mib = 1 << 20
    copy_bytes, host_bytes = (4 * mib, 4 * mib) if args.quick else (2048 * mib, 1024 * mib)
    jobs = [] if args.blocks_only else [lambda: [copy_row(copy_bytes, args.repeats)],
                                        lambda: list(host_rows(host_bytes, args.repeats))]
    if not args.blocks_only:
        jobs += [lambda s=s: [gemm_row(*s, args.repeats)] for s in gemm_shapes(blocks)]
    jobs += [lambda a=(m, s, t, b): list(block_rows(*a, args.repeats))
             for m, s, ts, bs in blocks + moe for t in ts for b in bs]
    attn = [lambda a=a: list(attention_rows(*a, args.repeats))
            for a in (() if args.no_attention else QUICK_ATTENTION if args.quick
                      else FULL_ATTENTION)]
    jobs = attn + jobs if args.attention_first else jobs + attn
    write_rows(jobs, Path(args.out), COLUMNS, args.repeats, args.budget_s)
    return 0


def write_rows(jobs, out: Path, columns: tuple[str, ...], repeats: int, budget_s: float) -> None:
    """Run ``jobs`` (each returns a list of row dicts) in order and write their rows to the CSV
    ``out`` under ``columns``, each with the device kind, backend, JAX version and ``repeats``:
    flushed and printed as they come, into ``out.partial`` (renamed to ``out`` at the end), so a
    run stopped at ``budget_s`` seconds, or killed, keeps what it measured. A job that raises
    (out of memory, an unsupported kernel) is skipped with a one-line message."""
    common = dict(device_kind=jax.devices()[0].device_kind, backend=jax.default_backend(),
                  jax_version=jax.__version__, repeats=repeats)
    start = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=columns, restval="")
        w.writeheader()
        for job in jobs:
            if time.perf_counter() - start > budget_s:
                print(f"budget of {budget_s:.0f} s spent: stopping", file=sys.stderr)
                break
            try:
                rows = job()
            except Exception as e:    # one failed shape (memory, an unsupported kernel) is a gap
                print(f"skipped: {type(e).__name__}: {str(e).splitlines()[0][:200]}", file=sys.stderr)
                continue
            for r in rows:
                row = dict(common, **r)
                w.writerow(row)
                fh.flush()
                print(",".join(str(row.get(c, "")) for c in columns), flush=True)
    os.replace(tmp, out)


if __name__ == "__main__":
    sys.exit(main())
