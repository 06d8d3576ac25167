"""Tracing primitives of the workload costing (:mod:`zoo.costing`): a function's FLOPs, HBM
bytes, unfused other bytes and primitive count from JAX/XLA's own analysis, and its backward
rebuilt as a function of its residuals (all abstract: ``jax.ShapeDtypeStruct`` inputs).

Sources: XLA's HloCostAnalysis (``jax.jit(f).lower(...).cost_analysis()``) for FLOPs and
``jax.experimental.roofline`` for bytes; :mod:`zoo.costing`'s docstring says why each.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
from jax.experimental import roofline
from jax.extend.core import jaxprs_in_params

__all__ = ["dot_bytes", "nbytes", "primitive_ops", "spec", "trace_costs", "vjp_parts"]


def nbytes(tree: Any) -> int:
    return sum(math.prod(l.shape) * jnp.dtype(l.dtype).itemsize
               for l in jax.tree_util.tree_leaves(tree))


def spec(tree: Any) -> Any:
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype), tree)


def dot_bytes(jaxpr: Any, primitive: str = "dot_general") -> int:
    """Operand and result bytes of every ``primitive`` (``dot_general`` by default) in ``jaxpr``
    and its sub-jaxprs."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive:
            total += nbytes([v.aval for v in (*eqn.invars, *eqn.outvars)])
        for sub in jaxprs_in_params(eqn.params):
            total += dot_bytes(sub, primitive)
    return total


def trace_costs(fn: Callable, *args, floor: float = 0.0, convs: bool = False
           ) -> tuple[float, float, float, int]:
    """(XLA FLOPs, roofline HBM bytes, other bytes, primitive ops) of ``fn(*args)``. HBM bytes are at least
    ``floor`` (the roofline model charges nothing for gathers and scatters, so the embedding needs
    the floor). Other bytes: the unfused HBM traffic of every op that is not a matmul
    (``roofline``'s ``unfused_hbm_bytes`` minus the ``dot_general`` operands and results; ops
    without a roofline rule, e.g. ``tanh``, count 0). ``convs`` (the Mochi VAE decoder):
    convolutions are charged as matmuls are, their operands and results HBM bytes rather than
    other bytes (``roofline`` gives a ``conv_general_dilated`` unfused bytes only, so its fused
    figure would leave every convolution's traffic out)."""
    analysis: Any = jax.jit(fn).lower(*args).cost_analysis()
    flops = float(analysis["flops"])
    _, rl = roofline.roofline(fn)(*args)
    jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
    conv = float(dot_bytes(jaxpr, "conv_general_dilated")) if convs else 0.0
    other = float(rl.unfused_hbm_bytes) - dot_bytes(jaxpr) - conv
    return flops, max(float(rl.hbm_bytes) + conv, float(floor)), max(other, 0.0), primitive_ops(jaxpr)


def primitive_ops(jaxpr: Any) -> int:
    """Primitive equations of ``jaxpr``, those of its sub-jaxprs (calls, custom derivatives,
    control flow bodies) counted in place of the equation that holds them."""
    total = 0
    for eqn in jaxpr.eqns:
        subs = list(jaxprs_in_params(eqn.params))
        total += sum(primitive_ops(sub) for sub in subs) if subs else 1
    return total


def vjp_parts(fn: Callable, p: Any, diff: tuple, other: tuple, wrt_params: bool):
    """The backward as ``(bwd, residual_leaves, cotangent)``: ``bwd(leaves, ct)`` is the pullback."""
    def pullback(p, diff, other):
        if wrt_params:
            return jax.vjp(lambda p, d: fn(p, *d, *other), p, diff)[1]
        return jax.vjp(lambda d: fn(p, *d, *other), diff)[1]
    vjp = jax.eval_shape(pullback, p, diff, other)
    leaves, treedef = jax.tree_util.tree_flatten(vjp)
    ct = spec(jax.eval_shape(fn, p, *diff, *other))
    return (lambda l, c: jax.tree_util.tree_unflatten(treedef, l)(c)), leaves, ct
