"""Tests of runtime.train.layouts: plans' tensor-parallel and FSDP layouts, meshes of different
sizes and every schedule the planner emits, compiled and run against ``jax.jit``."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import zoo
from ir import Layout, Plan, StagePlan
from runtime.train.layouts import batch_spec, layout_mesh, param_spec, param_specs
from runtime.train.run import run_plan
from simulator.schedules import generate

UNEVEN = str(Path(__file__).resolve().parents[2] / "hardware_profiles" / "clusters" / "cpu_uneven.yaml")
CPU4X2 = str(Path(__file__).resolve().parents[2] / "hardware_profiles" / "clusters" / "cpu4x2.yaml")
SMALL = dict(layers=6, hidden=64, heads=4, kv_heads=2, ffn=128)


def test_layout_mesh_axes_and_shapes():
    devs = jax.devices()[:8]
    m = layout_mesh(devs[:4], Layout(2, 2))
    assert m.axis_names == ("data", "model") and dict(m.shape) == {"data": 2, "model": 2}
    h = layout_mesh(devs, Layout(4, 2, fsdp=True, hsdp=2))
    assert h.axis_names == ("replica", "data", "model")
    assert dict(h.shape) == {"replica": 2, "data": 2, "model": 2}
    assert batch_spec(Layout(4, 2, fsdp=True, hsdp=2)) == P(("replica", "data"))
    assert batch_spec(Layout(2, 1)) == P("data")
    with pytest.raises(ValueError, match="needs 4 devices, got 2"):
        layout_mesh(devs[:2], Layout(2, 2))


def test_megatron_tensor_parallel_specs():
    cfg = zoo.get_config("llama-tiny", **SMALL)
    tp = Layout(1, 2)
    spec = {k: param_spec(cfg, k, tuple(v.shape), tp)
            for k, v in zoo.layer_param_shapes(cfg, "block0").items()}
    assert spec == {"attn_norm": P(), "mlp_norm": P(),
                    "wq": P(None, "model"), "wk": P(None, "model"), "wv": P(None, "model"),
                    "wo": P("model"), "w_gate": P(None, "model"), "w_up": P(None, "model"),
                    "w_down": P("model")}
    assert param_spec(cfg, "tok", (256, 64), tp) == P("model")          # vocabulary parallel
    assert param_spec(cfg, "out", (64, 256), tp) == P(None, "model")
    # 4-way: 2 KV heads cannot be split 4 ways, so K and V stay whole (Megatron replicates them)
    assert param_spec(cfg, "wk", (64, 32), Layout(1, 4)) == P()
    assert param_spec(cfg, "wq", (64, 64), Layout(1, 4)) == P(None, "model")


def test_fsdp_specs_shard_the_largest_free_dimension():
    cfg = zoo.get_config("llama-tiny", **SMALL)
    assert param_spec(cfg, "w_down", (128, 64), Layout(4, 1, fsdp=True)) == P("data")
    assert param_spec(cfg, "w_down", (128, 64), Layout(2, 2, fsdp=True)) == P("model", "data")
    assert param_spec(cfg, "w_up", (64, 128), Layout(2, 2, fsdp=True)) == P("data", "model")
    assert param_spec(cfg, "attn_norm", (64,), Layout(4, 1, fsdp=True)) == P("data")
    assert param_spec(cfg, "attn_norm", (6,), Layout(4, 1, fsdp=True)) == P()   # 4 does not divide 6
    # hybrid sharding: parameters over the 2 devices of a replica only
    assert param_spec(cfg, "w_up", (64, 128), Layout(4, 1, fsdp=True, hsdp=2)) == P(None, "data")
    assert param_spec(cfg, "w_up", (64, 128), Layout(4, 1)) == P()          # plain DP: replicated


def _uneven_plan(schedule: str = "1f1b", microbatches: int = 4) -> Plan:
    """embed..block1 on a (2 devices, tensor parallel 2), block2..block3 on b (4 devices, data 2 x
    tensor 2 with FSDP), block4..head on c (2 devices, FSDP over data 2)."""
    t = generate(schedule, 3, microbatches)
    meshes = ("a", "b", "c")
    bounds = (0, 3, 5, 8)
    stages = tuple(StagePlan(s, bounds[s], bounds[s + 1], meshes[s]) for s in range(3))
    return Plan(model="llama-tiny", cluster="cpu-uneven", stages=stages,
                layouts={"a": Layout(1, 2), "b": Layout(2, 2, fsdp=True),
                         "c": Layout(2, 1, fsdp=True)},
                schedule=t, rank_mesh=meshes, merge_last_stage=schedule == "1f1b",
                global_batch=8, seq_len=32, cluster_path=UNEVEN)


def test_hand_written_plan_tensor_parallel_fsdp_uneven_meshes_matches_jax_jit(tmp_path):
    """A plan written by hand (as plan.json, read back through the guarded reader) with tensor
    parallel 2 on a 2-device mesh, data 2 x tensor 2 with FSDP on a 4-device mesh and FSDP on
    another 2-device mesh: loss and gradients equal jax.jit's, the order is the plan's, one
    executable per unique fragment body and mesh, and parameters and Adam state keep the layouts'
    shardings."""
    import json

    from ir import plan_to_json
    path = tmp_path / "uneven.json"
    path.write_text(json.dumps(plan_to_json(_uneven_plan())))
    r = run_plan(str(path), steps=2, model_overrides=SMALL, simulate=False, quiet=True)
    assert r.max_rel_error < 1e-5, (r.loss_rel_errors, r.grad_rel_errors)
    assert r.order_mismatches == ()
    assert r.executables_ok, r.executables
    assert set(r.executables) == {"a", "b", "c"}
    sh = r.param_shardings
    assert sh["blocks"][0]["wq"] == ("a", P(None, "model"))
    assert sh["embed"]["tok"] == ("a", P("model"))
    assert sh["blocks"][2]["w_up"] == ("b", P("data", "model"))
    assert sh["blocks"][2]["w_down"] == ("b", P("model", "data"))
    assert sh["blocks"][4]["w_up"] == ("c", P(None, "data"))
    assert sh["head"]["out"] == ("c", P(None, "data"))   # the vocabulary, the larger dimension
    assert r.opt_state_follows_params


@pytest.mark.parametrize("schedule", ["zb-h2", "zb-v", "dualpipe-v"])
def test_split_backward_and_v_schedules_run_with_tensor_parallel(schedule):
    """Zero-bubble schedules (B and W split) and V placements (two stages per mesh) on meshes of
    data 1 x tensor 2 run and match jax.jit."""
    M = 4 if schedule != "dualpipe-v" else 8
    t = generate(schedule, 2, M)
    S = t.num_stages
    bounds = [round(i * 8 / S) for i in range(S + 1)]
    meshes = ("m0", "m1")
    plan = Plan(model="llama-tiny", cluster="cpu4x2",
                stages=tuple(StagePlan(s, bounds[s], bounds[s + 1], meshes[t.stage_rank[s]])
                             for s in range(S)),
                layouts={"m0": Layout(1, 2), "m1": Layout(1, 2)}, schedule=t, rank_mesh=meshes,
                merge_last_stage=False, global_batch=M * 2, seq_len=32, cluster_path=CPU4X2)
    r = run_plan(plan, steps=1, model_overrides=SMALL, simulate=False, quiet=True)
    assert r.max_rel_error < 1e-5
    assert r.order_mismatches == ()
    assert r.executables_ok, r.executables


def test_param_specs_follow_each_layers_mesh():
    cfg = zoo.get_config("llama-tiny", **SMALL)
    params = zoo.param_shapes(cfg)
    specs = param_specs(cfg, _uneven_plan(), params, zoo.layer_names(cfg))
    assert specs["embed"]["tok"] == P("model")
    assert specs["blocks"][1]["wo"] == P("model")
    assert specs["blocks"][3]["wo"] == P("model", "data")
    assert specs["blocks"][5]["wo"] == P("data")
    assert specs["head"]["norm"] == P("data")


def test_data_parallel_plan_with_uneven_batch_shares_matches_jax_jit():
    """Two pipelines side by side on 6 and 2 of 8 samples (the first on meshes a and b: tensor
    parallel and FSDP; the second on c alone), gradients all-reduced across the parts: the
    share-weighted loss and gradients equal jax.jit of the whole batch; every part's order is its
    schedule; both parts' parameter replicas stay equal."""
    from ir import DataParallelPlan

    t2, t1 = generate("1f1b", 2, 3), generate("1f1b", 1, 1)
    big = Plan(model="llama-tiny", cluster="cpu-uneven",
               stages=(StagePlan(0, 0, 4, "a"), StagePlan(1, 4, 8, "b")),
               layouts={"a": Layout(1, 2), "b": Layout(2, 2, fsdp=True)}, schedule=t2,
               rank_mesh=("a", "b"), merge_last_stage=False, global_batch=6, seq_len=32,
               cluster_path=UNEVEN)
    small = Plan(model="llama-tiny", cluster="cpu-uneven", stages=(StagePlan(0, 0, 8, "c"),),
                 layouts={"c": Layout(2, 1)}, schedule=t1, rank_mesh=("c",),
                 merge_last_stage=False, global_batch=2, seq_len=32, cluster_path=UNEVEN)
    dp = DataParallelPlan(model="llama-tiny", cluster="cpu-uneven", global_batch=8, seq_len=32,
                          parts=(big, small), sync_link="default", sync_bytes=0.0, sync_s=0.0,
                          cluster_path=UNEVEN)
    r = run_plan(dp, steps=2, model_overrides=SMALL, simulate=False, quiet=True)
    assert len(r.losses) == 2 and r.max_rel_error < 1e-5, (r.loss_rel_errors, r.grad_rel_errors)
    assert r.order_mismatches == ()
    assert r.executables_ok and set(r.executables) == {"a", "b", "c"}
    assert r.opt_state_follows_params


