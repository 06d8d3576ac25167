"""The transfer concatenation pass (``passes/concat_transfers.py``): lit style (a printed program
in, the pass, the expected program out), what it leaves alone, and a training step with gradient
clipping compiled with it: fewer transfers, results still equal to ``jax.jit``."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

import compiler
from compiler import MpmdConfig, named_computation
from compiler.export import export_program, run_sequential
from compiler.parse import parse_program
from compiler.passes.concat_transfers import concat_transfers
from compiler.program import Transfer, print_program
from compiler.verify import verify
from simulator.schedules import one_f_one_b

# l1 sends two scalars and an f32[4] to m2, in one run of transfers: one packed f32[6] moves.
IN = """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m2) -> (f32[4]@m2, f32[]@m2) {
  %0:3 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = reduce_sum[axes=(0,)] %a0 : f32[]
    %b1 = reduce_max[axes=(0,)] %a0 : f32[]
    %b2 = add %a0, %a0 : f32[4]
    return %b0, %b1, %b2
  } : (f32[4]@m1) -> (f32[]@m1, f32[]@m1, f32[4]@m1)
  %1 = transfer %0#0 : f32[]@m1 -> f32[]@m2
  %2 = transfer %0#1 : f32[]@m1 -> f32[]@m2
  %3 = transfer %0#2 : f32[4]@m1 -> f32[4]@m2
  %4:2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%arg1, %1, %2, %3) (%a0: f32[4], %a1: f32[], %a2: f32[], %a3: f32[4]) {
    %b0 = mul %a1, %a2 : f32[]
    %b1 = mul %a0, %a3 : f32[4]
    return %b1, %b0
  } : (f32[4]@m2, f32[]@m2, f32[]@m2, f32[4]@m2) -> (f32[4]@m2, f32[]@m2)
  return %4#0, %4#1
}
"""

OUT = """\
func @main(%arg0: f32[4]@m1, %arg1: f32[4]@m2) -> (f32[4]@m2, f32[]@m2) {
  %0 = fragment<mesh="m1", origin=["l1"], stage=0, call_counter=0> (%arg0) (%a0: f32[4]) {
    %b0 = reduce_sum[axes=(0,)] %a0 : f32[]
    %b1 = reduce_max[axes=(0,)] %a0 : f32[]
    %b2 = add %a0, %a0 : f32[4]
    %b3 = reshape[new_sizes=(1,)] %b0 : f32[1]
    %b4 = reshape[new_sizes=(1,)] %b1 : f32[1]
    %b5 = concatenate[dimension=0] %b3, %b4, %b2 : f32[6]
    return %b5
  } : (f32[4]@m1) -> f32[6]@m1
  %1 = transfer %0 : f32[6]@m1 -> f32[6]@m2
  %2:2 = fragment<mesh="m2", origin=["l2"], stage=1, call_counter=0> (%arg1, %1) (%a0: f32[4], %a1: f32[6]) {
    %b0 = slice[limit_indices=(1,) start_indices=(0,)] %a1 : f32[1]
    %b1 = reshape[new_sizes=()] %b0 : f32[]
    %b2 = slice[limit_indices=(2,) start_indices=(1,)] %a1 : f32[1]
    %b3 = reshape[new_sizes=()] %b2 : f32[]
    %b4 = slice[limit_indices=(6,) start_indices=(2,)] %a1 : f32[4]
    %b5 = mul %b1, %b3 : f32[]
    %b6 = mul %a0, %b4 : f32[4]
    return %b5, %b6
  } : (f32[4]@m2, f32[6]@m2) -> (f32[]@m2, f32[4]@m2)
  return %2#1, %2#0
}
"""


def meshes2():
    d = jax.devices()
    return {"m1": Mesh(np.array(d[0:2]), ("data",)), "m2": Mesh(np.array(d[2:4]), ("data",))}


def test_small_transfers_from_one_fragment_to_one_mesh_become_one():
    p = parse_program(IN, meshes=("m1", "m2"))
    verify(p)
    q = concat_transfers(p)
    verify(q)
    assert print_program(q) == OUT
    assert concat_transfers(q) is q   # one transfer left: nothing to pack, the program itself
    # the same results, bit for bit
    topo = meshes2()
    x, y = jnp.array([1.0, -2.0, 3.5, 0.25]), jnp.array([2.0, 3.0, -1.0, 0.5])
    want = run_sequential(export_program(p, topo), [x, y])
    got = run_sequential(export_program(q, topo), [x, y])
    assert len(want) == len(got) == 2
    for a, b in zip(got, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_large_values_and_program_outputs_are_left_alone():
    p = parse_program(IN, meshes=("m1", "m2"))
    # over the size limit: only the two scalars (4 bytes each) are packed
    q = concat_transfers(p, max_bytes=4)
    assert sum(isinstance(op, Transfer) for op in q.ops) == 2
    assert concat_transfers(p, max_bytes=0) is p
    # a transferred value that is also a program output stays a transfer of its own
    out = IN.replace("return %4#0, %4#1\n}", "return %4#0, %4#1, %1\n}").replace(
        "-> (f32[4]@m2, f32[]@m2) {", "-> (f32[4]@m2, f32[]@m2, f32[]@m2) {", 1)
    q = concat_transfers(parse_program(out, meshes=("m1", "m2")))
    verify(q)
    ts = [op for op in q.ops if isinstance(op, Transfer)]
    assert [str(q.types[t.value]) for t in ts] == ["f32[]", "f32[5]"]
    assert ts[0].out in q.outputs


# ----------------------------------------------------------------- a clipped training step

W = 8
LAYERS = [named_computation(lambda p, h: jnp.tanh(h @ p["w"] + p["b"]), name=f"layer{i}")
          for i in range(2)]


def loss_fn(params, xs):
    tot = 0.0
    for x in xs:
        h = x
        for i, lay in enumerate(LAYERS):
            h = lay(params[i], h)
        tot = tot + jnp.mean(h ** 2)
    return tot / len(xs)


def step(params, xs):
    loss, grads = jax.value_and_grad(loss_fn)(params, xs)
    norm = jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))
    scale = jnp.where(norm < 0.1, 1.0, 0.1 / norm)
    return loss, jax.tree.map(lambda p, g: p - 0.5 * scale * g, params, grads)


def test_a_clipped_step_sends_fewer_transfers_and_matches_jit():
    key = jax.random.PRNGKey(3)
    params = [{"w": jax.random.normal(jax.random.fold_in(key, i), (W, W)) / 3,
               "b": jnp.full((W,), 0.1 * i)} for i in range(2)]
    xs = [jax.random.normal(jax.random.fold_in(key, 10 + m), (4, W)) for m in range(2)]
    topo = {"m0": meshes2()["m1"], "m1": meshes2()["m2"]}
    table = one_f_one_b(num_ranks=2, microbatches=2)
    config = MpmdConfig(topology=topo, assignment={"layer0": "m0", "layer1": "m1"},
                        schedule={m: table.order[r] for r, m in enumerate(topo)}, microbatches=2)
    lowered = compiler.jit(step, config, verify=True).lower(params, xs)
    hist = dict(lowered.history)
    before = sum(isinstance(op, Transfer) for op in hist["remove_transfer_cycles"].ops)
    after = sum(isinstance(op, Transfer) for op in hist["concat_transfers"].ops)
    assert after < before   # m1's partial sums of squares move as one vector
    got = lowered.compile()(params, xs)
    want = jax.jit(step)(params, xs)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
