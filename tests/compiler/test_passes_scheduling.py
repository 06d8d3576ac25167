"""Stage merging, scheduling, forward/backward and rule merges, backward splitting: exact outputs."""

import jax
import jax.numpy as jnp
import pytest

from compiler.core.config import FragmentPattern
from compiler.core.errors import MergeError, ScheduleError
from compiler.core.frontend import trace_program
from compiler.ir import FragmentRef as R
from compiler.core.named import named_computation
from compiler.core.passes import (absorb_inferred_fragments, assign_meshes, comparator, fragment_dce,
                             gpipe_key, infer_meshes, merge_by_rules, merge_forward_backward,
                             merge_stages, one_f_one_b_key, schedule_fragments, split_backward,
                             unroll_call_counters)
from compiler.core.program import Fragment, print_program
from compiler.core.verify import verify

A1 = named_computation(lambda w, x: jnp.sin(x * w), name="a1")
A2 = named_computation(lambda w, x: x * w, name="a2")
B = named_computation(lambda w, x: x * w, name="b")
PLACE = {"a1": ("m1", 0), "a2": ("m1", 0), "b": ("m2", 1)}.get


def loss(w, xs):
    tot = 0.0
    for x in xs:
        tot = tot + jnp.sum(B(w[2], A2(w[1], A1(w[0], x))))
    return tot


def absorbed():
    args = ([jnp.ones(2)] * 3, [jnp.ones(2)] * 2)
    p, _, _ = trace_program(jax.grad(loss), args, meshes=("m1", "m2"), names={"a1", "a2", "b"})
    for fn in (unroll_call_counters, lambda p: assign_meshes(p, PLACE), infer_meshes, fragment_dce,
               absorb_inferred_fragments, fragment_dce):
        p = fn(p)
        verify(p)
    return p


def staged():
    return merge_stages(absorbed())


def skeleton(p):
    """Op headers only: the order of fragments and transfers."""
    out = []
    for op in p.ops:
        if isinstance(op, Fragment):
            out.append(f"{op.mesh} {op.kind}{op.stage}.{op.call_counter} "
                       f"{[str(o) for o in op.origin]}{' ' + op.part if op.part else ''}")
        else:
            out.append(f"{type(op).__name__} {getattr(op, 'src', '')}->{getattr(op, 'dst', '')}")
    return out


GPIPE = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("B", 0, 1)],
         "m2": [R("F", 1, 0), R("F", 1, 1), R("B", 1, 0), R("B", 1, 1)]}
ONE_F_ONE_B = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("B", 0, 1)],
               "m2": [R("F", 1, 0), R("B", 1, 0), R("F", 1, 1), R("B", 1, 1)]}


def test_schedule_table_and_comparator_agree():
    p = staged()
    assert skeleton(schedule_fragments(p, GPIPE)) == skeleton(
        schedule_fragments(p, comparator(gpipe_key)))
    assert skeleton(schedule_fragments(p, ONE_F_ONE_B)) == skeleton(
        schedule_fragments(p, comparator(one_f_one_b_key(2))))


def test_schedule_against_data_flow_is_an_error():
    bad = {"m1": [R("B", 0, 0), R("F", 0, 0), R("F", 0, 1), R("B", 0, 1)], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"dependency cycle"):
        schedule_fragments(staged(), bad)


def test_schedule_naming_missing_stage_is_an_error():
    bad = {"m1": GPIPE["m1"] + [R("F", 3, 0)], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"names fragment F3\.0 .*stages \[0\]"):
        schedule_fragments(staged(), bad)


def test_schedule_leaving_out_a_fragment_is_an_error():
    bad = {"m1": GPIPE["m1"][:-1], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"leaves out fragment .*call_counter 1"):
        schedule_fragments(staged(), bad)


def test_rule_merge_that_would_cycle_is_an_error():
    order = {"m1": [R("F", 0, 0), R("B", 0, 0), R("F", 0, 1), R("B", 0, 1)], "m2": GPIPE["m2"]}
    p = schedule_fragments(staged(), order)
    rules = [(FragmentPattern(kind="F", stage=0, microbatch=1), FragmentPattern(kind="B", stage=0))]
    with pytest.raises(MergeError, match="merge rule matched"):
        merge_by_rules(p, rules)



