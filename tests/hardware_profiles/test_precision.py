"""Precision honest on every device: each profile's matmul rates by the precisions it really has
(dense TFLOP/s, as the vendors publish them), the rate each model compute dtype runs at
(``DeviceProfile.matmul_precision``: an fp32 model at TF32 on NVIDIA Ampere and later, as JAX does
by default; one bfloat16 pass on TPU; TF32 operands at HiFi4 on Tenstorrent), a one-line refusal
of a dtype a device has no rate for (a bfloat16 model on a V100), and MFU and the roofline bound
computed on the precision the plan uses: for every bundled device and every dtype it runs, a
one-stage plan's MFU is at most 1 and its roofline bound at most its step.
"""

from __future__ import annotations

import dataclasses

import pytest

from hardware_profiles import precision_rows, profiles_rows
from hardware_profiles.loader import known_device_ids, load_device
from hardware_profiles.types import (DEFAULT_PRECISION, MODEL_DTYPES, Cluster, Link, MeshSpec,
                                     ProfileError)
from ir import LayerCost, Layout, Plan, StagePlan, Workload
from planner.predict import predict
from simulator import cost_model as cm
from simulator.plan_costs import PlanCosts
from simulator.plan_sim import simulate_plan
from simulator.schedules import generate

T = 1e12

EXPECTED: dict[str, dict[str, tuple[str, float]]] = {
    # device -> model dtype -> (the peak_flops entry its matmuls run at, dense FLOP/s)
    "a100-40gb-sxm": {"bf16": ("bf16", 312 * T), "fp16": ("fp16", 312 * T), "fp32": ("tf32", 156 * T)},
    "a100-80gb-sxm": {"bf16": ("bf16", 312 * T), "fp16": ("fp16", 312 * T), "fp32": ("tf32", 156 * T)},
    "b200": {"bf16": ("bf16", 2250 * T), "fp16": ("fp16", 2250 * T), "fp32": ("tf32", 1100 * T)},
    "b300": {"bf16": ("bf16", 2250 * T), "fp16": ("fp16", 2250 * T), "fp32": ("tf32", 1125 * T)},
    "gb200": {"bf16": ("bf16", 2500 * T), "fp16": ("fp16", 2500 * T), "fp32": ("tf32", 1250 * T)},
    "gb300": {"bf16": ("bf16", 2500 * T), "fp16": ("fp16", 2500 * T), "fp32": ("tf32", 1250 * T)},
    "blackhole-p100a": {"bf16": ("bf16", 332 * T), "fp32": ("bf16_hifi4", 166 * T)},
    "blackhole-p150a": {"bf16": ("bf16", 332 * T), "fp32": ("bf16_hifi4", 166 * T)},
    "blackhole-p150b": {"bf16": ("bf16", 332 * T), "fp32": ("bf16_hifi4", 166 * T)},
    "cpu-host": {"bf16": ("bf16", 0.1472 * T), "fp32": ("fp32", 0.1472 * T)},
    "gaudi3": {"bf16": ("bf16", 1835 * T)},
    "h100-sxm": {"bf16": ("bf16", 989 * T), "fp16": ("fp16", 989 * T), "fp32": ("tf32", 494.5 * T)},
    "h200-sxm": {"bf16": ("bf16", 989 * T), "fp16": ("fp16", 989 * T), "fp32": ("tf32", 494.5 * T)},
    "h800-sxm": {"bf16": ("bf16", 989 * T), "fp16": ("fp16", 989 * T), "fp32": ("tf32", 494.5 * T)},
    "l40s": {"bf16": ("bf16", 362 * T), "fp16": ("fp16", 362 * T), "fp32": ("tf32", 183 * T)},
    "mi300x": {"bf16": ("bf16", 1307 * T), "fp16": ("fp16", 1307 * T), "fp32": ("fp32", 163.4 * T)},
    "tpu-v4": {"bf16": ("bf16", 275 * T), "fp32": ("bf16", 275 * T)},
    "tpu-v5e": {"bf16": ("bf16", 197 * T), "fp32": ("bf16", 197 * T)},
    "tpu-v5p": {"bf16": ("bf16", 459 * T), "fp32": ("bf16", 459 * T)},
    "tpu-v6e": {"bf16": ("bf16", 918 * T), "fp32": ("bf16", 918 * T)},
    "v100-sxm2-16gb": {"fp16": ("fp16", 125 * T), "fp32": ("fp32", 15.7 * T)},
    "v100-sxm2-32gb": {"fp16": ("fp16", 125 * T), "fp32": ("fp32", 15.7 * T)},
    "wormhole-n150": {"bf16": ("bf16", 148 * T), "fp32": ("bf16_hifi4", 74 * T)},
    "wormhole-n300": {"bf16": ("bf16", 262 * T), "fp32": ("bf16_hifi4", 131 * T)},
}

