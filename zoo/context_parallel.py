"""Context-parallel attention: a sample's sequence split over a mesh's ``"context"`` axis.

``mpmd run`` gives every layer of a mesh whose layout has ``context > 1`` (:class:`ir.Layout`) a
:class:`ContextSplit` (:func:`context_split`, a context manager around the layer's trace). While
one is set and the traced program's mesh names :data:`CONTEXT_AXIS` (``compiler.constraints``:
the MPMD compiler's logical mesh, or ``jax.set_mesh``), ``zoo.layers.attention`` computes through
:func:`context_attention`; otherwise (a plain ``jax.jit``, the costing, every layout without
context parallelism) nothing here runs and the traced program is exactly the one without it.

The program stays in the global view: every array keeps its whole sequence and its tokens'
positions (so RoPE's positions ``0 .. S-1`` are each chunk's global positions), and the sequence
dimension of the activations is split over ``"context"`` (contiguous chunks: device ``i`` of the
group holds tokens ``[i S / c, (i + 1) S / c)``; the causal zig-zag order of
:class:`ir.Layout`'s docstring, which balances the causal work, is not applied here). Per method:

- ``"allgather"``: sharding constraints keep the queries split over ``"context"`` and make the
  keys and values whole along the sequence, so XLA's SPMD partitioner all-gathers K/V over the
  group before the attention core and reduce-scatters their gradients after it (Megatron-Core's
  ``--cp-comm-type all_gather``, Llama 3's long-context training, Dubey et al. 2024 sec. 3.3.2).
- ``"alltoall"``: DeepSpeed-Ulysses (Jacobs et al. 2023): two sharding constraints in a row move
  Q, K and V from the sequence split to a head split over ``("model", "context")`` (heads
  ``H / (t c)`` per device, the whole sequence each), which the partitioner lowers to
  all-to-alls, and the output back; the attention core runs as without context parallelism.
- ``"ring"``: Ring Attention (Liu et al. 2023): a ``jax.shard_map`` over the mesh in which each
  device keeps its query chunk and passes its K/V chunk around the group with
  ``jax.lax.ppermute`` (``c - 1`` passes), combining the ``c`` blocks' outputs by their
  log-sum-exp (the online softmax of FlashAttention, Dao et al. 2022), causal masking by the
  blocks' global token positions. The backward (a custom VJP keeping q, k, v, o and the
  log-sum-exp) runs the same ring, each K/V chunk travelling with its gradient accumulators,
  which one more pass brings home.

The ring is a ``shard_map`` whose body depends on the group's size, while the MPMD compiler
traces the whole program once under a logical mesh whose axes all have size 1
(``compiler.constraints``). So the ring's forward and backward are two primitives
(:data:`ring_fwd_p`, :data:`ring_bwd_p`) carrying the layer's concrete ``jax.sharding.Mesh``:
they trace as one equation each, and the ``shard_map`` is built when the fragment holding them is
lowered on that mesh. Lowered anywhere else (another device count) or evaluated eagerly, they
compute the same attention on the whole sequence (one block).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from compiler.constraints import constrain, mesh_axes, resolve_spec

CONTEXT_AXIS, MODEL_AXIS = "context", "model"
"""The mesh axis context parallelism splits the sequence over, and the tensor-parallel axis
(``runtime.train.layouts`` shapes each mesh with them)."""

METHODS = ("ring", "allgather", "alltoall")
"""The context-parallel attention methods (``ir.CONTEXT_METHODS``)."""

_MASKED = -1e30
"""The score of a masked key (as ``zoo.layers._scores``)."""


@dataclass(frozen=True)
class ContextSplit:
    """How one layer's attention is context parallel.

    Attributes:
        method: one of :data:`METHODS`.
        mesh: the ``jax.sharding.Mesh`` the layer runs on, with a :data:`CONTEXT_AXIS` axis (its
            other axes: the batch's, e.g. ``"data"``, and :data:`MODEL_AXIS`).

    Raises:
        ValueError: an unknown method, or a mesh without a :data:`CONTEXT_AXIS` axis.
    """

    method: str
    mesh: Any

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"context method {self.method!r} is not one of {', '.join(METHODS)}")
        if CONTEXT_AXIS not in tuple(self.mesh.axis_names):
            raise ValueError(f"mesh {self.mesh} has no {CONTEXT_AXIS!r} axis; a context split "
                             f"needs one (runtime.train.layouts.layout_mesh of a context layout)")

    @property
    def size(self) -> int:
        """Devices of the context group."""
        return int(dict(self.mesh.shape)[CONTEXT_AXIS])

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the batch is split over: all but context and model, in mesh order."""
        return tuple(a for a in self.mesh.axis_names if a not in (CONTEXT_AXIS, MODEL_AXIS))


_SPLIT: contextvars.ContextVar[ContextSplit | None] = contextvars.ContextVar(
    "context_split", default=None)


@contextlib.contextmanager
def context_split(split: ContextSplit | None) -> Iterator[None]:
    """Trace the attention inside as context parallel by ``split`` (None: not)."""
    token = _SPLIT.set(split)
    try:
        yield
    finally:
        _SPLIT.reset(token)


def current_split() -> ContextSplit | None:
    """The split set by :func:`context_split`, when the traced program's mesh names
    :data:`CONTEXT_AXIS` (``compiler.constraints.mesh_axes``); None otherwise."""
    split = _SPLIT.get()
    if split is None or CONTEXT_AXIS not in mesh_axes():
        return None
    return split


# --------------------------------------------------------------------------- dispatch
def context_attention(split: ContextSplit, q: jax.Array, k: jax.Array, v: jax.Array, *,
                      core: Callable[..., jax.Array], causal: bool, window: int = 0,
                      sinks: jax.Array | None = None) -> jax.Array:
    """``zoo.layers.attention`` with the sequence split over the context group (module docstring).

    Args:
        split: the layer's :class:`ContextSplit`.
        q, k, v: ``[B, S, H, D]``, ``[B, S, KV, D]``, ``[B, S, KV, Dv]`` (global view).
        core: ``(q, k, v) -> o`` the attention without context parallelism (``"allgather"``,
            ``"alltoall"``); the ring computes its own blocks.
        causal, window: as ``zoo.layers.attention``.
        sinks: ``[H]`` or None; the ring has none.
    Returns: ``[B, S, H, Dv]``.

    Raises:
        ValueError: sinks with the ring.
    """
    batch = split.batch_axes or None
    by_seq = P(batch, CONTEXT_AXIS, MODEL_AXIS)

    def pin(x: jax.Array, spec: P) -> jax.Array:   # only the axes that divide x (no padding)
        return constrain(x, resolve_spec(spec, x.shape, split.mesh))
    if split.method == "allgather":
        whole = P(batch, None, MODEL_AXIS)
        return pin(core(pin(q, by_seq), pin(k, whole), pin(v, whole)), by_seq)
    if split.method == "alltoall":
        by_head = P(batch, None, (MODEL_AXIS, CONTEXT_AXIS))
        q, k, v = (pin(pin(x, by_seq), by_head) for x in (q, k, v))
        return pin(pin(core(q, k, v), by_head), by_seq)
    if sinks is not None:
        raise ValueError("ring context parallel has no attention sinks; use context_method "
                         "allgather or alltoall for a model with sinks")
    return ring_attention(q, k, v, split.mesh, causal, window)


# --------------------------------------------------------------------------- ring blocks
def _block_scores(qg, k, q0, k0, causal: bool, window: int):
    """Float32 scores ``[B, KV, G, S, T]`` of queries ``qg [B, S, KV, G, D]`` at global positions
    ``q0 + i`` against keys ``k [B, T, KV, D]`` at ``k0 + j``, masked as ``zoo.layers._scores``."""
    s = jnp.einsum("bskgd,btkd->bkgst", qg, k, preferred_element_type=jnp.float32)
    s = s / math.sqrt(qg.shape[-1])
    if causal:
        i = q0 + jnp.arange(qg.shape[1])[:, None]
        j = k0 + jnp.arange(k.shape[1])[None, :]
        mask = i >= j
        if window:
            mask = mask & (i - j < window)
        s = jnp.where(mask, s, _MASKED)
    return s


def _ring_perm(size: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % size) for i in range(size)]


