"""Mixture of experts in the zoo, the cost model, the planner and the runtime: the routed MLP
against a per-token reference, published totals and active parameters, the expert-parallel
terms of the cost model, and an expert-parallel x pipeline plan run against ``jax.jit``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import zoo
from hardware_profiles import load_cluster
from ir import Layout, Plan, StagePlan, any_plan_to_json
from ir.plan_file import plan_from_doc
from planner.options import _layouts
from runtime.train.layouts import batch_spec, layout_axes, param_spec
from runtime.train.run import run_plan
from simulator import cost_model as cm
from simulator.schedules import generate
from zoo.costing import workload
from zoo.layers import expert_capacity, moe_swiglu
from zoo.model_files import load_model_file

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "zoo" / "configs"
CPU4X2 = str(ROOT / "hardware_profiles" / "clusters" / "cpu4x2.yaml")


def _reference(x, w_router, w_gate, w_up, w_down, top_k):
    """Each token through its top-k experts one by one, gates renormalized over them."""
    xt = x.reshape(-1, x.shape[-1])
    gates, chosen = jax.lax.top_k(jax.nn.softmax(xt @ w_router, axis=-1), top_k)
    gates = gates / gates.sum(-1, keepdims=True)
    out = jnp.zeros_like(xt)
    for j in range(top_k):
        e = chosen[:, j]
        g = jnp.einsum("th,thf->tf", xt, w_gate[e])
        u = jnp.einsum("th,thf->tf", xt, w_up[e])
        out = out + gates[:, j:j + 1] * jnp.einsum("tf,tfh->th", jax.nn.silu(g) * u, w_down[e])
    return out.reshape(x.shape)


def _weights(h=8, f=12, E=4, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    return (jax.random.normal(k[0], (2, 16, h)),
            (jax.random.normal(k[1], (h, E)), 0.3 * jax.random.normal(k[2], (E, h, f)),
             0.3 * jax.random.normal(k[3], (E, h, f)), 0.3 * jax.random.normal(k[4], (E, f, h))))


def test_routed_mlp_matches_the_per_token_reference_with_gradients():
    x, w = _weights()
    routed = lambda *w: moe_swiglu(x, *w, top_k=2, capacity_factor=2.0)   # C = T: no drops
    assert jnp.allclose(routed(*w), _reference(x, *w, 2), atol=1e-5)
    g1 = jax.grad(lambda *w: routed(*w).sum(), argnums=(0, 1, 2, 3))(*w)
    g2 = jax.grad(lambda *w: _reference(x, *w, 2).sum(), argnums=(0, 1, 2, 3))(*w)
    for a, b in zip(g1, g2):
        assert jnp.allclose(a, b, atol=1e-4)


def test_capacity_drops_what_does_not_fit():
    assert expert_capacity(32, 2, 4, 1.0) == 16 and expert_capacity(3, 1, 8, 1.0) == 1
    x, w = _weights()
    # capacity 1 per sample (its 16 tokens are one routing group): each expert takes one
    # (token, choice) pair of each sample, so at most 4 tokens of each sample get an output
    out = moe_swiglu(x, *w, top_k=2, capacity_factor=1 / 16)
    served = jnp.sum(jnp.any(out != 0, axis=-1), axis=-1)
    assert served.shape == (2,) and all(1 <= int(n) <= 4 for n in served)
    # a sample's routing does not depend on the other samples of its microbatch
    alone = moe_swiglu(x[:1], *w, top_k=2, capacity_factor=1 / 16)
    assert jnp.allclose(alone[0], out[0], atol=1e-6)


@pytest.mark.parametrize("name,total,active", [
    ("Mixtral-8x22B-v0.1.json", 141e9, 39e9),   # Mistral AI: 141B total, 39B active
    ("Qwen3-235B-A22B.json", 235e9, 22e9),      # Qwen3 model card: 235B total, 22B activated
])
def test_moe_totals_and_active_parameters_match_published(name, total, active):
    cfg = load_model_file(CONFIGS / name)
    assert abs(zoo.param_count(cfg) - total) / total < 0.01
    assert abs(zoo.active_param_count(cfg) - active) / active < 0.01


def test_deepseek_v3_total_and_activated_parameters():
    """DeepSeek-V3 Technical Report (2024), abstract: 671B total, 37B activated per token; its
    671B leaves out the multi-token-prediction module, and its activated count leaves out the
    input embedding (DeepSeek-V2's 21B of 236B matches the same way: 20.85B without it)."""
    cfg = load_model_file(CONFIGS / "DeepSeek-V3.json")
    assert abs(zoo.param_count(cfg) - 671e9) / 671e9 < 0.01
    # "37B" is rounded to the billion: the count must round to it (36.63B; 1.0% below 37B)
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e9) == 37
    assert (cfg.dense_layers, cfg.shared_experts, cfg.experts, cfg.kv_lora_rank, cfg.mla) == (
        3, 1, 256, 512, True)
    w = workload(dataclasses.replace(cfg, seq_len=1024), 8)
    assert w.layers[1:5] == ("dense_block",) * 3 + ("decoder_block",)
    assert w.costs["dense_block"].expert_param_count == 0
    assert w.costs["decoder_block"].expert_param_count == 256 * 3 * 7168 * 2048


