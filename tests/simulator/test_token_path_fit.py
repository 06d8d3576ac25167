"""The mixture-of-experts token path's two fitted figures (``simulator.token_path_fit``): the
per-pair time split a third / two thirds like the per-element one and charged once per routed
(token, expert) pair whatever the hidden size; the fit recovers known figures from rows whose
steps are linear in both; ``mpmd validate --fit-moe``'s writer puts the pair keys in a profile;
the bundled GPU kinds carry both figures with their origin."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from hardware_profiles import load_device
from hardware_profiles.loader import DEVICES_DIR
from hardware_profiles.types import Link, MeshSpec
from ir import FragmentKind, Layout
from mpmd.cli.validate_moe import DROPLESS_KEY, PAIR_KEYS, write_entry
from simulator import cost_model as cm
from simulator.token_path_fit import (TokenPathSlopes, _dropless_bounds, _surrogate_fit,
                                      with_token_path)

from tests.simulator.test_token_path import DENSE, MOE


def _bare():
    return with_token_path(load_device("h100-sxm"), 0.0, 0.0, 0.0)


def test_pair_time_split_a_third_forward_rest_input_gradient():
    dev = with_token_path(_bare(), 40e-12, 90e-9)
    assert dev.routed_element == 40e-12
    assert dev.forward_routing_pair == pytest.approx(30e-9)
    assert dev.backward_routing_pair == pytest.approx(60e-9)


def test_layer_time_adds_the_pair_time_per_routed_pair_of_the_devices_share():
    mesh = MeshSpec("m", _bare(), 16, {"data": 16}, Link(400e9, 1e-6), devices_per_node=8,
                    scale_out_link=Link(50e9, 5e-6))
    with_pairs = dataclasses.replace(mesh, device=with_token_path(_bare(), 0.0, 90e-9))
    wide = dataclasses.replace(MOE, alltoall_bytes_per_sample=4 * MOE.alltoall_bytes_per_sample)
    layout = Layout(8, 2, expert=8)
    for kind, share in ((FragmentKind.F, 1 / 3), (FragmentKind.B, 2 / 3)):
        for cost in (MOE, wide):          # the same per pair at four times the width
            base = cm.layer_time(cost, kind, 32, mesh, layout, "bf16", seq_len=4096)
            more = cm.layer_time(cost, kind, 32, with_pairs, layout, "bf16", seq_len=4096)
            assert more - base == pytest.approx(32 / 8 / 2 * MOE.routed_pairs_per_sample
                                                * 90e-9 * share)
    w = cm.layer_time(MOE, FragmentKind.W, 32, with_pairs, layout, "bf16", seq_len=4096)
    assert w == cm.layer_time(MOE, FragmentKind.W, 32, mesh, layout, "bf16", seq_len=4096)
    for kind in (FragmentKind.F, FragmentKind.B):     # a dense layer routes nothing
        assert cm.layer_time(DENSE, kind, 32, with_pairs, layout, "bf16", seq_len=4096) == \
            cm.layer_time(DENSE, kind, 32, mesh, layout, "bf16", seq_len=4096)


def _row(value, metric="iteration_s", source="s"):
    return SimpleNamespace(setup=SimpleNamespace(row=SimpleNamespace(
        value=value, metric=metric, source=source, global_batch=64, seq_len=1000, gpus=8)))


def test_surrogate_fit_recovers_the_figures_the_rows_were_made_with():
    a, p = 30e-12, 120e-9              # the truth: 30 ps per element, 120 ns per pair
    rows = []
    for i, (de, dp) in enumerate([(1e10, 1e6), (2e10, 8e6), (5e9, 4e6), (3e10, 2e6)]):
        step = 10.0 + i
        truth = step + a * de + p * dp
        fake = _row(truth)
        rows.append(TokenPathSlopes(fake.setup, step, de, dp))
    # a throughput row: the metric falls as the step grows
    tokens = _row(64 * 1000 / (12.0 + a * 2e10 + p * 5e6) / 8, metric="tokens_per_gpu_s")
    rows.append(TokenPathSlopes(tokens.setup, 12.0, 2e10, 5e6))
    got = _surrogate_fit(rows, 1e15, (0.0, 200.0), (0.0, 1000.0))
    assert got == pytest.approx((30.0, 120.0, 0.0), abs=0.2)


def test_surrogate_fit_tells_the_dropless_pair_time_from_the_shared_one():
    a, p, q = 30e-12, 40e-9, 150e-9   # dropless rows pay q per pair on top of p
    rows = []
    for i, (de, dp, dropless) in enumerate([(1e10, 1e6, True), (2e10, 8e6, False),
                                            (5e9, 4e6, True), (3e10, 2e6, False),
                                            (1e10, 6e6, True), (2e10, 3e6, False)]):
        step = 10.0 + i
        dq = dp if dropless else 0.0   # a token-dropping row does not move with q
        rows.append(TokenPathSlopes(_row(step + a * de + p * dp + q * dq).setup, step, de, dp, dq))
    got = _surrogate_fit(rows, 1e15, (0.0, 200.0), (0.0, 1000.0), (0.0, 1000.0))
    assert got == pytest.approx((30.0, 40.0, 150.0), abs=0.3)
    # without token-dropping rows the two per-pair figures cannot be told apart: held at 0
    only = [r for r in rows if r.per_dropless]
    assert _dropless_bounds(only, (0.0, 1000.0)) == (0.0, 0.0)
    assert _dropless_bounds(rows, (0.0, 1000.0)) == (0.0, 1000.0)


def test_layer_time_adds_the_dropless_pair_time_to_the_all_to_all_dispatch_only():
    """Megatron-Core's dropless all-to-all dispatch pays ``dropless_routing_pair`` per pair (a
    third in the forward); a token-dropping dispatch and the two-hop DeepEP/HybridEP one do not."""
    mesh = MeshSpec("m", _bare(), 16, {"data": 16}, Link(400e9, 1e-6), devices_per_node=8,
                    scale_out_link=Link(50e9, 5e-6))
    slow = dataclasses.replace(mesh, device=with_token_path(_bare(), 0.0, 0.0, 150e-9))
    dropless, drop = Layout(8, 2, expert=8), Layout(8, 2, expert=8, expert_dispatch="tokendrop")
    hybrid = Layout(8, 2, expert=8, expert_dispatch="deepep")
    assert dropless.expert_dispatch == "alltoall"
    assert Layout(8, 2, expert_dispatch="tokendrop").expert_dispatch == "tokendrop"  # EP 1 too
    for kind in (FragmentKind.F, FragmentKind.B):
        assert cm.layer_time(MOE, kind, 32, slow, hybrid, "bf16", seq_len=4096) == \
            cm.layer_time(MOE, kind, 32, mesh, hybrid, "bf16", seq_len=4096)
    for kind, share in ((FragmentKind.F, 1 / 3), (FragmentKind.B, 2 / 3)):
        base = cm.layer_time(MOE, kind, 32, mesh, dropless, "bf16", seq_len=4096)
        more = cm.layer_time(MOE, kind, 32, slow, dropless, "bf16", seq_len=4096)
        assert more - base == pytest.approx(32 / 8 / 2 * MOE.routed_pairs_per_sample
                                            * 150e-9 * share)
        assert cm.layer_time(MOE, kind, 32, slow, drop, "bf16", seq_len=4096) == \
            cm.layer_time(MOE, kind, 32, mesh, drop, "bf16", seq_len=4096)


def test_writer_puts_the_pair_keys_in_the_efficiency_block(tmp_path):
    src = DEVICES_DIR / "a100-80gb-sxm.yaml"
    assert load_device(str(src)).forward_routing_pair == 0.0
    out = tmp_path / "a100-80gb-sxm.yaml"
    write_entry(src, 12.5, "why", out=out)
    for key, ns in zip(PAIR_KEYS, (10.0, 20.0)):
        write_entry(out, ns, "why", out=out, key=key)
    write_entry(out, 11.0, "again", out=out, key=PAIR_KEYS[0])     # replaced, not appended
    write_entry(out, 130.0, "dropless", out=out, key=DROPLESS_KEY)
    text = out.read_text()
    assert text.count(f"{PAIR_KEYS[0]}:") == 1
    dev = load_device(str(out))
    assert (dev.routed_element, dev.forward_routing_pair, dev.backward_routing_pair,
            dev.dropless_routing_pair) == pytest.approx((12.5e-12, 11e-9, 20e-9, 130e-9))
    assert dev.sources["dropless_routing_pair"] == "dropless"


@pytest.mark.parametrize("kind", ["h100-sxm", "gb200", "b200", "gb300"])
def test_bundled_gpu_kinds_carry_both_fitted_figures(kind):
    dev = load_device(kind)
    assert dev.routed_element > 0 or dev.forward_routing_pair > 0
    assert dev.backward_routing_pair == pytest.approx(2 * dev.forward_routing_pair, rel=0.01)
    if dev.forward_routing_pair > 0:
        assert "validate --fit-moe" in dev.sources["forward_routing_pair"]


def test_hopper_twins_inherit_the_h100_figures():
    h100 = load_device("h100-sxm")
    for twin in ("h200-sxm", "h800-sxm"):
        d = load_device(twin)
        assert (d.routed_element, d.forward_routing_pair, d.backward_routing_pair,
                d.dropless_routing_pair) == (h100.routed_element, h100.forward_routing_pair,
                                             h100.backward_routing_pair, h100.dropless_routing_pair)
