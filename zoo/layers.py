"""Building blocks shared by the zoo's models: norms, RoPE, attention, MLPs, parameter init.

Shapes: activations are ``[batch, seq, width]``; attention heads ``[batch, seq, heads, head_dim]``.
Matmuls run in the parameters' dtype; attention scores, softmax, norms and the loss in float32.
Norms and the SwiGLU/GeLU elementwise product are wrapped in ``jax.checkpoint`` so the backward keeps
their (compute-dtype) inputs and recomputes the float32 internals, as fused norm / activation kernels
do (Megatron-LM, Korthikanti et al. 2022): the residuals then count what a production run keeps.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable, Literal, Mapping

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from compiler.constraints import constrain, mesh_axes
from zoo.context_parallel import context_attention, current_split

Shapes = Mapping[str, tuple[int, ...]]


# --------------------------------------------------------------------------- params
def is_norm_weight(name: str) -> bool:
    return "norm" in name and not name.endswith("_b")


def shapes_to_specs(shapes: Shapes, dtype) -> dict[str, jax.ShapeDtypeStruct]:
    return {k: jax.ShapeDtypeStruct(tuple(v), dtype) for k, v in shapes.items()}


def init_from_shapes(shapes, dtype, key: jax.Array, std: float = 0.02):
    """Parameters for a pytree of shapes (dict leaves ``name -> shape``): norm weights 1, biases
    (names ending ``_b``) 0, other weights N(0, std^2) (GPT-2 init), all weights sliced from one
    normal draw. Call under ``jax.jit``."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(
        shapes, is_leaf=lambda x: isinstance(x, tuple))
    names = [str(getattr(path[-1], "key", path[-1])) for path, _ in flat]
    sizes = [math.prod(shp) for _, shp in flat]
    drawn = [n for name, n in zip(names, sizes) if not (is_norm_weight(name) or name.endswith("_b"))]
    z = std * jax.random.normal(key, (sum(drawn),), jnp.float32)
    leaves, at = [], 0
    for name, (_, shp), n in zip(names, flat, sizes):
        if is_norm_weight(name):
            leaves.append(jnp.ones(shp, dtype))
        elif name.endswith("_b"):
            leaves.append(jnp.zeros(shp, dtype))
        else:
            leaves.append(z[at:at + n].reshape(shp).astype(dtype))
            at += n
    return jax.tree_util.tree_unflatten(treedef, leaves)


# --------------------------------------------------------------------------- norms
@partial(jax.checkpoint, static_argnums=(2,))
def rms_norm(x: jax.Array, w: jax.Array | None, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    if w is not None:
        y = y * w.astype(jnp.float32)
    return y.astype(x.dtype)


@partial(jax.checkpoint, static_argnums=(3,))
def layer_norm(x: jax.Array, w: jax.Array | None, b: jax.Array | None, eps: float) -> jax.Array:
    xf = x.astype(jnp.float32)
    mu = jnp.mean(xf, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(xf - mu), axis=-1, keepdims=True)
    y = (xf - mu) * jax.lax.rsqrt(var + eps)
    if w is not None:
        y = y * w.astype(jnp.float32)
    if b is not None:
        y = y + b.astype(jnp.float32)
    return y.astype(x.dtype)


# --------------------------------------------------------------------------- rope
def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding (Su et al. 2021) of ``x: [B, S, H, D]`` at ``positions: [S]``."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (jnp.arange(0, d, 2, dtype=jnp.float32) / d))
    ang = positions.astype(jnp.float32)[:, None] * inv[None, :]          # [S, D/2]
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1).astype(x.dtype)


# --------------------------------------------------------------------------- attention
def _scores(q, k, causal, window=0):
    """``q: [B,S,KV,G,D]``, ``k: [B,T,KV,D]`` -> float32 scores ``[B,KV,G,S,T]``; ``window`` > 0
    masks every key but the ``window`` last up to the query (a sliding window)."""
    s = jnp.einsum("bskgd,btkd->bkgst", q, k, preferred_element_type=jnp.float32)
    s = s / math.sqrt(q.shape[-1])
    if causal:
        S, T = q.shape[1], k.shape[1]
        i, j = jnp.arange(S)[:, None], jnp.arange(T)[None, :]
        mask = i >= j
        if window:
            mask = mask & (i - j < window)
        s = jnp.where(mask, s, -1e30)
    return s


