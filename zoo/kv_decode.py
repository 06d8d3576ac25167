"""Greedy decoding with a KV cache for the zoo's Llama-family decoders (imports JAX).

The layer math is the zoo's (:mod:`zoo.decoder`: pre-RMSNorm, grouped-query attention with RoPE,
SwiGLU; :mod:`zoo.layers`), split into the two steps a server runs:

- ``prefill(p, x [B,S,h]) -> (y [B,S,h], k_cache, v_cache)``: the block of ``x`` (causal attention
  over its own ``S`` tokens, exactly :func:`zoo.decoder.block_fn`'s computation) that also returns
  the keys (after RoPE) and values of its ``S`` tokens written at positions ``[0, S)`` of a cache
  of fixed length ``max_len``;
- ``decode(p, x [B,1,h], k_cache, v_cache, pos) -> (y [B,1,h], k_cache', v_cache')``: one new token
  at position ``pos`` (an int32 scalar): its key and value are written into the caches at ``pos``
  with ``lax.dynamic_update_slice``, its query (RoPE at ``pos``) attends over the whole cache with
  keys at positions ``> pos`` masked out. Shapes are static (the cache is
  ``[B, max_len, kv_heads, head_dim]`` whatever ``pos`` is), so one compiled program serves every
  step.

Model-level functions name each layer with :func:`compiler.named_computation` under the zoo's
layer names (``embed``, ``block0`` .., ``head``: :func:`zoo.models.layer_names`), so a plan's
stage assignment places each block, and with it its cache, on a mesh. The head returns the
last position's float32 logits and their argmax (the greedy token).

:func:`greedy_reference` decodes without a cache (the full forward of the growing sequence, padded
to ``max_len``, causal, so positions after the current one do not matter): what the cached
decoding must reproduce. :func:`greedy_decode` is the cached decoding as one function (prefill,
then a ``lax.scan`` of decode steps) for ``jax.jit``.

Scope: dense Llama-family decoders (RMSNorm, RoPE, SwiGLU, no biases, no multi-head latent
attention, no mixture of experts); others raise :class:`~zoo.config.ZooError`.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from compiler.named import named_computation
from zoo import decoder
from zoo.config import ModelConfig, ZooError, get_config
from zoo.layers import attention, rope, swiglu
from zoo.models import layer_names

__all__ = ["check_decoder", "cache_shape", "empty_cache", "block_prefill_fn", "block_decode_fn",
           "logits_fn", "prefill_fn", "decode_fn", "greedy_decode", "greedy_reference"]

def _cfg(cfg: ModelConfig | str) -> ModelConfig:
    return cfg if isinstance(cfg, ModelConfig) else get_config(cfg)


def check_decoder(cfg: ModelConfig | str) -> ModelConfig:
    """``cfg`` if it is a dense Llama-family decoder with RoPE, else :class:`ZooError`."""
    cfg = _cfg(cfg)
    if (cfg.family != "llama" or cfg.mla or cfg.moe or cfg.bias or cfg.pos_emb != "rope"
            or cfg.mlp != "swiglu" or cfg.norm != "rms"):
        raise ZooError(f"KV-cache decoding covers dense Llama-family decoders (RMSNorm, RoPE, "
                       f"SwiGLU, no biases, no MLA or experts), not {cfg.name!r} "
                       f"(family {cfg.family}); use e.g. llama-tiny")
    return cfg


def cache_shape(cfg: ModelConfig, batch: int, max_len: int) -> tuple[int, int, int, int]:
    """One block's key (or value) cache: ``[batch, max_len, kv_heads, head_dim]``."""
    return (batch, max_len, cfg.kv_heads, cfg.head_dim)


def empty_cache(cfg: ModelConfig, batch: int, max_len: int) -> tuple[jax.Array, jax.Array]:
    """A zero ``(k_cache, v_cache)`` of :func:`cache_shape` in the model's dtype."""
    z = jnp.zeros(cache_shape(cfg, batch, max_len), cfg.jnp_dtype)
    return z, z


def _qkv(cfg: ModelConfig, p: dict, x: jax.Array, pos: jax.Array):
    """The normed input's queries, keys, values, keys and queries rotated at positions
    ``pos + [0, S)`` (as :func:`zoo.decoder.block_fn`)."""
    B, S, _ = x.shape
    H, KV, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    a = decoder._norm(cfg, p, "attn_norm", x)
    q = (a @ p["wq"]).reshape(B, S, H, d)
    k = (a @ p["wk"]).reshape(B, S, KV, d)
    v = (a @ p["wv"]).reshape(B, S, KV, d)
    positions = pos + jnp.arange(S)
    return rope(q, positions, cfg.rope_theta), rope(k, positions, cfg.rope_theta), v


