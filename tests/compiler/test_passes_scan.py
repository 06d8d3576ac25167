"""A ``scan`` over stacked layer weights split across meshes (issue 49 item 2): each mesh holds its
own layers (``frontend._split_stacked`` + ``passes/stacked.py``), so the compiled program moves no
more transfers than the same step written as a Python loop over per-layer weights, and the loss,
gradients and updated weights match ``jax.jit`` (float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.frontend import jit
from compiler.named import named_computation
from compiler.passes.stacked import fold_stacked_slices
from compiler.program import Eqn, MeshlessOp, Program, TensorType, Transfer, eval_body
from compiler.verify import verify

L, W, MB = 4, 8, 2


def _layer(p, h):
    return jnp.tanh(h @ p["w"] + p["b"])


LAYER = named_computation(_layer, name="layer")
LAYERS = [named_computation(_layer, name=f"layer[{k}]") for k in range(L)]


def loss_scan(ps, xs):
    tot = 0.0
    for m in range(MB):
        h, _ = lax.scan(lambda h, p: (LAYER(p, h), None), xs[m], ps)
        tot = tot + jnp.mean(h ** 2)
    return tot / MB


def loss_list(pl, xs):
    tot = 0.0
    for m in range(MB):
        h = xs[m]
        for k in range(L):
            h = LAYERS[k](pl[k], h)
        tot = tot + jnp.mean(h ** 2)
    return tot / MB


def sgd(loss):
    def step(ps, xs):
        value, g = jax.value_and_grad(loss)(ps, xs)
        return value, g, jax.tree.map(lambda p, d: p - 0.1 * d, ps, g)
    return step


@pytest.fixture(scope="module")
def setup():
    d = jax.devices()
    topo = {"m1": Mesh(np.array(d[0:2]), ("x",)), "m2": Mesh(np.array(d[2:4]), ("x",))}
    cfg = MpmdConfig(topo, stage_assignment={f"layer[{k}]": k // 2 for k in range(L)},
                     stage_mesh={0: "m1", 1: "m2"}, microbatches=MB)
    k = jax.random.PRNGKey(3)
    ps = {"w": jax.random.normal(k, (L, W, W)) / 3,
          "b": jax.random.normal(jax.random.fold_in(k, 1), (L, W)) / 3}
    xs = jax.random.normal(jax.random.fold_in(k, 2), (MB, 4, W))
    return topo, cfg, ps, xs


def transfers(lowered) -> int:
    return sum(isinstance(op, Transfer) for op in lowered.program.ops)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


@pytest.fixture(scope="module")
def scan_lowered(setup):
    _, cfg, ps, xs = setup
    return jit(sgd(loss_scan), cfg, verify=True).lower(ps, xs)


def test_split_scan_moves_no_more_transfers_than_its_unrolled_form(setup, scan_lowered):
    _, cfg, ps, xs = setup
    pl = [jax.tree.map(lambda a, k=k: a[k], ps) for k in range(L)]
    unrolled = jit(sgd(loss_list), cfg, verify=True).lower(pl, xs)
    whole = jit(sgd(loss_scan), cfg, split_stacked=False).lower(ps, xs)
    # the unrolled step sends one activation forward and one cotangent back per microbatch
    assert transfers(unrolled) == 2 * MB
    assert transfers(scan_lowered) <= transfers(unrolled)
    assert transfers(whole) > transfers(unrolled)  # the stacked weights moved whole, as before
    # each mesh takes its own layers: two program inputs per stacked leaf, one per mesh
    assert scan_lowered.layout.ins == [((0, 2, "m1"), (2, 4, "m2"))] * 2 + [None]
    assert list(scan_lowered.program.input_meshes) == ["m1", "m2", "m1", "m2", "m1"]
    # every microbatch's forward on a mesh runs one executable (the layers are sliced once)
    for mp in scan_lowered.exported.programs.values():
        fwd = {s.executable for s in mp.steps if getattr(s, "kind", "") == "F"}
        assert len(fwd) == 1


def test_split_scan_matches_jit_and_keeps_each_mesh_s_layers_in_place(setup, scan_lowered):
    topo, _, ps, xs = setup
    got = scan_lowered.compile()(ps, xs)
    want = jax.jit(sgd(loss_scan))(ps, xs)
    assert rel_err(got[0], want[0]) < 1e-5
    for g, w in zip(jax.tree.leaves(got[1:]), jax.tree.leaves(want[1:])):
        assert g.shape == w.shape and rel_err(g, w) < 1e-5
    # the updated stacked weights are one array whose layers stay on their meshes
    new_w = got[2]["w"]
    assert {s.device for s in new_w.addressable_shards if s.index[0] == slice(0, 2, None)} == \
        set(topo["m1"].devices.flat)
    assert {s.device for s in new_w.addressable_shards if s.index[0] == slice(2, 4, None)} == \
        set(topo["m2"].devices.flat)
    # and can be fed back: a second step on the assembled result still matches jax.jit
    again = scan_lowered.compile()(got[2], xs)
    want2 = jax.jit(sgd(loss_scan))(want[2], xs)
    assert rel_err(again[0], want2[0]) < 1e-5
    for g, w in zip(jax.tree.leaves(again[2]), jax.tree.leaves(want2[2])):
        assert rel_err(g, w) < 1e-5


def test_a_loop_not_placed_layer_by_layer_is_not_split(setup):
    topo, _, ps, xs = setup
    cfg = MpmdConfig(topo, assignment={"layer": "m1"})
    lo = jit(sgd(loss_scan), cfg).lower(ps, xs)
    assert lo.layout is None
    assert len(lo.program.inputs) == 3


T4 = TensorType((4, 3), "float32")
T2 = TensorType((2, 3), "float32")
T1 = TensorType((1, 3), "float32")


def _slice(src: str, a: int, b: int, out: str) -> MeshlessOp:
    return MeshlessOp(Eqn(lax.slice_p, {"start_indices": (a, 0), "limit_indices": (b, 3),
                                        "strides": None}, (src,), (out,)))


def test_fold_reads_each_slice_from_its_own_chunk_through_elementwise_ops():
    # x = concat(a, b); y = 2 * x + x; outputs y[0:2], y[2:4], x[3:4]
    ops = (MeshlessOp(Eqn(lax.concatenate_p, {"dimension": 0}, ("a", "b"), ("x",))),
           MeshlessOp(Eqn(lax.mul_p, {}, ("x", "x"), ("t",))),
           MeshlessOp(Eqn(lax.add_p, {}, ("t", "x"), ("y",))),
           _slice("y", 0, 2, "y0"), _slice("y", 2, 4, "y1"), _slice("x", 3, 4, "x3"))
    p = Program(("m1", "m2"), ("a", "b"), ("m1", "m2"), ("y0", "y1", "x3"), ("m1", "m2", "m2"),
                ops, {"a": T2, "b": T2, "x": T4, "t": T4, "y": T4, "y0": T2, "y1": T2,
                      "x3": T1})
    q = fold_stacked_slices(p)
    verify(q)
    prims = [op.eqn.prim.name for op in q.ops]
    assert "concatenate" not in prims  # nothing reads the whole array any more
    assert prims.count("mul") == 2 and prims.count("add") == 2  # once per chunk
    defs = {op.outputs[0]: op.eqn for op in q.ops}
    y0 = defs[q.outputs[0]]
    assert y0.prim.name == "add" and y0.inputs[1] == "a"  # y[0:2] = 2 * a + a
    assert defs[y0.inputs[0]].inputs == ("a", "a")
    y1 = defs[q.outputs[1]]
    assert y1.prim.name == "add" and y1.inputs[1] == "b" and defs[y1.inputs[0]].inputs == ("b", "b")
    x3 = defs[q.outputs[2]]
    assert x3.prim.name == "slice" and x3.inputs == ("b",) and x3.params["start_indices"] == (1, 0)
    args = [jnp.arange(6.0).reshape(2, 3), jnp.arange(6.0, 12.0).reshape(2, 3)]
    got = eval_body([op.eqn for op in q.ops], q.inputs, q.outputs, args)
    want = eval_body([op.eqn for op in p.ops], p.inputs, p.outputs, args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_fold_leaves_a_program_without_stacks_unchanged():
    p = Program(("m1",), ("a",), ("m1",), ("s",), ("m1",), (_slice("a", 0, 1, "s"),),
                {"a": T4, "s": T1})
    assert fold_stacked_slices(p) is p