def _sink(sinks, s):
    """The sinks ``[KV, G]`` as float32 logits broadcast against scores ``[B,KV,G,S,T]``."""
    return sinks.astype(jnp.float32).reshape(1, *sinks.shape, 1, 1) * jnp.ones_like(s[..., :1])


def _lse(s, sinks):
    """Log-sum-exp over the keys, each row's sink logit included when given: ``[B,KV,G,S]``."""
    lse = jax.nn.logsumexp(s, axis=-1)
    return lse if sinks is None else jnp.logaddexp(lse, _sink(sinks, s)[..., 0])


def _plain(q, k, v, causal, window=0, sinks=None):
    s = _scores(q, k, causal, window)
    if sinks is None:
        p = jax.nn.softmax(s, axis=-1)
    else:   # the sink joins the denominator and takes no value row
        p = jax.nn.softmax(jnp.concatenate([s, _sink(sinks, s)], axis=-1), axis=-1)[..., :-1]
    return jnp.einsum("bkgst,btkd->bskgd", p.astype(v.dtype), v)


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _flash(q, k, v, sinks, causal, window):
    return _plain(q, k, v, causal, window, sinks)


def _flash_fwd(q, k, v, sinks, causal, window):
    s = _scores(q, k, causal, window)
    lse = _lse(s, sinks)                                                 # [B,KV,G,S]
    o = jnp.einsum("bkgst,btkd->bskgd", jnp.exp(s - lse[..., None]).astype(v.dtype), v)
    return o, (q, k, v, sinks, o, lse)


def _flash_bwd(causal, window, res, do):
    q, k, v, sinks, o, lse = res
    p = jnp.exp(_scores(q, k, causal, window) - lse[..., None])         # recomputed, float32
    dv = jnp.einsum("bkgst,bskgd->btkd", p.astype(do.dtype), do)
    dp = jnp.einsum("bskgd,btkd->bkgst", do, v, preferred_element_type=jnp.float32)
    delta = jnp.einsum("bskgd,bskgd->bkgs", do.astype(jnp.float32), o.astype(jnp.float32))
    ds = (p * (dp - delta[..., None]) / math.sqrt(q.shape[-1])).astype(q.dtype)
    dq = jnp.einsum("bkgst,btkd->bskgd", ds, k)
    dk = jnp.einsum("bkgst,bskgd->btkd", ds, q)
    dsinks = None
    if sinks is not None:   # d sink = -sum over queries of p_sink x delta
        p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, :, None] - lse)
        dsinks = (-jnp.sum(p_sink * delta, axis=(0, 3))).astype(sinks.dtype)
    return dq, dk, dv, dsinks


_flash.defvjp(_flash_fwd, _flash_bwd)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool,
              impl: str = "plain", window: int = 0, sinks: jax.Array | None = None) -> jax.Array:
    """Multi-head / grouped-query attention.

    Args:
        q: ``[B, S, H, D]``; k: ``[B, T, KV, D]``; v: ``[B, T, KV, Dv]`` with ``H % KV == 0``
            (``Dv`` may differ from ``D``, as in multi-head latent attention).
        causal: mask future keys (decoders) or not (DiT joint attention).
        impl: ``"plain"`` (softmax matrix materialized and kept for the backward), ``"flash"``
            (custom VJP keeping q, k, v, o and the log-sum-exp, recomputing the softmax in the
            backward, as FlashAttention does: Dao et al. 2022) or ``"fused"``
            (``jax.nn.dot_product_attention``: cuDNN's fused flash attention on an NVIDIA GPU,
            XLA's own lowering, scores materialized, elsewhere; ``D`` must equal ``Dv``; no
            sinks).
        window: with ``causal``, the keys a query attends: ``i - window < j <= i`` (a sliding
            window, ``zoo.ModelConfig.sliding_window``); 0 for every earlier key.
        sinks: ``[H]`` learned logits, one per head, added to each query's softmax denominator
            with no value (gpt-oss's attention sinks); None for none.
    Returns: ``[B, S, H, Dv]``.

    Context parallel: traced for a mesh with a ``"context"`` axis inside
    ``zoo.context_parallel.context_split`` (``mpmd run`` of a layout with ``context > 1``), the
    sequence is split over that axis by the split's method
    (:func:`zoo.context_parallel.context_attention`); otherwise nothing changes.

    Raises:
        ValueError: an unknown ``impl``, or sinks with ``"fused"`` (or with ring context
            parallel).
    """
    split = current_split()
    if split is not None:
        core = partial(_attention, causal=causal, impl=impl, window=window, sinks=sinks)
        return context_attention(split, q, k, v, core=core, causal=causal, window=window,
                                 sinks=sinks)
    return _attention(q, k, v, causal=causal, impl=impl, window=window, sinks=sinks)


