"""Tests of context parallelism in ``mpmd run`` (runtime.train.context, runtime.train.layouts,
zoo.context_parallel): the context mesh axis and specs, the refusals, and loss and gradients of
ring, all-gather and all-to-all (Ulysses) context parallel runs against ``jax.jit`` on one device.

The model is ``tiny-llama`` (zoo/configs/tiny-llama.yaml: 4 layers, hidden 256, 8 query and 4
key/value heads, seq_len 128): the smallest dense decoder of ``mpmd models`` whose key/value heads
split over Ulysses' context 2 at tensor 1 and whose sequence splits into 2 x 2 chunks."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import zoo
from compiler.runtime import run_program
from ir import Layout, Plan, StagePlan, plan_to_json
from runtime.train import check
from runtime.train.context import context_loss, context_problem, layer_splits
from runtime.train.layouts import batch_spec, layout_axes, layout_mesh, param_spec
from runtime.train.run import run_plan
from runtime.train.step import (RunError, batches, check_layouts, compile_plan, load_text,
                                place_inputs, plan_topology, run_cluster, step_outputs)
from simulator.schedules import generate
from zoo.context_parallel import ContextSplit, context_split
from zoo.layers import attention
from zoo.model_files import config_fields, resolve_model

CPU4X2 = "hardware_profiles/clusters/cpu4x2.yaml"
METHODS = ("ring", "allgather", "alltoall")
COLLECTIVE = {"ring": "collective-permute", "allgather": "all-gather", "alltoall": "all-to-all"}
"""The collective each method's attention makes XLA emit."""


def _cfg():
    return resolve_model("tiny-llama")