def _out_mlp(cfg: ModelConfig, p: dict, x: jax.Array, o: jax.Array) -> jax.Array:
    """The attention output projection, the residual, and the SwiGLU MLP (as the zoo block)."""
    x = x + o @ p["wo"]
    m = decoder._norm(cfg, p, "mlp_norm", x)
    return x + swiglu(m, p["w_gate"], p["w_up"], p["w_down"])


def _write(cache: jax.Array, new: jax.Array, pos: jax.Array) -> jax.Array:
    return jax.lax.dynamic_update_slice(cache, new.astype(cache.dtype),
                                        (0, pos, 0, 0))


def _cached_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                      pos: jax.Array) -> jax.Array:
    """``q [B,S,H,D]`` of positions ``pos + [0, S)`` over the cache ``[B,T,KV,D]``, keys after
    each query's position masked (the einsums and mask value of :mod:`zoo.layers`' attention)."""
    B, S, H, D = q.shape
    T, KV = k_cache.shape[1], k_cache.shape[2]
    qg = q.reshape(B, S, KV, H // KV, D)
    s = jnp.einsum("bskgd,btkd->bkgst", qg, k_cache, preferred_element_type=jnp.float32)
    s = s / math.sqrt(D)
    mask = (pos + jnp.arange(S))[:, None] >= jnp.arange(T)[None, :]
    s = jnp.where(mask, s, -1e30)
    w = jax.nn.softmax(s, axis=-1).astype(v_cache.dtype)
    return jnp.einsum("bkgst,btkd->bskgd", w, v_cache).reshape(B, S, H * v_cache.shape[-1])


def block_prefill_fn(cfg: ModelConfig | str, max_len: int):
    """``(p, x [B,S,h]) -> (y [B,S,h], k_cache, v_cache)`` with caches of length ``max_len``.

    Raises:
        ZooError: not a dense Llama-family decoder.
    """
    cfg = check_decoder(cfg)

    def prefill(p: dict, x: jax.Array):
        B, S, _ = x.shape
        if S > max_len:
            raise ZooError(f"prompt of {S} tokens exceeds the cache length {max_len}")
        zero = jnp.zeros((), jnp.int32)
        q, k, v = _qkv(cfg, p, x, zero)
        o = attention(q, k, v, causal=True, impl=cfg.attention).reshape(B, S, -1)
        kc, vc = empty_cache(cfg, B, max_len)
        return _out_mlp(cfg, p, x, o), _write(kc, k, zero), _write(vc, v, zero)
    return prefill


def block_decode_fn(cfg: ModelConfig | str):
    """``(p, x [B,1,h], k_cache, v_cache, pos int32 []) -> (y [B,1,h], k_cache', v_cache')``.

    Raises:
        ZooError: not a dense Llama-family decoder.
    """
    cfg = check_decoder(cfg)

    def decode(p: dict, x: jax.Array, k_cache: jax.Array, v_cache: jax.Array, pos: jax.Array):
        pos = jnp.asarray(pos, jnp.int32)
        q, k, v = _qkv(cfg, p, x, pos)
        k_cache, v_cache = _write(k_cache, k, pos), _write(v_cache, v, pos)
        o = _cached_attention(q, k_cache, v_cache, pos)
        return _out_mlp(cfg, p, x, o), k_cache, v_cache
    return decode


def logits_fn(cfg: ModelConfig | str):
    """``(p, x [B,S,h]) -> (logits float32 [B,V], token int32 [B])`` of the last position: the
    zoo head's norm and projection, and the greedy (argmax) token."""
    cfg = _cfg(cfg)

    def head(p: dict, x: jax.Array):
        logits = jnp.einsum("bh,hv->bv", decoder._norm(cfg, p, "norm", x[:, -1]), p["out"],
                            preferred_element_type=jnp.float32)
        return logits, jnp.argmax(logits, axis=-1).astype(jnp.int32)
    return head


def _one_token(embed: Callable) -> Callable:
    def embed_token(p: dict, token: jax.Array) -> jax.Array:
        return embed(p, token[:, None])
    return embed_token


def _named(cfg: ModelConfig, max_len: int | None, named: bool) -> dict[str, Callable]:
    wrap = (lambda f, n: named_computation(f, name=n)) if named else (lambda f, n: f)
    embed = decoder.embed_fn(cfg)
    if max_len is not None:
        block = block_prefill_fn(cfg, max_len)
    else:   # decode: the token [B] becomes a sequence of one inside the embedding's computation
        block, embed = block_decode_fn(cfg), _one_token(embed)
    fns = {"embed": wrap(embed, "embed"), "head": wrap(logits_fn(cfg), "head")}
    fns.update({n: wrap(block, n) for n in layer_names(cfg)[1:-1]})
    return fns


def prefill_fn(cfg: ModelConfig | str, max_len: int, *, named: bool = True):
    """``(params, tokens int32 [B,P]) -> (logits [B,V], token [B], caches)``: the prompt through
    every layer (each a named computation under its zoo layer name unless ``named=False``);
    ``caches`` one ``(k, v)`` pair per block, ``[B, max_len, kv_heads, head_dim]`` each."""
    cfg = check_decoder(cfg)
    fns = _named(cfg, max_len, named)

    def prefill(params, tokens):
        x = fns["embed"](params["embed"], tokens)
        caches = []
        for i, p in enumerate(params["blocks"]):
            x, k, v = fns[f"block{i}"](p, x)
            caches.append((k, v))
        logits, tok = fns["head"](params["head"], x)
        return logits, tok, caches
    return prefill


def decode_fn(cfg: ModelConfig | str, *, named: bool = True):
    """``(params, token int32 [B], caches, pos int32 []) -> (logits [B,V], token [B], caches')``:
    one decode step of the token at position ``pos``."""
    cfg = check_decoder(cfg)
    fns = _named(cfg, None, named)

    def decode(params, token, caches, pos):
        x = fns["embed"](params["embed"], token)
        out = []
        for i, (p, (k, v)) in enumerate(zip(params["blocks"], caches)):
            x, k, v = fns[f"block{i}"](p, x, k, v, pos)
            out.append((k, v))
        logits, tok = fns["head"](params["head"], x)
        return logits, tok, out
    return decode


def greedy_decode(cfg: ModelConfig | str, new_tokens: int, max_len: int, *, named: bool = False):
    """``(params, prompt int32 [B,P]) -> (tokens int32 [B, new_tokens + 1], logits float32
    [B, new_tokens + 1, V])``: the prefill's token, then ``new_tokens`` cached decode steps (a
    ``lax.scan``), each feeding back the previous token at position ``P + i``.

    Raises:
        ZooError: the cache cannot hold the prompt and the decoded tokens.
    """
    cfg = check_decoder(cfg)
    pre, dec = prefill_fn(cfg, max_len, named=named), decode_fn(cfg, named=named)

    def run(params, prompt):
        P = prompt.shape[1]
        if P + new_tokens > max_len:
            raise ZooError(f"prompt {P} + {new_tokens} decoded tokens exceed the cache length "
                           f"{max_len}")
        logits, tok, caches = pre(params, prompt)

        def step(carry, i):
            tok, caches = carry
            lg, tok, caches = dec(params, tok, caches, P + i)
            return (tok, caches), (tok, lg)
        _, (toks, lgs) = jax.lax.scan(step, (tok, caches), jnp.arange(new_tokens, dtype=jnp.int32))
        return (jnp.concatenate([tok[:, None], toks.T], axis=1),
                jnp.concatenate([logits[:, None], jnp.swapaxes(lgs, 0, 1)], axis=1))
    return run


def greedy_reference(cfg: ModelConfig | str, new_tokens: int) -> Callable[[Any, Any], Any]:
    """``(params, prompt int32 [B,P]) -> (tokens [B, new_tokens + 1], logits [B, new_tokens + 1,
    V])``: greedy decoding without a cache, each token from the zoo's full forward
    (:func:`zoo.decoder.block_fn`) of the whole sequence so far (padded to ``P + new_tokens``;
    causal attention makes the padding irrelevant)."""
    cfg = check_decoder(cfg)
    embed, block, head = decoder.embed_fn(cfg), decoder.block_fn(cfg), logits_fn(cfg)

    def run(params, prompt):
        B, P = prompt.shape
        L = P + new_tokens

        def full(seq, n):   # logits at position n - 1 of the first n tokens of seq [B, L]
            x = embed(params["embed"], seq)
            for p in params["blocks"]:
                x = block(p, x)
            x = jax.lax.dynamic_slice_in_dim(x, n - 1, 1, axis=1)
            return head(params["head"], x)

        seq = jnp.zeros((B, L), jnp.int32).at[:, :P].set(prompt)

        def step(seq, n):
            lg, tok = full(seq, n)
            seq = jax.lax.dynamic_update_slice(seq, tok[:, None], (0, jnp.minimum(n, L - 1)))
            return seq, (tok, lg)
        _, (toks, lgs) = jax.lax.scan(step, seq, P + jnp.arange(new_tokens + 1, dtype=jnp.int32))
        return toks.T, jnp.swapaxes(lgs, 0, 1)
    return run
