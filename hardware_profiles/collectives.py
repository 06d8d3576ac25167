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

from hardware_profiles.types import Link, ProfileError, Span

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


# --------------------------------------------------------------------------- level by level
TREE_BANDWIDTH_FACTOR = 0.9
"""NCCL's tree reaches 0.9 of the ring's bus bandwidth (``busBw = min(busBw * .9, maxTreeBw)``
in NCCL's tuning model, ``src/graph/tuning.cc``, ``ncclTopoTuneModel``)."""


def _span_check(op: str, nbytes: float, span: Span) -> None:
    _check(op, nbytes, span.ranks, span.intra)
    if span.inter is not None:
        _check(op, nbytes, span.ranks, span.inter)
    if not 1 <= span.nodes <= span.ranks:
        raise ProfileError(f"{op}: span of {span.ranks} ranks over {span.nodes} nodes; fix: use "
                           f"1 <= nodes <= ranks")


def _ring_latency(span: Span, steps_per_rank: int) -> float:
    """NCCL's ring latency: ``steps`` hops, of which ``steps_per_rank x (nodes - 1)`` cross the
    network (``(nsteps - nInterSteps) x intraLat + nInterSteps x interLat``, NCCL
    ``src/graph/tuning.cc``) and the rest stay inside a node."""
    n, nn = span.ranks, span.nodes
    inter = steps_per_rank * (nn - 1)
    intra = steps_per_rank * (n - 1) - inter
    return intra * span.intra.latency + inter * (span.inter.latency if span.inter else 0.0)


def span_all_reduce(nbytes: float, span: Span) -> tuple[float, str]:
    """(seconds, algorithm) of an all-reduce of ``nbytes`` per device over ``span``, the faster
    of NCCL's two algorithms, as NCCL's tuner picks by message size and group (NCCL
    ``src/graph/tuning.cc``: ``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``):

    - ring: ``2 (n-1)/n x nbytes / busBw`` + ``2 (n-1)`` hops, ``2 (N-1)`` of them over the
      network (bandwidth-optimal: what large gradient buckets take);
    - tree (only across nodes): chains inside each node, a double binary tree across the
      ``N`` nodes (Sanders, Speck & Traeff 2009, "Two-tree algorithms for full bandwidth
      broadcast, reduction and scan"): ``2 nbytes / (0.9 busBw)`` +
      ``2 ((n/N - 1) intra + ceil(log2 N) inter)`` hop latencies (what wins once ``2 (N-1)``
      network hops outweigh the 10% bandwidth loss: small messages on thousands of GPUs).

    ``busBw`` is :attr:`Span.bus_bandwidth`. A TPU slice's ICI is a switchless torus: the span's
    intra link already carries the torus-axis share, and rings along its axes are what XLA
    runs, so only the ring applies inside one node.

    Raises:
        ProfileError: bad sizes or links.
    """
    _span_check("all_reduce", nbytes, span)
    n = span.ranks
    if n == 1 or nbytes == 0:
        return 0.0, "none"
    bw = span.bus_bandwidth
    ring = 2 * (n - 1) / n * nbytes / bw + _ring_latency(span, 2)
    if span.nodes <= 1 or span.inter is None:
        return ring, "ring"
    tree = (2 * nbytes / (TREE_BANDWIDTH_FACTOR * bw)
            + 2 * ((span.rails - 1) * span.intra.latency
                   + math.ceil(math.log2(span.nodes)) * span.inter.latency))
    return (tree, "tree") if tree < ring else (ring, "ring")


def one_hop_all_reduce(nbytes: float, n: int, link: Link) -> tuple[float, str]:
    """(seconds, algorithm) of an all-reduce of ``nbytes`` per device over ``n`` devices that are
    all one hop apart (a switch such as NVSwitch, or a full mesh: ``DeviceProfile.scale_up_one_hop``),
    the faster of the two direct algorithms TensorRT-LLM's custom all-reduce runs for the small
    messages of inference (``cpp/tensorrt_llm/kernels/customAllReduceKernels.cu``, ONESHOT and
    TWOSHOT strategies):

    - one-shot: every device reads its ``n - 1`` peers' whole buffers and reduces locally:
      ``2 a + (n-1) nbytes / B`` (a flag barrier, then the reads);
    - two-shot: a direct reduce-scatter then a direct all-gather: ``3 a + 2 (n-1)/n nbytes / B``.

    Raises:
        ProfileError: bad sizes or link.
    """
    _check("all_reduce", nbytes, n, link)
    if n == 1 or nbytes == 0:
        return 0.0, "none"
    one = 2 * link.latency + (n - 1) * nbytes / link.bandwidth
    two = 3 * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth
    return (one, "one-shot") if one <= two else (two, "two-shot")