FP32_TF32 = {   # published dense FP32 (CUDA cores / vector) and TF32 tensor rates, TFLOP/s
    "v100-sxm2-16gb": (15.7, None), "v100-sxm2-32gb": (15.7, None), "a100-40gb-sxm": (19.5, 156), "a100-80gb-sxm": (19.5, 156),
    "h100-sxm": (67, 494.5), "h200-sxm": (67, 494.5), "h800-sxm": (67, 494.5),
    "b200": (75, 1100), "b300": (75, 1125), "gb200": (80, 1250), "gb300": (80, 1250), "l40s": (91.6, 183), "mi300x": (163.4, 653.7)}

SUPPORTED = [(name, dtype) for name in sorted(EXPECTED) for dtype in EXPECTED[name]]
REFUSED = [(name, dtype) for name in sorted(EXPECTED) for dtype in DEFAULT_PRECISION
           if dtype not in EXPECTED[name]]


def test_every_bundled_device_is_expected():
    assert sorted(EXPECTED) == known_device_ids()
    assert set(MODEL_DTYPES.values()) == set(DEFAULT_PRECISION) == {"bf16", "fp16", "fp32"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_model_dtype_runs_at_the_devices_own_rate(name):
    d = load_device(name)
    assert d.model_dtypes == tuple(k for k in DEFAULT_PRECISION if k in EXPECTED[name])
    for dtype, (entry, flops) in EXPECTED[name].items():
        assert d.matmul_precision(dtype) == entry
        assert d.peak(dtype) == d.matmul_peak(dtype) == pytest.approx(flops, rel=1e-12)
        assert d.achievable_flops(dtype) == pytest.approx(flops * d.matmul_efficiency, rel=1e-12)


@pytest.mark.parametrize("name", sorted(FP32_TF32))
def test_gpu_fp32_and_tf32_peaks_are_published_figures_with_sources(name):
    d = load_device(name)
    fp32, tf32 = FP32_TF32[name]
    assert d.peak_flops["fp32"] == pytest.approx(fp32 * T, rel=1e-12)
    assert ("tf32" in d.peak_flops) == (tf32 is not None)
    if tf32 is not None:
        assert d.peak_flops["tf32"] == pytest.approx(tf32 * T, rel=1e-12)
    for entry in ("fp32", "tf32") if tf32 else ("fp32",):
        src = d.sources[f"peak_flops.{entry}"]
        assert "datasheet" in src or "data sheet" in src or "specifications" in src, src


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if load_device(n).precision_rules))
def test_every_precision_rule_names_an_entry_and_cites_a_source(name):
    d = load_device(name)
    for dtype, entry in d.precision_rules.items():
        assert entry in d.peak_flops and dtype in DEFAULT_PRECISION
        assert len(d.sources[f"precision_rules.{dtype}"]) > 40


def test_v100_has_fp16_and_fp32_and_refuses_bfloat16_in_one_line():
    d = load_device("v100-sxm2-16gb")
    assert sorted(d.peak_flops) == ["fp16", "fp32"] and d.peak("bf16") == 0.0
    with pytest.raises(ProfileError) as e:
        d.matmul_peak("bf16")
    assert str(e.value) == (
        "device 'v100-sxm2-16gb' has no bf16 rate (its matmul rates: fp16, fp32); fix: set the "
        "model's dtype to float16 or float32 (a YAML model spec's 'dtype') or plan on devices "
        "that run bf16")


