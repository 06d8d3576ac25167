"""The calibration's data and fit: timed fragments, the fitted :class:`Calibration`, and the
least-squares fits that turn timings into a device profile (see :mod:`runtime.calibration.measure` for what
is measured, and :mod:`runtime.calibration.files` for the YAML written).

Fit: the cost model's fragment time is ``overhead + max(flops / F, bytes / B)`` per device
(``simulator.cost_model``). ``F`` minimises the squared error in seconds over the forward
fragments (:func:`fit_flops`); a data-parallel backward also all-reduces its layer's gradients, so
its rate and the all-reduce's bandwidth inside a backward are fitted together (:func:`fit_backward`).
:func:`fit_additive` fits the same rates for the additive model (``roofline: sum``: compute and
memory time add) in one non-negative least-squares solve; :func:`fit_calibration` runs both and
keeps the better. The host's own figures come in as a :class:`HostInfo` (:func:`read_host` is the
only function that reads the machine; :func:`nominal_peaks` is pure).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from runtime.calibration.layouts import LAYER_BODY, collective_terms
from compiler.errors import CompilerError
from hardware_profiles.types import layer_fixed_share
import numpy as np
from simulator.cost_model import combine_work
from zoo.costing import workload


class CalibrationError(CompilerError):
    """Calibration could not run (too few devices, a failed measurement); the message says why."""


WEIGHT_STREAM_MIB = 64
"""Weights per device the matrix-vector timing streams (MiB): past the host's caches."""
DECODE_ROTATION_MIB = 128
"""Weights (MiB, the whole mesh's) the decode-shaped timing cycles over: past the host's caches,
as a decode step streams every layer's weights once."""

DECODE_CACHE_TOKENS = 64
"""Positions of the KV cache the decode-shaped timing attends over (one sequence): a short
context, as the CPU decode runs use (16-token prompts, 32 new tokens), whose cache reads are
small next to the block's weights."""

DECODE_LAYERS = (1, 3)
"""Blocks per decode fragment the decode-shaped timing compares: what one more block adds is the
difference per block (:func:`~runtime.calibration.measure.measure_decode_layer`)."""

SMALL_BLOCK = {"hidden": 128, "ffn": 384, "heads": 4, "kv_heads": 4, "seq_len": 64}
"""The small decoder block whose time against its microbatch gives the fixed time per layer
(llama-tiny's structure at width 128 and 64 tokens per sample: its ops are so small that their
dispatch is a large share of its time, so the intercept is well determined)."""

ROUTED_MODEL = "zoo/configs/tiny-moe.yaml"
"""The mixture of experts whose block gives the time per routed pair (relative to the project
root; 4 SwiGLU experts of inner width 128, each token routed to its top 2, width 128, 64 tokens
per sample: the model ``mpmd run`` trains as expert parallel 2 x pipeline 2 in the benchmarks)."""


@dataclass(frozen=True, slots=True)
class FragmentTiming:
    """One measured fragment: ``layer`` ``kind`` (F or B) for ``samples`` samples on one mesh.

    ``flops`` / ``bytes`` are per device (XLA cost analysis of the partitioned executable, or the
    simulator's figures after :func:`~runtime.calibration.layouts.layout_costs`); ``seconds`` is the median wall time of one
    call, dispatch included; ``layout`` is the mesh's layout it ran under (``"dp"``, ``"tp"`` or
    ``"fsdp"``: :mod:`runtime.calibration.layouts`).
    """

    layer: str
    kind: str
    samples: int
    flops: float
    bytes: float
    seconds: float
    layout: str = "dp"
    seq_len: int = 0
    """Tokens per sample (0: the model's); 1 for a decode-shaped forward."""
    weight_bytes: float = 0.0
    """Of ``bytes``, the part that does not grow with the samples (the weights the matmuls
    stream): set by :func:`~runtime.calibration.layouts.layout_costs`."""
    ops: int = 0
    """The layer's primitive ops in this kind (``LayerCost.fwd_ops`` / ``bwd_ops``): set by
    :func:`~runtime.calibration.layouts.layout_costs`; 0 before."""