def test_grok_1_total_parameters():
    """xai-org/grok-1 README: 314B parameters, 8 experts, 2 per token (the config counts
    315.68B with its tied embedding once: within 0.6%)."""
    cfg = zoo.get_config("grok-1-314b")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim) == (64, 6144, 48, 8, 128)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn, cfg.vocab) == (8, 2, 32768, 131072)
    assert zoo.param_count(cfg) == 315_684_034_560
    assert abs(zoo.param_count(cfg) - 314e9) / 314e9 < 0.01
    assert zoo.expert_param_count(cfg) == 8 * 3 * 6144 * 32768


def test_dense_model_is_all_active():
    cfg = zoo.get_config("llama3-8b")
    assert zoo.active_param_count(cfg) == zoo.param_count(cfg) and zoo.expert_param_count(cfg) == 0


def _tiny(**kw):
    return dataclasses.replace(load_model_file(CONFIGS / "tiny-moe.yaml"), **kw)


def test_moe_block_costs_the_routed_work_and_carries_its_expert_fields():
    moe = _tiny(seq_len=256, capacity_factor=1.0)
    dense = dataclasses.replace(moe, experts=0, experts_per_token=0, expert_ffn=0,
                                ffn=moe.experts_per_token * moe.expert_ffn)
    a, b = workload(moe, 8).layer(1), workload(dense, 8).layer(1)
    router = 2 * moe.seq_len * moe.hidden * moe.experts
    assert abs(a.fwd_flops_per_sample - router - b.fwd_flops_per_sample) < 0.03 * b.fwd_flops_per_sample
    assert (a.experts, a.expert_param_count) == (4, 4 * 3 * 128 * 128)
    assert a.alltoall_bytes_per_sample == 256 * 2 * 128 * 4 * 1.0
    assert b.experts == 0 and b.expert_param_count == 0 and b.alltoall_bytes_per_sample == 0


def test_expert_parallel_memory_alltoall_and_gradient_sync():
    w = workload(_tiny(), 8)
    mesh = load_cluster(CPU4X2).meshes["m0"]
    c = w.layer(1)
    base, ep = Layout(2, 1), Layout(2, 1, expert=2)
    held = 1 - c.expert_param_count / 2 / c.param_count
    assert cm.held_fraction(c, ep) == pytest.approx(held) and cm.held_fraction(c, base) == 1.0
    m0, m1 = cm.stage_memory(w, 1, 2, base, 4.0), cm.stage_memory(w, 1, 2, ep, 4.0)
    saved = c.expert_param_count / 2 * (c.param_bytes / c.param_count + cm.GRAD_BYTES_PER_PARAM)
    assert m0.static_bytes - m1.static_bytes == pytest.approx(saved)
    a2a = 2 * cm.collective(mesh, "all_to_all", c.alltoall_bytes_per_sample * 2.0, 2, 1)
    assert cm.expert_alltoall(c, "F", 2.0, mesh, ep) == pytest.approx(a2a) and a2a > 0
    assert cm.expert_alltoall(c, "W", 2.0, mesh, ep) == 0.0
    assert cm.expert_alltoall(c, "F", 2.0, mesh, base) == 0.0
    assert cm.layer_time(c, "F", 4.0, mesh, ep) > cm.layer_time(c, "F", 4.0, mesh, base) - 1e-12
    _, b0, _ = cm.layer_grad_sync(c, mesh, base)
    _, b1, _ = cm.layer_grad_sync(c, mesh, ep)
    assert b0 - b1 == pytest.approx(c.expert_param_count / 2 * cm.GRAD_BYTES_PER_PARAM)