@pytest.mark.slow
@pytest.mark.parametrize("layouts", [
    {"m0": Layout(1, 2), "m1": Layout(1, 2), "m2": Layout(1, 2), "m3": Layout(1, 2)},
    {"m0": Layout(2, 1, fsdp=True), "m1": Layout(2, 1, fsdp=True), "m2": Layout(2, 1, fsdp=True),
     "m3": Layout(2, 1, fsdp=True)},
], ids=["tensor-parallel", "fsdp"])
def test_fresh_calibration_predicts_tensor_parallel_and_fsdp_steps(tmp_path, layouts):
    """Measures real step times (slow; needs an otherwise idle machine): after a fresh ``mpmd
    calibrate`` (which times fragments under data-parallel, tensor-parallel and FSDP layouts), a
    1F1B plan of llama-tiny whose meshes are all tensor parallel 2, or all FSDP over 2, trains 50
    steps with decreasing loss, and its measured step is within 15% of the simulated one."""
    from runtime.calibration.measure import calibrate_command

    calibrate_command(str(tmp_path), write=True, console=None)
    cluster = str(tmp_path / "cpu4x2.yaml")
    t = generate("1f1b", 4, 4)
    meshes = ("m0", "m1", "m2", "m3")
    bounds = (0, 3, 5, 7, 10)
    plan = Plan(model="llama-tiny", cluster="cpu4x2",
                stages=tuple(StagePlan(s, bounds[s], bounds[s + 1], meshes[s]) for s in range(4)),
                layouts=layouts, schedule=t, rank_mesh=meshes, merge_last_stage=True,
                global_batch=8, seq_len=128, cluster_path=cluster)
    r = run_plan(plan, steps=50, check_every=10, cluster_path=cluster, quiet=True)
    print(f"{next(iter(layouts.values()))}: losses {np.mean(r.losses[:5]):.4f} -> "
          f"{np.mean(r.losses[-5:]):.4f}; step measured {r.measured_step_s:.3f} s, simulated "
          f"{r.simulated_step_s:.3f} s ({r.step_time_error:.1%})")
    assert r.max_rel_error < 1e-5 and r.order_mismatches == () and r.executables_ok
    assert np.mean(r.losses[-5:]) < np.mean(r.losses[:5]) - 0.3
    assert r.step_time_error < 0.15, (r.measured_step_s, r.simulated_step_s)