def _where(size: int):
    """This device's index in the context group (0 for a group of one)."""
    return jax.lax.axis_index(CONTEXT_AXIS) if size > 1 else 0


def _fwd_local(q, k, v, *, size: int, causal: bool, window: int):
    """One device's ring forward: ``q [B, S, H, D]`` its query chunk, ``k``, ``v`` its K/V chunk
    (``[B, S, KV, .]``); returns ``o [B, S, H, Dv]`` and the log-sum-exp ``[B, S, H]`` (float32).
    Step ``s`` holds the K/V chunk of device ``i - s`` (mod ``size``)."""
    B, S, H, D = q.shape
    KV = k.shape[2]
    qg = q.reshape(B, S, KV, H // KV, D)
    me = _where(size)
    acc = lse = None
    for step in range(size):
        src = (me - step) % size
        s = _block_scores(qg, k, me * S, src * S, causal, window)
        blk = jax.nn.logsumexp(s, axis=-1)                                    # [B,KV,G,S]
        o = jnp.einsum("bkgst,btkd->bskgd", jnp.exp(s - blk[..., None]), v,
                       preferred_element_type=jnp.float32)
        if acc is None:         # the first block is the diagonal one: every row has a key
            acc, lse = o, blk
        else:
            new = jnp.logaddexp(lse, blk)
            w_old = jnp.exp(lse - new).transpose(0, 3, 1, 2)[..., None]      # [B,S,KV,G,1]
            w_new = jnp.exp(blk - new).transpose(0, 3, 1, 2)[..., None]
            acc, lse = acc * w_old + o * w_new, new
        if step < size - 1:
            k, v = jax.lax.ppermute((k, v), CONTEXT_AXIS, _ring_perm(size))
    o = acc.astype(v.dtype).reshape(B, S, H, v.shape[-1])
    return o, lse.transpose(0, 3, 1, 2).reshape(B, S, H)


def _bwd_local(q, k, v, o, lse, do, *, size: int, causal: bool, window: int):
    """One device's ring backward (FlashAttention's, block by block): returns ``dq``, and the
    ``dk``, ``dv`` of its own K/V chunk, which travel the ring with the chunk and come home."""
    B, S, H, D = q.shape
    KV = k.shape[2]
    G = H // KV
    f32 = jnp.float32
    qg = q.reshape(B, S, KV, G, D)
    dog = do.reshape(B, S, KV, G, -1)
    lse = lse.reshape(B, S, KV, G).transpose(0, 2, 3, 1)                     # [B,KV,G,S]
    delta = jnp.einsum("bskgd,bskgd->bkgs", dog.astype(f32),
                       o.reshape(B, S, KV, G, -1).astype(f32))
    me = _where(size)
    dq = jnp.zeros(qg.shape, f32)
    dk = jnp.zeros(k.shape, f32)
    dv = jnp.zeros(v.shape, f32)
    for step in range(size):
        src = (me - step) % size
        p = jnp.exp(_block_scores(qg, k, me * S, src * S, causal, window) - lse[..., None])
        dv = dv + jnp.einsum("bkgst,bskgd->btkd", p, dog.astype(f32))
        dp = jnp.einsum("bskgd,btkd->bkgst", dog, v, preferred_element_type=f32)
        ds = p * (dp - delta[..., None]) / math.sqrt(D)
        dq = dq + jnp.einsum("bkgst,btkd->bskgd", ds, k.astype(f32))
        dk = dk + jnp.einsum("bkgst,bskgd->btkd", ds, qg.astype(f32))
        if size > 1:
            if step < size - 1:
                k, v = jax.lax.ppermute((k, v), CONTEXT_AXIS, _ring_perm(size))
            dk, dv = jax.lax.ppermute((dk, dv), CONTEXT_AXIS, _ring_perm(size))
    return dq.reshape(q.shape).astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# --------------------------------------------------------------------------- primitives
def _specs(mesh: Any, B: int, H: int, KV: int) -> tuple[P, P]:
    """The ``shard_map`` specs of ``q``-like ``[B, S, H, .]`` and ``k``-like ``[B, S, KV, .]``
    arrays: the batch over the mesh's batch axes (the longest prefix dividing ``B``), the
    sequence over :data:`CONTEXT_AXIS`, the heads over :data:`MODEL_AXIS` when it divides both
    head counts (Megatron's column-parallel Q, K, V), else whole."""
    sizes = dict(mesh.shape)
    batch: list[str] = []
    n = 1
    for a in mesh.axis_names:
        if a in (CONTEXT_AXIS, MODEL_AXIS):
            continue
        if B % (n * sizes[a]):
            break
        batch.append(a)
        n *= sizes[a]
    t = sizes.get(MODEL_AXIS, 1)
    heads = MODEL_AXIS if t > 1 and H % t == 0 and KV % t == 0 else None
    b = tuple(batch) or None
    return P(b, CONTEXT_AXIS, heads), P(b, CONTEXT_AXIS, heads)


def _ring_fwd_sharded(q, k, v, *, mesh, causal, window):
    sq, sk = _specs(mesh, q.shape[0], q.shape[2], k.shape[2])
    body = partial(_fwd_local, size=int(dict(mesh.shape)[CONTEXT_AXIS]), causal=causal,
                   window=window)
    return jax.shard_map(body, mesh=mesh, in_specs=(sq, sk, sk), out_specs=(sq, sq),
                         check_vma=False)(q, k, v)


def _ring_bwd_sharded(q, k, v, o, lse, do, *, mesh, causal, window):
    sq, sk = _specs(mesh, q.shape[0], q.shape[2], k.shape[2])
    body = partial(_bwd_local, size=int(dict(mesh.shape)[CONTEXT_AXIS]), causal=causal,
                   window=window)
    return jax.shard_map(body, mesh=mesh, in_specs=(sq, sk, sk, sq, sq, sq),
                         out_specs=(sq, sk, sk), check_vma=False)(q, k, v, o, lse, do)


def _whole_fwd(q, k, v, *, mesh, causal, window):
    return _fwd_local(q, k, v, size=1, causal=causal, window=window)


def _whole_bwd(q, k, v, o, lse, do, *, mesh, causal, window):
    return _bwd_local(q, k, v, o, lse, do, size=1, causal=causal, window=window)


def _lowering(sharded: Callable[..., Any], whole: Callable[..., Any]):
    """The lowering rule of a ring primitive: the ``shard_map`` on the primitive's mesh when the
    computation being lowered runs on as many devices, else the whole-sequence computation.
    The ``shard_map`` is traced under the mesh's own abstract mesh: the equation's context holds
    the compiler's logical mesh (every axis of size 1), which ``shard_map`` would refuse."""
    lower_sharded = mlir.lower_fun(sharded, multiple_results=True)
    lower_whole = mlir.lower_fun(whole, multiple_results=True)

    def rule(ctx, *args, mesh, causal, window):
        devices = getattr(ctx.module_context.axis_context, "num_devices", None)
        if devices != mesh.devices.size:
            return lower_whole(ctx, *args, mesh=mesh, causal=causal, window=window)
        with jax.sharding.use_abstract_mesh(AbstractMesh((), ())), \
                jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return lower_sharded(ctx, *args, mesh=mesh, causal=causal, window=window)
    return rule


def _fwd_abstract(q, k, v, *, mesh, causal, window):
    return (jax.core.ShapedArray(q.shape[:-1] + (v.shape[-1],), v.dtype),
            jax.core.ShapedArray(q.shape[:-1], jnp.float32))


def _bwd_abstract(q, k, v, o, lse, do, *, mesh, causal, window):
    return tuple(jax.core.ShapedArray(x.shape, x.dtype) for x in (q, k, v))


ring_fwd_p = Primitive("ring_attention_fwd")
"""``(q [B,S,H,D], k [B,S,KV,D], v [B,S,KV,Dv]; mesh, causal, window) -> (o [B,S,H,Dv],
lse [B,S,H] float32)``: the ring forward over ``mesh``'s context axis."""
ring_bwd_p = Primitive("ring_attention_bwd")
"""``(q, k, v, o, lse, do; mesh, causal, window) -> (dq, dk, dv)``: the ring backward."""

for _p, _abs, _sh, _wh in ((ring_fwd_p, _fwd_abstract, _ring_fwd_sharded, _whole_fwd),
                           (ring_bwd_p, _bwd_abstract, _ring_bwd_sharded, _whole_bwd)):
    _p.multiple_results = True
    _p.def_abstract_eval(_abs)
    _p.def_impl(_wh)
    mlir.register_lowering(_p, _lowering(_sh, _wh))


@partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def ring_attention(q: jax.Array, k: jax.Array, v: jax.Array, mesh: Any, causal: bool,
                   window: int = 0) -> jax.Array:
    """Ring attention (module docstring) of ``q [B, S, H, D]``, ``k [B, S, KV, D]``,
    ``v [B, S, KV, Dv]`` over ``mesh``'s :data:`CONTEXT_AXIS`; returns ``[B, S, H, Dv]``."""
    return ring_fwd_p.bind(q, k, v, mesh=mesh, causal=causal, window=window)[0]


def _ring_vjp_fwd(q, k, v, mesh, causal, window):
    o, lse = ring_fwd_p.bind(q, k, v, mesh=mesh, causal=causal, window=window)
    return o, (q, k, v, o, lse)


def _ring_vjp_bwd(mesh, causal, window, res, do):
    return tuple(ring_bwd_p.bind(*res, do, mesh=mesh, causal=causal, window=window))


ring_attention.defvjp(_ring_vjp_fwd, _ring_vjp_bwd)