def test_fsdp_beside_expert_parallel_gathers_only_the_devices_experts():
    """Megatron-FSDP beside EP: the static bytes are every parameter over every device either
    way; a device gathers (and reduce-scatters) the dense part over the data axis and only its
    experts over their expert-data replicas, so its traffic and its gathered layer shrink."""
    w = workload(_tiny(), 8)
    mesh = load_cluster(CPU4X2).meshes["m0"]
    c = next(c for c in w.costs.values() if c.experts)
    dense, ep = Layout(8, 1, fsdp=True), Layout(8, 1, fsdp=True, expert=4)
    assert sum(cm.fsdp_traffic(c, mesh, ep)) < sum(cm.fsdp_traffic(c, mesh, dense))
    first, last = 1, len(w.layers) - 1
    m_dense, m_ep = (cm.stage_memory(w, first, last, lay, 1.0) for lay in (dense, ep))
    assert m_ep.static_bytes == pytest.approx(m_dense.static_bytes)
    share = c.expert_param_count / c.param_count
    assert m_ep.gathered_bytes == pytest.approx(
        max(w.layer(i).param_bytes * (1 - share * 3 / 4) if w.layer(i).experts
            else w.layer(i).param_bytes for i in range(first, last)))


def test_layout_expert_axis_rules_and_plan_round_trip():
    assert str(Layout(8, 4, expert=2)) == "dp8xtp4-ep2"
    with pytest.raises(ValueError, match="must divide data x context x tensor"):
        Layout(6, 1, expert=4)
    with pytest.raises(ValueError, match="not combined with hybrid sharding"):
        Layout(4, 1, fsdp=True, hsdp=2, expert=2)
    assert str(Layout(4, 1, fsdp=True, expert=2)) == "dp4xtp1-fsdp-ep2"
    plan = _ep_plan()
    back = plan_from_doc(json.loads(json.dumps(any_plan_to_json(plan))))
    assert back.layouts == plan.layouts and back.layouts["m0"].expert == 2


def test_planner_offers_expert_parallel_layouts_for_a_moe_model_only():
    mesh = load_cluster(CPU4X2).meshes["m0"]
    assert Layout(2, 1, expert=2) in _layouts(mesh, 4.0, 8, False, experts=4)
    assert all(l.expert == 1 for l in _layouts(mesh, 4.0, 8, True, experts=0))


def test_runtime_shards_experts_over_the_expert_axis():
    cfg = _tiny()
    lay = Layout(2, 1, expert=2)
    assert layout_axes(lay) == {"data": 1, "expert": 2, "model": 1}
    assert batch_spec(lay) == P(("data", "expert"))
    assert param_spec(cfg, "w_gate", (4, 128, 128), lay) == P("expert")
    assert param_spec(cfg, "w_down", (4, 128, 128), Layout(1, 2)) == P(None, "model")
    assert param_spec(cfg, "w_router", (128, 4), lay) == P()


def test_expert_parallel_exchanges_tokens_with_all_to_alls_not_weight_gathers():
    """Under a mesh with an expert axis the routed MLP reshards its dispatch buffers: the
    forward compiles to two all-to-alls (dispatch, combine) and the backward to their two
    transposes, as the cost model charges (cost_model.expert_alltoall); no expert weight is
    all-gathered; the numbers are those of the plain jax.jit."""
    import numpy as np
    from jax.sharding import NamedSharding

    from runtime.train.layouts import layout_mesh

    x, w = _weights(h=8, f=12, E=4)
    lay = Layout(2, 1, expert=2)
    mesh = layout_mesh(jax.devices()[:2], lay)
    xs = jax.device_put(x, NamedSharding(mesh, batch_spec(lay)))
    ws = tuple(jax.device_put(a, NamedSharding(mesh, P("expert") if a.ndim == 3 else P()))
               for a in w)
    routed = lambda x, *w: moe_swiglu(x, *w, top_k=2, capacity_factor=2.0)
    loss = lambda x, *w: jnp.sum(routed(x, *w) ** 2)
    with jax.set_mesh(mesh):
        fwd = jax.jit(routed).lower(xs, *ws).compile().as_text()
        grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(xs, *ws).compile().as_text()
        got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(xs, *ws)
    assert fwd.count("all-to-all(") == 2 and grad.count("all-to-all(") == 4   # 2 fwd + 2 bwd
    assert "f32[4,8,12]{2,1,0} all-gather(" not in fwd + grad
    want = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(x, *w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=2e-5, atol=1e-6)


