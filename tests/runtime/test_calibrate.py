"""Tests of runtime.calibration.measure: the roofline fit, the runtime measurements, the profile files.

Every test here but the ``slow`` ones is independent of the machine: the host's figures (cores,
/proc/cpuinfo, memory, date) are passed in as fixed values, never read, and nothing is timed.
"""

from __future__ import annotations

import dataclasses

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import runtime.calibration.measure as calibrate_mod
from runtime.calibration.measure import (Calibration, CalibrationError, FragmentTiming, HostInfo, grad_bytes,
                                         fit_additive, fit_backward, fit_calibration, fit_flops,
                                         local_meshes, measure_overhead, measure_runtime_concurrency,
                                         nominal_peaks, read_host)
from runtime.calibration.fit import cpu_model
from runtime.calibration.files import (cluster_yaml, device_reference, device_yaml, profile_paths,
                                       write_profiles)
from hardware_profiles import load_cluster
from hardware_profiles.loader import load_device

REPO = Path(__file__).resolve().parents[2]
AVX512 = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Test CPU\nflags\t\t: fpu sse2 avx2 avx512f\n"
          "cpu MHz\t\t: 2600.000\n")
AVX2 = "flags\t\t: fpu sse2 avx avx2 fma\ncpu MHz\t\t: 2250.000\n"
HOST = HostInfo(cores=2, cpuinfo=AVX512, memory_bytes=25.6e9, date="2026-01-02")


def _cal(**kw) -> Calibration:
    """A synthetic calibration: peak 166.4 GFLOP/s (2 cores x 2.6 GHz x 64 / 2), achievable
    49.92 GFLOP/s (matmul efficiency exactly 0.3), 25.6 GB of RAM over 8 devices."""
    base = dict(peak_flops=1.664e11, achievable_flops=4.992e10, memory_bandwidth=1e10,
                achievable_bandwidth=3e9, fragment_overhead=1e-4, link_bandwidth=1e9,
                link_latency=1e-4, intra_bandwidth=2e9, intra_latency=5e-5,
                concurrency_speedup=1.1, runtime_concurrency=0.99, host_slots=1,
                devices_per_mesh=2, cores=2,
                fragments=(FragmentTiming("block", "F", 2, 1e9, 3e7, 0.02),), fit_rel_error=0.1,
                date="2026-01-02", peak_source="2 cores x 2.60 GHz (given)",
                memory_bytes=25.6e9)
    base.update(kw)
    return Calibration(**base)


def test_nominal_peaks_come_from_the_given_cpuinfo_not_this_host():
    peak, src, ghz = nominal_peaks(2, 2, AVX512)
    assert peak == pytest.approx(2 * 2.6e9 * 64 / 2, rel=1e-15) and ghz == pytest.approx(2.6)
    assert src == ("2 cores x 2.60 GHz (/proc/cpuinfo) x 64 float32 FLOP/cycle (AVX-512 FMA) = "
                   "333 GFLOP/s per host, / 2 devices per mesh")
    assert nominal_peaks(2, 4, AVX2)[0] == pytest.approx(4 * 2.25e9 * 32 / 2, rel=1e-15)
    assert nominal_peaks(1, 1, "")[:3:2] == (pytest.approx(2e9 * 8), 2.0)   # SSE, 2 GHz
    assert nominal_peaks(2, 2, AVX512, ghz=3.0)[0] == pytest.approx(2 * 3e9 * 64 / 2, rel=1e-15)
    # a flag that merely starts with avx512 is not avx512f
    assert "AVX2" in nominal_peaks(1, 1, "flags : avx2 avx512_vnni\n")[1]
    assert cpu_model(AVX512) == "Intel(R) Xeon(R) Test CPU" and cpu_model(AVX2) == ""


def test_read_host_reads_this_machine_once_into_plain_values():
    h = read_host()
    assert isinstance(h.cores, int) and h.cores >= 1
    assert isinstance(h.cpuinfo, str) and h.memory_bytes >= 0
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", h.date)


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
    assert c.predict(1e9, 0.0) == pytest.approx(1e-4 + 1e9 / 4.992e10)
    assert c.predict(0.0, 3e9) == pytest.approx(1e-4 + 1.0)
    add = _cal(roofline="sum")
    assert add.predict(1e9, 3e9) == pytest.approx(1e-4 + 1e9 / 4.992e10 + 1.0)
    assert c.predict(1e9, 3e9) == pytest.approx(1e-4 + 1.0)
    assert c.matmul_efficiency == pytest.approx(0.3, rel=1e-15)