def _attention(q: jax.Array, k: jax.Array, v: jax.Array, *, causal: bool, impl: str,
               window: int, sinks: jax.Array | None) -> jax.Array:
    """:func:`attention` on the whole sequence."""
    B, S, H, D = q.shape
    KV = k.shape[2]
    qg = q.reshape(B, S, KV, H // KV, D)
    sg = None if sinks is None else sinks.reshape(KV, H // KV)
    if impl == "plain":
        o = _plain(qg, k, v, causal, window, sg)
    elif impl == "flash":
        o = _flash(qg, k, v, sg, causal, window)
    elif impl == "fused":
        if sinks is not None:
            raise ValueError("attention impl 'fused' has no sinks; use 'plain' or 'flash'")
        kernel: Literal["cudnn"] | None = "cudnn" if jax.default_backend() == "gpu" else None
        span = (window - 1, 0) if causal and window else None
        return jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation=kernel,
                                            local_window_size=span)
    else:
        raise ValueError(f"attention impl {impl!r} is not 'plain', 'flash' or 'fused'")
    return o.reshape(B, S, H, v.shape[-1])


# --------------------------------------------------------------------------- mlp
def swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
           limit: float = 0.0) -> jax.Array:
    """SwiGLU MLP (Shazeer 2020): ``(silu(x Wg) * (x Wu)) Wd`` (``limit``: :func:`glu`)."""
    return glu(x @ w_gate, x @ w_up, limit) @ w_down


@jax.checkpoint
def _silu_mul(g: jax.Array, u: jax.Array) -> jax.Array:
    return jax.nn.silu(g) * u


@partial(jax.checkpoint, static_argnums=(2,))
def _clamped_silu_mul(g: jax.Array, u: jax.Array, limit: float) -> jax.Array:
    """gpt-oss's SwiGLU (openai/gpt-oss ``gpt_oss/torch/model.py``, ``swiglu``, alpha 1.702):
    ``(clip(u, -limit, limit) + 1) * g' * sigmoid(1.702 g')``, ``g' = min(g, limit)``."""
    g = jnp.minimum(g, limit)
    u = jnp.clip(u, -limit, limit)
    return g * jax.nn.sigmoid(1.702 * g) * (u + 1)


def glu(g: jax.Array | None, u: jax.Array, limit: float = 0.0) -> jax.Array:
    """The gated product of a SwiGLU: ``silu(g) * u``, or gpt-oss's clamped form when
    ``limit`` > 0 (:func:`_clamped_silu_mul`); with no gate (``g`` None) the squared ReLU
    ``relu(u)^2`` of a non-gated MLP (Nemotron-H; So et al. 2021, "Primer")."""
    if g is None:
        return _relu2(u)
    return _clamped_silu_mul(g, u, limit) if limit else _silu_mul(g, u)


@jax.checkpoint
def _relu2(u: jax.Array) -> jax.Array:
    return jnp.square(jax.nn.relu(u))


def relu2_mlp(x: jax.Array, w_up: jax.Array, w_down: jax.Array) -> jax.Array:
    """Nemotron-H's MLP: ``relu(x Wu)^2 Wd`` (no gate, no biases)."""
    return _relu2(x @ w_up) @ w_down