def _ep_plan() -> Plan:
    cfg = _tiny()
    t = generate("1f1b", 2, 4)
    return Plan(model=cfg.name, cluster="cpu4x2",
                stages=(StagePlan(0, 0, 3, "m0"), StagePlan(1, 3, 6, "m1")),
                layouts={"m0": Layout(2, 1, expert=2), "m1": Layout(2, 1, expert=2)},
                schedule=t, rank_mesh=("m0", "m1"), merge_last_stage=False, global_batch=8,
                seq_len=cfg.seq_len, cluster_path=CPU4X2,
                model_config=dataclasses.asdict(cfg))


def test_latent_attention_shared_experts_and_dense_first_block_run_with_expert_parallel():
    """The DeepSeek-V3 structure at toy size (zoo/configs/tiny-mla-moe.yaml) on two meshes of 2
    CPU devices: expert parallel 2 on the first, tensor parallel 2 (latent attention's heads,
    the shared expert, the experts' widths) on the second, a 2-stage 1F1B pipeline, against
    jax.jit."""
    cfg = load_model_file(CONFIGS / "tiny-mla-moe.yaml")
    t = generate("1f1b", 2, 4)
    plan = Plan(model=cfg.name, cluster="cpu4x2",
                stages=(StagePlan(0, 0, 3, "m0"), StagePlan(1, 3, 6, "m1")),
                layouts={"m0": Layout(2, 1, expert=2), "m1": Layout(1, 2)},
                schedule=t, rank_mesh=("m0", "m1"), merge_last_stage=False, global_batch=8,
                seq_len=cfg.seq_len, cluster_path=CPU4X2, model_config=dataclasses.asdict(cfg))
    r = run_plan(plan, steps=1, simulate=False, quiet=True)
    assert r.max_rel_error < 1e-5
    assert r.order_mismatches == ()


def test_expert_parallel_times_pipeline_run_matches_jax_jit():
    """A tiny MoE (4 experts, top 2) on two meshes of 2 CPU devices, expert parallel 2 on each
    and a 2-stage 1F1B pipeline: the loss and every gradient match jax.jit of the same model."""
    r = run_plan(_ep_plan(), steps=1, simulate=False, quiet=True)
    assert r.max_rel_error < 1e-5
    assert r.order_mismatches == ()


def test_dualpipe_hides_the_expert_alltoall_under_compute():
    """DualPipe (the model's DualPipeV) and Megatron-Core's interleaved 1F1B with the
    expert-parallel all-to-all overlap run the all-to-alls under another microbatch's compute:
    a fragment pays overlapped(work, all-to-all), slowed by the device's interference, instead of
    the sum; no other schedule hides them. The overlapped interleaved schedule runs the
    interleaved order, under its own name, and is only run when named."""
    from simulator.schedules import KINDS, generate, kind

    assert [n for n, k in KINDS.items() if k.hides_alltoall] == ["dualpipe-v",
                                                                 "interleaved-1f1b-a2a"]
    a2a_table = generate("interleaved-1f1b-a2a", 4, 8, virtual_stages=3)
    plain = generate("interleaved-1f1b", 4, 8, virtual_stages=3)
    assert (a2a_table.name, a2a_table.order, a2a_table.stage_rank) == (
        "interleaved-1f1b-a2a", plain.order, plain.stage_rank)
    assert not kind("interleaved-1f1b-a2a").searched
    w = workload(_tiny(), 8)
    c = w.layer(1)
    # an H100 node (its compute and collectives overlap; the CPU meshes' "sum" roofline does not)
    mesh = load_cluster(ROOT / "hardware_profiles" / "clusters" / "h100x64.yaml").meshes["h100_0"]
    ep, base = Layout(8, 1, expert=2), Layout(8, 1)
    a2a = cm.expert_alltoall(c, "F", 1.0, mesh, ep)
    # the token path (cost_model.token_path_time per element, and the fitted time per routed
    # pair: sorting, padding, host sync) is not hidden
    dev = mesh.device
    path = (cm.token_path_time(c, "F", 1.0, dev, 2) + c.routed_pairs_per_sample * 1.0
            * (dev.forward_routing_pair + dev.dropless_routing_pair * cm.TOKEN_PATH_FORWARD_SHARE))
    assert c.routed_pairs_per_sample > 0
    shown = cm.layer_time(c, "F", 8.0, mesh, ep)
    hidden = cm.layer_time(c, "F", 8.0, mesh, ep, alltoall_hidden=True)
    work = shown - a2a - path
    assert path > 0
    assert hidden == pytest.approx(cm.overlapped(work, a2a, mesh.device.comm_interference)
                                   + path)
    assert work + path <= hidden < shown
    # nothing to hide without expert parallelism
    assert (cm.layer_time(c, "F", 8.0, mesh, base, alltoall_hidden=True)
            == cm.layer_time(c, "F", 8.0, mesh, base))
    assert kind("dualpipe-v").hides_alltoall and not kind("zb-v").hides_alltoall