@pytest.mark.parametrize("name,dtype", REFUSED)
def test_a_dtype_without_a_rate_is_refused_naming_device_dtype_and_fix(name, dtype):
    d = load_device(name)
    assert d.peak(dtype) == 0.0
    for f in (d.matmul_precision, d.matmul_peak, d.achievable_flops):
        with pytest.raises(ProfileError) as e:
            f(dtype)
        msg = str(e.value)
        assert "\n" not in msg and f"device {name!r} has no {dtype} rate" in msg
        assert "fix: set the model's dtype to " in msg


def test_a_precision_rule_naming_a_missing_entry_is_refused(tmp_path):
    from hardware_profiles.paths import DEVICES_DIR

    text = (DEVICES_DIR / "tpu-v4.yaml").read_text().replace("    value: bf16\n    source: 'JAX",
                                                             "    value: tf32\n    source: 'JAX")
    p = tmp_path / "tpu-v4.yaml"
    p.write_text(text)
    with pytest.raises(ProfileError, match=r"precision_rules.fp32 names 'tf32', which peak_tflops "
                                           r"lacks \(has \['bf16', 'int8'\]\)"):
        load_device(p)


def test_profiles_tables_show_the_precisions_each_device_has():
    main = {r[0]: r for r in profiles_rows()}
    assert main["v100-sxm2-16gb"][2] == "-" and main["h100-sxm"][2] == "989"
    assert main["cpu-host"][2] == "0.147"
    rows = {r[0]: r[1:] for r in precision_rows()}
    #            bf16     fp16   tf32     fp32    fp8      other                       fp32 model at
    assert rows["v100-sxm2-16gb"] == ("-", "125", "-", "15.7", "-", "-", "fp32")
    assert rows["a100-40gb-sxm"] == ("312", "312", "156", "19.5", "-", "-", "tf32")
    assert rows["h100-sxm"] == ("989", "989", "494.5", "67", "1,979", "-", "tf32")
    assert rows["b200"] == ("2,250", "2,250", "1,100", "75", "4,500", "fp4 9,000", "tf32")
    assert rows["mi300x"] == ("1,307", "1,307", "653.7", "163.4", "2,615", "-", "fp32")
    assert rows["tpu-v5e"] == ("197", "-", "-", "-", "-", "int8 394", "bf16")
    assert rows["wormhole-n150"] == ("148", "-", "-", "-", "-", "bf16_hifi4 74, bfp8 262",
                                     "bf16_hifi4")
    assert rows["gaudi3"][-1] == "-"


# --------------------------------------------------------------------------- MFU and roofline
BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def _workload(dtype: str) -> Workload:
    """Two identical blocks of 200 GFLOP forward per sample (10 of it attention), 400 backward,
    with weights and activations in ``dtype``'s bytes: compute-bound on every device, and
    small enough to plan and replay in milliseconds."""
    b = BYTES[dtype]
    cost = LayerCost(name="block", fwd_flops_per_sample=2e11, bwd_flops_per_sample=4e11,
                     bwd_input_flops_per_sample=2e11, fwd_bytes_fixed=1e6 * b,
                     fwd_bytes_per_sample=1e6 * b, bwd_bytes_fixed=2e6 * b,
                     bwd_bytes_per_sample=2e6 * b, param_count=1_000_000, param_bytes=1e6 * b,
                     activation_bytes_per_sample=128 * 512 * b,
                     residual_bytes_per_sample=4 * 128 * 512 * b,
                     tp_allreduce_bytes_per_sample=0.0, attention_fwd_flops_per_sample=1e10,
                     attention_bwd_flops_per_sample=2e10)
    return Workload(model="toy", layers=("block", "block"), costs={"block": cost}, seq_len=128,
                    global_batch=32, dtype_bytes=b, dtype=dtype)


