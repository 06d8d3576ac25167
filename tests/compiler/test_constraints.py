"""Sharding constraints written against axis names (compiler.constraints): recorded on the
topology's logical mesh while the frontend traces, resolved on each fragment's own mesh, the
identity without a mesh; a reshard between two constraints runs as an all-to-all on the mesh
that has the axes and as nothing on the mesh that lacks them, with jax.jit's numbers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec as P

from compiler.config import MpmdConfig
from compiler.constraints import (constrain, logical_mesh, mesh_axes, resolve_params,
                                  resolve_spec, tracing)
from compiler.exported import Call
from compiler.frontend import jit, trace_program
from compiler.named import named_computation
from compiler.program import eval_body

BY_BATCH, BY_EXPERT = P(("data", "expert")), P("data", "expert")


@pytest.fixture(scope="module")
def topology():
    d = np.array(jax.devices())
    return {"m1": Mesh(d[0:2].reshape(1, 2), ("data", "expert")),
            "m2": Mesh(d[2:4], ("data",))}


def test_logical_mesh_has_every_axis_name_once_at_size_one(topology):
    m = logical_mesh(topology)
    assert m.axis_names == ("data", "expert") and m.axis_sizes == (1, 1)
    assert logical_mesh({"a": object()}) is None


def test_resolve_spec_keeps_the_axes_a_mesh_has_and_that_divide(topology):
    m1, m2 = topology["m1"], topology["m2"]
    assert resolve_spec(BY_BATCH, (4, 8), m1) == P(("data", "expert"))
    assert resolve_spec(BY_EXPERT, (4, 8), m2) == P("data")          # no expert axis on m2
    assert resolve_spec(P(None, "expert"), (4, 3), m1) == P()        # 2 does not divide 3
    assert resolve_spec(P(("expert", "data")), (6,), m1) == P(("expert", "data"))
    assert resolve_spec(P(("data", "expert")), (3,), m2) == P()      # 2 does not divide 3


def test_constrain_is_the_identity_without_a_mesh_and_logical_when_tracing(topology):
    f = lambda x: constrain(x, BY_BATCH) * 2
    assert mesh_axes() == ()
    assert "sharding_constraint" not in str(jax.make_jaxpr(f)(jnp.ones((4, 4))))
    with tracing(topology):
        assert mesh_axes() == ("data", "expert")
        e = jax.make_jaxpr(f)(jnp.ones((4, 4))).jaxpr.eqns[0]
    assert e.primitive.name == "sharding_constraint"
    assert isinstance(e.params["sharding"].mesh, AbstractMesh)
    assert e.params["sharding"].spec == BY_BATCH
    # resolved on m2 it keeps only "data"; dropped when evaluated without a mesh
    got = resolve_params("sharding_constraint", e.params, topology["m2"], (4, 4))
    assert got["sharding"] == NamedSharding(topology["m2"], P("data"))
    # the ambient mesh (jax.set_mesh) is used outside the frontend
    with jax.set_mesh(topology["m2"]):
        assert mesh_axes() == ("data",)
        e = jax.make_jaxpr(f)(jnp.ones((4, 4))).jaxpr.eqns[0]
    assert e.params["sharding"].spec == P("data")


def _exchange(w, x):
    y = constrain(constrain(x * w, BY_BATCH), BY_EXPERT)
    return constrain(constrain(jnp.tanh(y), BY_EXPERT), BY_BATCH)


A = named_computation(_exchange, name="a")
B = named_computation(_exchange, name="b")


def _step(w, x):
    return jnp.sum(B(w, A(w, x)) ** 2)


def _hlo(lowered, mesh: str) -> str:
    """Compiled HLO of the mesh's forward executable."""
    prog = lowered.program
    call = next(s for s in lowered.exported.programs[mesh].steps
                if isinstance(s, Call) and s.kind == "F")
    exe = lowered.exported.executables[call.executable]
    args = [jax.ShapeDtypeStruct(prog.types[v].shape, np.dtype(prog.types[v].dtype), sharding=sh)
            for v, sh in zip(call.inputs, exe.in_shardings)]
    return exe.fn.lower(*args).compile().as_text()


def test_a_reshard_between_constraints_is_an_all_to_all_only_where_the_axes_are(topology):
    w = jnp.float32(0.5)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 4, 8))
    cfg = MpmdConfig(topology, assignment={"a": "m1", "b": "m2"},
                     in_specs={1: P(("data", "expert"))}, input_meshes={0: "m1", 1: "m1"})
    lowered = jit(jax.value_and_grad(_step, argnums=1), cfg).lower(w, x)
    got = lowered.compile()(w, x)
    want = jax.jit(jax.value_and_grad(_step, argnums=1))(w, x)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-6)
    assert _hlo(lowered, "m1").count("all-to-all(") == 2
    assert "all-to-all(" not in _hlo(lowered, "m2")


def test_eval_body_drops_logical_constraints_without_a_mesh(topology):
    with tracing(topology):
        p, _, _ = trace_program(lambda x: A(1.0, x), (jnp.ones((4, 4, 8)),), meshes=("m1",))
    body = p.ops[0].body
    assert sum(e.prim.name == "sharding_constraint" for e in body) == 4
    (out,) = eval_body(body, p.ops[0].inputs, p.ops[0].outputs, [jnp.ones((4, 4, 8))])
    np.testing.assert_allclose(np.asarray(out), np.tanh(np.ones((4, 4, 8))), rtol=1e-6)