@dataclass(frozen=True, slots=True)
class HostInfo:
    """What calibration needs to know about the machine it runs on (:func:`read_host` reads it
    once, at the command's top level; tests pass fixed values).

    ``cores``: cores the process may use; ``cpuinfo``: ``/proc/cpuinfo`` text ("" if unknown);
    ``memory_bytes``: physical memory, bytes (0 if unknown); ``date``: ``YYYY-MM-DD`` of the run.
    """

    cores: int
    cpuinfo: str = ""
    memory_bytes: float = 0.0
    date: str = ""


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted figures (SI units, per device of a ``devices_per_mesh``-device mesh).

    The host's own figures come in from :class:`HostInfo` (never read here): ``cores``,
    ``peak_flops`` with its ``peak_source`` text (:func:`nominal_peaks`), ``memory_bytes`` (the
    host's RAM, shared by its ``host_devices`` JAX CPU devices) and the ``date`` measured.
    """

    peak_flops: float
    achievable_flops: float
    memory_bandwidth: float
    achievable_bandwidth: float
    fragment_overhead: float
    link_bandwidth: float
    link_latency: float
    intra_bandwidth: float
    intra_latency: float
    concurrency_speedup: float
    runtime_concurrency: float
    host_slots: int
    devices_per_mesh: int
    cores: int
    fragments: tuple[FragmentTiming, ...] = ()
    fit_rel_error: float = 0.0
    backward_efficiency: float = 1.0
    standalone_allreduce_bandwidth: float = 0.0
    roofline: str = "max"
    roofline_errors: tuple[tuple[str, float], ...] = ()
    date: str = ""
    peak_source: str = ""
    memory_bytes: float = 0.0
    host_devices: int = 8
    cpu_model: str = ""
    weight_bandwidth: float = 0.0
    """The rate a matmul of one token per device streams its weights at, B/s: a matrix-vector
    product timed alone (0: not measured; the profile then has no ``weight_stream``)."""
    decode_layer_overhead: float | None = None
    """Seconds a decode-shaped layer (one token per device) takes beyond its streamed weights,
    FLOP and collectives (:func:`fit_decode_overhead`; None: not measured)."""
    decode_fragment: FragmentTiming | None = None
    """The decode-shaped fragment that gave ``decode_layer_overhead``."""
    forward_layer_overhead: float = 0.0
    backward_layer_overhead: float = 0.0
    """Fixed seconds per layer in a forward / a whole backward (:func:`fit_layer_overhead`),
    those of the small block, whose ops are ``small_block_ops``."""
    small_block_ops: tuple[int, int] = (0, 0)
    """The small block's primitive ops, forward and whole backward (``LayerCost.fwd_ops`` /
    ``bwd_ops``): another layer's fixed time scales with its own ops over these."""
    small_block: tuple[FragmentTiming, ...] = ()
    """The small block's timings that gave them."""
    forward_routing_pair: float = 0.0
    backward_routing_pair: float = 0.0
    """Seconds per routed (token, expert) pair of a device's tokens in a mixture of experts'
    forward / whole backward, beyond the cost model's charge
    (:func:`runtime.calibration.routing.fit_routing_pairs`)."""
    routed_block: tuple[FragmentTiming, ...] = ()
    """The routed block's timings that gave them (empty: not measured, no routing terms)."""

    @property
    def matmul_efficiency(self) -> float:
        return min(1.0, self.achievable_flops / self.peak_flops)

    @property
    def memory_efficiency(self) -> float:
        return min(1.0, self.achievable_bandwidth / self.memory_bandwidth)

    @property
    def weight_stream_efficiency(self) -> float:
        return min(1.0, self.weight_bandwidth / self.memory_bandwidth)

    def predict(self, flops: float, nbytes: float) -> float:
        """The cost model's time for one forward fragment of ``flops`` / ``nbytes`` per device, s."""
        return self.fragment_overhead + work_time(flops, nbytes, self.achievable_flops,
                                                  self.achievable_bandwidth, self.roofline)


# --------------------------------------------------------------------------- fit
def work_time(flops: float, nbytes: float, rate: float, bandwidth: float, roofline: str) -> float:
    """Seconds of ``flops`` at ``rate`` and ``nbytes`` at ``bandwidth``, combined as the cost
    model does (:func:`simulator.cost_model.combine_work`)."""
    return combine_work(flops / rate, nbytes / bandwidth, roofline)


