"""Frontend end to end: a 4-layer MLP's loss and gradients under GPipe, 1F1B and ZB-H1 programs
equal jax.jit of the original step (relative error < 1e-5, float32)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from compiler.config import MpmdConfig, schedule_from_plan
from compiler.errors import CompilerError, ConfigError
from compiler.frontend import jit, trace_program
from ir import FragmentRef as R
from compiler.named import named_computation
from compiler.program import print_program

L, M = 4, 2
LAYERS = [named_computation(lambda w, h: jnp.tanh(h @ w["w"] + w["b"]), name=f"layer{i}")
          for i in range(L)]


def loss_fn(params, xs, ys):
    tot = 0.0
    for x, y in zip(xs, ys):
        h = x
        for i in range(L):
            h = LAYERS[i](params[i], h)
        tot = tot + jnp.mean((h - y) ** 2)
    return tot / len(xs)


STEP = jax.value_and_grad(loss_fn)


def data():
    k = jax.random.PRNGKey(0)
    params = [{"w": jax.random.normal(jax.random.fold_in(k, i), (8, 8)) * 0.5,
               "b": jnp.full((8,), 0.1)} for i in range(L)]
    xs = [jax.random.normal(jax.random.fold_in(k, 100 + j), (4, 8)) for j in range(M)]
    ys = [jax.random.normal(jax.random.fold_in(k, 200 + j), (4, 8)) for j in range(M)]
    return params, xs, ys


@pytest.fixture(scope="module")
def topology():
    d = jax.devices()
    return {"m1": Mesh(d[0:2], ("x",)), "m2": Mesh(d[2:4], ("x",))}


def F(s, m):
    return R("F", s, m)


def B(s, m):
    return R("B", s, m)


def W(s, m):
    return R("W", s, m)


SCHEDULES = {
    "gpipe": {"m1": [F(0, 0), F(0, 1), B(0, 0), B(0, 1)],
              "m2": [F(1, 0), F(1, 1), B(1, 0), B(1, 1)]},
    "1f1b": {"m1": [F(0, 0), F(0, 1), B(0, 0), B(0, 1)],
             "m2": [F(1, 0), B(1, 0), F(1, 1), B(1, 1)]},
    "zb-h1": {"m1": [F(0, 0), F(0, 1), B(0, 0), W(0, 0), B(0, 1), W(0, 1)],
              "m2": [F(1, 0), B(1, 0), F(1, 1), B(1, 1), W(1, 0), W(1, 1)]},
}


def config(topology, name, **kw):
    return MpmdConfig(topology, stage_assignment={f"layer{i}": i // 2 for i in range(L)},
                      stage_mesh={0: "m1", 1: "m2"}, schedule=SCHEDULES[name], microbatches=M,
                      merge_forward_backward=(name == "1f1b"), **kw)


def rel_err(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_mlp_matches_jax_jit(topology, name):
    params, xs, ys = data()
    want = jax.jit(STEP)(params, xs, ys)
    lowered = jit(STEP, config(topology, name), verify=True).lower(params, xs, ys)
    got = lowered.compile()(params, xs, ys)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_err(g, w) < 1e-5
    # every mesh runs its user fragments in the schedule's order
    for mesh, refs in SCHEDULES[name].items():
        names = [s.name for s in lowered.exported.programs[mesh].steps
                 if hasattr(s, "executable") and s.kind in ("F", "B", "W", "FB")]
        expect = [str(r) for r in refs]
        if name == "1f1b" and mesh == "m2":
            expect = ["FB1.0", "FB1.1"]
        assert names == expect
    # one executable per stage body and kind shared by both microbatches, plus one accumulator
    # init per mesh: no inferred code is left (the loss sum and mean, the gradient sums and the
    # loss cotangent are absorbed)
    calls = lowered.exported.meta["calls"]
    fwd0 = [k for k in calls if k.startswith("p") and "stage0" in k and k.endswith("_fwd")]
    assert len(fwd0) == 1 and calls[fwd0[0]] == 2
    kinds = {"gpipe": ("fwd", "bwd"), "1f1b": ("fwd_bwd",), "zb-h1": ("fwd", "bwd", "wgrad")}
    want = {f"m{i}_{'stage%d' % (i - 1)}_{k}" for i in (1, 2) for k in kinds[name]} \
        - ({"m1_stage0_fwd_bwd"} if name == "1f1b" else set())
    if name == "1f1b":
        want |= {"m1_stage0_fwd", "m1_stage0_bwd"}
    got_exes = {"_".join(k.split("_")[1:3] + [k.rsplit("_", 2)[-1] if not k.endswith("fwd_bwd")
                                              else "fwd_bwd"]) for k in calls}
    assert got_exes == want | {"m1_acc_init", "m2_acc_init"}, calls
    assert all(n == M for k, n in calls.items() if "acc_init" not in k)


def test_call_counters_and_transpose_counts(topology):
    params, xs, ys = data()
    p, _, _ = trace_program(STEP, (params, xs, ys), meshes=("m1", "m2"),
                            names={f"layer{i}" for i in range(L)})
    named = [(op.name, op.transpose) for op in p.ops if type(op).__name__ == "NamedComputation"]
    assert named[:4] == [("layer0", 0), ("layer1", 0), ("layer2", 0), ("layer3", 0)]
    assert sorted(named) == sorted([(f"layer{i}", t) for i in range(L) for t in (0, 1)] * M)


def test_assignment_to_unknown_mesh_is_an_error(topology):
    with pytest.raises(ConfigError, match="named computation 'layer0' is assigned to mesh 'm3', "
                                          "which is not in the topology"):
        MpmdConfig(topology, assignment={"layer0": "m3"})


def test_transfer_inference_off_is_an_error(topology):
    params, xs, ys = data()
    cfg = config(topology, "gpipe", infer_transfers=False, output_meshes={0: "m1"})
    with pytest.raises(CompilerError, match="transfer is needed while transfer inference is off"):
        jit(STEP, cfg).lower(params, xs, ys)


def test_batch_sharded_input_propagates(topology):
    params, xs, ys = data()
    xs = [jax.device_put(x, NamedSharding(topology["m1"], P("x"))) for x in xs]
    lowered = jit(STEP, config(topology, "1f1b")).lower(params, xs, ys)
    text = print_program(lowered.program)
    # the activations sent to m2 stay batch sharded
    assert 'transfer %2#2 : f32[4,8]@m1[{"x"},{}] -> f32[4,8]@m2[{"x"},{}]' in text
    got = lowered.compile()(params, xs, ys)
    want = jax.jit(STEP)(params, xs, ys)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert rel_err(g, w) < 1e-5


def test_schedule_from_plan_shape():
    class _Sched:
        order = ((F(0, 0),), (F(1, 0),))

    class _Plan:
        schedule = _Sched()
        rank_mesh = ("a", "b")
    assert schedule_from_plan(_Plan()) == {"a": (F(0, 0),), "b": (F(1, 0),)}