def test_absorb_output():
    got = print_program(absorbed())
    assert got == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1, %arg4: f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0:2 = fragment<mesh="m1", origin=["a1"], stage=0, call_counter=0> (%arg3, %arg0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    return %b1, %b2
  } : (f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %1 = fragment<mesh="m1", origin=["a2"], stage=0, call_counter=0> (%0#0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %2 = transfer %1 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> () () {
    return
  } : () -> ()
  %3:2 = fragment<mesh="m1", origin=["a1"], stage=0, call_counter=1> (%arg4, %arg0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    return %b1, %b2
  } : (f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %4 = fragment<mesh="m1", origin=["a2"], stage=0, call_counter=1> (%3#0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %5 = transfer %4 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> () () {
    return
  } : () -> ()
  %6:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1> (%5, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %7 = transfer %6#1 : f32[2]@m2 -> f32[2]@m1
  %8:2 = fragment<mesh="m1", origin=["a2"(1)], stage=0, call_counter=1> (%3#0, %7, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    return %b0, %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %9 = fragment<mesh="m1", origin=["a1"(1)], stage=0, call_counter=1> (%8#1, %3#1, %arg4) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a2, %b0 : f32[2]
    return %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %10:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%2, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %11 = transfer %10#1 : f32[2]@m2 -> f32[2]@m1
  %12 = fragment<mesh="m2", origin=[]> (%6#0, %10#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %13:2 = fragment<mesh="m1", origin=["a2"(1)], stage=0, call_counter=0> (%0#0, %11, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    return %b0, %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %14 = fragment<mesh="m1", origin=[]> (%8#0, %13#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %15 = fragment<mesh="m1", origin=["a1"(1)], stage=0, call_counter=0> (%13#1, %0#1, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a2, %b0 : f32[2]
    return %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %16 = fragment<mesh="m1", origin=[]> (%9, %15) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %16, %14, %12
}
"""


def test_merge_stages_merges_names_of_a_stage():
    got = print_program(staged())
    assert got == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1, %arg4: f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=0> (%arg3, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %1 = transfer %0#2 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> () () {
    return
  } : () -> ()
  %2:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=1> (%arg4, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %3 = transfer %2#2 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> () () {
    return
  } : () -> ()
  %4:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1> (%3, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %5 = transfer %4#1 : f32[2]@m2 -> f32[2]@m1
  %6:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=1> (%2#0, %5, %arg1, %2#1, %arg4) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %7:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%1, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %8 = transfer %7#1 : f32[2]@m2 -> f32[2]@m1
  %9 = fragment<mesh="m2", origin=[]> (%4#0, %7#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %10:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=0> (%0#0, %8, %arg1, %0#1, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %11 = fragment<mesh="m1", origin=[]> (%6#0, %10#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %12 = fragment<mesh="m1", origin=[]> (%6#1, %10#1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %12, %11, %9
}
"""


def test_gpipe_order():
    got = skeleton(schedule_fragments(staged(), GPIPE))
    assert got == ['m1 F0.0 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.0 [\'"b"\']', 'm1 F0.1 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.1 [\'"b"\']', 'm2 B1.0 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.0 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 B1.1 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.1 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 otherNone.None []', 'm1 otherNone.None []', 'm1 otherNone.None []']


def test_one_f_one_b_order():
    got = skeleton(schedule_fragments(staged(), ONE_F_ONE_B))
    assert got == ['m1 F0.0 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.0 [\'"b"\']', 'm1 F0.1 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 B1.0 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.0 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 F1.1 [\'"b"\']', 'm2 B1.1 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.1 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 otherNone.None []', 'm1 otherNone.None []', 'm1 otherNone.None []']


def test_forward_backward_merge_of_last_stage():
    got = print_program(merge_forward_backward(schedule_fragments(staged(), ONE_F_ONE_B)))
    assert got == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1, %arg4: f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=0> (%arg3, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %1 = transfer %0#2 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> () () {
    return
  } : () -> ()
  %2:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=1> (%arg4, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %3 = transfer %2#2 : f32[2]@m1 -> f32[2]@m2
  %4:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%1, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %5 = transfer %4#1 : f32[2]@m2 -> f32[2]@m1
  %6:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=0> (%0#0, %5, %arg1, %0#1, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> () () {
    return
  } : () -> ()
  %7:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1> (%3, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %a0, %b0 : f32[2]
    %b2 = mul %b0, %a1 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %8 = transfer %7#1 : f32[2]@m2 -> f32[2]@m1
  %9:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=1> (%2#0, %8, %arg1, %2#1, %arg4) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %10 = fragment<mesh="m2", origin=[]> (%7#0, %4#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %11 = fragment<mesh="m1", origin=[]> (%9#0, %6#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %12 = fragment<mesh="m1", origin=[]> (%9#1, %6#1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %12, %11, %10
}
"""


def test_forward_backward_merge_not_under_gpipe():
    got = skeleton(merge_forward_backward(schedule_fragments(staged(), GPIPE)))
    assert got == ['m1 F0.0 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.0 [\'"b"\']', 'm1 F0.1 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.1 [\'"b"\']', 'm2 B1.0 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.0 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 B1.1 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.1 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 otherNone.None []', 'm1 otherNone.None []', 'm1 otherNone.None []']


def test_rule_merge_by_predicate():
    got = skeleton(merge_by_rules(schedule_fragments(staged(), GPIPE), lambda a, b: a.mesh == 'm2' and a.kind == b.kind == 'F'))
    assert got == ['m1 F0.0 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm1 F0.1 [\'"a1"\', \'"a2"\']', 'Transfer m1->m2', 'm2 F1.None [\'"b"\']', 'm2 B1.0 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.0 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 B1.1 [\'"b"(1)\']', 'Transfer m2->m1', 'm1 B0.1 [\'"a2"(1)\', \'"a1"(1)\']', 'm2 otherNone.None []', 'm1 otherNone.None []', 'm1 otherNone.None []']


def test_split_backward_into_b_and_w():
    got = print_program(split_backward(staged()))
    assert got == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1, %arg4: f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=0> (%arg3, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %1 = transfer %0#2 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> () () {
    return
  } : () -> ()
  %2:3 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=1> (%arg4, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = sin %b0 : f32[2]
    %b2 = cos %b0 : f32[2]
    %b3 = mul %b1, %a2 : f32[2]
    return %b1, %b2, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1, f32[2]@m1)
  %3 = transfer %2#2 : f32[2]@m1 -> f32[2]@m2
  fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> () () {
    return
  } : () -> ()
  %4:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1, part="B"> (%arg2) (%a0: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %b0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %5 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1, part="W"> (%3, %4#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %6 = transfer %4#1 : f32[2]@m2 -> f32[2]@m1
  fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=1, part="B"> () () {
    return
  } : () -> ()
  %7:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=1, part="W"> (%2#0, %6, %arg1, %2#1, %arg4) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %8:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0, part="B"> (%arg2) (%a0: f32[2]) {
    %b0 = broadcast_in_dim[broadcast_dimensions=() shape=(2,)] 1.0:f32 : f32[2]
    %b1 = mul %b0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %9 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0, part="W"> (%1, %8#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %10 = transfer %8#1 : f32[2]@m2 -> f32[2]@m1
  %11 = fragment<mesh="m2", origin=[]> (%5, %9) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=0, part="B"> () () {
    return
  } : () -> ()
  %12:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=0, part="W"> (%0#0, %10, %arg1, %0#1, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2], %a4: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a1, %a2 : f32[2]
    %b2 = mul %b1, %a3 : f32[2]
    %b3 = mul %a4, %b2 : f32[2]
    return %b0, %b3
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %13 = fragment<mesh="m1", origin=[]> (%7#0, %12#0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %14 = fragment<mesh="m1", origin=[]> (%7#1, %12#1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %14, %13, %11
}
"""
