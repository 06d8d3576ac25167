"""Uniform accumulation, zero-add folding and chained constant cloning: input program -> exact output.

The programs are what mesh inference leaves after the microbatches' backward fragments: per-
microbatch gradients ``g0``/``g1`` summed by an inferred ``add_any`` tree (last microbatch first,
as ``jax.grad`` emits it), the loss sum scaled by ``1/M``, and a constant cotangent chain.
"""

import numpy as np
import pytest
from jax import lax
from jax._src.ad_util import add_jaxvals_p

from compiler.passes import (absorb_inferred_fragments, accumulate_uniformly, copy_constants,
                             fold_zero_adds)
from compiler.program import (Eqn, Fragment, Lit, MeshlessOp, Origin, Program, TensorType,
                              eval_body, print_program)
from compiler.verify import verify

T = TensorType((4,), "float32")
S = TensorType((), "float32")


def eq(prim, ins, out):
    return Eqn(prim, {}, tuple(ins), (out,))


def user(name, cc, ins, outs, body, t=1, part=""):
    return Fragment("m1", (Origin(name, t),), tuple(ins), tuple(outs), tuple(body), 0, cc, part)


def inferred(ins, outs, body):
    return Fragment("m1", (), tuple(ins), tuple(outs), tuple(body))


def program(ops, outputs, inputs=("x",), types=None):
    ty = {n: T for n in "x a0 a1 g0 g1 g2 s1 s2 y h0 h1 c k".split()}
    ty.update(types or {})
    return Program(("m1",), tuple(inputs), ("m1",) * len(inputs), tuple(outputs),
                   (None,) * len(outputs), tuple(ops), ty)


def grads_program(order=(0, 1, 2)):
    """Three backward fragments (program order ``order``) and ``(g2 + g1) + g0``."""
    frags = {m: user("l", m, ["x"], [f"g{m}"], [eq(lax.mul_p, ["x", Lit(float(m + 1), "float32")],
                                                   f"g{m}")]) for m in range(3)}
    return program([frags[m] for m in order] + [
        inferred(["g2", "g1"], ["s1"], [eq(add_jaxvals_p, ["g2", "g1"], "s1")]),
        inferred(["s1", "g0"], ["s2"], [eq(add_jaxvals_p, ["s1", "g0"], "s2")]),
    ], ["s2"])


def run(p, x):
    """Evaluate a one-mesh program op by op (fragments only) on input ``x``."""
    env = {"x": x}
    for op in p.ops:
        env.update(zip(op.outputs, eval_body(op.body, op.inputs, op.outputs,
                                             [env[v] for v in op.inputs])))
    return [np.asarray(env[v]) for v in p.outputs]


