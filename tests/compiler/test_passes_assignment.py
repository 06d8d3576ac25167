"""Mesh assignment, call-counter unrolling and mesh inference: input program -> expected program."""

import jax.numpy as jnp
import pytest

from compiler.errors import AssignmentError, CompilerError, ConfigError, InferenceError
from compiler.frontend import trace_program
from compiler.named import named_computation
from compiler.passes import assign_meshes, infer_meshes, unroll_call_counters
from compiler.program import print_program

A = named_computation(lambda x: x * 2.0, name="a")
B = named_computation(lambda x: x + 1.0, name="b")
PLACE = {"a": ("m1", 0), "b": ("m2", 1)}.get


def f(x, y):
    s = jnp.sin(x)  # used on both meshes: cloned by inference
    return A(s) + B(s), B(y)


def traced(fn=f):
    p, _, _ = trace_program(fn, (jnp.ones(4), jnp.ones(4)), meshes=("m1", "m2"), names={"a", "b"})
    return p


def unrolled():
    return unroll_call_counters(traced())


def assigned():
    return assign_meshes(unrolled(), PLACE)


def test_unknown_mesh_is_an_error():
    with pytest.raises(AssignmentError, match="named computation 'a' is assigned to mesh 'm9'"):
        assign_meshes(unrolled(), {"a": ("m9", 0)}.get)


def test_transfer_needed_while_inference_off_is_an_error():
    with pytest.raises(InferenceError, match=r"value v0 \(program input\) lives on mesh 'm1' but "
                       r"is needed on mesh 'm2': a transfer is needed while transfer inference is off"):
        infer_meshes(assigned(), infer_transfers=False)


def test_microbatch_count_mismatch_is_an_error():
    with pytest.raises(ConfigError, match="'a' is called 1 times but microbatches=2"):
        unroll_call_counters(traced(), microbatches=2)


def test_unassigned_named_computation_dissolves_into_meshless_ops():
    p = assign_meshes(unrolled(), {"a": ("m1", 0)}.get)
    assert sum(1 for op in p.ops if type(op).__name__ == "Fragment") == 1
    assert [type(op).__name__ for op in p.ops].count("MeshlessOp") == 4
    assert issubclass(InferenceError, CompilerError)



def test_unroll_gives_call_counters_in_program_order():
    got = print_program(unrolled())
    assert got == """\
func @main(%arg0: f32[4], %arg1: f32[4]) -> (f32[4], f32[4]) {
  %0 = sin %arg0 : f32[4]
  %1 = named_computation<"a", call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]) -> f32[4]
  %2 = named_computation<"b", call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]) -> f32[4]
  %3 = add %1, %2 : f32[4]
  %4 = named_computation<"b", call_counter=1> (%arg1) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]) -> f32[4]
  return %3, %4
}
"""


def test_assignment_places_fragments_and_inputs():
    got = print_program(assigned())
    assert got == """\
func @main(%arg0: f32[4], %arg1: f32[4]@m2) -> (f32[4], f32[4]@m2) {
  %0 = sin %arg0 : f32[4]
  %1 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %3 = add %1, %2 : f32[4]
  %4 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> (%arg1) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  return %3, %4
}
"""


def test_inference_clones_by_use_set_and_transfers():
    got = print_program(infer_meshes(assigned()))
    assert got == """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m2) -> (f32[4]@m1, f32[4]@m2) {
  %0 = fragment<mesh="m1", origin=[]> (%arg0) (%a0: f32[4]) {
    %b0 = sin %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %arg0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=[]> (%1) (%a0: f32[4]) {
    %b0 = sin %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %3 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %4 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%2) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %5 = transfer %4 : f32[4]@m2 -> f32[4]@m1
  %6 = fragment<mesh="m1", origin=[]> (%3, %5) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a1 : f32[4]
    return %b0
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  %7 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> (%arg1) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  return %6, %7
}
"""