def test_fit_calibration_keeps_the_better_roofline():
    # synthetic additive (roofline: sum) timings: the sum model fits them exactly, max does not
    F, B, Fb, ar, o, lat = 1.2e11, 4e9, 1e11, 8e8, 1e-4, 6e-5
    frags = []
    for layer, fl, by in (("block", 1e9, 2e7), ("head", 4e7, 9e5)):
        for s in (2, 4, 8):
            f = FragmentTiming(layer, "F", s, fl * s / 2, by * (1 + s / 8), 0.0)
            frags.append(FragmentTiming(layer, "F", s, f.flops, f.bytes,
                                        o + f.flops / F + f.bytes / B))
            b = FragmentTiming(layer, "B", s, fl * s, 2 * by * (1 + s / 8), 0.0)
            frags.append(FragmentTiming(layer, "B", s, b.flops, b.bytes,
                                        o + b.flops / Fb + b.bytes / B + 2 * lat
                                        + grad_bytes(b) / ar))
    fit = fit_calibration(frags, o, B, 2, lat)
    assert fit["roofline"] == "sum"
    assert fit["achievable_flops"] == pytest.approx(F, rel=1e-6)
    assert fit["backward_efficiency"] == pytest.approx(Fb / F, rel=1e-6)
    assert fit["allreduce_bandwidth"] == pytest.approx(ar, rel=1e-6)
    errs = dict(fit["roofline_errors"])
    assert errs["sum"] < 1e-9 < errs["max"] and fit["rel_error"] == errs["sum"]


def test_profiles_written_load_with_measured_origins(tmp_path):
    dev, clu = tmp_path / "cpu-host.yaml", tmp_path / "cpu4x2.yaml"
    assert write_profiles(_cal(), str(dev), str(clu)) == (dev, clu)
    d = load_device(dev)
    assert d.achievable_flops("fp32") == pytest.approx(4.992e10, rel=1e-12)
    assert d.peak_flops["fp32"] == pytest.approx(1.664e11, rel=1e-12)
    assert d.memory_bytes == pytest.approx(25.6e9 / 8, rel=1e-12)
    assert d.fragment_overhead == pytest.approx(1e-4, rel=1e-12)
    for k in ("matmul_efficiency", "memory_efficiency", "fragment_overhead"):
        assert d.sources[k].startswith("measured 2026-01-02 on this machine (2 cores shared by 8 ")
    assert d.sources["peak_flops.fp32"] == "2 cores x 2.60 GHz (given)"
    assert "model not named" in d.sources["tdp_watts"]
    assert "(CPU 'EPYC test')" in device_yaml(_cal(cpu_model="EPYC test"))["tdp_w"]["source"]
    data = yaml.safe_load(clu.read_text())
    assert data["host_slots"] == {"local": 1}
    assert [m["host"] for m in data["meshes"]] == ["local"] * 4
    assert [m["device"] for m in data["meshes"]] == ["cpu-host.yaml"] * 4
    assert cluster_yaml(_cal(host_slots=2))["host_slots"] == {"local": 2}
    assert device_yaml(_cal())["efficiency"]["matmul"]["origin"].startswith("measured 2026-01-02")
    assert d.roofline == "max"
    # the same calibration renders the same bytes (nothing read from the host or the clock)
    first = dev.read_bytes(), clu.read_bytes()
    write_profiles(_cal(), dev, clu)
    assert (dev.read_bytes(), clu.read_bytes()) == first
    (tmp_path / "sum").mkdir()
    dev2 = tmp_path / "sum" / "cpu-host.yaml"     # a new path: load_device caches by path
    write_profiles(_cal(roofline="sum", roofline_errors=(("max", 0.04), ("sum", 0.02))),
                   str(dev2), str(clu))
    d = load_device(dev2)
    assert d.roofline == "sum" and "max 0.040, sum 0.020" in d.sources["roofline"]


