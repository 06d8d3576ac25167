"""Absorb, stage merging, scheduling, forward/backward and rule merges, backward splitting, lit
style: each test reads a printed program (``compiler.parse``), runs one pass and compares the
printed result, independent of the frontend and of the passes before it."""

import pytest

from compiler.config import FragmentPattern
from compiler.errors import MergeError, ScheduleError
from compiler.parse import parse_program
from compiler.passes import (absorb_inferred_fragments, comparator, gpipe_key, merge_by_rules,
                             merge_forward_backward, merge_stages, one_f_one_b_key,
                             schedule_fragments, split_backward)
from compiler.program import Fragment, print_program
from compiler.verify import verify
from ir import FragmentRef as R


def run(pass_fn, text, *args):
    """``text`` parsed and verified, ``pass_fn`` run on it, the result verified and printed."""
    p = parse_program(text)
    verify(p)
    out = pass_fn(p, *args)
    verify(out)
    return print_program(out)


def skeleton(p):
    """Op headers only: the order of fragments and transfers."""
    out = []
    for op in p.ops:
        if isinstance(op, Fragment) and not op.is_user:
            out.append(f"{op.mesh} inferred")
        elif isinstance(op, Fragment):   # "*": merged over microbatches
            mb = "*" if op.call_counter is None else op.call_counter
            out.append(f"{op.mesh} {op.kind}{op.stage}.{mb}")
        else:
            out.append(f"Transfer {op.src}->{op.dst}")
    return out


# Inferred fragments around a user fragment "a", as mesh inference leaves them.
INFERRED = """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1) {
  %0 = fragment<mesh="m1", origin=[]> (%arg0) (%a0: f32[2]) {
    %b0 = sin %a0 : f32[2]
    return %b0
  } : (f32[2]@m1) -> f32[2]@m1
  %1 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=0> (%0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %2 = fragment<mesh="m1", origin=[]> (%1) (%a0: f32[2]) {
    %b0 = cos %a0 : f32[2]
    return %b0
  } : (f32[2]@m1) -> f32[2]@m1
  %3 = transfer %2 : f32[2]@m1 -> f32[2]@m2
  %4 = fragment<mesh="m1", origin=[]> (%0, %1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %3, %4
}
"""