def read_host() -> HostInfo:
    """This machine's :class:`HostInfo`: the only place calibration reads the host itself.

    Cores are the ones this process may run on (``os.sched_getaffinity``, else ``os.cpu_count``);
    the CPU description is ``/proc/cpuinfo`` ("" where unreadable); memory is
    ``os.sysconf`` pages x page size (0 where unknown); the date is the local date.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        memory = 0.0
    return HostInfo(cores=max(1, cores), cpuinfo=cpuinfo, memory_bytes=memory,
                    date=time.strftime("%Y-%m-%d"))


def cpu_model(cpuinfo: str) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` text ("" when it names none)."""
    return next((l.partition(":")[2].strip() for l in cpuinfo.splitlines()
                 if l.startswith("model name")), "")


def nominal_peaks(devices_per_mesh: int, cores: int, cpuinfo: str, ghz: float | None = None
                  ) -> tuple[float, str, float]:
    """(peak FLOP/s per device, source text, GHz used) of a CPU for float32; pure (reads nothing).

    Args:
        devices_per_mesh: devices sharing the host in one mesh (the peak is split among them).
        cores: the host's cores (:attr:`HostInfo.cores`).
        cpuinfo: ``/proc/cpuinfo`` text (:attr:`HostInfo.cpuinfo`): its first ``flags`` line picks
            the vector width, its first ``cpu MHz`` line the clock; "" gives SSE and 2 GHz.
        ghz: the clock, overriding ``cpu MHz``.

    Peak of the host = cores x GHz x FLOP per cycle per core, where FLOP per cycle is
    2 FMA units x 16 float32 lanes x 2 with AVX-512 (Intel 64 and IA-32 Architectures Optimization
    Reference Manual: two 512-bit FMA ports on server cores), 2 x 8 x 2 with AVX2 only. A fragment
    has the whole host while it runs (one at a time), so a device of a ``devices_per_mesh`` mesh
    gets ``1 / devices_per_mesh`` of it.
    """
    lines = cpuinfo.splitlines()
    flags = set(next((l for l in lines if l.startswith("flags")), "").partition(":")[2].split())
    if ghz is None:
        mhz = [float(l.partition(":")[2]) for l in lines if l.startswith("cpu MHz")]
        ghz = mhz[0] / 1000 if mhz else 2.0
    per_cycle = 64 if "avx512f" in flags else (32 if "avx2" in flags else 8)
    host = cores * ghz * 1e9 * per_cycle
    src = (f"{cores} cores x {ghz:.2f} GHz (/proc/cpuinfo) x {per_cycle} float32 FLOP/cycle "
           f"({'AVX-512' if per_cycle == 64 else 'AVX2' if per_cycle == 32 else 'SSE'} FMA) = "
           f"{host / 1e9:.0f} GFLOP/s per host, / {devices_per_mesh} devices per mesh")
    return host / devices_per_mesh, src, ghz


def grad_bytes(f: FragmentTiming, *, model: str = "llama-tiny") -> float:
    """Bytes of layer ``f.layer``'s fp32 gradients on each device (parameters are replicated)."""
    return workload(model, max(1, f.samples)).costs[LAYER_BODY[f.layer]].param_count * 4.0


