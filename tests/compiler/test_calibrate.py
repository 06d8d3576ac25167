"""Tests of compiler.calibrate: the roofline fit, the runtime measurements, the profile files."""

from __future__ import annotations

import pytest
import yaml

from compiler.calibrate import (Calibration, CalibrationError, FragmentTiming, grad_bytes,
                                fit_additive, fit_backward, fit_flops, local_meshes, measure_overhead, measure_runtime_concurrency)
from compiler.calibration_files import cluster_yaml, device_yaml, write_profiles
from hardware_profiles import load_cluster
from hardware_profiles.loader import load_device


def _cal(**kw) -> Calibration:
    base = dict(peak_flops=1.664e11, achievable_flops=5e10, memory_bandwidth=1e10,
                achievable_bandwidth=3e9, fragment_overhead=1e-4, link_bandwidth=1e9,
                link_latency=1e-4, intra_bandwidth=2e9, intra_latency=5e-5,
                concurrency_speedup=1.1, runtime_concurrency=0.99, host_slots=1,
                devices_per_mesh=2, cores=2,
                fragments=(FragmentTiming("block", "F", 2, 1e9, 3e7, 0.02),), fit_rel_error=0.1)
    base.update(kw)
    return Calibration(**base)


def test_fit_recovers_the_rate_of_synthetic_roofline_timings():
    F, B, o = 4e10, 3e9, 2e-4
    frags = [FragmentTiming("block", k, s, f, b, o + max(f / F, b / B))
             for k, s, f, b in (("F", 2, 1e9, 3e7), ("B", 2, 2e9, 1e8), ("F", 8, 4e9, 9e7),
                                ("B", 8, 8e9, 3e8), ("F", 1, 1e5, 8e6))]
    got, err = fit_flops(frags, o, B)
    assert got == pytest.approx(F, rel=0.01)
    assert err < 0.01
    with pytest.raises(CalibrationError, match="no fragment timings"):
        fit_flops([], o, B)


def test_fit_backward_separates_the_gradient_all_reduce_from_the_compute_rate():
    # synthetic backwards: compute at 3e10 FLOP/s plus a ring all-reduce of each layer's
    # gradients at 5e8 B/s (n = 2: 2(n-1)/n = 1, 2(n-1) = 2 latency steps)
    F, B, o, ar, lat = 3e10, 3e9, 1e-4, 5e8, 5e-5
    frags = []
    for layer, fl in (("block", 1e9), ("head", 4e7)):
        for s in (2, 4, 8):
            f = FragmentTiming(layer, "B", s, fl * s, 1e7 * s, 0.0)
            t = o + max(f.flops / F, f.bytes / B) + 2 * lat + grad_bytes(f) / ar
            frags.append(FragmentTiming(layer, "B", s, f.flops, f.bytes, t))
    got_f, got_ar, err = fit_backward(frags, o, B, 2, lat)
    assert got_f == pytest.approx(F, rel=0.01)
    assert got_ar == pytest.approx(ar, rel=0.02)
    assert err < 0.01
    with pytest.raises(CalibrationError, match="no backward timings"):
        fit_backward([], o, B, 2, lat)


def test_fit_additive_recovers_the_three_rates_jointly():
    # synthetic fragments under the additive model: F 1.2e11 FLOP/s, memory 4e9 B/s (given),
    # backward 1e11 FLOP/s, gradient all-reduce 8e8 B/s (n = 2)
    F, B, Fb, ar, o, lat = 1.2e11, 4e9, 1e11, 8e8, 1e-4, 6e-5
    frags = []
    for layer, fl, by in (("block", 1e9, 2e7), ("head", 4e7, 9e5)):
        for s in (2, 4, 8):
            fwd = FragmentTiming(layer, "F", s, fl * s / 2, by * (1 + s / 8), 0.0)
            frags.append(FragmentTiming(layer, "F", s, fwd.flops, fwd.bytes,
                                        o + fwd.flops / F + fwd.bytes / B))
            bwd = FragmentTiming(layer, "B", s, fl * s, 2 * by * (1 + s / 8), 0.0)
            frags.append(FragmentTiming(layer, "B", s, bwd.flops, bwd.bytes,
                                        o + bwd.flops / Fb + bwd.bytes / B + 2 * lat
                                        + grad_bytes(bwd) / ar))
    got = fit_additive(frags, o, B, 2, lat)
    for g, want in zip(got[:3], (F, Fb, ar)):
        assert g == pytest.approx(want, rel=1e-6)
    assert got[3] < 1e-9
    with pytest.raises(CalibrationError, match="forward and backward"):
        fit_additive([f for f in frags if f.kind == "F"], o, B, 2, lat)


def test_predict_is_the_cost_models_roofline():
    c = _cal()
    assert c.predict(1e9, 0.0) == pytest.approx(1e-4 + 1e9 / 5e10)
    assert c.predict(0.0, 3e9) == pytest.approx(1e-4 + 1.0)
    add = _cal(roofline="sum")
    assert add.predict(1e9, 3e9) == pytest.approx(1e-4 + 1e9 / 5e10 + 1.0)
    assert c.predict(1e9, 3e9) == pytest.approx(1e-4 + 1.0)
    assert c.matmul_efficiency == pytest.approx(5e10 / 1.664e11)


def test_profiles_written_load_with_measured_origins(tmp_path):
    dev, clu = tmp_path / "cpu-host.yaml", tmp_path / "cpu4x2.yaml"
    write_profiles(_cal(), str(dev), str(clu))
    d = load_device(dev)
    assert d.achievable_flops("fp32") == pytest.approx(5e10, rel=1e-3)
    assert d.fragment_overhead == pytest.approx(1e-4)
    for k in ("matmul_efficiency", "memory_efficiency", "fragment_overhead"):
        assert d.sources[k].startswith("measured")
    data = yaml.safe_load(clu.read_text())
    assert data["host_slots"] == {"local": 1}
    assert [m["host"] for m in data["meshes"]] == ["local"] * 4
    assert cluster_yaml(_cal(host_slots=2))["host_slots"] == {"local": 2}
    assert device_yaml(_cal())["efficiency"]["matmul"]["origin"].startswith("measured")
    assert d.roofline == "max"
    (tmp_path / "sum").mkdir()
    dev2 = tmp_path / "sum" / "cpu-host.yaml"     # a new path: load_device caches by path
    write_profiles(_cal(roofline="sum", roofline_errors=(("max", 0.04), ("sum", 0.02))),
                   str(dev2), str(clu))
    d = load_device(dev2)
    assert d.roofline == "sum" and "max 0.040, sum 0.020" in d.sources["roofline"]


def test_shipped_cluster_and_profile_are_calibrated():
    c = load_cluster("hardware_profiles/clusters/cpu4x2.yaml")
    assert list(c.meshes) == ["m0", "m1", "m2", "m3"]
    assert all(m.num_devices == 2 and m.host == "local" for m in c.meshes.values())
    assert c.host_slots["local"] >= 1
    dev = c.meshes["m0"].device
    assert dev.name == "cpu-host"
    assert "measured" in dev.sources["matmul_efficiency"]
    assert 1e8 < dev.achievable_flops("fp32") < 1e12


def test_runtime_measurements_on_local_devices():
    meshes = local_meshes(2, 2)
    o = measure_overhead(meshes[0], calls=50)
    assert 0 < o < 0.01
    # the recording runtime runs one step at a time: concurrency is 1, never 2
    conc = measure_runtime_concurrency(meshes, fragments=2, samples=2)
    assert 0.5 < conc <= 1.0001
    with pytest.raises(CalibrationError, match="needs 100 devices"):
        local_meshes(50, 2)