def test_gradient_tree_becomes_one_add_per_fragment_in_program_order():
    p = grads_program(order=(0, 1, 2))  # e.g. GPipe/1F1B order: microbatch 0's backward first
    got = accumulate_uniformly(p)
    verify(got)
    assert print_program(got) == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m1 {
  %0 = fragment<mesh="m1", origin=[], part="init"> () () {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 0.0:f32 : f32[4]
    return %b0
  } : () -> f32[4]@m1
  %1 = fragment<mesh="m1", origin=["l"(1)], stage=0, call_counter=0> (%arg0, %0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, 1.0:f32 : f32[4]
    %b1 = add_any %a1, %b0 : f32[4]
    return %b1
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m1", origin=["l"(1)], stage=0, call_counter=1> (%arg0, %1) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    %b1 = add_any %a1, %b0 : f32[4]
    return %b1
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  %3 = fragment<mesh="m1", origin=["l"(1)], stage=0, call_counter=2> (%arg0, %2) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, 3.0:f32 : f32[4]
    %b1 = add_any %a1, %b0 : f32[4]
    return %b1
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  return %3
}
"""
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_array_equal(run(got, x)[0], run(p, x)[0])


def test_accumulation_follows_the_scheduled_order_not_the_tree():
    got = accumulate_uniformly(grads_program(order=(2, 0, 1)))
    verify(got)
    user_frags = [op for op in got.ops if isinstance(op, Fragment) and op.is_user]
    assert [f.call_counter for f in user_frags] == [2, 0, 1]
    # microbatch 2 reads the zeros, each later one the previous one's sum; one body for all
    init = got.ops[0]
    assert init.part == "init" and init.inputs == () and init.kind == "init"
    assert user_frags[0].inputs[-1] == init.outputs[0]
    assert user_frags[1].inputs[-1] == user_frags[0].outputs[0]
    assert user_frags[2].outputs == ("s2",) and got.outputs == ("s2",)
    assert len(got.ops) == 4


def test_loss_sum_scaled_by_literal_is_distributed_over_the_terms():
    div = lambda a, c, o: Eqn(lax.div_p, {}, (a, Lit(c, "float32")), (o,))  # noqa: E731
    p = program([
        user("h", 0, ["x"], ["a0"], [eq(lax.mul_p, ["x", "x"], "a0")], t=0),
        user("h", 1, ["x"], ["a1"], [eq(lax.add_p, ["x", "x"], "a1")], t=0),
        MeshlessOp(eq(lax.add_p, [Lit(0.0, "float32"), "a0"], "s1")),
        inferred(["s1", "a1"], ["s2"], [eq(lax.add_p, ["s1", "a1"], "s2")]),
        inferred(["s2"], ["y"], [div("s2", 2.0, "y")]),
    ], ["y"])
    folded = fold_zero_adds(p)
    assert [type(op).__name__ for op in folded.ops] == ["Fragment"] * 4
    assert folded.ops[2].inputs == ("a0", "a1")
    got = accumulate_uniformly(folded)
    verify(got)
    assert print_program(got) == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m1 {
  %0 = fragment<mesh="m1", origin=[], part="init"> () () {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 0.0:f32 : f32[4]
    return %b0
  } : () -> f32[4]@m1
  %1 = fragment<mesh="m1", origin=["h"], stage=0, call_counter=0> (%arg0, %0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a0 : f32[4]
    %b1 = div %b0, 2.0:f32 : f32[4]
    %b2 = add %a1, %b1 : f32[4]
    return %b2
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m1", origin=["h"], stage=0, call_counter=1> (%arg0, %1) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    %b1 = div %b0, 2.0:f32 : f32[4]
    %b2 = add %a1, %b1 : f32[4]
    return %b2
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  return %2
}
"""
    x = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(run(got, x)[0], (x * x + 2 * x) / 2, rtol=1e-7)


def test_trees_that_cannot_be_absorbed_are_left_alone():
    # a leaf that is a program input: the add could not be absorbed into a user fragment
    p = program([
        user("l", 0, ["x"], ["g0"], [eq(lax.mul_p, ["x", "x"], "g0")]),
        inferred(["g0", "x"], ["s1"], [eq(add_jaxvals_p, ["g0", "x"], "s1")]),
    ], ["s1"])
    assert accumulate_uniformly(p) is p
    # an inner sum read twice ends its tree: g2 + g1 is absorbed, the sum above it (a leaf s1
    # computed by that tree, not by a user fragment) stays inferred
    q = grads_program()
    q = program(list(q.ops), ["s2", "s1"])
    got = accumulate_uniformly(q)
    verify(got)
    left = [op for op in got.ops if isinstance(op, Fragment) and op.kind == "other"]
    assert [(f.inputs, f.outputs) for f in left] == [(("s1", "g0"), ("s2",))]
    x = np.arange(4, dtype=np.float32)
    for a, b in zip(run(got, x), run(q, x)):
        np.testing.assert_array_equal(a, b)


def test_copy_constants_leaves_accumulator_zeros_alone():
    got = accumulate_uniformly(grads_program())
    assert print_program(copy_constants(got)) == print_program(got)


def test_absorb_clones_chains_of_constant_code_into_each_microbatch():
    one = Eqn(lax.add_p, {}, (Lit(0.5, "float32"), Lit(0.5, "float32")), ("c",))  # operand-free
    p = program([
        inferred([], ["c"], [one]),
        inferred(["c"], ["k"], [eq(lax.div_p, ["c", Lit(2.0, "float32")], "k")]),
        user("l", 0, ["x", "k"], ["h0"], [eq(lax.mul_p, ["x", "k"], "h0")]),
        user("l", 1, ["x", "k"], ["h1"], [eq(lax.mul_p, ["x", "k"], "h1")]),
    ], ["h0", "h1"], types={"c": S, "k": S})
    got = absorb_inferred_fragments(p)
    verify(got)
    users = [op for op in got.ops if isinstance(op, Fragment) and op.is_user]
    # both microbatches compute 1/2 themselves and keep one body; the shared code is dead
    assert [f.inputs for f in users] == [("x",), ("x",)]
    assert [e.prim.name for e in users[0].body] == ["add", "div", "mul"]
    assert [e.prim.name for e in users[1].body] == ["add", "div", "mul"]
