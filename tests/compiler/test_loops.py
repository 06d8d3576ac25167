"""Loops end to end: a step written with ``fori_loop`` over microbatches or ``scan`` over layers
compiles to the fragments, call counters and per-mesh order of its Python-unrolled twin, and
matches ``jax.jit`` (loss and gradients, float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.errors import CompilerError
from compiler.frontend import jit, trace_program
from compiler.named import named_computation
from compiler.program import Fragment, MeshlessOp, Program, print_program
from ir import FragmentRef as R

M = 4


@pytest.fixture(scope="module")
def topology():
    d = jax.devices()
    return {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}


def _tanh_layer(w, h):
    return jnp.tanh(h @ w)


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def user_order(lowered):
    """Per mesh, the names of the user fragment calls (``F0.2``: kind, stage, microbatch)."""
    return {m: [s.name for s in mp.steps if getattr(s, "kind", "") in ("F", "B", "W", "FB")]
            for m, mp in lowered.exported.programs.items()}


def user_fragments(p: Program) -> list[str]:
    """Each user fragment printed on its own (operands as ``%argN``), in program order."""
    out = []
    for op in p.ops:
        if isinstance(op, Fragment) and op.is_user:
            alone = Program(p.meshes, op.inputs, (op.mesh,) * len(op.inputs), op.outputs,
                            (None,) * len(op.outputs), (op,), p.types)
            out.append(print_program(alone))
    return out


def first(history, name):
    return next(p for n, p in history if n == name)


# ----------------------------------------------------------------- fori_loop over microbatches

L1 = named_computation(_tanh_layer, name="l1")
L2 = named_computation(_tanh_layer, name="l2")


def mb_loss(ws, x):
    return jnp.mean(L2(ws[1], L1(ws[0], x)) ** 2)


def step_fori(ws, xs):
    def body(i, acc):
        x = lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)
        loss, g = jax.value_and_grad(mb_loss)(ws, x)
        return acc[0] + loss, jax.tree.map(jnp.add, acc[1], g)
    return lax.fori_loop(0, M, body, (0.0, jax.tree.map(jnp.zeros_like, ws)))


def step_unrolled(ws, xs):
    acc = (0.0, jax.tree.map(jnp.zeros_like, ws))
    for i in range(M):
        x = lax.dynamic_index_in_dim(xs, i, 0, keepdims=False)
        loss, g = jax.value_and_grad(mb_loss)(ws, x)
        acc = (acc[0] + loss, jax.tree.map(jnp.add, acc[1], g))
    return acc


ONE_F_ONE_B = {"m1": [R("F", 0, 0), R("F", 0, 1), R("B", 0, 0), R("F", 0, 2), R("B", 0, 1),
                      R("F", 0, 3), R("B", 0, 2), R("B", 0, 3)],
               "m2": [R(k, 1, m) for m in range(M) for k in "FB"]}


def mb_data():
    k = jax.random.PRNGKey(0)
    ws = [jax.random.normal(jax.random.fold_in(k, i), (8, 8)) * 0.5 for i in range(2)]
    xs = jax.random.normal(jax.random.fold_in(k, 9), (M, 4, 8))
    return ws, xs


def test_fori_loop_over_microbatches_compiles_to_the_unrolled_program_and_pipelines(topology):
    cfg = MpmdConfig(topology, assignment={"l1": "m1", "l2": "m2"}, microbatches=M,
                     schedule=ONE_F_ONE_B)
    ws, xs = mb_data()
    lf = jit(step_fori, cfg, verify=True).lower(ws, xs)
    lu = jit(step_unrolled, cfg, verify=True).lower(ws, xs)
    # before the passes: one loop; after unrolling + call counters: the Python loop's program
    assert [type(op).__name__ for op in lf.initial_program.ops].count("ForLoop") == 1
    assert print_program(dict(lf.history)["unroll"]) == print_program(dict(lu.history)["unroll"])
    assert print_program(lf.program) == print_program(lu.program)
    assert user_order(lf) == user_order(lu) == {m: [str(r) for r in refs]
                                                for m, refs in ONE_F_ONE_B.items()}
    ccs = sorted((f.mesh, f.kind, f.call_counter) for f in lf.program.fragments() if f.is_user)
    assert ccs == sorted((m, k, c) for m in ("m1", "m2") for k in "FB" for c in range(M))
    got = lf.compile()(ws, xs)
    want = jax.jit(step_fori)(ws, xs)
    assert rel_err(got[0], want[0]) < 1e-5
    for g, w in zip(got[1], want[1]):
        assert rel_err(g, w) < 1e-5
    assert got[1][0].sharding.mesh == topology["m1"] and got[1][1].sharding.mesh == topology["m2"]


# ----------------------------------------------------------------- scan over layers

L = 4
LAYER = named_computation(_tanh_layer, name="layer")
LAYERS = [named_computation(_tanh_layer, name=f"layer[{k}]") for k in range(L)]


def loss_scan(ws, xs):
    tot = 0.0
    for m in range(2):
        h, _ = lax.scan(lambda h, w: (LAYER(w, h), None), xs[m], ws)
        tot = tot + jnp.mean(h ** 2)
    return tot / 2


def loss_layers_unrolled(ws, xs):
    tot = 0.0
    for m in range(2):
        h = xs[m]
        for k in range(L):
            h = LAYERS[k](ws[k], h)
        tot = tot + jnp.mean(h ** 2)
    return tot / 2


def layer_data(mbs):
    k = jax.random.PRNGKey(1)
    return (jax.random.normal(k, (L, 8, 8)) * 0.5,
            jax.random.normal(jax.random.fold_in(k, 1), (mbs, 4, 8)))


def layer_config(topology, mbs, **kw):
    return MpmdConfig(topology, stage_assignment={f"layer[{k}]": k // 2 for k in range(L)},
                      stage_mesh={0: "m1", 1: "m2"}, microbatches=mbs, **kw)


def test_scan_over_layers_is_split_across_meshes_as_assigned(topology):
    ws, xs = layer_data(2)
    step_s, step_u = jax.value_and_grad(loss_scan), jax.value_and_grad(loss_layers_unrolled)
    ls = jit(step_s, layer_config(topology, 2), verify=True).lower(ws, xs)
    lu = jit(step_u, layer_config(topology, 2), verify=True).lower(ws, xs)
    # the named computations become the same fragments (names, meshes, stages, call counters,
    # bodies) as the hand-unrolled layers' once DCE has run (the scan's transposed body computes
    # the input cotangent of layer 0 too, which jax.grad of the Python loop never builds)
    frags = user_fragments(first(ls.history, "dce"))
    assert frags == user_fragments(first(lu.history, "dce"))
    assert len(frags) == 2 * 2 * L  # microbatches x (forward, backward) x layers
    assert user_order(ls) == user_order(lu) == {
        "m1": ["F0.0", "F0.1", "B0.1", "B0.0"], "m2": ["F1.0", "F1.1", "B1.1", "B1.0"]}
    finals = {(f.mesh, tuple(o.name for o in f.origin)) for f in ls.program.fragments()
              if f.is_user}
    assert finals == {("m1", ("layer[0]", "layer[1]")), ("m2", ("layer[2]", "layer[3]")),
                      ("m1", ("layer[1]", "layer[0]")), ("m2", ("layer[3]", "layer[2]"))}
    got, want = ls.compile()(ws, xs), jax.jit(step_s)(ws, xs)
    assert rel_err(got[0], want[0]) < 1e-5 and rel_err(got[1], want[1]) < 1e-5


def test_fori_over_microbatches_around_scan_over_layers_pipelines(topology):
    def mb(ws, x):
        h, _ = lax.scan(lambda h, w: (LAYER(w, h), None), x, ws)
        return jnp.mean(h ** 2)

    def step(ws, xs):
        def body(i, acc):
            loss, g = jax.value_and_grad(mb)(ws, lax.dynamic_index_in_dim(xs, i, 0, False))
            return acc[0] + loss, acc[1] + g
        return lax.fori_loop(0, M, body, (0.0, jnp.zeros_like(ws)))

    ws, xs = layer_data(M)
    sched = {m: [R(k, s, i) for i in range(M) for k in "FB"] for s, m in enumerate(("m1", "m2"))}
    lo = jit(step, layer_config(topology, M, schedule=sched), verify=True).lower(ws, xs)
    assert user_order(lo) == {m: [str(r) for r in refs] for m, refs in sched.items()}
    got, want = lo.compile()(ws, xs), jax.jit(step)(ws, xs)
    assert rel_err(got[0], want[0]) < 1e-5 and rel_err(got[1], want[1]) < 1e-5


# ----------------------------------------------------------------- what cannot be honoured


def test_while_loop_with_named_computation_is_a_one_line_error(topology):
    def step(w, x, n):
        return lax.fori_loop(0, n, lambda i, h: L1(w, h), x)  # traced bound: a while_loop

    with pytest.raises(CompilerError) as e:
        trace_program(step, (jnp.ones((8, 8)), jnp.ones((4, 8)), jnp.int32(3)),
                      meshes=("m1",), names={"l1"})
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("named computation 'l1' is called inside while: a while_loop")


def test_cond_around_named_computation_is_a_one_line_error():
    def step(w, x):
        return lax.cond(x.sum() > 0, lambda h: L1(w, h), lambda h: h, x)

    with pytest.raises(CompilerError, match=r"^named computation 'l1' is called inside cond: "):
        trace_program(step, (jnp.ones((8, 8)), jnp.ones((4, 8))), meshes=("m1",), names={"l1"})


def test_loop_without_named_computations_stays_one_meshless_op():
    def step(w, x):
        return lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ w), x)

    p, _, _ = trace_program(step, (jnp.ones((8, 8)), jnp.ones((4, 8))), meshes=("m1",),
                            names={"l1"})
    assert [op.eqn.prim.name for op in p.ops if isinstance(op, MeshlessOp)] == ["scan"]


def test_iterations_assigned_for_one_name_but_not_the_other_is_an_error(topology):
    other = named_computation(_tanh_layer, name="other")

    def loss(ws, x):
        h, _ = lax.scan(lambda h, w: (other(w, LAYER(w, h)), None), x, ws)
        return jnp.mean(h)

    cfg = MpmdConfig(topology, assignment={"layer[0]": "m1", "layer[1]": "m2", "other": "m1"})
    with pytest.raises(CompilerError, match=r"^named computation 'other' shares a loop with "
                                            r"'layer', whose iterations are assigned one by one"):
        jit(loss, cfg).lower(jnp.ones((2, 8, 8)), jnp.ones((4, 8)))
