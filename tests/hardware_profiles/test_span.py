"""Collectives level by level (hardware_profiles.collectives.span_*, MeshSpec.collective_span)."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_profiles import load_device
from hardware_profiles.collectives import (TREE_BANDWIDTH_FACTOR, ring_all_reduce, span_all_gather,
                                           span_all_reduce, span_all_to_all, span_reduce_scatter)
from hardware_profiles.types import Link, MeshSpec, ProfileError, Span, straggler_factor

NVL = Link(400e9, 1e-6)
IB = Link(50e9, 5e-6)


def test_one_node_ring_is_the_flat_ring():
    s = Span(8, 1, NVL)
    t, algo = span_all_reduce(1e9, s)
    assert algo == "ring"
    assert t == pytest.approx(ring_all_reduce(1e9, 8, NVL), rel=1e-12)


def test_ring_across_nodes_splits_hops_and_uses_rails():
    s = Span(16, 2, NVL, IB)          # 8 rails per node, 2 nodes
    assert s.rails == 8
    assert s.bus_bandwidth == min(400e9, 8 * 50e9)
    ring = 2 * 15 / 16 * 1e9 / 400e9 + (30 - 2) * 1e-6 + 2 * 5e-6
    t, algo = span_all_reduce(1e9, s)
    assert algo == "ring"
    assert t == pytest.approx(ring, rel=1e-12)


def test_tree_wins_for_small_messages_on_many_nodes():
    s = Span(4096, 4096, NVL, IB)     # one rank per node: data-parallel over 4096 nodes
    t, algo = span_all_reduce(1e6, s)
    tree = 2 * 1e6 / (TREE_BANDWIDTH_FACTOR * 50e9) + 2 * 12 * 5e-6
    assert algo == "tree"
    assert t == pytest.approx(tree, rel=1e-12)
    big, algo_big = span_all_reduce(1e10, s)
    assert algo_big == "ring"          # bandwidth-bound: the ring's 10% better bandwidth wins


def test_gather_scatter_and_all_to_all():
    s = Span(16, 2, NVL, IB)
    ag = 15 / 16 * 1e9 / 400e9 + 14 * 1e-6 + 1 * 5e-6
    assert span_all_gather(1e9, s) == pytest.approx(ag, rel=1e-12)
    assert span_reduce_scatter(1e9, s) == pytest.approx(ag, rel=1e-12)
    a2a = max(7 / 16 * 1e9 / 400e9, 8 / 16 * 1e9 / 50e9) + 14 * 1e-6 + 5e-6
    assert span_all_to_all(1e9, s) == pytest.approx(a2a, rel=1e-12)


def test_bad_span_is_one_line_error():
    with pytest.raises(ProfileError, match="nodes"):
        span_all_gather(1.0, Span(4, 8, NVL, IB))


@given(st.integers(1, 12), st.integers(0, 6), st.floats(1.0, 1e10))
def test_all_reduce_never_beats_the_bandwidth_bound(log_n, log_rails, nbytes):
    rails = 2 ** min(log_rails, log_n)
    n = 2 ** log_n
    s = Span(n, n // rails, NVL, IB if n > rails else None)
    t, _ = span_all_reduce(nbytes, s)
    if n > 1:
        assert t >= 2 * (n - 1) / n * nbytes / s.bus_bandwidth * (1 - 1e-12)


def test_mesh_span_levels_and_scale_out_efficiency():
    h100 = load_device("h100-sxm")
    mesh = MeshSpec("m", h100, 64, {"data": 8, "tensor": 8}, NVL, devices_per_node=8,
                    scale_out_link=IB)
    assert mesh.collective_span(8) == Span(8, 1, NVL)                 # tensor parallel in a node
    dp = mesh.collective_span(8, 8)                                    # data parallel: 1 rail
    assert (dp.ranks, dp.nodes, dp.rails, dp.inter) == (8, 8, 1, IB)
    import dataclasses
    slow = dataclasses.replace(mesh, device=dataclasses.replace(h100, scale_out_efficiency=0.5))
    assert slow.collective_span(8, 8).inter.bandwidth == 25e9


def test_straggler_factor():
    assert straggler_factor(1, 0.05) == 1.0
    assert straggler_factor(1024, 0.0) == 1.0
    assert straggler_factor(16, 0.02) == pytest.approx(1 + 0.02 * math.sqrt(2 * math.log(16)))


def test_two_hop_all_to_all_crosses_the_network_once_per_remote_node():
    from hardware_profiles.collectives import span_two_hop_all_to_all

    s = Span(64, 8, NVL, IB)                          # 8 nodes of 8 rails
    remote_nodes = 7 * (1 - (7 / 8) ** 8)             # top-8 of experts spread over 8 nodes
    want = max(7 / 8 * 1e9 / 400e9, 1e9 / 8 * remote_nodes / 50e9) + 1e-6 + 5e-6
    assert span_two_hop_all_to_all(1e9, s, 8) == pytest.approx(want, rel=1e-12)
    # the network carries fewer bytes than one copy per expert: faster than the plain all-to-all
    assert span_two_hop_all_to_all(1e9, s, 8) < span_all_to_all(1e9, s)
    # one copy per token (top-1) is a plain exchange's bytes at most
    assert span_two_hop_all_to_all(1e9, s, 1) <= span_all_to_all(1e9, s) + 6e-6
    # inside one node it is the all-to-all
    assert span_two_hop_all_to_all(1e9, Span(8, 1, NVL), 8) == span_all_to_all(1e9, Span(8, 1, NVL))
    with pytest.raises(ProfileError, match="fanout 0.5 below 1"):
        span_two_hop_all_to_all(1e9, s, 0.5)
