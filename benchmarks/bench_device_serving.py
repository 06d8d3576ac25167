"""Time LLM serving steps (decode with a KV cache, prefill) on this machine's accelerator.

Run where JAX sees a GPU or TPU (it needs only ``zoo.config`` and JAX):

    PYTHONPATH=. python benchmarks/bench_device_serving.py --out device_serving.csv

One CSV row per measurement (:data:`COLUMNS`), flushed as it goes, of a WHOLE model's forward
step (every block, the final norm and the output head) as one device of a tensor-parallel layout
runs it (:func:`zoo.config.tensor_shard`: heads, key/value heads and MLP width divided by
``tensor``, the vocabulary too; the all-reduces are not run, one device has no peer), bf16:

- ``decode``: ``batch`` requests, one new token each, attending a KV cache of ``context`` tokens
  per request (the cache is read whole; the new token's key/value write, 1/context of that
  traffic, is not run). The blocks run as one unrolled loop in one jitted step, so every weight
  is streamed from HBM once per step, as a serving engine does.
- ``prefill``: one request of ``prompt`` tokens, causal attention through
  ``jax.nn.dot_product_attention`` (cuDNN's flash attention on NVIDIA GPUs), the logits of its
  last token.

Each time is the median of ``repeats`` timed calls after warm-up, in seconds (``_time`` of
``bench_device_layers``). ``weight_bytes`` and ``kv_bytes`` are the bytes the step must read.
``--quick`` runs a tiny model on any backend (CPU included): the smoke test the suite runs.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_device_layers import _time  # noqa: E402
from zoo.config import ModelConfig, get_config, tensor_shard  # noqa: E402

COLUMNS = ("device_kind", "backend", "jax_version", "item", "model", "tensor", "batch",
           "context", "prompt", "layers", "seconds", "repeats", "weight_bytes", "kv_bytes")

# (model, tensor, decode (batch, context) pairs, prefill prompts): what one device of a TP layout runs
FULL = (
    ("llama3-8b", 1, [(1, 512), (8, 512), (32, 512), (64, 512), (1, 2048), (32, 2048), (64, 2048),
                      (128, 2048)], (128, 2048, 8192)),
    ("llama3-70b", 8, [(1, 512), (32, 512), (1, 2048), (64, 2048), (128, 2048)], (2048,)),
)
QUICK = (("llama-tiny", 1, [(1, 16), (4, 32)], (32,)),)


def _shard(cfg: ModelConfig, tensor: int) -> ModelConfig:
    return dataclasses.replace(tensor_shard(cfg, tensor), vocab=cfg.vocab // tensor)


def _weights(cfg: ModelConfig, key) -> dict:
    """``{"blocks": [per-layer weights], "nf", "head"}``, bf16, each layer its own buffers."""
    d, h, kv, f = cfg.head_dim, cfg.heads, cfg.kv_heads, cfg.ffn
    shapes = {"wq": (cfg.hidden, h * d), "wk": (cfg.hidden, kv * d), "wv": (cfg.hidden, kv * d),
              "wo": (h * d, cfg.hidden), "wg": (cfg.hidden, f), "wu": (cfg.hidden, f),
              "wd": (f, cfg.hidden), "n1": (cfg.hidden,), "n2": (cfg.hidden,)}

    def init(k, s):
        return (0.02 * jax.random.normal(k, s, jnp.float32)).astype(jnp.bfloat16)
    blocks = []
    for i in range(cfg.layers):
        keys = jax.random.split(jax.random.fold_in(key, i), len(shapes))
        blocks.append({n: init(k, s) for k, (n, s) in zip(keys, sorted(shapes.items()))})
    k1, k2 = jax.random.split(key)
    return {"blocks": blocks, "nf": init(k1, (cfg.hidden,)), "head": init(k2, (cfg.hidden, cfg.vocab))}


def _norm(x, w):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-5)).astype(x.dtype) * w


def _mlp(x, wg, wu, wd):
    return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def decode_step(cfg: ModelConfig):
    """``(weights, x [batch, hidden], cache_k/cache_v: per layer [batch, kv, context, d]) -> logits``
    (the cache laid out heads before tokens, as paged-attention kernels read it: a token-major
    layout made XLA transpose, i.e. copy, the whole cache twice a step)."""
    d, h, kv = cfg.head_dim, cfg.heads, cfg.kv_heads

    def layer(x, lw):
        w, ck, cv = lw
        b = x.shape[0]
        xn = _norm(x, w["n1"])
        q = (xn @ w["wq"]).reshape(b, kv, h // kv, d)
        k = (xn @ w["wk"]).reshape(b, kv, 1, d)
        v = (xn @ w["wv"]).reshape(b, kv, 1, d)
        # scores over the cached tokens and the new one, one softmax over both
        s = jnp.concatenate([jnp.einsum("bkgd,bksd->bkgs", q, ck),
                             jnp.einsum("bkgd,bkxd->bkgx", q, k)], -1)
        a = jax.nn.softmax(s.astype(jnp.float32) / jnp.sqrt(d), -1).astype(x.dtype)
        o = jnp.einsum("bkgs,bksd->bkgd", a[..., :-1], cv) + a[..., -1:] * v
        x = x + o.reshape(b, h * d) @ w["wo"]
        return x + _mlp(_norm(x, w["n2"]), w["wg"], w["wu"], w["wd"]), None

    def step(p, x, ck, cv):
        # one Python loop over the layers, each with its own buffers (no lax.scan: a scan's slice
        # of stacked weights was copied each step on GPU, 3x the weight traffic; see the README)
        for w, k, v in zip(p["blocks"], ck, cv):
            x, _ = layer(x, (w, k, v))
        return _norm(x, p["nf"]) @ p["head"]
    return jax.jit(step)


def prefill_step(cfg: ModelConfig):
    """``(weights, x [1, prompt, hidden]) -> logits of the last token``."""
    d, h, kv = cfg.head_dim, cfg.heads, cfg.kv_heads
    impl = "cudnn" if jax.default_backend() == "gpu" else None

    def layer(x, w):
        b, n, _ = x.shape
        xn = _norm(x, w["n1"])
        q = (xn @ w["wq"]).reshape(b, n, h, d)
        k = (xn @ w["wk"]).reshape(b, n, kv, d)
        v = (xn @ w["wv"]).reshape(b, n, kv, d)
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
        x = x + o.reshape(b, n, h * d) @ w["wo"]
        return x + _mlp(_norm(x, w["n2"]), w["wg"], w["wu"], w["wd"]), None

    def step(p, x):
        for w in p["blocks"]:
            x, _ = layer(x, w)
        return _norm(x[:, -1], p["nf"]) @ p["head"]
    return jax.jit(step)


def _nbytes(tree) -> int:
    return sum(a.size * a.dtype.itemsize for a in jax.tree_util.tree_leaves(tree))


def rows(model: str, tensor: int, decodes, prompts, repeats: int):
    full = get_config(model)
    cfg = _shard(full, tensor)
    p = _weights(cfg, jax.random.PRNGKey(0))
    base = dict(model=model, tensor=tensor, layers=cfg.layers, weight_bytes=_nbytes(p))
    dec = decode_step(cfg)
    for batch, context in decodes:
        shape = (batch, cfg.kv_heads, context, cfg.head_dim)   # heads before tokens: no transpose
        ck = [jnp.full(shape, 0.01, jnp.bfloat16) for _ in range(cfg.layers)]
        cv = [jnp.full(shape, 0.02, jnp.bfloat16) for _ in range(cfg.layers)]
        x = jnp.ones((batch, cfg.hidden), jnp.bfloat16)
        s = _time(dec, p, x, ck, cv, repeats=repeats)
        yield dict(base, item="decode", batch=batch, context=context, seconds=s,
                   kv_bytes=2 * _nbytes(ck))
        del ck, cv
    pre = prefill_step(cfg)
    for n in prompts:
        x = jnp.ones((1, n, cfg.hidden), jnp.bfloat16)
        yield dict(base, item="prefill", batch=1, prompt=n, seconds=_time(pre, p, x, repeats=repeats))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="CSV to write")
    ap.add_argument("--quick", action="store_true", help="a tiny model on any backend (smoke test)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=float("inf"),
                    help="stop starting new models after this many seconds")
    args = ap.parse_args(argv)
    backend = jax.default_backend()
    if backend == "cpu" and not args.quick:
        print("bench_device_serving: JAX's backend is cpu; run it where JAX sees a GPU or TPU, "
              "or pass --quick for the CPU smoke run", file=sys.stderr)
        return 2
    common = dict(device_kind=jax.devices()[0].device_kind, backend=backend,
                  jax_version=jax.__version__, repeats=args.repeats)
    start = time.perf_counter()
    out = Path(args.out)
    tmp = out.with_name(out.name + ".partial")
    with open(tmp, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        w.writeheader()
        for job in (QUICK if args.quick else FULL):
            if time.perf_counter() - start > args.budget_s:
                print(f"budget of {args.budget_s:.0f} s spent: stopping", file=sys.stderr)
                break
            try:
                for r in rows(*job, args.repeats):
                    row = dict(common, **r)
                    w.writerow(row)
                    fh.flush()
                    print(",".join(str(row.get(c, "")) for c in COLUMNS), flush=True)
            except Exception as e:   # one failed model (memory, a kernel) is a gap, not the end
                print(f"skipped {job[:2]}: {type(e).__name__}: {str(e).splitlines()[0][:200]}",
                      file=sys.stderr)
    os.replace(tmp, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