def test_weight_stream_and_decode_overhead_are_written_and_loaded(tmp_path):
    """A calibration that measured the matrix-vector weight stream and the decode-shaped layer
    writes both into the profile, with their origins; one that did not writes neither."""
    decode = FragmentTiming("block", "F", 1, 1e6, 8e6, 1e-3, "tp", seq_len=1, weight_bytes=7e6)
    cal = _cal(weight_bandwidth=8e9, decode_layer_overhead=2.5e-4, decode_fragment=decode)
    dev = tmp_path / "cpu-host.yaml"
    write_profiles(cal, str(dev), str(tmp_path / "cpu4x2.yaml"))
    d = load_device(dev)
    assert d.weight_stream_efficiency == pytest.approx(0.8, rel=1e-12)   # 8 of 10 GB/s
    assert d.weight_bandwidth(1) == pytest.approx(8e9, rel=1e-12)
    assert d.weight_bandwidth(2) == pytest.approx(3e9, rel=1e-12)         # a matrix-matrix product
    assert d.decode_layer_overhead == pytest.approx(2.5e-4, rel=1e-12)
    assert "reached 8.00 GB/s per device" in d.sources["weight_stream_efficiency"]
    assert "added 1000.0 us" in d.sources["decode_layer_overhead"]
    plain = device_yaml(_cal())["efficiency"]
    assert "weight_stream" not in plain and "decode_layer_overhead_us" not in plain


def test_decode_overhead_is_what_the_layer_takes_beyond_the_cost_models_charge():
    """fit_decode_overhead: what one more decode-shaped layer added to a fragment less its FLOP,
    its weights at the matrix-vector rate, its activations at the a + b rate and its two
    tensor-parallel all-reduces (ring over 2 devices: 2 latencies + bytes / bandwidth); the
    fragment overhead (1e-4 s) is not the layer's and is not taken off."""
    from runtime.calibration.fit import fit_decode_overhead
    from runtime.calibration.layouts import collective_terms, layout_costs

    cal = _cal(roofline="sum", weight_bandwidth=8e9)
    raw = FragmentTiming("block", "F", 1, 0.0, 0.0, 5e-3, "tp", seq_len=1)
    f = layout_costs([raw], 2)[0]
    assert f.seq_len == 1 and 0 < f.weight_bytes < f.bytes
    fixed, per = collective_terms(f, 2, cal.intra_latency)
    charge = (f.flops / 4.992e10 + (f.bytes - f.weight_bytes) / 3e9 + f.weight_bytes / 8e9
              + fixed + per / 2e9)
    assert fit_decode_overhead(cal, f) == pytest.approx(5e-3 - charge, rel=1e-12)
    fast = dataclasses.replace(f, seconds=charge / 2)
    assert fit_decode_overhead(cal, fast) == 0.0        # never negative


def test_profiles_without_the_hosts_figures_are_refused():
    with pytest.raises(CalibrationError, match="memory_bytes 0.0; both must be positive"):
        device_yaml(_cal(memory_bytes=0.0))
    with pytest.raises(CalibrationError, match="peak_flops 0.0"):
        device_yaml(_cal(peak_flops=0.0))