def test_simulate_draws_the_alltoalls_inside_their_fragments():
    """The replay's timeline draws every MoE layer's dispatch and combine (forward) and their
    transposes (backward) on each expert-parallel mesh's '<mesh>/alltoall' track: each inside
    the fragment that pays it, adding up per mesh to PlanCosts.expert_alltoall's seconds, and the
    step is the engine's, unchanged by the drawing; a plan without expert parallelism draws
    none."""
    from simulator.engine import simulate
    from simulator.plan_costs import PlanCosts
    from simulator.plan_sim import plan_program, simulate_plan

    plan, cluster = _ep_plan(), load_cluster(CPU4X2)
    w = workload(_tiny(), plan.global_batch)
    res = simulate_plan(plan, w, cluster)
    a2a = [e for e in res.timeline.events if e.kind == "all_to_all"]
    # 2 MoE layers per stage x (dispatch, combine) x (F, B) x 4 microbatches, on each mesh
    assert len(a2a) == 2 * 2 * 2 * 2 * plan.microbatches
    assert {e.track for e in a2a} == {"m0/alltoall", "m1/alltoall"}
    frags = {(e.mesh, e.stage, e.microbatch, e.kind): e for e in res.timeline.events
             if e.track.endswith("/compute")}
    for e in a2a:
        f = frags[e.mesh, e.stage, e.microbatch, e.name.split()[-1][0]]
        assert f.start_s <= e.start_s < e.end_s <= f.end_s + 1e-12
    want = PlanCosts(plan, w, cluster).expert_alltoall()
    for m in ("m0", "m1"):
        drawn = sum(e.duration_s for e in a2a if e.mesh == m)
        assert drawn == pytest.approx(want[m][1], rel=1e-9)
        assert sum(e.bytes for e in a2a if e.mesh == m) * 2 == pytest.approx(want[m][0], rel=1e-9)
    assert res.step_time_s == simulate(plan_program(plan, w, cluster)).step_time_s
    dense = dataclasses.replace(plan, layouts={"m0": Layout(2, 1), "m1": Layout(2, 1)})
    assert not [e for e in simulate_plan(dense, w, cluster).timeline.events
                if e.kind == "all_to_all"]


