"""Tests of runtime.calibration.routing: a mixture of experts' routing time per (token, expert)
pair, fitted beyond the cost model's charge, written into the profile and charged by the simulator.

Nothing here is timed but the one structure test of :func:`measure_routed_block` (its figures are
not checked against any bound: they are this machine's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hardware_profiles import load_cluster
from hardware_profiles.loader import load_device
from ir import Layout
from runtime.calibration.files import device_yaml, write_profiles
from runtime.calibration.fit import Calibration, CalibrationError, FragmentTiming
from runtime.calibration.routing import (ROUTED_LAYOUTS, ROUTED_PATH, fit_routing_pairs,
                                         measure_routed_block, routed_layout)
from simulator import cost_model as cm
from zoo.costing import workload
from zoo.model_files import load_model_file

REPO = Path(__file__).resolve().parents[2]


def _mesh(**device):
    """The bundled calibrated CPU mesh (2 devices), its device with ``device``'s fields."""
    m = load_cluster(REPO / "hardware_profiles/clusters/cpu4x2.yaml").meshes["m0"]
    dev = dataclasses.replace(m.device, **{"forward_routing_pair": 0.0,
                                           "backward_routing_pair": 0.0, **device})
    return dataclasses.replace(m, device=dev)


def _charged(mesh, kind: str, samples: int, layout: str) -> tuple[float, float]:
    """(seconds the cost model charges the routed block, its pairs per device)."""
    w = workload(load_model_file(ROUTED_PATH), samples)
    c = w.costs["decoder_block"]
    lay = routed_layout(layout, mesh.num_devices)
    return (cm.layer_time(c, kind, float(samples), mesh, lay, cm.compute_dtype(w),
                          seq_len=w.seq_len),
            c.routed_pairs_per_sample * samples / lay.data)


def test_routed_pairs_are_the_tokens_times_top_k():
    cfg = load_model_file(ROUTED_PATH)
    c = workload(cfg, 2).costs["decoder_block"]
    assert c.routed_pairs_per_sample == 64 * 2 == cfg.seq_len * cfg.experts_per_token
    assert workload("llama-tiny", 2).costs["decoder_block"].routed_pairs_per_sample == 0


def test_layer_time_charges_each_routed_pair_of_the_devices_tokens():
    """F and a whole B pay their time per pair for the device's pairs (2 samples over data
    parallel 2: 64 tokens x top 2 = 128 pairs); a W pays none, nor does a dense layer."""
    plain = _mesh()
    routed = _mesh(forward_routing_pair=8e-6, backward_routing_pair=6e-6)
    cost = workload(load_model_file(ROUTED_PATH), 2).costs["decoder_block"]
    lay = Layout(2, 1, expert=2)
    for kind, extra, split in (("F", 128 * 8e-6, False), ("B", 128 * 6e-6, False),
                               ("B", 128 * 6e-6, True), ("W", 0.0, True)):
        a = cm.layer_time(cost, kind, 2.0, plain, lay, "fp32", seq_len=64, split_backward=split)
        b = cm.layer_time(cost, kind, 2.0, routed, lay, "fp32", seq_len=64, split_backward=split)
        assert b - a == pytest.approx(extra, rel=1e-9, abs=1e-15), kind
    dense = workload("llama-tiny", 2).costs["decoder_block"]
    assert (cm.layer_time(dense, "F", 2.0, routed, Layout(2, 1), "fp32", seq_len=128)
            == cm.layer_time(dense, "F", 2.0, plain, Layout(2, 1), "fp32", seq_len=128))


def test_fit_recovers_a_synthetic_time_per_pair():
    """Timings built as overhead + the cost model's charge + x pairs are fitted back to x, for
    each kind; a timing the model already over-charges fits to 0, never below."""
    mesh, overhead = _mesh(), 1e-4
    rows = []
    for layout in ROUTED_LAYOUTS:
        for b in (2, 8):
            for kind, x in (("F", 7e-6), ("B", 5e-6)):
                charged, pairs = _charged(mesh, kind, b, layout)
                rows.append(FragmentTiming("routed_block", kind, b, 0.0, 0.0,
                                           overhead + charged + x * pairs, layout, 64))
    f, b = fit_routing_pairs(rows, mesh, overhead)
    assert (f, b) == (pytest.approx(7e-6, rel=1e-9), pytest.approx(5e-6, rel=1e-9))
    fast = [dataclasses.replace(r, seconds=r.seconds / 10) for r in rows]
    assert fit_routing_pairs(fast, mesh, overhead) == (0.0, 0.0)


def test_fit_refuses_a_profile_that_already_charges_routing_or_a_missing_kind():
    mesh = _mesh()
    rows = [FragmentTiming("routed_block", "F", 2, 0.0, 0.0, 1e-3, "dp", 64)]
    with pytest.raises(CalibrationError, match="no routed-block B timings"):
        fit_routing_pairs(rows, mesh, 1e-4)
    with pytest.raises(CalibrationError, match="already charges routing"):
        fit_routing_pairs(rows, _mesh(forward_routing_pair=1e-6), 1e-4)
    with pytest.raises(ValueError, match="unknown routed-block layout 'tp'"):
        routed_layout("tp", 2)


def _cal(**kw) -> Calibration:
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


def test_routing_times_are_written_with_their_origin_and_loaded(tmp_path):
    routed = tuple(FragmentTiming("routed_block", k, b, 0.0, 0.0, 1e-3, lay, 64)
                   for lay in ROUTED_LAYOUTS for b in (2, 8) for k in ("F", "B"))
    cal = _cal(forward_routing_pair=8.25e-6, backward_routing_pair=6.5e-6, routed_block=routed)
    dev = tmp_path / "cpu-host.yaml"
    write_profiles(cal, dev, tmp_path / "cpu4x2.yaml")
    d = load_device(dev)
    assert (d.forward_routing_pair, d.backward_routing_pair) == (
        pytest.approx(8.25e-6, rel=1e-12), pytest.approx(6.5e-6, rel=1e-12))
    src = d.sources["forward_routing_pair"]
    assert ("timed forward under data parallel and expert parallel over 2 devices at 2, 8 "
            "samples") in src and "zoo/configs/tiny-moe.yaml" in src
    assert "whole backward" in d.sources["backward_routing_pair"]
    assert "forward_routing_pair_ns" not in device_yaml(_cal())["efficiency"]   # not measured
    bundled = load_device("b200")   # the accelerator's: the token path's per-pair fit
    assert (bundled.forward_routing_pair, bundled.backward_routing_pair,
            bundled.dropless_routing_pair) == (pytest.approx(11.17e-9, rel=1e-12),
                                               pytest.approx(22.33e-9, rel=1e-12),
                                               pytest.approx(134.3e-9, rel=1e-12))
    assert "mpmd validate --fit-moe" in bundled.sources["forward_routing_pair"]
    assert "mpmd validate --fit-moe" in bundled.sources["dropless_routing_pair"]


def test_the_routed_block_is_timed_per_layout_sample_count_and_kind():
    """Structure only (the times are this machine's): one positive timing for each layout,
    microbatch and kind, labelled as the fit reads them."""
    from runtime.calibration.measure import local_meshes

    rows = measure_routed_block(local_meshes(1, 2)[0], samples=(2,), repeats=1)
    assert [(r.layout, r.samples, r.kind) for r in rows] == [
        ("dp", 2, "F"), ("dp", 2, "B"), ("ep", 2, "F"), ("ep", 2, "B")]
    assert all(r.seconds > 0 and r.layer == "routed_block" and r.seq_len == 64 for r in rows)
