"""Cost primitives for collectives over a device group, in seconds (alpha-beta model).

A group of ``n`` devices communicates over a :class:`~hardware_profiles.types.Link` with per-direction
bandwidth ``B`` (B/s, per device) and per-step latency ``a`` (s). ``nbytes`` is always the FULL buffer
size per device (bytes): the all-reduce input, the all-gather OUTPUT, the reduce-scatter INPUT, the
all-to-all send buffer, the point-to-point message.

Formulas (alpha-beta costs of the classic algorithms), from Thakur, Rabenseifner & Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, sections 4.1-4.6,
and the NCCL documentation ("Performance considerations", algbw/busbw factors in nccl-tests
doc/PERFORMANCE.md):

    ring all-reduce        2 (n-1)/n * nbytes / B  +  2 (n-1) * a
    all-gather (ring)        (n-1)/n * nbytes / B  +    (n-1) * a
    reduce-scatter (ring)    (n-1)/n * nbytes / B  +    (n-1) * a
    all-to-all (pairwise)    (n-1)/n * nbytes / B  +    (n-1) * a
    send/recv                          nbytes / B  +          a
    tree all-reduce        2 ceil(log2 n) * (a + nbytes / B)   (binomial reduce + broadcast)

``n == 1`` costs 0 and so does ``nbytes == 0`` (nothing is sent). Every function raises
:class:`ProfileError` for ``n < 1``, a non-integer ``n``, negative or non-finite ``nbytes``.
"""

from __future__ import annotations

import math
import numbers

from hardware_profiles.types import Link, ProfileError

ALGORITHMS = ("ring", "tree")


def _check(op: str, nbytes: float, n: int, link: Link) -> None:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise ProfileError(f"{op}: group size n={n!r} is not an integer; fix: pass the device count as int")
    if n < 1:
        raise ProfileError(f"{op}: group size n={n} < 1; fix: pass a device count >= 1")
    if not (isinstance(nbytes, numbers.Real) and not isinstance(nbytes, bool) and math.isfinite(nbytes)) or nbytes < 0:
        raise ProfileError(f"{op}: nbytes={nbytes!r} is negative or not finite; fix: pass a byte count >= 0")
    if not link.bandwidth > 0:
        raise ProfileError(f"{op}: link bandwidth {link.bandwidth!r} B/s is not positive; fix: use a positive bandwidth")
    if link.latency < 0:
        raise ProfileError(f"{op}: link latency {link.latency!r} s is negative; fix: use a latency >= 0")


def _steps(op: str, nbytes: float, n: int, link: Link, rounds: int) -> float:
    """``rounds`` passes of a ring: rounds (n-1)/n * nbytes/B + rounds (n-1) * latency."""
    _check(op, nbytes, n, link)
    if n == 1 or nbytes == 0:
        return 0.0
    return rounds * (n - 1) / n * nbytes / link.bandwidth + rounds * (n - 1) * link.latency


def ring_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Ring all-reduce of an ``nbytes`` buffer on each of ``n`` devices, seconds.

    2(n-1)/n * nbytes/B + 2(n-1) * latency (Thakur et al. 2005, Rabenseifner's reduce-scatter +
    all-gather; NCCL ring, busbw factor 2(n-1)/n).
    """
    return _steps("all_reduce", nbytes, n, link, 2)


def tree_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """Tree all-reduce: binomial-tree reduce then broadcast, ceil(log2 n) steps each, seconds.

    2 ceil(log2 n) * (latency + nbytes/B) (Thakur et al. 2005, section 4.4, unpipelined). Cheaper
    than the ring when latency dominates (small buffers, large n).
    """
    _check("tree_all_reduce", nbytes, n, link)
    if n == 1 or nbytes == 0:
        return 0.0
    depth = math.ceil(math.log2(n))
    return 2 * depth * (link.latency + nbytes / link.bandwidth)


def all_reduce(nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """All-reduce cost with ``algorithm`` in ``ALGORITHMS`` (``"ring"`` or ``"tree"``), seconds.

    Raises:
        ProfileError: unknown algorithm, n < 1, negative bytes.
    """
    if algorithm == "ring":
        return ring_all_reduce(nbytes, n, link)
    if algorithm == "tree":
        return tree_all_reduce(nbytes, n, link)
    raise ProfileError(f"all_reduce: unknown algorithm {algorithm!r}; fix: use one of {list(ALGORITHMS)}")


def all_gather(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather whose OUTPUT is ``nbytes`` per device: (n-1)/n * nbytes/B + (n-1) * latency."""
    return _steps("all_gather", nbytes, n, link, 1)


def reduce_scatter(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter whose INPUT is ``nbytes`` per device: (n-1)/n * nbytes/B + (n-1) * latency."""
    return _steps("reduce_scatter", nbytes, n, link, 1)


def all_to_all(nbytes: float, n: int, link: Link) -> float:
    """Pairwise-exchange all-to-all of an ``nbytes`` send buffer per device (n-1 blocks of nbytes/n leave).

    (n-1)/n * nbytes/B + (n-1) * latency (Thakur et al. 2005, section 4.6, pairwise exchange).
    """
    return _steps("all_to_all", nbytes, n, link, 1)


def send_recv(nbytes: float, link: Link) -> float:
    """Point-to-point transfer of ``nbytes``: latency + nbytes/B seconds (0 for 0 bytes)."""
    _check("send_recv", nbytes, 2, link)
    if nbytes == 0:
        return 0.0
    return link.latency + nbytes / link.bandwidth


def collective_time(op: str, nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """Dispatch by name: ``op`` in ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``,
    ``"all_to_all"``, ``"send_recv"`` (``n`` ignored for send_recv), seconds.

    Raises:
        ProfileError: unknown op or algorithm, bad n or bytes.
    """
    if op == "all_reduce":
        return all_reduce(nbytes, n, link, algorithm)
    fns = {"all_gather": all_gather, "reduce_scatter": reduce_scatter, "all_to_all": all_to_all}
    if op in fns:
        return fns[op](nbytes, n, link)
    if op == "send_recv":
        return send_recv(nbytes, link)
    raise ProfileError(f"unknown collective {op!r}; fix: use one of "
                       f"['all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all', 'send_recv']")