def fit_backward(frags: Sequence[FragmentTiming], overhead: float, bandwidth: float,
                 devices_per_mesh: int, latency: float, max_rate: float = 1e12,
                 roofline: str = "max") -> tuple[float, float, float]:
    """(achievable backward FLOP/s, all-reduce bandwidth B/s, relative rms error) over ``frags``.

    A data-parallel backward also all-reduces its layer's fp32 gradients ``g`` over the mesh (the
    parameters are replicated), so its time is modelled as the simulator charges it::

        t = overhead + work(flops / F_b, bytes / bandwidth) + 2 (n-1) latency + 2 (n-1)/n g / B_ar

    where ``work`` is the max or the sum per ``roofline`` (:func:`work_time`).

    The all-reduce is the part of a backward that does not grow with the samples; timing it alone
    (:func:`measure_allreduce`) gives a bandwidth several times higher than it reaches inside a
    backward on XLA:CPU (there the two devices' threads meet at the rendezvous after computing on
    shared cores), so ``B_ar`` is fitted here together with ``F_b``: for each ``F_b`` of a
    log-spaced search, the least-squares ``1 / B_ar >= 0`` in closed form (squared error in
    seconds, as :func:`fit_flops`). ``F_b`` is searched up to ``max_rate`` (the forward's rate:
    the profile's ``backward_efficiency`` is at most 1), so ``B_ar`` is fitted for the rate used.

    Raises:
        CalibrationError: no backward timings.
    """
    frags = [f for f in frags if f.seconds > 0]
    if not frags:
        raise CalibrationError("no backward timings to fit; measure some fragments first")
    terms = [collective_terms(f, devices_per_mesh, latency) for f in frags]
    ring = [per for _, per in terms]
    norm = sum(f.seconds ** 2 for f in frags)

    def solve(F: float) -> tuple[float, float]:
        rest = [f.seconds - overhead - work_time(f.flops, f.bytes, F, bandwidth, roofline) - fixed
                for f, (fixed, _) in zip(frags, terms)]
        den = sum(r * r for r in ring)
        inv_b = max(0.0, sum(r * y for r, y in zip(ring, rest)) / den) if den > 0 else 0.0
        err = sum((y - r * inv_b) ** 2 for r, y in zip(ring, rest))
        return inv_b, math.sqrt(err / norm)

    grid = [F for F in (10 ** (8 + i / 400) for i in range(0, 1601)) if F <= max_rate] or [max_rate]
    best = min(grid, key=lambda F: solve(F)[1])
    inv_b, err = solve(best)
    return best, (1.0 / inv_b if inv_b > 0 else float("inf")), err


def fit_flops(frags: Sequence[FragmentTiming], overhead: float, bandwidth: float,
              roofline: str = "max") -> tuple[float, float]:
    """(achievable FLOP/s, relative rms error) of the roofline model over ``frags``
    (``overhead + work_time(flops, bytes, F, bandwidth, roofline)``).

    Minimises the squared error in seconds (so the fragments that dominate a step dominate the fit),
    by a log-spaced search over 1e8..1e12 FLOP/s; the error returned is
    ``sqrt(sum((pred - t)^2) / sum(t^2))``.
    """
    frags = [f for f in frags if f.seconds > 0]
    if not frags:
        raise CalibrationError("no fragment timings to fit; measure some fragments first")
    norm = sum(f.seconds ** 2 for f in frags)

    def err(F: float) -> float:
        return math.sqrt(sum((overhead + work_time(f.flops, f.bytes, F, bandwidth, roofline)
                              - f.seconds) ** 2 for f in frags) / norm)

    grid = [10 ** (8 + i / 400) for i in range(0, 1601)]
    best = min(grid, key=err)
    return best, err(best)


def fit_additive(frags: Sequence[FragmentTiming], overhead: float, bandwidth: float,
                 devices_per_mesh: int, latency: float) -> tuple[float, float, float, float]:
    """(forward FLOP/s, backward FLOP/s, all-reduce B/s, relative rms error) of the additive model
    (``roofline: sum``) over forward and backward ``frags``, fitted together::

        F: t = overhead + flops / F + bytes / bandwidth + fixed + per / B_ar
        B: t = overhead + flops / F_b + bytes / bandwidth + fixed + per / B_ar

    with each fragment's collectives as ``fixed + per / B_ar`` (:func:`~runtime.calibration.layouts.collective_terms`: none for a
    data-parallel forward, the gradient all-reduce ``2 (n-1) latency + 2 (n-1)/n g / B_ar`` for
    its backward; the activation all-reduce, parameter all-gather and gradient reduce-scatter under
    tensor parallel and FSDP).

    ``bandwidth`` is measured (the ``a + b`` fragment), not fitted: a fragment's FLOP and bytes both
    grow with its samples, so fitting both rates would trade one against the other. The model is
    linear in ``1/F, 1/F_b, 1/B_ar``: one non-negative least-squares solve
    (``scipy.optimize.nnls``; squared error in seconds, as :func:`fit_flops`). A rate whose
    inverse comes out 0 is returned as ``inf``.

    Raises:
        CalibrationError: no forward or no backward timings.
    """
    from scipy.optimize import nnls

    frags = [f for f in frags if f.seconds > 0]
    fwd = [f for f in frags if f.kind == "F"]
    bwd = [f for f in frags if f.kind != "F"]
    if not fwd or not bwd:
        raise CalibrationError("the additive fit needs forward and backward timings; measure both")
    rows, y = [], []
    for f in fwd:     # a forward's collectives: tensor-parallel all-reduce, FSDP all-gather
        fixed, per = collective_terms(f, devices_per_mesh, latency)
        rows.append([f.flops, 0.0, per])
        y.append(f.seconds - overhead - f.bytes / bandwidth - fixed)
    for f in bwd:
        fixed, per = collective_terms(f, devices_per_mesh, latency)
        rows.append([0.0, f.flops, per])
        y.append(f.seconds - overhead - f.bytes / bandwidth - fixed)
    A, b = np.array(rows), np.array(y)
    scale = A.max(axis=0)
    scale[scale == 0] = 1.0
    x, _ = nnls(A / scale, b)
    x = x / scale
    resid = A @ x - b
    err = float(np.sqrt((resid ** 2).sum() / sum(f.seconds ** 2 for f in fwd + bwd)))
    inv = [1.0 / float(v) if v > 0 else float("inf") for v in x]
    return inv[0], inv[1], inv[2], err


