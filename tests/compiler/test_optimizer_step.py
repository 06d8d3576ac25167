"""A training step with its optimizer inside, on 4 meshes of 2 CPU devices (issue 49, item 1).

A 4-layer MLP with a tied input/output matrix (first and last mesh), 2 microbatches under 1F1B,
an L2 term on the loss, gradient clipping by global norm and AdamW with weight decay masked to
the matrices (written by hand: optax is not on the project's machines; the optax version runs
where it is installed). Checked against ``jax.jit`` of the same step: loss, gradients, optimizer
state and parameters; and the number of fragments: the update adds at most two executables per
mesh (its partial norms, and the update after the global norm), every inferred fragment is merged.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

import compiler
from compiler import MpmdConfig, named_computation
from compiler.exported import Call
from compiler.program import Fragment
from simulator.schedules import one_f_one_b

W, L, M = 16, 4, 2
LAYERS = [named_computation(lambda p, h: jnp.tanh(h @ p["w"] + p["b"]), name=f"layer{i}")
          for i in range(L)]
HEAD = named_computation(lambda emb, h, y: jnp.mean((h @ emb.T - y) ** 2), name="head")


def loss_fn(params, xs, ys, l2=1e-3):
    tot = 0.0
    for x, y in zip(xs, ys):
        h = x @ params["emb"]                    # the tied matrix, on the first mesh ...
        h = LAYERS[0](params["layers"][0], h)
        for i in range(1, L):
            h = LAYERS[i](params["layers"][i], h)
        tot = tot + HEAD(params["emb"], h, y)     # ... and on the last
    reg = sum(jnp.sum(p ** 2) for p in jax.tree.leaves(params) if p.ndim == 2)
    return tot / len(xs) + l2 * reg


def adamw(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.1, clip=0.5):
    def init(params):
        z = jax.tree.map(jnp.zeros_like, params)
        return jnp.zeros((), jnp.int32), z, z

    def update(grads, state, params):
        count, mu, nu = state
        norm = jnp.sqrt(sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads)))
        grads = jax.tree.map(lambda g: g * jnp.where(norm < clip, 1.0, clip / norm), grads)
        mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)
        count = count + 1
        c1, c2 = 1 - b1 ** count, 1 - b2 ** count
        upd = jax.tree.map(lambda m, v, p: -lr * ((m / c1) / (jnp.sqrt(v / c2) + eps)
                                                  + (wd * p if p.ndim == 2 else 0.0)),
                           mu, nu, params)
        return upd, (count, mu, nu)

    return init, update


def make_step(update):
    def step(params, state, xs, ys):
        loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
        upd, state = update(grads, state, params)
        return loss, grads, jax.tree.map(jnp.add, params, upd), state
    return step


def grads_step(params, state, xs, ys):
    return jax.value_and_grad(loss_fn)(params, xs, ys)


def data():
    k = jax.random.PRNGKey(1)
    params = {"emb": jax.random.normal(k, (W, W)) / 4,
              "layers": [{"w": jax.random.normal(jax.random.fold_in(k, i), (W, W)) / 4,
                          "b": jnp.full((W,), 0.1)} for i in range(L)]}
    xs = [jax.random.normal(jax.random.fold_in(k, 10 + m), (8, W)) for m in range(M)]
    ys = [jax.random.normal(jax.random.fold_in(k, 20 + m), (8, W)) for m in range(M)]
    return params, xs, ys


@pytest.fixture(scope="module")
def config():
    d = jax.devices()
    topo = {f"m{i}": Mesh(np.array(d[2 * i:2 * i + 2]), ("data",)) for i in range(4)}
    table = one_f_one_b(num_ranks=4, microbatches=M)
    assignment = {f"layer{i}": f"m{i}" for i in range(L)}
    assignment["head"] = "m3"
    return MpmdConfig(topology=topo, assignment=assignment, microbatches=M,
                      schedule={m: table.order[r] for r, m in enumerate(topo)})


def _inferred_per_mesh(lowered):
    out = {}
    for f in lowered.program.fragments():
        if not f.is_user and f.part != "init":
            out[f.mesh] = out.get(f.mesh, 0) + 1
    return out


def _check(got, want):
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=1e-6)


def test_adamw_with_clipping_and_l2_matches_jit_in_few_fragments(config):
    params, xs, ys = data()
    init, update = adamw()
    step = make_step(update)
    args = (params, init(params), xs, ys)
    lowered = compiler.jit(step, config, verify=True).lower(*args)
    base = compiler.jit(grads_step, config).lower(*args)
    n_exe, n_base = len(lowered.exported.executables), len(base.exported.executables)
    calls = sum(isinstance(s, Call) for p in lowered.exported.programs.values() for s in p.steps)
    # 19 executables and 27 calls with the update, 16 executables without it (before
    # merge_inferred each equation of the update and of the L2 term was an executable; 28 / 22 /
    # 33 before separate_inferred_terms added the L2 gradient after the microbatch sum, when it
    # gave one microbatch's backward a body of its own; 23 / 20 / 32 while the first layer's
    # x @ emb ran on the last mesh as a fragment of its own; 22 / 19 / 30 while each mesh's L2
    # partial, sent to the last mesh for the loss, was a fragment before the mesh's backward;
    # 19 / 16 / 27 while each mesh's L2 and clipping partials were a fragment after its last
    # backward, before fuse_partials made them part of that backward (in the step without the
    # update, each mesh's L2 partial likewise), copied into the other microbatch's backward so
    # the two keep one body)
    assert (n_exe, n_base, calls) == (16, 13, 24)
    assert n_exe <= n_base + len(config.topology)
    # per mesh m0-m2: the update after the global norm (the L2 and clipping partials are in the
    # mesh's backward); m3: the rest of the step's inferred work merged into one (the first
    # layer's x @ emb, on the first mesh, is absorbed into the first layer's fragment)
    assert _inferred_per_mesh(lowered) == {"m0": 1, "m1": 1, "m2": 1, "m3": 1}
    # the update of a layer runs on the layer's mesh: new parameters stay where they were
    got = lowered.compile(executor=lambda e, a: compiler.run_program(e, a, record=False).outputs)(
        *args)
    for i in range(L):
        assert got[2]["layers"][i]["w"].sharding.mesh == config.topology[f"m{i}"]
    assert got[2]["emb"].sharding.mesh == config.topology["m3"]   # the tied matrix's home
    want = jax.jit(step)(*args)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)     # loss
    _check(got[1], want[1])                                    # gradients
    _check(got[3], want[3])                                    # count, mu, nu
    _check(got[2], want[2])                                    # parameters


def test_the_update_fragments_read_no_parameter_from_another_mesh(config):
    """Clipping's global norm gathers one scalar per gradient, not the gradients."""
    params, xs, ys = data()
    init, update = adamw()
    lowered = compiler.jit(make_step(update), config).lower(params, init(params), xs, ys)
    p = lowered.program
    moved = [p.types[t.out] for t in p.ops if not isinstance(t, Fragment)]
    big = [t for t in moved if t.shape == (W, W)]
    # the tied matrix from its home (the last mesh, where the head reads it) to the first, once,
    # for the first layer's x @ emb, and its gradient from x @ emb back (one per microbatch)
    assert len(big) == M + 1, big


