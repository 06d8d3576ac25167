"""Transfer merging and cycle removal, constant copying, DCE and dedup, sharding propagation; the
programs read from their printed text (``compiler.parse``), except the constant one (the printed
form leaves out a constant's value)."""

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh

from compiler.driver import run_passes
from compiler.errors import VerificationError
from compiler.passes import (copy_constants, fragment_dce, fragment_dedup, merge_transfers,
                             propagate_shardings, remove_transfer_cycles)
from compiler.program import CONSTANT, Eqn, Fragment, Lit, Origin, Program, TensorType, Transfer, print_program
from compiler.parse import parse_program
from compiler.verify import verify

T = TensorType((4,), "float32")


def frag(mesh, name, ins, outs, body, cc=0):
    return Fragment(mesh, (Origin(name),) if name else (), tuple(ins), tuple(outs), tuple(body),
                    0 if mesh == "m1" else 1, cc)


def add(a, b, o):
    return Eqn(lax.add_p, {}, (a, b), (o,))


def program(ops, outputs, names="x a b c d e f g h k t0 t1 t2 t3 t4".split()):
    return Program(("m1", "m2"), ("x",), ("m1",), tuple(outputs), (None,) * len(outputs),
                   tuple(ops), {n: T for n in names})


# x -> m2 -> m1 (a cycle back) and two transfers of the same value to m2
CYCLE = """\
func @main(%arg0: f32[4]@m1) -> (f32[4]@m2, f32[4]@m1) {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %3 = transfer %1 : f32[4]@m2 -> f32[4]@m1
  %4 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1, %2) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a1 : f32[4]
    return %b0
  } : (f32[4]@m2, f32[4]@m2) -> f32[4]@m2
  %5 = fragment<mesh="m1", origin=["l3"], stage=0, call_counter=0> (%3) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  return %4, %5
}
"""


def cycle_program():
    return parse_program(CYCLE, meshes=("m1", "m2"))


def const_program():
    return program([
        frag("m1", "l1", ["x"], ["a", "k"], [Eqn(CONSTANT, {"value": np.ones(4, np.float32)}, (), ("k",)),
                                             add("x", "k", "a")]),
        Transfer("k", "m1", "m2", "t0"),
        Transfer("a", "m1", "m2", "t1"),
        frag("m2", "l2", ["t0", "t1"], ["b"], [add("t1", "t0", "b")]),
    ], ["b"])


# dead values and fragments, a duplicate fragment, an unused transfer
DEAD = """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m1 {
  %0:2 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    %b1 = add %b0, %a0 : f32[4]
    return %b0, %b1
  } : (f32[4]@m1) -> (f32[4]@m1, f32[4]@m1)
  %1 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%0#0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%0#0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %3 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, 1.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %4 = transfer %0#1 : f32[4]@m1 -> f32[4]@m2
  %5 = fragment<mesh="m1", origin=["l2"], stage=0, call_counter=0> (%1, %2) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a1 : f32[4]
    return %b0
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  return %5
}
"""


def dead_program():
    return parse_program(DEAD, meshes=("m1", "m2"))


def test_verifier_rejects_use_before_definition():
    p = program([frag("m1", "l1", ["y"], ["a"], [add("y", "y", "a")])], ["a"], names=["x", "y", "a"])
    with pytest.raises(VerificationError, match="value y is used by op 0"):
        verify(p)


def test_verifier_rejects_operand_on_other_mesh():
    p = program([frag("m2", "l1", ["x"], ["a"], [add("x", "x", "a")])], ["a"])
    with pytest.raises(VerificationError, match="value x on mesh 'm1' is an operand of op 0"):
        verify(p)


def test_driver_names_the_pass_that_broke_the_program():
    bad = lambda p: p.with_ops(p.ops[1:])  # drops the producer of later operands
    with pytest.raises(VerificationError, match="after pass 'broken'"):
        run_passes(cycle_program(), [("broken", bad)], verify=True)


def test_sharding_propagates_through_fragments_and_transfers():
    d = jax.devices()
    topo = {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}
    p = propagate_shardings(remove_transfer_cycles(cycle_program()), topo, {0: (("x",),)})
    assert [p.specs[v] for v in p.outputs] == [(("x",),), (("x",),)]



def test_merge_transfers_keeps_one_per_value_and_mesh():
    got = print_program(merge_transfers(cycle_program()))
    assert got == """\
func @main(%arg0: f32[4]@m1) -> (f32[4]@m2, f32[4]@m1) {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = transfer %1 : f32[4]@m2 -> f32[4]@m1
  %3 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %4 = fragment<mesh="m1", origin=["l3"], stage=0, call_counter=0> (%2) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  return %3, %4
}
"""


def test_remove_transfer_cycles_reuses_the_original():
    got = print_program(fragment_dce(remove_transfer_cycles(cycle_program())))
    assert got == """\
func @main(%arg0: f32[4]@m1) -> (f32[4]@m2, f32[4]@m1) {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %3 = fragment<mesh="m1", origin=["l3"], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  return %2, %3
}
"""


def test_copy_constants_then_dce_drops_the_constant_transfer():
    got = print_program(fragment_dce(copy_constants(const_program())))
    assert got == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m2 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = constant : f32[4]
    %b1 = add %a0, %b0 : f32[4]
    return %b1
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = constant : f32[4]
    %b1 = add %a0, %b0 : f32[4]
    return %b1
  } : (f32[4]@m2) -> f32[4]@m2
  return %2
}
"""


def test_fragment_dce():
    got = print_program(fragment_dce(dead_program()))
    assert got == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m1 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %3 = fragment<mesh="m1", origin=["l2"], stage=0, call_counter=0> (%1, %2) (%a0: f32[4], %a1: f32[4]) {
    %b0 = add %a0, %a1 : f32[4]
    return %b0
  } : (f32[4]@m1, f32[4]@m1) -> f32[4]@m1
  return %3
}
"""


def test_fragment_dedup_then_dce():
    got = print_program(fragment_dce(fragment_dedup(dead_program())))
    assert got == """\
func @main(%arg0: f32[4]@m1) -> f32[4]@m1 {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = fragment<mesh="m1", origin=[], stage=0, call_counter=0> (%0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = fragment<mesh="m1", origin=["l2"], stage=0, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  return %2
}
"""