def fit_calibration(frags: Sequence[FragmentTiming], overhead: float, bandwidth: float,
                    devices_per_mesh: int, latency: float) -> dict[str, object]:
    """Fit both rooflines to the timed fragments and keep the better (pure: no measuring).

    Overlapped (``max``: :func:`fit_flops` then :func:`fit_backward`) or additive (``sum``:
    :func:`fit_additive`) compute and memory time, both with the memory rate ``bandwidth`` of the
    ``a + b`` fragment, compared on the data-parallel fragments. When the additive model wins and
    tensor-parallel or FSDP fragments were timed, it is refitted over all of them: every
    collective inside a fragment (gradient all-reduce, activation all-reduce, parameter all-gather,
    gradient reduce-scatter) on the one fitted intra-mesh link. Returns ``roofline``, ``achievable_flops`` (FLOP/s),
    ``backward_efficiency``, ``allreduce_bandwidth`` (B/s), ``rel_error`` and
    ``roofline_errors`` (each model's relative rms error).

    Raises:
        CalibrationError: no forward or no backward fragments.
    """
    dp = [f for f in frags if f.layout == "dp"]
    fwd = [f for f in dp if f.kind == "F"]
    bwd = [f for f in dp if f.kind != "F"]
    ach, rms_f = fit_flops(fwd, overhead, bandwidth)
    bwd_f, ar, rms_b = fit_backward(bwd, overhead, bandwidth, devices_per_mesh, latency,
                                    max_rate=ach)
    rms = math.sqrt((rms_f ** 2 * len(fwd) + rms_b ** 2 * len(bwd)) / (len(fwd) + len(bwd)))
    fits = {"max": (rms, ach, bwd_f, ar)}
    f_s, fb_s, ar_s, rms_s = fit_additive(dp, overhead, bandwidth, devices_per_mesh, latency)
    if all(math.isfinite(v) for v in (f_s, fb_s, ar_s)):
        fits["sum"] = (rms_s, f_s, min(fb_s, f_s), ar_s)
    roofline = min(fits, key=lambda k: fits[k][0])
    rms, ach_flops, bwd_flops, ar_bw = fits[roofline]
    if roofline == "sum" and len(dp) < len(frags):
        # tensor-parallel and FSDP fragments too: their collectives share the one fitted link
        f_s, fb_s, ar_s, rms_s = fit_additive(frags, overhead, bandwidth, devices_per_mesh, latency)
        if all(math.isfinite(v) for v in (f_s, fb_s, ar_s)):
            rms, ach_flops, bwd_flops, ar_bw = rms_s, f_s, min(fb_s, f_s), ar_s
    return {"roofline": roofline, "achievable_flops": ach_flops,
            "backward_efficiency": min(1.0, bwd_flops / ach_flops), "allreduce_bandwidth": ar_bw,
            "rel_error": rms, "roofline_errors": tuple((k, v[0]) for k, v in fits.items())}


