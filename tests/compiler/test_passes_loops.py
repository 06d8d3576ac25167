"""The loop and call passes, one at a time, on a traced ``scan`` (exact input -> expected text)."""


import jax.numpy as jnp
from jax import lax

from compiler.calls import CallOp, Func
from compiler.frontend import trace_program
from compiler.named import named_computation
from compiler.passes import (call_inline, erase_unused_callee_block_arguments,
                             from_unroll_to_call_counter, sink_negligible_ops_into_call_op,
                             unroll_for_loops)
from compiler.program import Eqn, MeshlessOp, Program, TensorType, print_program
from compiler.verify import verify

F = named_computation(lambda w, h: h * w, name="f")


def step(w, h, xs):
    z = jnp.full((4,), 2.0)  # operand-free, read by every iteration: sunk into the body

    def body(c, x):
        return F(w, c) * z + x, c  # carry h, ys = the carry each iteration started from

    return lax.scan(body, h, xs)


def traced():
    p, _, _ = trace_program(step, (jnp.ones(4), jnp.ones(4), jnp.ones((2, 4))),
                            meshes=("m1", "m2"), names={"f"})
    return p


TRACED = """\
func @main(%arg0: f32[4], %arg1: f32[4], %arg2: f32[2,4]) -> (f32[4], f32[2,4]) {
  %0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 2.0:f32 : f32[4]
  %1:2 = for @loop0<length=2, num_consts=2, num_carry=1> (%arg0, %0, %arg1, %arg2) (%loop0.p0: f32[4], %loop0.p1: f32[4], %loop0.p2: f32[4], %loop0.p3: f32[4]) {
    %loop0.0 = named_computation<"f"> (%loop0.p2, %loop0.p0) (%a0: f32[4], %a1: f32[4]) {
      %b0 = mul %a0, %a1 : f32[4]
      return %b0
    } : (f32[4], f32[4]) -> f32[4]
    %loop0.1 = convert_element_type[new_dtype=float32 weak_type=False] %loop0.p1 : f32[4]
    %loop0.2 = mul %loop0.0, %loop0.1 : f32[4]
    %loop0.3 = add %loop0.2, %loop0.p3 : f32[4]
    return %loop0.3, %loop0.p2
  } : (f32[4], f32[4], f32[4], f32[2,4]) -> (f32[4], f32[2,4])
  return %1#0, %1#1
}
"""

CALLS = """\
func @main(%arg0: f32[4], %arg1: f32[4], %arg2: f32[2,4]) -> (f32[4], f32[2,4]) {
  %0 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 2.0:f32 : f32[4]
  %1 = slice[limit_indices=(1, 4) start_indices=(0, 0)] %arg2 : f32[1,4]
  %2 = squeeze[dimensions=(0,)] %1 : f32[4]
  %3:2 = call @loop0<{c}=0> (%arg0, %0, %arg1, %2) : (f32[4], f32[4], f32[4], f32[4]) -> (f32[4], f32[4])
  %4 = slice[limit_indices=(2, 4) start_indices=(1, 0)] %arg2 : f32[1,4]
  %5 = squeeze[dimensions=(0,)] %4 : f32[4]
  %6:2 = call @loop0<{c}=1> (%arg0, %0, %3#0, %5) : (f32[4], f32[4], f32[4], f32[4]) -> (f32[4], f32[4])
  %7 = stack[axis=0] %3#1, %6#1 : f32[2,4]
  return %6#0, %7
}
"""

SUNK = """\
func @main(%arg0: f32[4], %arg1: f32[4], %arg2: f32[2,4]) -> (f32[4], f32[2,4]) {
  %0 = slice[limit_indices=(1, 4) start_indices=(0, 0)] %arg2 : f32[1,4]
  %1 = squeeze[dimensions=(0,)] %0 : f32[4]
  %2:2 = call @loop0<call_counter=0> (%arg0, %arg1, %1) : (f32[4], f32[4], f32[4]) -> (f32[4], f32[4])
  %3 = slice[limit_indices=(2, 4) start_indices=(1, 0)] %arg2 : f32[1,4]
  %4 = squeeze[dimensions=(0,)] %3 : f32[4]
  %5:2 = call @loop0<call_counter=1> (%arg0, %2#0, %4) : (f32[4], f32[4], f32[4]) -> (f32[4], f32[4])
  %6 = stack[axis=0] %2#1, %5#1 : f32[2,4]
  return %5#0, %6
}
"""

INLINED = """\
func @main(%arg0: f32[4], %arg1: f32[4], %arg2: f32[2,4]) -> (f32[4], f32[2,4]) {
  %0 = slice[limit_indices=(1, 4) start_indices=(0, 0)] %arg2 : f32[1,4]
  %1 = squeeze[dimensions=(0,)] %0 : f32[4]
  %2 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 2.0:f32 : f32[4]
  %3 = named_computation<"f{i0}"{cc0}> (%arg1, %arg0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a1 : f32[4]
    return %b0
  } : (f32[4], f32[4]) -> f32[4]
  %4 = mul %3, %2 : f32[4]
  %5 = add %4, %1 : f32[4]
  %6 = slice[limit_indices=(2, 4) start_indices=(1, 0)] %arg2 : f32[1,4]
  %7 = squeeze[dimensions=(0,)] %6 : f32[4]
  %8 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 2.0:f32 : f32[4]
  %9 = named_computation<"f{i1}"{cc1}> (%5, %arg0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a1 : f32[4]
    return %b0
  } : (f32[4], f32[4]) -> f32[4]
  %10 = mul %9, %8 : f32[4]
  %11 = add %10, %7 : f32[4]
  %12 = stack[axis=0] %arg1, %5 : f32[2,4]
  return %11, %12
}
"""


