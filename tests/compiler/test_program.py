"""The program IR: printer, canonical body keys (dedup), body evaluation, export of a small program."""

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh

from compiler.export import export_program, run_sequential
from compiler.program import (Eqn, Fragment, Lit, Origin, Program, TensorType, Transfer, body_key,
                              eval_body, print_program)

T = TensorType((4,), "float32")


def frag(mesh, name, t, ins, outs, body, cc):
    return Fragment(mesh, (Origin(name, t),), tuple(ins), tuple(outs), tuple(body), 0, cc)


def prog():
    e = lambda a, o: Eqn(lax.mul_p, {}, (a, Lit(2.0, "float32")), (o,))  # noqa: E731
    ops = (frag("m1", "l", 0, ["x"], ["a"], [e("x", "a")], 0),
           frag("m1", "l", 0, ["y"], ["b"], [e("y", "b")], 1),
           Transfer("a", "m1", "m2", "c"),
           frag("m2", "k", 1, ["c"], ["d"], [e("c", "d")], 0))
    return Program(("m1", "m2"), ("x", "y"), ("m1", "m1"), ("d", "b"), (None, None), ops,
                   {n: T for n in "xyabcd"})


def test_print_program():
    assert print_program(prog()) == """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m1) -> (f32[4]@m2, f32[4]@m1) {
  %0 = fragment<mesh="m1", origin=["l"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = fragment<mesh="m1", origin=["l"], stage=0, call_counter=1> (%arg1) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %2 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %3 = fragment<mesh="m2", origin=["k"(1)], stage=0, call_counter=0> (%2) (%a0: f32[4]) {
    %b0 = mul %a0, 2.0:f32 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  return %3, %1
}
"""


def test_body_key_equal_across_call_counters_and_differs_across_meshes():
    p = prog()
    k0, k1, _t, k2 = (body_key(op, p) if isinstance(op, Fragment) else None for op in p.ops)
    assert k0 == k1 and k0 != k2


def test_eval_body():
    f = prog().ops[0]
    (out,) = eval_body(f.body, f.inputs, f.outputs, [np.arange(4, dtype=np.float32)])
    np.testing.assert_array_equal(np.asarray(out), [0.0, 2.0, 4.0, 6.0])


def test_export_dedups_bodies_and_runs():
    d = jax.devices()
    topo = {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}
    ep = export_program(prog(), topo)
    assert ep.meta["calls"] == {"p0_m1_stage0_l_fwd": 2, "p1_m2_stage0_k_bwd": 1}
    assert [type(s).__name__ for s in ep.programs["m1"].steps] == ["Call", "Call", "Send"]
    # the transferred value's last use on m2 is the k(1) call: donated; inputs never are
    assert ep.programs["m2"].steps[0].donate == (0,) and ep.programs["m1"].steps[0].donate == ()
    x, y = np.ones(4, np.float32), np.arange(4, dtype=np.float32)
    d_, b_ = run_sequential(ep, [x, y])
    np.testing.assert_array_equal(np.asarray(d_), x * 4)
    np.testing.assert_array_equal(np.asarray(b_), y * 2)