def fit_decode_overhead(cal: Calibration, f: FragmentTiming) -> float:
    """The fixed time per layer of a decode step, s: what one more layer adds to a decode
    fragment (``f``: one layer's forward on one token per device with its KV cache, its weights
    streamed from memory, :func:`~runtime.calibration.measure.measure_decode_layer`) beyond the
    cost model's charge for that layer, ``work(flops / F, act / B + weights / B_w) +
    collectives`` with ``B_w`` the matrix-vector rate (``cal.weight_bandwidth``); at least 0.
    (The fragment's own dispatch, ``cal.fragment_overhead``, is not in ``f``.) What it holds: the
    step's many small ops (norms, rotary embedding, softmax, cache update), each dispatched on its
    own (``DeviceProfile.decode_layer_overhead``)."""
    fixed, per = collective_terms(f, cal.devices_per_mesh, cal.intra_latency)
    weight_bw = cal.weight_bandwidth or cal.achievable_bandwidth
    memory = (f.bytes - f.weight_bytes) / cal.achievable_bandwidth + f.weight_bytes / weight_bw
    work = combine_work(f.flops / cal.achievable_flops, memory, cal.roofline)
    return max(0.0, f.seconds - (work + fixed + per / cal.intra_bandwidth))


def fit_layer_overhead(frags: Sequence[FragmentTiming], overhead: float) -> tuple[float, float]:
    """(forward, backward) fixed seconds per layer: the intercept of a least-squares line through
    the small block's times against its samples (:func:`~runtime.calibration.measure.measure_small_block`),
    per kind, less the fragment's dispatch ``overhead``; at least 0. What it holds: the
    layer's ops dispatched one after another, each at a cost that does not grow with the
    microbatch (``DeviceProfile.forward_layer_overhead``, ``backward_layer_overhead``).

    Raises:
        CalibrationError: fewer than two sample counts timed for a kind.
    """
    out = []
    for kind in ("F", "B"):
        pts = [(f.samples, f.seconds) for f in frags if f.kind == kind]
        if len({s for s, _ in pts}) < 2:
            raise CalibrationError(f"the small block's {kind} was timed at {len(pts)} sample "
                                   f"count(s); time it at two or more to fit its fixed time")
        x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
        slope, intercept = np.polyfit(x, y, 1)
        out.append(max(0.0, float(intercept) - overhead))
    return out[0], out[1]


def layer_fixed(cal: Calibration, f: FragmentTiming) -> float:
    """The fixed time per layer the calibration charges fragment ``f`` (one layer), s: the small
    block's, in proportion to ``f``'s ops (:func:`hardware_profiles.types.layer_fixed_share`); 0
    for a decode-shaped forward (its own overhead holds its small ops)."""
    if f.seq_len == 1:
        return 0.0
    return fixed_share(f, cal.forward_layer_overhead, cal.backward_layer_overhead,
                       cal.small_block_ops)


def fixed_share(f: FragmentTiming, forward: float, backward: float,
                measured_ops: tuple[int, int]) -> float:
    """Fragment ``f``'s share, s, of the fixed time per layer ``forward`` (or ``backward``) that
    was measured on a block of ``measured_ops`` (forward, backward) primitive ops
    (:func:`hardware_profiles.types.layer_fixed_share`)."""
    if f.kind == "F":
        return layer_fixed_share(forward, f.ops, measured_ops[0])
    return layer_fixed_share(backward, f.ops, measured_ops[1])


def model_seconds(cal: Calibration, f: FragmentTiming) -> float:
    """The fitted model's time for fragment ``f`` (s): overhead, the work at the forward or
    backward rate, and its collectives (:func:`~runtime.calibration.layouts.collective_terms`) on the fitted intra-mesh link."""
    rate = cal.achievable_flops * (1.0 if f.kind == "F" else cal.backward_efficiency)
    fixed, per = collective_terms(f, cal.devices_per_mesh, cal.intra_latency)
    return (cal.fragment_overhead + layer_fixed(cal, f)
            + work_time(f.flops, f.bytes, rate, cal.achievable_bandwidth, cal.roofline)
            + fixed + per / cal.intra_bandwidth)