def _plan(layout: Layout, *, model: str = "tiny-llama", seq_len: int | None = None,
          microbatches: int = 2, global_batch: int = 4) -> Plan:
    """Two stages (embed..block1 on m0, block2..head on m1 of cpu4x2: 2 devices each), 1F1B,
    both meshes with ``layout``: the 2-stage plans of test_run_layouts.py with context set."""
    cfg = resolve_model(model)
    n = len(zoo.layer_names(cfg))
    bounds = (0, n // 2, n)
    meshes = ("m0", "m1")
    return Plan(model=model, cluster="cpu4x2",
                stages=tuple(StagePlan(s, bounds[s], bounds[s + 1], meshes[s]) for s in range(2)),
                layouts={m: layout for m in meshes}, schedule=generate("1f1b", 2, microbatches),
                rank_mesh=meshes, merge_last_stage=False, global_batch=global_batch,
                seq_len=seq_len or cfg.seq_len, cluster_path=CPU4X2,
                model_config=config_fields(cfg))


def _max_abs(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


# --------------------------------------------------------------------------- axes and specs
def test_context_axis_sits_between_data_and_model():
    """Megatron-Core's tp-cp-ep-dp order: tensor innermost, then context, then data."""
    lay = Layout(2, 2, context=2)
    assert layout_axes(lay) == {"data": 2, "context": 2, "model": 2}
    assert layout_axes(Layout(4, 1, fsdp=True, hsdp=2, context=2)) == {
        "replica": 2, "data": 2, "context": 2, "model": 1}
    assert layout_axes(Layout(2, 2)) == {"data": 2, "model": 2}       # no context: as before
    devs = jax.devices()[:8]
    m = layout_mesh(devs, lay)
    assert m.axis_names == ("data", "context", "model")
    ids = np.vectorize(lambda d: d.id)(m.devices)
    assert ids[1, 0, 0] - ids[0, 0, 0] == 4 and ids[0, 1, 0] - ids[0, 0, 0] == 2
    assert ids[0, 0, 1] - ids[0, 0, 0] == 1
    assert batch_spec(lay) == P("data", "context")
    assert batch_spec(Layout(4, 1, fsdp=True, hsdp=2, context=2)) == P(("replica", "data"),
                                                                        "context")
    assert batch_spec(Layout(2, 1)) == P("data")


def test_parameters_replicated_over_context_and_fsdp_shards_over_data_and_context():
    cfg = _cfg()
    assert param_spec(cfg, "wq", (256, 256), Layout(1, 2, context=2)) == P(None, "model")
    assert param_spec(cfg, "attn_norm", (256,), Layout(1, 1, context=2)) == P()
    assert param_spec(cfg, "w_up", (256, 768), Layout(2, 1, fsdp=True, context=2)) == \
        P(None, ("data", "context"))


# --------------------------------------------------------------------------- refusals
def test_refusals_name_the_mesh_and_the_fix():
    cfg = _cfg()
    assert context_problem(_plan(Layout(1, 1, context=2)), cfg) is None
    assert context_problem(_plan(Layout(2, 1)), cfg) is None
    bad = context_problem(_plan(Layout(1, 1, context=2), seq_len=126), cfg)
    assert bad.startswith("mesh m0's layout dp1xcp2xtp1 (context parallel 2): ") and "126" in bad
    assert "\n" not in bad
    sinks = dataclasses.replace(cfg, attention_sinks=True)
    assert "sinks" in context_problem(_plan(Layout(1, 1, context=2)), sinks)
    assert context_problem(_plan(Layout(1, 1, context=2, context_method="alltoall")),
                           sinks) is None
    hybrid = resolve_model("tiny-hybrid")
    why = context_problem(_plan(Layout(1, 1, context=2), model="tiny-hybrid", seq_len=40), hybrid)
    assert "hybrid Mamba" in why and "fix: run a plan with context 1" in why
    moe = resolve_model("tiny-moe")
    lay = Layout(2, 1, context=2, expert=2)
    assert "expert parallel 2 with context parallel" in context_problem(
        _plan(lay, model="tiny-moe"), moe)


def test_ulysses_heads_refused_before_anything_is_built():
    """All-to-all context 16 would give each device half a head of tiny-llama's 8."""
    plan = _plan(Layout(1, 1, context=16, context_method="alltoall"))
    with pytest.raises(RunError, match="all-to-all context parallel 16"):
        check_layouts(plan, _cfg())


# --------------------------------------------------------------------------- the attention
def test_without_a_context_mesh_the_traced_attention_is_unchanged():
    """A split set but no mesh naming "context" (a plain jax.jit, the costing): the same jaxpr."""
    q = jax.ShapeDtypeStruct((2, 16, 4, 8), jnp.float32)
    kv = jax.ShapeDtypeStruct((2, 16, 2, 8), jnp.float32)

    def f(q, k, v):
        return attention(q, k, v, causal=True, impl="flash")
    plain = str(jax.make_jaxpr(f)(q, kv, kv))
    mesh = layout_mesh(jax.devices()[:2], Layout(1, 1, context=2))
    with context_split(ContextSplit("ring", mesh)):
        assert str(jax.make_jaxpr(f)(q, kv, kv)) == plain


def _placed(cfg, params, lay, mesh):
    """``params`` placed as ``lay`` says (runtime.train.layouts.param_spec)."""
    def put(name, x):
        return jax.device_put(x, NamedSharding(mesh, param_spec(cfg, name, tuple(x.shape), lay)))
    return {"embed": {k: put(k, v) for k, v in params["embed"].items()},
            "blocks": [{k: put(k, v) for k, v in b.items()} for b in params["blocks"]],
            "head": {k: put(k, v) for k, v in params["head"].items()}}


def _spmd_vs_jit(cfg, lay):
    """Max abs difference of ``(loss, grads)`` of one microbatch of 2 samples, every layer context
    parallel on a mesh of ``lay``, against jax.jit on one device; and the compiled HLO text."""
    mesh = layout_mesh(jax.devices()[:lay.devices], lay)
    splits = {n: ContextSplit(lay.context_method, mesh) for n in zoo.layer_names(cfg)}
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    batch = {k: v[0] for k, v in next(batches(load_text(), 1, 2, cfg.seq_len)).items()}
    ref = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    step = jax.jit(jax.value_and_grad(context_loss(cfg, splits)))
    placed = _placed(cfg, params, lay, mesh)
    batch = jax.device_put(batch, NamedSharding(mesh, batch_spec(lay)))
    with jax.set_mesh(mesh):
        compiled = step.lower(placed, batch).compile()
        got = compiled(placed, batch)
    return _max_abs(got, ref), compiled.as_text()


@pytest.mark.parametrize("layout", [
    dict(data=1, tensor=1), pytest.param(dict(data=2, tensor=2), marks=pytest.mark.slow),
    pytest.param(dict(data=2, tensor=1, fsdp=True), marks=pytest.mark.slow)],
    ids=["dp1xcp2xtp1", "dp2xcp2xtp2", "dp2xcp2xtp1-fsdp"])
@pytest.mark.parametrize("method", METHODS)
def test_context_parallel_loss_and_grads_match_jit(method, layout):
    """One stage of tiny-llama (embed, 2 blocks, head) as one SPMD program with every layer context
    parallel (the sequence split 2 ways; parameters placed by the layout: Megatron tensor
    parallel, FSDP over data x context), against jax.jit on one device: loss and every gradient
    within 1e-5 (max abs), and the method's collective in the compiled program."""
    cfg = dataclasses.replace(_cfg(), layers=2)
    err, hlo = _spmd_vs_jit(cfg, Layout(**layout, context=2, context_method=method))
    assert err < 1e-5
    assert COLLECTIVE[method] in hlo


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("model", ["tiny-moe", "tiny-mla-moe"])
def test_context_parallel_mixture_of_experts_and_latent_attention(model, method):
    """The zoo's small mixture of experts and multi-head latent attention model (value heads of
    another width than the keys') context parallel 2: within 1e-5 of jax.jit."""
    err, hlo = _spmd_vs_jit(resolve_model(model), Layout(1, 1, context=2, context_method=method))
    assert err < 1e-5
    assert COLLECTIVE[method] in hlo


@pytest.mark.parametrize("window", [0, 5])
def test_ring_attention_blocks_mask_by_global_positions(window):
    """The ring primitive alone (grouped-query heads, data 2 x context 2 x tensor 2, a sliding
    window across the chunk boundary or none): output and q/k/v gradients equal
    zoo.layers.attention's on the whole sequence."""
    from zoo.context_parallel import ring_attention
    B, S, H, KV, D = 2, 16, 4, 2, 8
    q, k, v, w = (jax.random.normal(key, shape) for key, shape in zip(
        jax.random.split(jax.random.PRNGKey(1), 4),
        [(B, S, H, D), (B, S, KV, D), (B, S, KV, D), (B, S, H, D)]))
    mesh = layout_mesh(jax.devices()[:8], Layout(2, 2, context=2))

    def ref(q, k, v):
        return jnp.sum(attention(q, k, v, causal=True, window=window) * w)

    def ring(q, k, v):
        return jnp.sum(ring_attention(q, k, v, mesh, True, window) * w)
    sh = NamedSharding(mesh, P("data", "context", "model"))
    f = jax.jit(jax.value_and_grad(ring, argnums=(0, 1, 2)), in_shardings=(sh, sh, sh))
    assert "collective-permute" in f.lower(q, k, v).compile().as_text()
    want = jax.jit(jax.value_and_grad(ref, argnums=(0, 1, 2)))(q, k, v)
    assert _max_abs(f(q, k, v), want) < 1e-4


# --------------------------------------------------------------------------- plans
def _recording(exported):
    """``exported`` with each executable recording its last arguments (to lower it again)."""
    seen: dict[str, tuple] = {}

    def wrap(name, fn):
        def call(*args):
            seen[name] = args
            return fn(*args)
        return call
    exes = {k: dataclasses.replace(e, fn=wrap(k, e.fn)) for k, e in exported.executables.items()}
    return dataclasses.replace(exported, executables=exes), seen


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_cp2_pipeline2_plan_matches_jit(method):
    """A 2-stage 1F1B plan of tiny-llama on cpu4x2's m0 and m1 (2 devices each), both meshes
    data 1 x context 2 x tensor 1: compiled by the MPMD compiler and run, its loss and gradients
    are within 1e-5 (max abs) of jax.jit on one device, the order is the plan's, one executable
    per fragment body, and every stage's executables hold the method's collective."""
    plan = _plan(Layout(1, 1, context=2, context_method=method))
    topology = plan_topology(plan, run_cluster(plan, CPU4X2))
    assert topology["m0"].axis_names == ("data", "context", "model")
    prog = compile_plan(plan, topology)
    exported, seen = _recording(prog.exported)
    params = place_inputs(prog.params, exported)
    ex = run_program(exported, (params, prog.first))
    loss, grads = step_outputs(ex.outputs, jax.tree.structure(
        jax.eval_shape(prog.step, params, prog.first)))
    dev = jax.devices()[0]
    rl, rg = jax.jit(prog.step)(jax.device_put(jax.device_get(params), dev),
                                jax.device_put(prog.first, dev))
    assert abs(float(loss) - float(rl)) < 1e-5
    assert _max_abs(grads, rg) < 1e-5
    assert check.order_mismatches(plan, ex.order) == []
    bodies = zoo.workload(prog.cfg, plan.global_batch, plan.seq_len).layers
    assert all(c.ok for c in check.executable_counts(exported, plan, bodies).values())
    for mesh in ("m0", "m1"):
        hlo = [prog.exported.executables[k].fn.lower(*seen[k]).compile().as_text()
               for k, e in prog.exported.executables.items() if e.mesh == mesh and k in seen]
        assert any(COLLECTIVE[method] in h for h in hlo), mesh


@pytest.mark.slow
def test_run_plan_json_with_context_checks_against_jit(tmp_path):
    """mpmd run's own checks on a context-parallel plan read back from plan.json (ring on m0,
    Ulysses on m1): loss and gradients against jax.jit, the order, the executables."""
    plan = _plan(Layout(1, 1, context=2))
    plan = dataclasses.replace(plan, layouts={
        "m0": Layout(1, 1, context=2), "m1": Layout(1, 1, context=2, context_method="alltoall")})
    path = tmp_path / "cp.json"
    path.write_text(json.dumps(plan_to_json(plan)))
    r = run_plan(str(path), steps=2, simulate=False, quiet=True)
    assert r.max_rel_error < 1e-5, (r.loss_rel_errors, r.grad_rel_errors)
    assert r.order_mismatches == () and r.executables_ok, r.executables
    assert r.losses[1] < r.losses[0]
    assert r.plan.layouts["m1"].context_method == "alltoall"


def test_layer_splits_follow_each_layers_mesh():
    ulysses = Layout(1, 1, context=2, context_method="alltoall")
    plan = dataclasses.replace(_plan(Layout(2, 1)), layouts={"m0": ulysses, "m1": Layout(2, 1)})
    topology = plan_topology(plan, run_cluster(plan, CPU4X2))
    splits = layer_splits(plan, _cfg(), topology)
    assert sorted(splits) == ["block0", "block1", "embed"]
    assert all(s.method == "alltoall" and s.mesh is topology["m0"] for s in splits.values())