def _one_stage(name: str, devices: int = 8):
    dev = load_device(name)
    mesh = MeshSpec("m", dev, devices, {"data": devices}, Link(dev.scale_up_bandwidth, 0.0))
    cluster = Cluster("c", {"m": mesh}, ())
    plan = Plan(model="toy", cluster="c", stages=(StagePlan(0, 0, 2, "m"),),
                layouts={"m": Layout(devices, 1)}, schedule=generate("1f1b", 1, 4),
                rank_mesh=("m",), merge_last_stage=False, global_batch=32, seq_len=128,
                devices={"m": (name, devices)})
    return plan, cluster


@pytest.mark.parametrize("name,dtype", SUPPORTED)
def test_one_stage_plan_mfu_at_most_one_and_roofline_at_most_the_step(name, dtype):
    w = _workload(dtype)
    plan, cluster = _one_stage(name)
    peak = 8 * EXPECTED[name][dtype][1]
    assert cm.compute_dtype(w) == dtype
    assert PlanCosts(plan, w, cluster).peak_flops == pytest.approx(peak, rel=1e-12)
    pred = predict(plan, w, cluster)
    assert pred.roofline_step_time_s == pytest.approx(w.step_flops / peak, rel=1e-12)
    assert pred.mfu == pytest.approx(w.step_flops / (pred.step_time_s * peak), rel=1e-12)
    assert 0 < pred.mfu <= 1 and pred.roofline_step_time_s <= pred.step_time_s
    # every FLOP runs at most at the achievable rate, so MFU is at most the matmul efficiency
    assert pred.mfu <= cluster.meshes["m"].device.matmul_efficiency * (1 + 1e-12)
    sim = simulate_plan(plan, w, cluster)
    assert 0 < sim.mfu <= 1 and w.step_flops / peak <= sim.step_time_s


@pytest.mark.parametrize("name,dtype", REFUSED)
def test_one_stage_plan_of_a_dtype_the_device_lacks_is_refused(name, dtype):
    plan, cluster = _one_stage(name)
    with pytest.raises(ProfileError, match=f"device '{name}' has no {dtype} rate"):
        predict(plan, _workload(dtype), cluster)


def test_mixed_pipeline_of_a100_and_v100_in_fp32_counts_each_at_its_own_rate():
    """A float32 pipeline over 8 A100 and 8 V100: the A100 stage at its TF32 rate, the V100 stage
    at its FP32 rate, MFU and the roofline bound over both (it was the V100's FP32 peak alone,
    the A100 counting 0, and MFU above 1)."""
    w = dataclasses.replace(_workload("fp32"), global_batch=64)
    a, v = load_device("a100-40gb-sxm"), load_device("v100-sxm2-16gb")
    meshes = {n: MeshSpec(n, d, 8, {"data": 8}, Link(d.scale_up_bandwidth, 0.0))
              for n, d in (("a", a), ("v", v))}
    cluster = Cluster("c", meshes, (), default_link=Link(25e9, 5e-6))
    plan = Plan(model="toy", cluster="c", stages=(StagePlan(0, 0, 1, "a"), StagePlan(1, 1, 2, "v")),
                layouts={"a": Layout(8, 1), "v": Layout(8, 1)}, schedule=generate("1f1b", 2, 4),
                rank_mesh=("a", "v"), merge_last_stage=False, global_batch=64, seq_len=128,
                devices={"a": ("a100-40gb-sxm", 8), "v": ("v100-sxm2-16gb", 8)})
    peak = 8 * 156e12 + 8 * 15.7e12
    assert PlanCosts(plan, w, cluster).peak_flops == pytest.approx(peak, rel=1e-12)
    pred = predict(plan, w, cluster)
    assert pred.mfu == pytest.approx(w.step_flops / (pred.step_time_s * peak), rel=1e-12)
    assert 0 < pred.mfu <= 1 and pred.roofline_step_time_s <= pred.step_time_s
    sim = simulate_plan(plan, w, cluster)
    assert 0 < sim.mfu <= 1
    # the V100 stage's forward of one microbatch runs at the V100's FP32 rate, the A100's at TF32
    costs = PlanCosts(plan, w, cluster)
    cost = w.layer(0)
    fa = cm.layer_time(cost, "F", 16.0, meshes["a"], Layout(8, 1), "fp32", seq_len=128)
    fv = cm.layer_time(cost, "F", 16.0, meshes["v"], Layout(8, 1), "fp32", seq_len=128)
    assert fv > fa and costs.dtype == "fp32"


