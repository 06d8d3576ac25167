"""The transfer-aware passes (``passes/transfer_aware.py``), lit style: a printed program in
(``compiler.parse``), one pass, the expected program out; and a pipelined step compiled with both
still equal to ``jax.jit``."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.frontend import jit
from compiler.named import named_computation
from compiler.parse import parse_program
from compiler.passes.transfer_aware import (
    split_and_prioritize_transfer_independent_computations as split_independent,
    transfer_aware_merge)
from compiler.program import Origin, Transfer, print_program
from compiler.verify import verify


def run(pass_fn, text):
    """``text`` parsed and verified, ``pass_fn`` run on it, the result verified and printed."""
    p = parse_program(text, meshes=("m1", "m2"))
    verify(p)
    out = pass_fn(p)
    verify(out)
    return print_program(out)


def unchanged(pass_fn, text) -> bool:
    p = parse_program(text, meshes=("m1", "m2"))
    return pass_fn(p) == p


# ----------------------------------------------------------------- split and prioritize

# l2 squares y (on m2) before it needs l1's result from m1.
SPLIT_IN = """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m2) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%arg1, %1) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    %b1 = add %b0, %a1 : f32[4]
    %b2 = mul %b1, %b0 : f32[4]
    return %b2
  } : (f32[4]@m2, f32[4]@m2) -> f32[4]@m2
  return %2
}
"""


def test_split_moves_the_transfer_independent_part_first():
    got = run(split_independent, SPLIT_IN)
    assert got == """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m2) -> f32[4]@m2 {
  %0 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%arg1) (%a0: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %1 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = transfer %1 : f32[4]@m1 -> f32[4]@m2
  %3 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%0, %2) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a1 : f32[4]
    %b1 = mul %b0, %a0 : f32[4]
    return %b1
  } : (f32[4]@m2, f32[4]@m2) -> f32[4]@m2
  return %3
}
"""
    assert unchanged(split_independent, got)  # B depends on the transfer throughout: idempotent


def test_split_leaves_fragments_wholly_dependent_or_independent_alone():
    assert unchanged(split_independent, """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    %b1 = add %b0, %a0 : f32[4]
    return %b1
  } : (f32[4]@m2) -> f32[4]@m2
  return %2
}
""")


# ----------------------------------------------------------------- transfer-aware merge

# An inferred sum reads the transferred f32[4] on m2.
PULL_IN = """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=[]> (%1) (%a0: f32[4]) {
    %b0 = reduce_sum[axes=(0,)] %a0 : f32[]
    return %b0
  } : (f32[4]@m2) -> f32[]@m2
  %3 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%2) (%a0: f32[]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] %a0 : f32[4]
    return %b0
  } : (f32[]@m2) -> f32[4]@m2
  return %3
}
"""


def test_transfer_aware_merge_pulls_a_reduction_before_the_transfer():
    # the f32[4] transfer becomes an f32[] one; the sum runs in l1's fragment
    assert run(transfer_aware_merge, PULL_IN) == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    %b1 = reduce_sum[axes=(0,)] %b0 : f32[]
    return %b1
  } : (f32[4]@m1) -> f32[]@m1
  %1 = transfer %0 : f32[]@m1 -> f32[]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] %a0 : f32[4]
    return %b0
  } : (f32[]@m2) -> f32[4]@m2
  return %2
}
"""


# An inferred broadcast on m1 feeds the transfer.
PUSH_IN = """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = reduce_sum[axes=(0,)] %a0 : f32[]
    return %b0
  } : (f32[4]@m1) -> f32[]@m1
  %1 = fragment<mesh="m1", origin=[]> (%0) (%a0: f32[]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] %a0 : f32[4]
    return %b0
  } : (f32[]@m1) -> f32[4]@m1
  %2 = transfer %1 : f32[4]@m1 -> f32[4]@m2
  %3 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%2) (%a0: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  return %3
}
"""