def test_out_folder_holds_a_cluster_that_loads_its_own_device(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert profile_paths() == (Path("calibrated/cpu-host.yaml"), Path("calibrated/cpu4x2.yaml"))
    write_profiles(_cal(date="2026-01-03"), *profile_paths())        # relative, folder made
    c = load_cluster("calibrated/cpu4x2.yaml")
    dev = c.meshes["m0"].device
    assert dev.sources["matmul_efficiency"].startswith("measured 2026-01-03")
    assert dev.achievable_flops("fp32") == pytest.approx(4.992e10, rel=1e-12)
    assert c.path == "calibrated/cpu4x2.yaml"      # what a plan's cluster_path records
    # loaded from another working directory, the cluster still finds the device beside it
    monkeypatch.chdir(REPO)
    c2 = load_cluster(tmp_path / "calibrated" / "cpu4x2.yaml")
    assert c2.meshes["m3"].device is dev


def test_device_and_cluster_out_overrides_name_the_device_relatively(tmp_path):
    dev, clu = profile_paths("ignored", tmp_path / "d" / "dev.yaml", tmp_path / "c" / "clu.yaml")
    assert (dev, clu) == (tmp_path / "d" / "dev.yaml", tmp_path / "c" / "clu.yaml")
    assert profile_paths("x", device_out="y.yaml") == (Path("y.yaml"), Path("x/cpu4x2.yaml"))
    assert device_reference(dev, clu) == "../d/dev.yaml"
    write_profiles(_cal(date="2026-01-04"), dev, clu)
    got = load_cluster(clu).meshes["m1"].device
    assert got.name == "dev"                  # the loader wants a device named as its file
    assert got.sources["matmul_efficiency"].startswith("measured 2026-01-04")
    # the bundled pair keeps naming the bundled device by its id
    bundled = REPO / "hardware_profiles"
    assert device_reference(bundled / "devices" / "cpu-host.yaml",
                            bundled / "clusters" / "cpu4x2.yaml") == "cpu-host"


def test_calibrate_command_writes_both_files_and_shows_progress(tmp_path, monkeypatch):
    """The ``mpmd calibrate`` command end to end with the timing replaced by a synthetic
    calibration (the real one is the slow test below)."""
    from mpmd.cli.main import main

    seen = []

    def fake(host, *, repeats, progress):
        assert host == HOST and repeats == 2
        for m in ("[1/8] fragments: block F, 2 samples (1 of 18)", "[8/8] runtime concurrency"):
            progress(m)
            seen.append(m)
        return _cal(cores=host.cores, memory_bytes=host.memory_bytes, date=host.date)

    monkeypatch.setattr(calibrate_mod, "calibrate", fake)
    monkeypatch.setattr(calibrate_mod, "read_host", lambda: HOST)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["calibrate", "--out", "cal", "--repeats", "2"])
    assert res.exit_code == 0, res.output
    assert len(seen) == 2
    # not a terminal: no spinner, one line a step
    assert "calibrating: [1/8] fragments\ncalibrating: [8/8] runtime concurrency\n" in res.output
    assert "wrote cal/cpu-host.yaml and cal/cpu4x2.yaml; plan with --cluster cal/cpu4x2.yaml" \
        in res.output.replace("\n", " ")
    c = load_cluster("cal/cpu4x2.yaml")
    assert c.meshes["m0"].device.achievable_flops("fp32") == pytest.approx(4.992e10, rel=1e-12)
    assert not (tmp_path / "hardware_profiles").exists()
    res = CliRunner().invoke(main, ["calibrate", "--help"])
    assert "--out" in res.output and "--device-out" in res.output


def test_unwritable_outputs_fail_before_measuring(tmp_path, monkeypatch):
    from mpmd.cli.main import main

    def never(*a, **k):
        raise AssertionError("measured before checking the outputs")

    monkeypatch.setattr(calibrate_mod, "calibrate", never)
    monkeypatch.setattr(calibrate_mod, "read_host", never)
    (tmp_path / "f").write_text("")
    (tmp_path / "d").mkdir()
    cases = {("--out", str(tmp_path / "f" / "sub")): f"{tmp_path / 'f'} is a file, not a folder",
             ("--cluster-out", str(tmp_path / "f" / "c.yaml")): "is a file, not a folder",
             ("--out", str(tmp_path / "f")): "is a file, not a folder",
             ("--device-out", str(tmp_path / "d")): "is a directory"}
    for args, needle in cases.items():
        res = CliRunner().invoke(main, ["calibrate", *args])
        assert res.exit_code == 2 and needle in res.output, (args, res.output)
        assert "Traceback" not in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"]     # nothing written


def test_shipped_cluster_and_profile_are_calibrated():
    c = load_cluster(REPO / "hardware_profiles/clusters/cpu4x2.yaml")
    assert list(c.meshes) == ["m0", "m1", "m2", "m3"]
    assert all(m.num_devices == 2 and m.host == "local" for m in c.meshes.values())
    assert c.host_slots["local"] >= 1
    dev = c.meshes["m0"].device
    assert dev.name == "cpu-host"
    assert "measured" in dev.sources["matmul_efficiency"]
    assert 1e8 < dev.achievable_flops("fp32") < 1e12


def test_runtime_measurements_run_on_local_devices():
    """Structure only (no bound on how fast this machine is): the overhead is a positive time and
    the recording runtime, one step at a time, keeps at most one fragment running."""
    meshes = local_meshes(2, 2)
    assert measure_overhead(meshes[0], calls=5) > 0
    assert 0 < measure_runtime_concurrency(meshes, fragments=1, samples=2) <= 1.0001
    with pytest.raises(CalibrationError, match="needs 100 devices"):
        local_meshes(50, 2)