def test_simulate_reports_each_meshs_expert_alltoall(tmp_path):
    """`mpmd simulate` lists the all-to-all volume the fragments are charged: 4 transfers
    (dispatch and combine, forward and backward) of every MoE layer's tokens per microbatch,
    on every device of the mesh."""
    from click.testing import CliRunner

    from mpmd.cli.main import main
    from simulator.plan_costs import PlanCosts

    plan = _ep_plan()
    w = workload(_tiny(), plan.global_batch)
    costs = PlanCosts(plan, w, load_cluster(CPU4X2))
    got = costs.expert_alltoall()
    per_dev = plan.global_batch / plan.microbatches / 2
    c = w.layer(1)
    want0 = 4 * c.alltoall_bytes_per_sample * per_dev * 2 * 2 * plan.microbatches   # 2 MoE layers
    assert set(got) == {"m0", "m1"} and got["m0"][0] == pytest.approx(want0)
    assert got["m1"][0] == pytest.approx(want0)          # layers 3, 4 (the head has no experts)
    dense = dataclasses.replace(plan, layouts={"m0": Layout(2, 1), "m1": Layout(2, 1)})
    assert PlanCosts(dense, w, load_cluster(CPU4X2)).expert_alltoall() == {}
    path = tmp_path / "ep.json"
    path.write_text(json.dumps(any_plan_to_json(plan)))
    res = CliRunner().invoke(main, ["simulate", str(path)])
    assert res.exit_code == 0, res.output
    assert "expert all-to-all per mesh" in res.output


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=24), st.integers(1, 8))
def test_slots_are_a_partial_permutation_and_its_inverse(choice, capacity):
    from zoo.layers import _slots

    E, n = 4, len(choice)
    slot_of_pair, pair_of_slot = (jnp.asarray(a).tolist() for a in _slots(jnp.asarray(choice), E, capacity))
    for p, e in enumerate(choice):
        earlier = sum(1 for q in range(p) if choice[q] == e)       # stable: earlier pairs first
        expect = e * capacity + earlier if earlier < capacity else E * capacity
        assert slot_of_pair[p] == expect
        if expect < E * capacity:
            assert pair_of_slot[expect] == p
    kept = {s for s in slot_of_pair if s < E * capacity}
    assert all((pair_of_slot[s] == n) == (s not in kept) for s in range(E * capacity))


def test_permutation_gradient_equals_the_scatter_add_it_replaces():
    from zoo.layers import _permute, _slots

    choice = jnp.asarray([2, 0, 2, 1, 2, 0, 3, 2])       # 4 tokens x top 2; expert 2 overflows
    slot_of_pair, pair_of_slot = _slots(choice, 4, 2)
    T, k = 4, 2
    x = jax.random.normal(jax.random.PRNGKey(0), (T, 3))
    token_of_slot = jnp.where(pair_of_slot < T * k, pair_of_slot // k, T)
    inverse = slot_of_pair.reshape(T, k)
    g = jax.random.normal(jax.random.PRNGKey(1), (8, 3))
    ours = jax.vjp(lambda x: _permute(x, token_of_slot, inverse), x)[1](g)[0]
    plain = jax.vjp(lambda x: jnp.take(x, token_of_slot, axis=0, mode="fill", fill_value=0), x)[1](g)[0]
    assert jnp.allclose(ours, plain, atol=1e-6) and float(jnp.abs(plain).sum()) > 0


def test_combine_and_its_gradients_equal_the_plain_gather_and_gated_sum():
    """zoo.layers._combine (a barrier between gather and sum, a written-out backward) against
    autodiff of the plain gather + einsum: output, dy and dgates, with a dropped pair (expert 2
    overflows its 2 slots) and an empty slot (expert 1 gets one pair)."""
    from zoo.layers import _combine, _slots

    choice = jnp.asarray([2, 0, 2, 1, 2, 0, 3, 2])       # 4 tokens x top 2
    T, k, E, C, h = 4, 2, 4, 2, 3
    slot_of_pair, pair_of_slot = _slots(choice, E, C)
    index = slot_of_pair.reshape(T, k)
    assert int((index == E * C).sum()) == 2 and int((pair_of_slot == T * k).sum()) == 2
    y = jax.random.normal(jax.random.PRNGKey(0), (E * C, h))
    gates = jax.random.uniform(jax.random.PRNGKey(1), (T, k))
    dout = jax.random.normal(jax.random.PRNGKey(2), (T, h))

    def plain(y, gates):
        return jnp.einsum("tkh,tk->th", jnp.take(y, index, axis=0, mode="fill", fill_value=0), gates)

    out, vjp = jax.vjp(lambda y, g: _combine(y, index, pair_of_slot, g), y, gates)
    ref, ref_vjp = jax.vjp(plain, y, gates)
    assert jnp.allclose(out, ref, atol=1e-6)
    for ours, want in zip(vjp(dout), ref_vjp(dout)):
        assert jnp.allclose(ours, want, atol=1e-6) and float(jnp.abs(want).sum()) > 0
    batched = jax.vmap(lambda y, g: _combine(y, index, pair_of_slot, g))(y[None], gates[None])
    assert jnp.allclose(batched[0], ref, atol=1e-6)