def test_transfer_aware_merge_pushes_a_broadcast_after_the_transfer():
    assert run(transfer_aware_merge, PUSH_IN) == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = reduce_sum[axes=(0,)] %a0 : f32[]
    return %b0
  } : (f32[4]@m1) -> f32[]@m1
  %1 = transfer %0 : f32[]@m1 -> f32[]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] %a0 : f32[4]
    %b1 = mul %b0, %b0 : f32[4]
    return %b1
  } : (f32[]@m2) -> f32[4]@m2
  return %2
}
"""


def test_transfer_aware_merge_keeps_code_that_would_not_shrink_a_transfer():
    assert unchanged(transfer_aware_merge, """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=[]> (%1) (%a0: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %3 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%2) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  return %3
}
""")


# ----------------------------------------------------------------- in the pipeline

L1 = named_computation(lambda w, h: jnp.tanh(h @ w), name="l1")
# l2's weight penalty does not depend on the activation transferred from m1: split runs it first
L2 = named_computation(lambda w, h: jnp.tanh(h @ w) + jnp.sum(w * w), name="l2")


def step(ws, xs):
    def body(i, acc):
        x = lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)
        loss, g = jax.value_and_grad(
            lambda ws: jnp.mean(L2(ws[1], L1(ws[0], x)) ** 2))(ws)
        return acc[0] + loss, jax.tree.map(jnp.add, acc[1], g)
    return lax.fori_loop(0, 2, body, (0.0, jax.tree.map(jnp.zeros_like, ws)))


def test_both_passes_in_the_pipeline_keep_the_step_equal_to_jit():
    d = jax.devices()
    topo = {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}
    cfg = MpmdConfig(topo, assignment={"l1": "m1", "l2": "m2"}, microbatches=2,
                     transfer_aware_merge=True, split_transfer_independent=True)
    k = jax.random.PRNGKey(3)
    ws = [jax.random.normal(jax.random.fold_in(k, i), (8, 8)) * 0.5 for i in range(2)]
    xs = jax.random.normal(k, (2, 4, 8))
    lo = jit(step, cfg, verify=True).lower(ws, xs)
    names = [n for n, _ in lo.history]
    assert names.index("transfer_aware_merge") == names.index("absorb") + 1
    k = names.index("split_transfer_independent")
    assert k < names.index("merge_transfers")
    before, after = lo.history[k - 1][1], lo.history[k][1]
    # the forward of l2 (each microbatch) is split: sum(w * w) no longer waits on the transfer
    count = lambda p: sum(1 for f in p.fragments() if f.origin == (Origin("l2"),))  # noqa: E731
    assert (count(before), count(after)) == (2, 4)
    got, want = lo.compile()(ws, xs), jax.jit(step)(ws, xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def _transfer_bytes(p):
    return sorted(int(np.prod(p.types[t.out].shape)) * 4 for t in p.ops if isinstance(t, Transfer))


def test_the_pipeline_sends_the_sum_instead_of_the_activation():
    """The sum is requested on m1 but reads y on m2: mesh inference computes it on m2 (a
    reduction runs where its operand is) and sends 4 bytes, with or without transfer-aware
    merging (which used to be what moved it)."""
    def fwd(w1, w2, x):
        y = L2(w2, L1(w1, x))
        return y, jnp.sum(y)

    d = jax.devices()
    topo = {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}
    args = (jnp.eye(8) * 0.5, jnp.eye(8) * 0.25, jnp.arange(32.0).reshape(4, 8) / 32)
    base = dict(assignment={"l1": "m1", "l2": "m2"}, output_meshes={1: "m1"})
    plain = jit(fwd, MpmdConfig(topo, **base), verify=True).lower(*args)
    merged = jit(fwd, MpmdConfig(topo, transfer_aware_merge=True, **base), verify=True).lower(*args)
    assert _transfer_bytes(plain.program) == [4, 128]   # x -> m2, sum(y) -> m1
    assert _transfer_bytes(merged.program) == [4, 128]
    for lowered in (plain, merged):
        l2 = [f for f in lowered.program.fragments() if f.origin and f.origin[0].name == "l2"]
        assert [e.prim.name for e in l2[0].body][-1] == "reduce_sum"
    got, want = merged.compile()(*args), jax.jit(fwd)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)
    assert got[1].sharding.mesh == topo["m1"]