@pytest.mark.slow
def test_runtime_measurements_on_an_idle_machine():
    """Measures real time (slow: the bounds assume an otherwise idle machine): a runtime step
    costs under 10 ms, and the runtime keeps close to one fragment running."""
    meshes = local_meshes(2, 2)
    assert 0 < measure_overhead(meshes[0], calls=50) < 0.01
    assert 0.5 < measure_runtime_concurrency(meshes, fragments=2, samples=2) <= 1.0001


@pytest.mark.slow
def test_mpmd_calibrate_for_real_writes_a_loadable_profile(tmp_path):
    """Runs ``mpmd calibrate --out`` for real (slow: times every fragment on this machine)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    res = subprocess.run([sys.executable, "-m", "mpmd", "calibrate", "--out", "out",
                          "--repeats", "1"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu-host.yaml", "cpu4x2.yaml"]
    c = load_cluster(tmp_path / "out" / "cpu4x2.yaml")
    dev = c.meshes["m0"].device
    assert dev.sources["matmul_efficiency"].startswith("measured ")
    assert 0 < dev.matmul_efficiency <= 1 and 0 < dev.memory_efficiency <= 1
    assert dev.fragment_overhead > 0 and c.host_slots["local"] >= 1
    assert "wrote out/cpu-host.yaml and out/cpu4x2.yaml" in res.stdout.replace("\n", " ")


def test_fixed_time_per_layer_is_the_small_blocks_intercept_less_the_overhead():
    """fit_layer_overhead: a line through the small block's times against its samples; its
    intercept less the fragment overhead is the fixed time per layer, per kind (F: 300 us + 0.25
    ms per sample, B: 1.3 ms + 0.5 ms per sample, overhead 100 us)."""
    from runtime.calibration.fit import fit_layer_overhead

    frags = [FragmentTiming("small_block", k, b, 0.0, 0.0, a + s * b, "dp", 64)
             for b in (2, 4, 8) for k, a, s in (("F", 4e-4, 2.5e-4), ("B", 1.4e-3, 5e-4))]
    f, b = fit_layer_overhead(frags, 1e-4)
    assert f == pytest.approx(3e-4, rel=1e-9) and b == pytest.approx(1.3e-3, rel=1e-9)
    # an intercept below the dispatch overhead is no negative time
    assert fit_layer_overhead([dataclasses.replace(x, seconds=x.samples * 1e-3) for x in frags],
                              1e-4) == (0.0, 0.0)
    with pytest.raises(CalibrationError, match="timed at 1 sample count"):
        fit_layer_overhead([x for x in frags if x.samples == 2], 1e-4)


def test_fixed_time_per_layer_is_written_loaded_and_charged_per_layer(tmp_path):
    """The profile carries both fixed times with their origin; the cost model adds them to every
    layer with FLOP (the forward's to an F, the backward's to a B, split by FLOP between B and W),
    never to a decode-shaped forward, which has its own."""
    small = tuple(FragmentTiming("small_block", k, b, 0.0, 0.0, 1e-3, "dp", 64)
                  for b in (2, 4) for k in "FB")
    cal = _cal(forward_layer_overhead=3e-4, backward_layer_overhead=1.2e-3, small_block=small)
    dev = tmp_path / "cpu-host.yaml"
    write_profiles(cal, str(dev), str(tmp_path / "cpu4x2.yaml"))
    d = load_device(dev)
    assert (d.forward_layer_overhead, d.backward_layer_overhead) == (
        pytest.approx(3e-4, rel=1e-12), pytest.approx(1.2e-3, rel=1e-12))
    assert "microbatch of 2, 4 samples" in d.sources["forward_layer_overhead"]
    assert "forward_layer_overhead_us" not in device_yaml(_cal())["efficiency"]

    from hardware_profiles.cluster_loader import load_cluster
    from ir import Layout
    from simulator import cost_model as cm
    from zoo.costing import workload

    mesh = load_cluster(tmp_path / "cpu4x2.yaml").meshes["m0"]
    bare = dataclasses.replace(mesh, device=dataclasses.replace(
        d, forward_layer_overhead=0.0, backward_layer_overhead=0.0))
    c = workload("llama-tiny", 8).costs["decoder_block"]
    lay = Layout(2, 1)

    def extra(kind, **kw):
        return (cm.layer_time(c, kind, 4.0, mesh, lay, "fp32", seq_len=128, **kw)
                - cm.layer_time(c, kind, 4.0, bare, lay, "fp32", seq_len=128, **kw))
    assert extra("F") == pytest.approx(3e-4, rel=1e-9)
    assert extra("B") == pytest.approx(1.2e-3, rel=1e-9)
    share = c.bwd_input_flops_per_sample / c.bwd_flops_per_sample
    assert extra("B", split_backward=True) == pytest.approx(1.2e-3 * share, rel=1e-9)
    assert extra("W") == pytest.approx(1.2e-3 * (1 - share), rel=1e-9)
    one = cm.layer_time(c, "F", 2.0, mesh, lay, "fp32", seq_len=1)     # one token per device
    assert one == pytest.approx(cm.layer_time(c, "F", 2.0, bare, lay, "fp32", seq_len=1), rel=1e-12)


def test_fixed_time_per_layer_scales_with_the_layers_ops(tmp_path):
    """A calibration that counted the small block's ops writes them beside each fixed time; a
    layer then pays the fixed time times its own ops over the small block's (a mixture of
    experts' block, with more ops, pays more; the embedding, with few, less), and the fit takes
    off each timed fragment's own share."""
    from hardware_profiles.cluster_loader import load_cluster
    from ir import Layout
    from runtime.calibration.fit import layer_fixed
    from runtime.calibration.measure import small_block_ops
    from simulator import cost_model as cm
    from zoo.costing import workload
    from zoo.model_files import load_model_file

    ops = small_block_ops()
    small = tuple(FragmentTiming("small_block", k, b, 0.0, 0.0, 1e-3, "dp", 64)
                  for b in (2, 4) for k in "FB")
    cal = _cal(forward_layer_overhead=3e-4, backward_layer_overhead=1.2e-3, small_block=small,
               small_block_ops=ops)
    dev = tmp_path / "cpu-host.yaml"
    write_profiles(cal, str(dev), str(tmp_path / "cpu4x2.yaml"))
    d = load_device(dev)
    assert d.layer_overhead_ops == ops
    assert f"its {ops[0]} ops dispatched" in d.sources["forward_layer_overhead"]
    mesh = load_cluster(tmp_path / "cpu4x2.yaml").meshes["m0"]
    bare = dataclasses.replace(mesh, device=dataclasses.replace(
        d, forward_layer_overhead=0.0, backward_layer_overhead=0.0))
    lay = Layout(2, 1)
    moe = workload(load_model_file(REPO / "zoo/configs/tiny-moe.yaml"), 8).costs["decoder_block"]
    embed = workload("llama-tiny", 8).costs["embed"]
    for c in (moe, embed):
        for kind, fixed, n, ref in (("F", 3e-4, c.fwd_ops, ops[0]), ("B", 1.2e-3, c.bwd_ops, ops[1])):
            extra = (cm.layer_time(c, kind, 4.0, mesh, lay, "fp32", seq_len=64)
                     - cm.layer_time(c, kind, 4.0, bare, lay, "fp32", seq_len=64))
            assert extra == pytest.approx(fixed * n / ref, rel=1e-9)
    assert moe.fwd_ops > 1.5 * ops[0] and moe.bwd_ops > ops[1] and embed.fwd_ops < ops[0] / 10
    f = FragmentTiming("embed", "F", 2, 0.0, 0.0, 1e-3, "dp", ops=embed.fwd_ops)
    assert layer_fixed(cal, f) == pytest.approx(3e-4 * embed.fwd_ops / ops[0], rel=1e-12)
    assert layer_fixed(_cal(forward_layer_overhead=3e-4), f) == 3e-4     # ops not counted


def test_decode_layer_is_timed_as_what_one_more_block_adds_to_a_fragment():
    """Structure only (no bound on this machine's speed): the decode-shaped timing is a one-token,
    tensor-parallel F of one sample, and fragments of blocks must be compared at two increasing
    counts."""
    from runtime.calibration.measure import measure_decode_layer

    mesh = local_meshes(1, 2)[0]
    f = measure_decode_layer(mesh, repeats=1, cache_tokens=8, layers=(1, 2))
    assert (f.layer, f.kind, f.samples, f.layout, f.seq_len) == ("block", "F", 1, "tp", 1)
    assert f.seconds > 0
    with pytest.raises(CalibrationError, match="decode fragments of 2 and 2 blocks"):
        measure_decode_layer(mesh, layers=(2, 2))