def test_optax_adamw_with_a_mask_and_clipping_matches_jit(config):
    optax = pytest.importorskip("optax")
    params, xs, ys = data()
    tx = optax.chain(optax.clip_by_global_norm(0.5),
                     optax.adamw(1e-2, weight_decay=0.1,
                                 mask=lambda ps: jax.tree.map(lambda x: x.ndim == 2, ps)))

    def step(params, state, xs, ys):
        loss, grads = jax.value_and_grad(loss_fn)(params, xs, ys)
        upd, state = tx.update(grads, state, params)
        return loss, optax.apply_updates(params, upd), state

    args = (params, tx.init(params), xs, ys)
    lowered = compiler.jit(step, config).lower(*args)
    base = compiler.jit(grads_step, config).lower(*args)
    assert len(lowered.exported.executables) <= len(base.exported.executables) + \
        2 * len(config.topology)
    _check(lowered.compile()(*args), jax.jit(step)(*args))


def test_the_tied_input_product_runs_where_its_result_is_used(config):
    """The first layer's ``x @ emb`` is used on m0: computed there, with ``emb`` moved from the
    last mesh once, no activation round trip through the last mesh (2 (8, 16) transfers per
    microbatch before inference weighed a program input's one move against them)."""
    params, xs, ys = data()
    p = compiler.jit(grads_step, config).lower(params, None, xs, ys).program
    x_names = set(p.inputs[-2 * M:-M])
    round_trip = [t for t in p.ops if not isinstance(t, Fragment) and t.src == "m0"
                  and t.dst == "m3" and t.value in x_names]
    assert not round_trip, round_trip
    emb = p.inputs[0]
    assert p.input_meshes[0] == "m3"
    assert [(t.src, t.dst) for t in p.ops if not isinstance(t, Fragment) and t.value == emb] == \
        [("m3", "m0")]


def test_cpu_executables_donate_last_uses_but_not_inputs_outputs_or_reused_zeros(config):
    """On CPU the executables donate (``jax.jit``'s ``donate_argnums``) last uses a result can
    take over; never a program input (the caller's parameters and state), output, or an ``init``
    call's zeros (the runtime reuses them). A training loop's steps, each fed the previous one's
    state, match ``jax.jit``'s; the caller's arrays and the reused zeros stay readable."""
    from compiler.runtime import plan
    params, xs, ys = data()
    init, update = adamw()
    step = make_step(update)
    args = (params, init(params), xs, ys)
    lowered = compiler.jit(step, config).lower(*args)
    ep, prog = lowered.exported, lowered.program
    donating = {k: e for k, e in ep.executables.items() if e.donate}
    # every mesh but m0 donates: m0's only donating executable was its partials' fragment,
    # now part of its backward (fuse_partials); none of its update's results can take over a
    # last-use operand
    assert {e.mesh for e in donating.values()} >= {"m1", "m2", "m3"}
    zeros = {v for f in prog.fragments() if f.kind == "init" for v in f.outputs}
    assert zeros
    kept = set(prog.inputs) | set(prog.outputs) | zeros
    n = 0
    for mp in ep.programs.values():
        for st in mp.steps:
            if isinstance(st, Call):
                for j in ep.executables[st.executable].donate:
                    assert st.inputs[j] not in kept and j in st.donate
                    n += 1
    assert n >= 12
    run = lowered.compile(executor=lambda e, a: compiler.run_program(e, a, record=False).outputs)
    ref = jax.jit(step)
    flat_args = jax.tree.leaves(args)
    got, want = run(*args), ref(*args)
    for _ in range(2):   # the training loop: each step fed the returned parameters and state
        got = run(got[2], got[3], xs, ys)
        want = ref(want[2], want[3], xs, ys)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
        _check(got[1], want[1])
        _check(got[3], want[3])
        _check(got[2], want[2])
    assert not any(x.is_deleted() for x in flat_args)            # the caller's arrays
    cached = [y for ys_ in plan(ep).zeros.values() for y in ys_]
    assert cached and not any(y.is_deleted() for y in cached)    # the reused zeros
    again = run(*args)                                           # the first step once more
    _check(again[2], ref(*args)[2])