def fill(text, **kw):
    for k, v in kw.items():
        text = text.replace("{" + k + "}", v)
    return text


def test_frontend_turns_the_scan_into_a_for_loop():
    assert print_program(traced()) == TRACED


def test_unroll_for_loops_makes_one_call_per_iteration_with_unroll_counters():
    p = unroll_for_loops(traced())
    verify(p)
    assert print_program(p) == fill(CALLS, c="unroll_counter")


def test_from_unroll_to_call_counter():
    p = from_unroll_to_call_counter(unroll_for_loops(traced()))
    assert print_program(p) == fill(CALLS, c="call_counter")


def test_from_unroll_to_call_counter_gives_an_index_when_iterations_are_placed():
    place = {"f[0]": ("m1", 0), "f[1]": ("m2", 1)}.get
    p = from_unroll_to_call_counter(unroll_for_loops(traced()), place=place)
    assert print_program(p) == fill(CALLS, c="index")
    p = call_inline(sink_negligible_ops_into_call_op(p))
    assert print_program(p) == fill(INLINED, i0="[0]", i1="[1]", cc0="", cc1="")


def test_erase_unused_callee_block_arguments_keeps_a_callee_whose_arguments_are_all_read():
    p = from_unroll_to_call_counter(unroll_for_loops(traced()))
    assert erase_unused_callee_block_arguments(p) == p


def test_sink_negligible_ops_into_call_op_moves_the_shared_constant_into_the_body():
    p = sink_negligible_ops_into_call_op(from_unroll_to_call_counter(unroll_for_loops(traced())))
    verify(p)
    assert print_program(p) == SUNK
    body = p.ops[2].callee
    assert [op.eqn.prim.name for op in body.ops[:1]] == ["broadcast_in_dim"]
    assert len(body.params) == 3


def test_call_inline_copies_call_counters_and_folds_the_identity_convert():
    p = sink_negligible_ops_into_call_op(from_unroll_to_call_counter(unroll_for_loops(traced())))
    p = call_inline(p)
    verify(p)
    assert print_program(p) == fill(INLINED, i0="", i1="", cc0=", call_counter=0",
                                              cc1=", call_counter=1")


def test_erase_unused_callee_block_arguments_forwards_a_passed_through_carry():
    t = TensorType((4,), "float32")

    f = Func("body", ("a", "b"), (MeshlessOp(Eqn(lax.mul_p, {}, ("a", "a"), ("m",))),),
             ("m", "b"))
    p = Program(("m1",), ("x", "y"), (None, None), ("r1", "s1"), (None, None),
                (CallOp(f, ("x", "y"), ("r0", "s0"), call_counter=0),
                 CallOp(f, ("r0", "s0"), ("r1", "s1"), call_counter=1)),
                {n: t for n in "x y a b m r0 s0 r1 s1".split()})
    assert print_program(p) == """\
func @main(%arg0: f32[4], %arg1: f32[4]) -> (f32[4], f32[4]) {
  %0:2 = call @body<call_counter=0> (%arg0, %arg1) : (f32[4], f32[4]) -> (f32[4], f32[4])
  %1:2 = call @body<call_counter=1> (%0#0, %0#1) : (f32[4], f32[4]) -> (f32[4], f32[4])
  return %1#0, %1#1
}
"""
    q = erase_unused_callee_block_arguments(p)
    assert print_program(q) == """\
func @main(%arg0: f32[4], %arg1: f32[4]) -> (f32[4], f32[4]) {
  %0 = call @body<call_counter=0> (%arg0) : (f32[4]) -> (f32[4])
  %1 = call @body<call_counter=1> (%0) : (f32[4]) -> (f32[4])
  return %1, %arg1
}
"""
    assert print_program(call_inline(q)) == """\
func @main(%arg0: f32[4], %arg1: f32[4]) -> (f32[4], f32[4]) {
  %0 = mul %arg0, %arg0 : f32[4]
  %1 = mul %0, %0 : f32[4]
  return %1, %arg1
}
"""


def test_call_inline_turns_the_fori_counter_into_literals():
    def fori(w, h):
        return lax.fori_loop(0, 2, lambda i, c: F(w, c) + i.astype(jnp.float32), h)

    p, _, _ = trace_program(fori, (jnp.ones(4), jnp.ones(4)), meshes=("m1",), names={"f"})
    passes = [unroll_for_loops, from_unroll_to_call_counter, erase_unused_callee_block_arguments,
              sink_negligible_ops_into_call_op, call_inline]
    for fn in passes:
        p = fn(p)
    verify(p)
    assert print_program(p) == """\
func @main(%arg0: f32[4], %arg1: f32[4]) -> f32[4] {
  %0 = named_computation<"f", call_counter=0> (%arg1, %arg0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a1 : f32[4]
    return %b0
  } : (f32[4], f32[4]) -> f32[4]
  %1 = add %0, 0.0:f32 : f32[4]
  %2 = named_computation<"f", call_counter=1> (%1, %arg0) (%a0: f32[4], %a1: f32[4]) {
    %b0 = mul %a0, %a1 : f32[4]
    return %b0
  } : (f32[4], f32[4]) -> f32[4]
  %3 = add %2, 1.0:f32 : f32[4]
  return %3
}
"""