def span_all_gather(nbytes: float, span: Span) -> float:
    """Ring all-gather whose OUTPUT is ``nbytes`` per device over ``span``, seconds:
    ``(n-1)/n x nbytes / busBw`` + ``n - 1`` hops, ``N - 1`` over the network (NCCL runs
    all-gather and reduce-scatter as rings only)."""
    _span_check("all_gather", nbytes, span)
    n = span.ranks
    if n == 1 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / span.bus_bandwidth + _ring_latency(span, 1)


def span_reduce_scatter(nbytes: float, span: Span) -> float:
    """Ring reduce-scatter whose INPUT is ``nbytes`` per device over ``span``, seconds (the
    all-gather's cost, :func:`span_all_gather`)."""
    _span_check("reduce_scatter", nbytes, span)
    n = span.ranks
    if n == 1 or nbytes == 0:
        return 0.0
    return (n - 1) / n * nbytes / span.bus_bandwidth + _ring_latency(span, 1)


def span_all_to_all(nbytes: float, span: Span) -> float:
    """Pairwise all-to-all of an ``nbytes`` send buffer per device over ``span``, seconds. Of
    the ``n - 1`` blocks of ``nbytes / n`` a device sends, ``rails - 1`` stay in its node (the
    scale-up link) and ``n - rails`` cross the network on the device's own NIC (no rail
    aggregation: every block has its own destination); the two run side by side, so the slower
    bounds the time, plus ``n - 1`` hop latencies (Thakur et al. 2005, sec. 4.6)."""
    _span_check("all_to_all", nbytes, span)
    n = span.ranks
    if n == 1 or nbytes == 0:
        return 0.0
    k = span.rails if span.nodes > 1 else n
    local = (k - 1) / n * nbytes / span.intra.bandwidth
    remote = (n - k) / n * nbytes / span.inter.bandwidth if span.inter is not None and n > k else 0.0
    return max(local, remote) + _ring_latency(span, 1)


def span_two_hop_all_to_all(nbytes: float, span: Span, fanout: float) -> float:
    """A mixture of experts' token dispatch (or combine) of an ``nbytes`` send buffer per device
    (``fanout`` copies of each token, one per routed expert) over ``span`` in two hops, as
    DeepEP's internode kernels (DeepSeek-AI 2025, github.com/deepseek-ai/DeepEP, "normal kernels":
    RDMA between nodes, NVLink inside them; Megatron-Core's ``flex`` dispatcher) and HybridEP
    run it, seconds. A token crosses the network once per remote domain that holds one of its
    experts, not once per expert: with ``fanout`` experts drawn uniformly (the benchmarks'
    balanced routing) over ``N`` domains it reaches ``(N - 1) (1 - (1 - 1/N)^fanout)`` remote
    ones on average, each over the device's own NIC (its rail); there (and for the tokens that
    stay home) the copies fan out to the experts' devices over the scale-up link, ``(k - 1) / k``
    of the buffer for ``k`` members per domain. The two hops are pipelined (the slower bounds
    the time) plus two hop latencies. Inside one domain: :func:`span_all_to_all`.

    Raises:
        ProfileError: bad sizes or links, or ``fanout`` below 1.
    """
    _span_check("all_to_all", nbytes, span)
    if fanout < 1:
        raise ProfileError(f"two-hop all-to-all: fanout {fanout!r} below 1; fix: the experts per "
                           f"token (top-k)")
    if span.nodes <= 1 or span.inter is None:
        return span_all_to_all(nbytes, span)
    n, k = span.nodes, span.rails
    remote_domains = (n - 1) * (1.0 - (1.0 - 1.0 / n) ** fanout)
    remote = nbytes / fanout * remote_domains / span.inter.bandwidth
    local = (k - 1) / k * nbytes / span.intra.bandwidth
    return max(local, remote) + span.intra.latency + span.inter.latency


def span_collective(op: str, nbytes: float, span: Span) -> float:
    """Dispatch by name over a :class:`Span`: ``op`` in ``"all_reduce"``, ``"all_gather"``,
    ``"reduce_scatter"``, ``"all_to_all"``; seconds.

    Raises:
        ProfileError: unknown op, bad sizes or links.
    """
    if op == "all_reduce":
        return span_all_reduce(nbytes, span)[0]
    fns = {"all_gather": span_all_gather, "reduce_scatter": span_reduce_scatter,
           "all_to_all": span_all_to_all}
    if op not in fns:
        raise ProfileError(f"unknown collective {op!r}; fix: use one of "
                           f"['all_reduce', 'all_gather', 'reduce_scatter', 'all_to_all']")
    return fns[op](nbytes, span)