def test_absorb_merges_consumers_into_their_producer_and_leaves_input_slicing_alone():
    """The cos and the add read "a"'s result: both join "a". The sin reads program inputs only
    (as slicing a microbatch does), so it stays inferred and the microbatches keep one body."""
    assert run(absorb_inferred_fragments, INFERRED) == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1) {
  %0 = fragment<mesh="m1", origin=[]> (%arg0) (%a0: f32[2]) {
    %b0 = sin %a0 : f32[2]
    return %b0
  } : (f32[2]@m1) -> f32[2]@m1
  %1:2 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=0> (%0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = cos %b0 : f32[2]
    %b2 = add_any %a0, %b0 : f32[2]
    return %b1, %b2
  } : (f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %2 = transfer %1#0 : f32[2]@m1 -> f32[2]@m2
  return %2, %1#1
}
"""


# One microbatch, two stages; stage 0 holds two named computations, "a1" and "a2".
ONE_MICROBATCH = """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0 = fragment<mesh="m1", origin=["a1"], stage=0, call_counter=0> (%arg3, %arg0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %1 = fragment<mesh="m1", origin=["a2"], stage=0, call_counter=0> (%0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %2 = transfer %1 : f32[2]@m1 -> f32[2]@m2
  %3 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%2, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %4:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%2, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a1, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %5 = transfer %4#0 : f32[2]@m2 -> f32[2]@m1
  %6:2 = fragment<mesh="m1", origin=["a2"(1)], stage=0, call_counter=0> (%5, %arg1, %0) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a2 : f32[2]
    return %b0, %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %7 = fragment<mesh="m1", origin=["a1"(1)], stage=0, call_counter=0> (%6#0, %arg3) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %3, %7, %6#1, %4#1
}
"""


def test_merge_stages_merges_the_named_computations_of_a_stage():
    """"a1" and "a2" (stage 0) become one fragment per pass: ["a1", "a2"] and ["a2"(1), "a1"(1)]."""
    assert run(merge_stages, ONE_MICROBATCH) == """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m1, %arg2: f32[2]@m2, %arg3: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1, f32[2]@m1, f32[2]@m2) {
  %0:2 = fragment<mesh="m1", origin=["a1", "a2"], stage=0, call_counter=0> (%arg3, %arg0, %arg1) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %b0, %a2 : f32[2]
    return %b0, %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  %1 = transfer %0#1 : f32[2]@m1 -> f32[2]@m2
  %2 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%1, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %3:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%1, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a1, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %4 = transfer %3#0 : f32[2]@m2 -> f32[2]@m1
  %5:2 = fragment<mesh="m1", origin=["a2"(1), "a1"(1)], stage=0, call_counter=0> (%4, %arg1, %0#0, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2], %a3: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a2 : f32[2]
    %b2 = mul %b0, %a3 : f32[2]
    return %b1, %b2
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1, f32[2]@m1) -> (f32[2]@m1, f32[2]@m1)
  return %2, %5#1, %5#0, %3#1
}
"""


# Backward fragments only: the last stage's B returns an activation gradient (sent back) and a
# weight gradient; the first stage's B sends nothing back.
BACKWARD = """\
func @main(%arg0: f32[2]@m2, %arg1: f32[2]@m2, %arg2: f32[2]@m1, %arg3: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1) {
  %0:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%arg0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %1 = transfer %0#0 : f32[2]@m2 -> f32[2]@m1
  %2 = fragment<mesh="m1", origin=["a"(1)], stage=0, call_counter=0> (%1, %arg2, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %b0, %a2 : f32[2]
    return %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %0#1, %2
}
"""


def test_split_backward_into_b_and_w():
    """The last stage's B keeps the activation gradient it sends back, W the weight gradient; the
    first stage sends nothing back, so its B is empty and W holds all."""
    assert run(split_backward, BACKWARD) == """\
func @main(%arg0: f32[2]@m2, %arg1: f32[2]@m2, %arg2: f32[2]@m1, %arg3: f32[2]@m1) -> (f32[2]@m2, f32[2]@m1) {
  %0 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0, part="B"> (%arg0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %1 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0, part="W"> (%arg0) (%a0: f32[2]) {
    %b0 = mul %a0, %a0 : f32[2]
    return %b0
  } : (f32[2]@m2) -> f32[2]@m2
  %2 = transfer %0 : f32[2]@m2 -> f32[2]@m1
  fragment<mesh="m1", origin=["a"(1)], stage=0, call_counter=0, part="B"> () () {
    return
  } : () -> ()
  %3 = fragment<mesh="m1", origin=["a"(1)], stage=0, call_counter=0, part="W"> (%2, %arg2, %arg3) (%a0: f32[2], %a1: f32[2], %a2: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %b0, %a2 : f32[2]
    return %b1
  } : (f32[2]@m1, f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  return %1, %3
}
"""


# The last stage under 1F1B: its F and the B that consumes it, adjacent on the mesh.
LAST_STAGE = """\
func @main(%arg0: f32[2]@m2, %arg1: f32[2]@m2) -> (f32[2]@m2, f32[2]@m2) {
  %0 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%arg0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %1:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  return %1#0, %1#1
}
"""


def test_forward_backward_merge_of_the_last_stage():
    assert run(merge_forward_backward, LAST_STAGE) == """\
func @main(%arg0: f32[2]@m2, %arg1: f32[2]@m2) -> (f32[2]@m2, f32[2]@m2) {
  %0:2 = fragment<mesh="m2", origin=["b", "b"(1)], stage=1, call_counter=0> (%arg0, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %b0, %a1 : f32[2]
    %b2 = mul %b0, %b0 : f32[2]
    return %b1, %b2
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  return %0#0, %0#1
}
"""


# Two microbatches, stages already merged (F/B of "a" on m1, of "b" on m2), in program order.
TWO_MICROBATCHES = """\
func @main(%arg0: f32[2]@m1, %arg1: f32[2]@m2, %arg2: f32[2]@m1, %arg3: f32[2]@m1) -> (f32[2]@m1, f32[2]@m2) {
  %0 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=0> (%arg2, %arg0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %1 = transfer %0 : f32[2]@m1 -> f32[2]@m2
  %2 = fragment<mesh="m1", origin=["a"], stage=0, call_counter=1> (%arg3, %arg0) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %3 = transfer %2 : f32[2]@m1 -> f32[2]@m2
  %4 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=0> (%1, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %5 = fragment<mesh="m2", origin=["b"], stage=1, call_counter=1> (%3, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  %6:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=0> (%4, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %7 = transfer %6#0 : f32[2]@m2 -> f32[2]@m1
  %8:2 = fragment<mesh="m2", origin=["b"(1)], stage=1, call_counter=1> (%5, %arg1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    %b1 = mul %a0, %a0 : f32[2]
    return %b0, %b1
  } : (f32[2]@m2, f32[2]@m2) -> (f32[2]@m2, f32[2]@m2)
  %9 = transfer %8#0 : f32[2]@m2 -> f32[2]@m1
  %10 = fragment<mesh="m1", origin=["a"(1)], stage=0, call_counter=0> (%7, %arg2) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %11 = fragment<mesh="m1", origin=["a"(1)], stage=0, call_counter=1> (%9, %arg3) (%a0: f32[2], %a1: f32[2]) {
    %b0 = mul %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %12 = fragment<mesh="m1", origin=[]> (%10, %11) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m1, f32[2]@m1) -> f32[2]@m1
  %13 = fragment<mesh="m2", origin=[]> (%6#1, %8#1) (%a0: f32[2], %a1: f32[2]) {
    %b0 = add_any %a0, %a1 : f32[2]
    return %b0
  } : (f32[2]@m2, f32[2]@m2) -> f32[2]@m2
  return %12, %13
}
"""
GPIPE = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("B", 0, 1)],
         "m2": [R("F", 1, 0), R("F", 1, 1), R("B", 1, 0), R("B", 1, 1)]}
ONE_F_ONE_B = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("B", 0, 1)],
               "m2": [R("F", 1, 0), R("B", 1, 0), R("F", 1, 1), R("B", 1, 1)]}
HEAD = ["m1 F0.0", "Transfer m1->m2", "m1 F0.1", "Transfer m1->m2"]
TAIL = ["m1 inferred", "m2 inferred"]


def scheduled(order):
    return schedule_fragments(parse_program(TWO_MICROBATCHES), order)


def test_gpipe_and_one_f_one_b_orders():
    assert skeleton(scheduled(GPIPE)) == HEAD + [
        "m2 F1.0", "m2 F1.1", "m2 B1.0", "Transfer m2->m1", "m2 B1.1", "Transfer m2->m1",
        "m1 B0.0", "m1 B0.1"] + TAIL
    assert skeleton(scheduled(ONE_F_ONE_B)) == HEAD + [
        "m2 F1.0", "m2 B1.0", "Transfer m2->m1", "m1 B0.0", "m2 F1.1", "m2 B1.1",
        "Transfer m2->m1", "m1 B0.1"] + TAIL


def test_schedule_table_and_comparator_agree():
    assert skeleton(scheduled(GPIPE)) == skeleton(scheduled(comparator(gpipe_key)))
    assert skeleton(scheduled(ONE_F_ONE_B)) == skeleton(scheduled(comparator(one_f_one_b_key(2))))


def test_forward_backward_merge_under_one_f_one_b_and_not_under_gpipe():
    """Under 1F1B each of the last stage's F is followed by its own B: two merged fragments;
    under GPipe none is: nothing merges."""
    assert skeleton(merge_forward_backward(scheduled(ONE_F_ONE_B))) == HEAD + [
        "m2 FB1.0", "Transfer m2->m1", "m1 B0.0", "m2 FB1.1", "Transfer m2->m1", "m1 B0.1"] + TAIL
    assert skeleton(merge_forward_backward(scheduled(GPIPE))) == skeleton(scheduled(GPIPE))


def test_schedule_against_data_flow_is_an_error():
    bad = {"m1": [R("B", 0, 0), R("F", 0, 0), R("F", 0, 1), R("B", 0, 1)], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"dependency cycle"):
        scheduled(bad)


def test_schedule_naming_missing_stage_is_an_error():
    bad = {"m1": GPIPE["m1"] + [R("F", 3, 0)], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"names fragment F3\.0 .*stages \[0\]"):
        scheduled(bad)


def test_schedule_leaving_out_a_fragment_is_an_error():
    bad = {"m1": GPIPE["m1"][:-1], "m2": GPIPE["m2"]}
    with pytest.raises(ScheduleError, match=r"leaves out fragment .*call_counter 1"):
        scheduled(bad)


def test_rule_merge_by_predicate():
    got = merge_by_rules(scheduled(GPIPE), lambda a, b: a.mesh == "m2" and a.kind == b.kind == "F")
    assert skeleton(got) == HEAD + [
        "m2 F1.*", "m2 B1.0", "Transfer m2->m1", "m2 B1.1", "Transfer m2->m1", "m1 B0.0",
        "m1 B0.1"] + TAIL


def test_rule_merge_that_would_cycle_is_an_error():
    """F0.1 and B0.1 are adjacent on m1, but B0.1 waits on m2's F1.1, which waits on F0.1."""
    p = scheduled({"m1": [R("F", 0, 0), R("B", 0, 0), R("F", 0, 1), R("B", 0, 1)],
                   "m2": ONE_F_ONE_B["m2"]})
    rules = [(FragmentPattern(kind="F", stage=0, microbatch=1), FragmentPattern(kind="B", stage=0))]
    with pytest.raises(MergeError, match="merge rule matched"):
        merge_by_rules(p, rules)
