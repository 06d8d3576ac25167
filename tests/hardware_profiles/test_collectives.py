"""Collective cost formulas: exact on small cases, errors, and monotonicity properties."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware_profiles import (
    Link,
    ProfileError,
    all_gather,
    all_reduce,
    all_to_all,
    collective_time,
    reduce_scatter,
    ring_all_reduce,
    send_recv,
    tree_all_reduce,
)

# bandwidth 1e9 B/s, latency 1e-6 s: easy exact arithmetic
L = Link(bandwidth=1e9, latency=1e-6)


def test_ring_all_reduce_exact():
    # n=4, 1e9 bytes: 2*3/4 * 1 s + 2*3 * 1 us
    assert ring_all_reduce(1e9, 4, L) == pytest.approx(1.5 + 6e-6, rel=1e-12)
    assert all_reduce(1e9, 4, L) == ring_all_reduce(1e9, 4, L)
    # n=2: 2*1/2 * bytes/bw + 2 latencies
    assert ring_all_reduce(4e6, 2, L) == pytest.approx(4e-3 + 2e-6, rel=1e-12)


def test_all_gather_reduce_scatter_all_to_all_exact():
    for fn in (all_gather, reduce_scatter, all_to_all):
        assert fn(8e9, 8, L) == pytest.approx(7 / 8 * 8 + 7e-6, rel=1e-12)
        assert fn(3e9, 3, L) == pytest.approx(2.0 + 2e-6, rel=1e-12)


def test_reduce_scatter_plus_all_gather_is_ring_all_reduce():
    for n in (2, 3, 5, 8):
        assert reduce_scatter(1e8, n, L) + all_gather(1e8, n, L) == pytest.approx(ring_all_reduce(1e8, n, L), rel=1e-12)


def test_tree_all_reduce_exact():
    # n=8: 2 * 3 steps * (1 us + 1 ms)
    assert tree_all_reduce(1e6, 8, L) == pytest.approx(6 * (1e-6 + 1e-3), rel=1e-12)
    # n=5: ceil(log2 5) = 3
    assert all_reduce(1e6, 5, L, algorithm="tree") == pytest.approx(6 * (1e-6 + 1e-3), rel=1e-12)
    # small message, many devices: the tree beats the ring
    assert tree_all_reduce(1e3, 64, L) < ring_all_reduce(1e3, 64, L)
    # large message: the ring wins
    assert tree_all_reduce(1e9, 64, L) > ring_all_reduce(1e9, 64, L)


def test_send_recv_exact():
    assert send_recv(5e8, L) == pytest.approx(0.5 + 1e-6, rel=1e-12)
    assert send_recv(0, L) == 0.0
    assert collective_time("send_recv", 5e8, 99, L) == send_recv(5e8, L)


def test_single_device_and_zero_bytes_cost_nothing():
    for fn in (ring_all_reduce, tree_all_reduce, all_gather, reduce_scatter, all_to_all):
        assert fn(1e9, 1, L) == 0.0
        assert fn(0, 8, L) == 0.0


def test_dispatch():
    assert collective_time("all_gather", 8e9, 8, L) == all_gather(8e9, 8, L)
    assert collective_time("all_reduce", 1e6, 8, L, "tree") == tree_all_reduce(1e6, 8, L)
    with pytest.raises(ProfileError, match="unknown collective 'broadcast'; fix: use one of"):
        collective_time("broadcast", 1, 2, L)
    with pytest.raises(ProfileError, match="unknown algorithm 'butterfly'"):
        all_reduce(1, 2, L, algorithm="butterfly")


@pytest.mark.parametrize("fn", [ring_all_reduce, tree_all_reduce, all_gather, reduce_scatter, all_to_all])
def test_bad_inputs(fn):
    with pytest.raises(ProfileError, match=r"group size n=0 < 1; fix"):
        fn(1.0, 0, L)
    with pytest.raises(ProfileError, match=r"group size n=-3 < 1"):
        fn(1.0, -3, L)
    with pytest.raises(ProfileError, match=r"nbytes=-1.0 is negative"):
        fn(-1.0, 4, L)
    with pytest.raises(ProfileError, match=r"n=2.5 is not an integer"):
        fn(1.0, 2.5, L)
    with pytest.raises(ProfileError, match=r"nbytes=nan"):
        fn(math.nan, 4, L)
    with pytest.raises(ProfileError, match="link bandwidth 0 B/s is not positive"):
        fn(1.0, 4, Link(0, 1e-6))


def test_send_recv_negative():
    with pytest.raises(ProfileError, match="nbytes=-5 is negative"):
        send_recv(-5, L)


links = st.builds(Link, st.floats(1e6, 1e13), st.floats(0, 1e-3))
sizes = st.floats(0, 1e12)
counts = st.integers(1, 4096)


@settings(max_examples=200, deadline=None)
@given(link=links, b1=sizes, b2=sizes, n1=counts, n2=counts)
def test_all_reduce_monotone_in_bytes_and_n(link, b1, b2, n1, n2):
    (b_lo, b_hi), (n_lo, n_hi) = sorted((b1, b2)), sorted((n1, n2))
    for alg in ("ring", "tree"):
        t = all_reduce(b_lo, n_lo, link, alg)
        assert t >= 0
        assert all_reduce(b_hi, n_lo, link, alg) >= t
        assert all_reduce(b_lo, n_hi, link, alg) >= t
        assert all_reduce(b_hi, n_hi, link, alg) >= t


@settings(max_examples=100, deadline=None)
@given(link=links, b=sizes, n=counts)
def test_collective_ordering(link, b, n):
    """All-gather and reduce-scatter each cost half a ring all-reduce; nothing is negative."""
    ag, rs, ar = all_gather(b, n, link), reduce_scatter(b, n, link), ring_all_reduce(b, n, link)
    assert ag == rs >= 0
    assert ar == pytest.approx(2 * ag, rel=1e-12, abs=1e-300)