def test_a_bfloat16_model_on_a_cluster_with_a_v100_is_refused():
    w = _workload("bf16")
    plan, cluster = _one_stage("v100-sxm2-16gb")
    with pytest.raises(ProfileError, match="set the model's dtype to float16 or float32"):
        PlanCosts(plan, w, cluster).peak_flops
    with pytest.raises(ProfileError, match="no bf16 rate"):
        cluster.peak_flops("bf16")
    assert cluster.peak_flops("fp16") == 8 * 125e12


def test_workload_dtype_defaults_from_its_bytes_and_names_only_known_precisions():
    base = _workload("bf16")
    assert cm.compute_dtype(dataclasses.replace(base, dtype="")) == "bf16"
    assert cm.compute_dtype(dataclasses.replace(base, dtype="", dtype_bytes=4)) == "fp32"
    assert cm.compute_dtype(dataclasses.replace(base, dtype="fp16")) == "fp16"
    from ir.errors import IRError
    with pytest.raises(IRError, match="dtype 'fp8' is not one of"):
        dataclasses.replace(base, dtype="fp8")


def test_zoo_models_carry_their_precision():
    from zoo.config import get_config

    assert get_config("opt-350m").dtype == "float16"       # OPT: FP16 weights (Zhang et al. 2022)
    assert get_config("llama-tiny").dtype == "float32"
    assert MODEL_DTYPES[get_config("llama3-70b").dtype] == "bf16"


def test_the_planner_refuses_a_dtype_a_device_lacks_before_any_search():
    from planner.shaping import shape_and_plan

    plan, cluster = _one_stage("tpu-v5e")
    with pytest.raises(ProfileError, match="device 'tpu-v5e' has no fp16 rate .* fix: set the "
                                           "model's dtype to bfloat16 or float32"):
        shape_and_plan(_workload("fp16"), cluster)


def test_mpmd_plan_refuses_a_dtype_a_device_lacks_in_one_line():
    """OPT-350M is a float16 model (as OPT was trained): a TPU has no fp16 rate."""
    from click.testing import CliRunner

    from mpmd.cli.main import main

    r = CliRunner().invoke(main, ["plan", "--model", "opt-350m", "--cluster", "tpuv5e256",
                                  "--global-batch", "32", "--time-limit", "1"])
    lines = [ln for ln in r.output.splitlines() if ln.strip() and not ln.startswith("planning")]
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert lines[-1] == ("error: device 'tpu-v5e' has no fp16 rate (its matmul rates: bf16, int8); "
                         "fix: set the model's dtype to bfloat16 or float32 (a YAML model spec's "
                         "'dtype') or plan on devices that run fp16")


def test_training_recipes_table_lists_who_runs_what():
    """``mpmd profiles``' recipe table: only the devices with low-precision tensor cores, each
    recipe with its relative efficiency and origin; Hopper has no microscaling."""
    import re

    from hardware_profiles import recipe_rows

    rows = dict(recipe_rows())
    assert sorted(rows) == ["b200", "b300", "gb200", "gb300", "h100-sxm", "h200-sxm", "h800-sxm"]
    recipes = {n: re.findall(r"([a-z0-9-]+) (\d\.\d{3}) (fitted|derived|measured|prior)", t)
               for n, t in rows.items()}
    assert [r[0] for r in recipes["h100-sxm"]] == ["fp8", "fp8-blockwise"]
    assert [r[0] for r in recipes["gb200"]] == ["fp8", "fp8-blockwise", "mxfp8", "nvfp4"]
    assert recipes["h100-sxm"][0][2] == "fitted"      # on the published FP8 runs
