"""The RFC's two worked examples (shared/reference/000_*.txt), traced from real JAX functions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

from compiler.config import MpmdConfig
from compiler.errors import CompilerError
from compiler.frontend import jit
from ir import FragmentRef as R
from compiler.named import named_computation
from compiler.program import print_program

layer1 = named_computation(lambda x, y: x + x, name="layer1")
layer2 = named_computation(lambda x, y: x + x, name="layer2")


@pytest.fixture(scope="module")
def topology():
    d = jax.devices()
    return {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}


def example1(a0, a1):
    h = layer1(a0, a1)
    o = layer2(h, jnp.zeros((4,)))
    return h * h, o / o


EX1_ASSIGNED = """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]) -> (f32[4], f32[4]) {
  %0 = fragment<mesh="m1", origin=["layer1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m1) -> f32[4]@m1
  %1 = transfer %0 : f32[4]@m1 -> f32[4]@m2
  %2 = broadcast_in_dim[broadcast_dimensions=() shape=(4,)] 0.0:f32 : f32[4]
  %3 = fragment<mesh="m2", origin=["layer2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    return %b0
  } : (f32[4]@m2) -> f32[4]@m2
  %4 = mul %0, %0 : f32[4]
  %5 = div %3, %3 : f32[4]
  return %4, %5
}
"""

EX1_INFERRED = """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m1) -> (f32[4]@m1, f32[4]@m2) {
  %0:2 = fragment<mesh="m1", origin=["layer1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    %b1 = mul %b0, %b0 : f32[4]
    return %b0, %b1
  } : (f32[4]@m1) -> (f32[4]@m1, f32[4]@m1)
  %1 = transfer %0#0 : f32[4]@m1 -> f32[4]@m2
  %2 = fragment<mesh="m2", origin=["layer2"], stage=1, call_counter=0> (%1) (%a0: f32[4]) {
    %b0 = add %a0, %a0 : f32[4]
    %b1 = div %b0, %b0 : f32[4]
    return %b1
  } : (f32[4]@m2) -> f32[4]@m2
  return %0#1, %2
}
"""


def test_example1_mesh_assignment_and_inference(topology):
    cfg = MpmdConfig(topology, assignment={"layer1": "m1", "layer2": "m2"})
    lo = jit(example1, cfg, verify=True).lower(jnp.ones(4), jnp.ones(4))
    hist = dict(lo.history)
    assert print_program(hist["assignment"]) == EX1_ASSIGNED
    # multiply pushed into layer1's fragment on m1, divide into layer2's on m2; one transfer
    assert print_program(hist["absorb"]) == EX1_INFERRED
    a0, a1 = jnp.arange(4.0) + 1, jnp.ones(4)
    got = lo.compile()(a0, a1)
    want = jax.jit(example1)(a0, a1)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def example2(x):
    outs = []
    for _mb in range(2):
        y, vjp = jax.vjp(lambda x: layer2(layer1(x, x), x), x)
        outs.append(vjp(y)[0])
    return outs


ONE_F_ONE_B = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("B", 0, 1)],
               "m2": [R("F", 1, 0), R("B", 1, 0), R("F", 1, 1), R("B", 1, 1)]}


def _frag(mesh, origin, cc, arg, body, shard=""):
    t = f"f32[4]@{mesh}{shard}"
    lines = [f'fragment<mesh="{mesh}", origin=[{origin}], stage={0 if mesh == "m1" else 1}, '
             f'call_counter={cc}> ({arg}) (%a0: f32[4]) {{']
    lines += [f"    {b}" for b in body]
    lines += [f"  }} : ({t}) -> {t}"]
    return "\n".join(lines)


def _ex2(order, shard=""):
    """Expected text: order is a list of (kind, arg-or-None) building the program."""
    out, k = [], 0
    for item in order:
        if item[0] == "T":
            _, src, a, b = item
            out.append(f"  %{k} = transfer {src} : f32[4]@{a}{shard} -> f32[4]@{b}{shard}")
        else:
            mesh, origin, cc, arg, body = item
            out.append(f"  %{k} = " + _frag(mesh, origin, cc, arg, body, shard))
        k += 1
    return out


ADD = ["%b0 = add %a0, %a0 : f32[4]", "return %b0"]
ADDANY = ["%b0 = add_any %a0, %a0 : f32[4]", "return %b0"]
MERGED = ["%b0 = add %a0, %a0 : f32[4]", "%b1 = add_any %b0, %b0 : f32[4]", "return %b1"]


def _program(ops, shard=""):
    t = f"f32[4]@m1{shard}"
    return "\n".join([f"func @main(%arg0: {t}) -> ({t}, {t}) {{"] + ops
                     + ["  return %10, %11" if len(ops) == 12 else "  return %8, %9", "}"]) + "\n"


EX2_SCHEDULED = _program(_ex2([
    ("m1", '"layer1"', 0, "%arg0", ADD), ("T", "%0", "m1", "m2"),
    ("m2", '"layer2"', 0, "%1", ADD), ("m2", '"layer2"(1)', 0, "%2", ADDANY),
    ("T", "%3", "m2", "m1"),
    ("m1", '"layer1"', 1, "%arg0", ADD), ("T", "%5", "m1", "m2"),
    ("m2", '"layer2"', 1, "%6", ADD), ("m2", '"layer2"(1)', 1, "%7", ADDANY),
    ("T", "%8", "m2", "m1"),
    ("m1", '"layer1"(1)', 0, "%4", ADDANY), ("m1", '"layer1"(1)', 1, "%9", ADDANY)]))


def _merged(shard=""):
    return _program(_ex2([
        ("m1", '"layer1"', 0, "%arg0", ADD), ("T", "%0", "m1", "m2"),
        ("m2", '"layer2", "layer2"(1)', 0, "%1", MERGED), ("T", "%2", "m2", "m1"),
        ("m1", '"layer1"', 1, "%arg0", ADD), ("T", "%4", "m1", "m2"),
        ("m2", '"layer2", "layer2"(1)', 1, "%5", MERGED), ("T", "%6", "m2", "m1"),
        ("m1", '"layer1"(1)', 0, "%3", ADDANY), ("m1", '"layer1"(1)', 1, "%7", ADDANY)],
        shard), shard)


def test_example2_1f1b_merge_propagate_export(topology):
    cfg = MpmdConfig(topology, assignment={"layer1": "m1", "layer2": "m2"}, schedule=ONE_F_ONE_B,
                     merge_forward_backward=True, in_specs={0: P("x")}, microbatches=2)
    lo = jit(example2, cfg, verify=True).lower(jnp.ones(4))
    hist = dict(lo.history)
    # 1F1B: layer1 mb1 before layer1(1) mb0
    assert print_program(hist["schedule"]) == EX2_SCHEDULED
    # layer2 and layer2(1) merged per microbatch
    assert print_program(hist["merge_forward_backward"]) == _merged()
    # propagation: everything batch sharded
    assert print_program(lo.program) == _merged('[{"x"}]')
    ep = lo.exported
    assert ep.meta["calls"] == {"p0_m1_stage0_layer1_fwd": 2, "p1_m2_stage1_layer2_fwd_bwd": 2,
                                "p2_m1_stage0_layer1_bwd": 2}
    assert [(s.executable, s.name) for s in ep.programs["m1"].steps if hasattr(s, "executable")] \
        == [("p0_m1_stage0_layer1_fwd", "F0.0"), ("p0_m1_stage0_layer1_fwd", "F0.1"),
            ("p2_m1_stage0_layer1_bwd", "B0.0"), ("p2_m1_stage0_layer1_bwd", "B0.1")]
    assert [s.name for s in ep.programs["m2"].steps if hasattr(s, "executable")] == \
        ["FB1.0", "FB1.1"]
    # donation as in the RFC's io_aliases: the fwd_bwd and bwd calls donate their transferred input
    assert [s.donate for s in ep.programs["m2"].steps if hasattr(s, "executable")] == [(0,), (0,)]
    assert ep.inputs[0][2].spec == P("x")
    x = jnp.arange(4.0)
    got = lo.compile()(x)
    want = jax.jit(example2)(x)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
        assert g.sharding.spec == P("x")
        assert {d.id for d in g.sharding.device_set} == {d.id for d in topology["m1"].devices.flat}


def test_example2_plan_naming_unknown_microbatch_is_an_error(topology):
    bad = dict(ONE_F_ONE_B)
    bad["m1"] = ONE_F_ONE_B["m1"] + [R("F", 0, 2)]
    cfg = MpmdConfig(topology, assignment={"layer1": "m1", "layer2": "m2"}, schedule=bad)
    with pytest.raises(CompilerError, match=r"names fragment F0\.2 .*microbatches \[0, 1\]"):
        jit(example2, cfg).lower(jnp.ones(4))