def expert_capacity(tokens: int, top_k: int, experts: int, capacity_factor: float) -> int:
    """Tokens one expert takes from a microbatch of ``tokens`` tokens:
    ``ceil(tokens x top_k x capacity_factor / experts)``, at least 1 (Fedus et al. 2022, "Switch
    Transformers", Sec. 2.2, "expert capacity")."""
    return max(1, math.ceil(tokens * top_k * capacity_factor / experts))


DATA_AXIS, EXPERT_AXIS = "data", "expert"
"""The mesh axes a mixture of experts' token exchange names (``runtime.train.layouts`` shapes each
mesh with them): the batch is split over ``(DATA_AXIS, EXPERT_AXIS)`` and the experts over
``EXPERT_AXIS``."""


def moe_swiglu(x: jax.Array, w_router: jax.Array, w_gate: jax.Array | None, w_up: jax.Array,
               w_down: jax.Array, *, top_k: int, capacity_factor: float,
               biases: Mapping[str, jax.Array] | None = None, limit: float = 0.0,
               latent: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Mixture-of-experts SwiGLU with top-k token-choice routing (``zoo.ModelConfig`` docs).

    Tokens are routed within their sample: each sample's sequence is one routing group (GShard's
    groups, Lepikhin et al. 2021, Sec. 3.2), so a data-parallel or expert-parallel layout shards
    the routing with the batch and no device sorts another device's tokens. In a group, each
    (token, choice) pair is sorted by expert and placed in its expert's buffer of
    :func:`expert_capacity` rows for the group's ``S`` tokens (pairs past it are dropped: that
    expert adds nothing to the token); the experts run as batched matmuls over
    ``[B, experts, capacity, h]``, so a trace costs ``2 x tokens x top_k x capacity_factor x h x f``
    FLOP per expert matmul, as the routed work is, not every expert on every token; the outputs
    are gathered back and summed with the gates.

    Expert parallel: traced for a mesh with an :data:`EXPERT_AXIS` (the MPMD compiler's topology,
    or an ambient ``jax.set_mesh``; ``compiler.constraints``), the dispatch buffers are resharded from the batch split over
    ``(DATA_AXIS, EXPERT_AXIS)`` to the experts split over :data:`EXPERT_AXIS` before the expert
    matmuls, and back after them (:func:`_exchange`): XLA's SPMD partitioner makes each an
    all-to-all of the tokens (GShard's dispatch and combine, Sec. 3.2), and its backward the two
    transposed all-to-alls. Without those two constraints the partitioner all-gathers the expert
    weights instead. Without such a mesh (a plain ``jax.jit``) nothing changes in the numbers.

    Args:
        x: ``[B, S, h]``; w_router: ``[h, E]``; w_gate, w_up: ``[E, h, f]``; w_down: ``[E, f, h]``;
            ``w_gate`` None: squared-ReLU experts without a gate (:func:`glu`).
        top_k: experts per token; capacity_factor: expert capacity over the balanced share.
        biases: the router's and the experts' biases (gpt-oss), ``{"w_router_b": [E],
            "w_gate_b", "w_up_b": [E, f], "w_down_b": [E, h]}``; None for none.
        limit: gpt-oss's SwiGLU clamp (:func:`glu`); 0 for the plain SwiGLU.
        latent: LatentMoE's ``(w_down [h, L], w_up [L, h])`` (``zoo.ModelConfig.moe_latent``):
            the router scores ``x``, the tokens are dispatched as ``x w_down`` and the experts'
            weights are ``[E, L, f]`` / ``[E, f, L]``; the combined ``[B, S, L]`` is projected
            back by ``w_up``. None: the experts run at ``h``.
    Returns: ``[B, S, h]``.
    """
    B, T, _ = x.shape
    E = w_router.shape[1]
    C = expert_capacity(T, top_k, E, capacity_factor)
    h = w_up.shape[1]                   # the routed width: hidden, or LatentMoE's latent

    bias = dict(biases or {})

    def route(xt: jax.Array):
        logits = xt @ w_router
        if "w_router_b" in bias:
            logits = logits + bias["w_router_b"]
        probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
        gates, chosen = jax.lax.top_k(probs, top_k)
        gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
        slot_of_pair, pair_of_slot = _slots(chosen.reshape(-1), E, C)
        return slot_of_pair, pair_of_slot, gates.astype(xt.dtype)

    slot_of_pair, pair_of_slot, gates = jax.vmap(route)(x)      # [B, T*k], [B, E*C], [B, T, k]
    # dispatch: slot s of expert s // C takes token pair_of_slot[s] // k (T: an empty slot)
    token_of_slot = jnp.where(pair_of_slot < T * top_k, pair_of_slot // top_k, T)
    to_token = slot_of_pair.reshape(B, T, top_k)
    xr = x if latent is None else x @ latent[0]                 # [B, T, h] (h: the routed width)
    buf = jax.vmap(_permute)(xr, token_of_slot, to_token)       # [B, E*C, h]
    buf = _exchange(buf.reshape(B, E, C, h), to_experts=True)
    g = None if w_gate is None else jnp.einsum("bech,ehf->becf", buf, w_gate)
    u = jnp.einsum("bech,ehf->becf", buf, w_up)
    if "w_gate_b" in bias and g is not None:     # an empty slot's row gets them too; no token reads it back
        g = g + bias["w_gate_b"][None, :, None, :]
        u = u + bias["w_up_b"][None, :, None, :]
    y = jnp.einsum("becf,efh->bech", glu(g, u, limit), w_down)
    if "w_down_b" in bias:
        y = y + bias["w_down_b"][None, :, None, :]
    y = _exchange(y, to_experts=False).reshape(B, E * C, h)
    # combine: each (token, choice) pair reads its slot (E*C: dropped, a zero row), gated
    out = jax.vmap(_combine)(y, to_token, pair_of_slot, gates)           # [B, T, h]
    return out if latent is None else out @ latent[1]


def _slots(choice: jax.Array, experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Where each (token, choice) pair of a routing group goes: ``choice: [P]`` (pair ``p`` = token
    ``p // k``'s ``p % k``-th expert). Pairs are stably sorted by expert and take their expert's
    slots ``e x capacity + position`` in order; those past ``capacity`` are dropped.

    Returns: ``slot_of_pair [P]`` (``experts x capacity`` when dropped) and its inverse
    ``pair_of_slot [experts x capacity]`` (``P`` for an empty slot), int32.
    """
    n = choice.shape[0]
    order = jnp.argsort(choice, stable=True)                       # sorted position -> pair
    by_expert = choice[order]
    first = jnp.searchsorted(by_expert, jnp.arange(experts + 1))   # each expert's first position
    pos = jnp.arange(n) - first[by_expert]
    slot = jnp.where(pos < capacity, by_expert * capacity + pos, experts * capacity)
    slot_of_pair = jnp.zeros(n, jnp.int32).at[order].set(slot.astype(jnp.int32))
    c = jnp.arange(capacity)
    at = first[:experts, None] + c[None, :]                         # [E, C] sorted positions
    filled = c[None, :] < (first[1:] - first[:-1])[:, None]
    pair_of_slot = jnp.where(filled, order[jnp.minimum(at, n - 1)], n).reshape(-1)
    return slot_of_pair, pair_of_slot.astype(jnp.int32)


@jax.custom_vjp
def _permute(x: jax.Array, index: jax.Array, inverse: jax.Array) -> jax.Array:
    """Rows of ``x [N, h]`` gathered at ``index`` (any shape; ``N``: a zero row): ``index.shape +
    (h,)``. ``inverse [N, r]``: the flat output rows each row of ``x`` went to (the flat output
    size when unused), so the gradient is a gather and a sum too, not a scatter-add: a token
    permutation both ways (XLA's GPU scatter-add of bf16 rows ran several times slower than the
    gathers; ``reports/validation/device/README.md``)."""
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def _permute_fwd(x, index, inverse):
    return _permute(x, index, inverse), (index, inverse)


def _permute_bwd(res, g):
    index, inverse = res
    flat = g.reshape(-1, g.shape[-1])
    dx = jnp.take(flat, inverse, axis=0, mode="fill", fill_value=0).sum(axis=1)
    return dx.astype(g.dtype), None, None


_permute.defvjp(_permute_fwd, _permute_bwd)


@jax.custom_vjp
def _combine(y: jax.Array, index: jax.Array, inverse: jax.Array, gates: jax.Array) -> jax.Array:
    """The gated sum of each token's expert outputs: ``out[t] = sum_j gates[t, j] y[index[t, j]]``
    for ``y [N, h]`` (the experts' flat slots; ``N``: a dropped pair, a zero row), ``index [T, k]``,
    ``gates [T, k]``; ``inverse [N]``: the pair ``t k + j`` each slot holds (``T k``: empty).
    Returns ``[T, h]``.

    The backward is written out (a gather and a product each way, no scatter-add): ``dgates[t,
    j] = y[index[t, j]] . dout[t]`` and ``dy[s] = gates[p] dout[p // k]`` for the pair ``p`` of
    slot ``s``. Autodiff of the gather makes a scatter-add of the rows instead: on one H100 the
    whole layer's forward and backward took 12.1 against 9.5 ms (Qwen3-235B's routed layer, one
    sample of 4096 tokens) and 69.4 against 59.8 ms (DeepSeek-V3's expert shape, 32 experts, 4
    samples), its forward within 3% (``python benchmarks/bench_device_experts.py --combine``;
    ``reports/validation/device/h100_combine.md``)."""
    picked = jnp.take(y, index, axis=0, mode="fill", fill_value=0)                # [T, k, h]
    return jnp.einsum("tkh,tk->th", picked, gates)


def _combine_fwd(y, index, inverse, gates):
    return _combine(y, index, inverse, gates), (y, index, inverse, gates)


def _combine_bwd(res, dout):
    y, index, inverse, gates = res
    k = index.shape[1]
    picked = jnp.take(y, index, axis=0, mode="fill", fill_value=0)                # [T, k, h]
    dgates = jnp.einsum("tkh,th->tk", picked, dout,
                        preferred_element_type=jnp.float32).astype(gates.dtype)
    gate_of_slot = jnp.take(gates.reshape(-1), inverse, mode="fill", fill_value=0)  # [N]
    dy = jnp.take(dout, inverse // k, axis=0, mode="fill", fill_value=0) * gate_of_slot[:, None]
    return dy.astype(y.dtype), None, None, dgates


_combine.defvjp(_combine_fwd, _combine_bwd)


def _exchange(buf: jax.Array, *, to_experts: bool) -> jax.Array:
    """``buf: [B, E, C, h]`` resharded between the batch split (``(data, expert)`` on ``B``) and
    the expert split (``data`` on ``B``, ``expert`` on ``E``): two sharding constraints in a row
    (``compiler.constrain``), which XLA's partitioner joins into one all-to-all. The identity
    when the current mesh has no :data:`EXPERT_AXIS` (see :func:`moe_swiglu`)."""
    if EXPERT_AXIS not in mesh_axes():
        return buf
    by_batch = P((DATA_AXIS, EXPERT_AXIS))
    by_expert = P(DATA_AXIS, EXPERT_AXIS)
    first, then = (by_batch, by_expert) if to_experts else (by_expert, by_batch)
    return constrain(constrain(buf, first), then)


@jax.checkpoint
def _gelu(h: jax.Array) -> jax.Array:
    return jax.nn.gelu(h, approximate=True)


def gelu_mlp(x, w1, b1, w2, b2) -> jax.Array:
    """GPT MLP: ``gelu(x W1 + b1) W2 + b2`` (tanh-approximate GeLU)."""
    return _gelu(x @ w1 + b1) @ w2 + b2


def relu_mlp(x, w1, b1, w2, b2) -> jax.Array:
    """OPT MLP: ``relu(x W1 + b1) W2 + b2`` (Zhang et al. 2022, "OPT", sec. 2.2: ReLU activation)."""
    return jax.nn.relu(x @ w1 + b1) @ w2 + b2


def cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Mean token cross-entropy (float32 scalar) of ``logits: [B,S,V]`` for ``targets: [B,S]``."""
    lf = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(lf, axis=-1)
    tgt = jnp.take_along_axis(lf, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return jnp.mean(lse - tgt)


LayerFn = Callable[..., jax.Array]
