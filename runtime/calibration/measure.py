"""Calibrate a device profile and a cluster of local JAX devices by timing real fragments.

What is measured (median of ``repeats`` runs each, ``block_until_ready`` for honest timing):

- **fragments**: forward and backward as a training step runs them (``jax.vjp``: the forward keeps
  its residuals, which on XLA:CPU costs 1.7-2.3x the plain forward; the backward consumes them)
  of the zoo's llama layers (``embed``, ``block``, ``head`` of :mod:`zoo.decoder`) at a few
  microbatch sizes, on one mesh of ``devices_per_mesh`` devices under each layout plans use
  (:mod:`runtime.calibration.layouts`: data parallel, Megatron tensor parallel, FSDP), so the
  collectives inside fragments (gradient all-reduce, activation all-reduce, parameter all-gather,
  gradient reduce-scatter) are timed where they really run. Each fragment's per-device FLOP and bytes are the ones the
  simulator charges for it (:func:`runtime.calibration.layouts.layout_costs`: the ``zoo.costing`` workload of llama-tiny
  through ``simulator.cost_model.layer_time``'s formulas), so the fitted rate reproduces the measured
  times *through the simulator's own costing*. (XLA:CPU's ``bytes accessed`` counts several times
  the workload's fused-roofline bytes; a bandwidth fitted to it would be applied to the workload's
  smaller figure and make every memory-heavy fragment look too fast.)
- **fragment overhead**: the runtime's cost per step, from :func:`compiler.runtime.run_program`
  running many one-element calls.
- **memory bandwidth**: a memory-bound fragment (``a + b`` over 64 MiB per device) on the mesh:
  the rate activations move at.
- **weight stream**: a matrix-vector product ``x @ W`` over 64 MiB of weights per device
  (:func:`measure_weight_stream`): the rate a matmul of one token per device (a decode step's)
  streams its weights at. XLA:CPU runs it as a matrix-vector kernel that reads each weight once,
  several times faster than its elementwise loops (and its matrix-matrix kernels, which pack the
  weights first) move bytes.
- **links**: ``jax.device_put`` between the meshes' shardings (bandwidth from a 16 MiB value,
  latency from a 4-byte one), and between the two devices of one mesh (the intra-mesh link).
- **host sharing**: ``k`` equal fragments on ``k`` different meshes dispatched together versus one
  after the other; ``host_slots`` is that speed-up rounded down (at least 1). The runtime times one
  step at a time (see :mod:`compiler.runtime`), and XLA's CPU runtime already spreads one fragment
  over all cores, so concurrent meshes on one host buy little.

Fit (:mod:`runtime.calibration.fit`): the cost model's fragment time is
``overhead + max(flops / F, bytes / B)`` per device, or the sum for a profile with
``roofline: sum`` (``simulator.cost_model``); both are fitted and the better kept. ``B`` is the
memory-bound fragment's rate; ``F`` (and the backward's rate with its gradient all-reduce)
minimise the squared error in seconds over the measured fragments. Efficiencies are the rates over
the profile's nominal peaks (see :func:`nominal_peaks`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from runtime.calibration.fit import (DECODE_CACHE_TOKENS, DECODE_LAYERS, DECODE_ROTATION_MIB,
                                     LAYER_BODY, SMALL_BLOCK, WEIGHT_STREAM_MIB,
                                     Calibration, CalibrationError, FragmentTiming, HostInfo,
                                     cpu_model, fit_additive, fit_backward, fit_calibration,
                                     fit_decode_overhead, fit_flops, fit_layer_overhead,
                                     fixed_share, grad_bytes, model_seconds, nominal_peaks,
                                     read_host)
from compiler.exported import Call, Executable, ExportedProgram, MeshProgram
from compiler.runtime import run_program
from rich.console import Console
from rich.table import Table
from hardware_profiles import load_cluster
from runtime.calibration.files import check_writable, profile_paths, write_profiles
from runtime.calibration.layouts import layout_costs, layout_of, LAYOUTS
from runtime.calibration.routing import fit_routing_pairs, measure_routed_block
from runtime.calibration.timing import _block, placed_params, time_call, time_interleaved
from runtime.train.layouts import MODEL, batch_spec, layout_mesh
from zoo import kv_decode, workload
from zoo.config import get_config
from zoo.decoder import block_fn, block_shapes, embed_fn, embed_shapes, head_fn, head_shapes
from zoo.layers import init_from_shapes

Progress = Callable[[str], None]

__all__ = ["Calibration", "CalibrationError", "FragmentTiming", "HostInfo", "LAYER_BODY", "calibrate",
           "calibrate_command", "fit_additive", "fit_backward", "fit_flops", "grad_bytes", "local_meshes",
           "measure_allreduce", "measure_bandwidth", "measure_concurrency", "measure_fragments",
           "fit_calibration", "measure_link", "measure_overhead", "measure_runtime_concurrency",
           "measure_stream", "print_calibration",
           "model_seconds", "nominal_peaks", "read_host", "time_call"]


def _cost(compiled: Any) -> tuple[float, float]:
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):
        ca = ca[0]
    return float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0))


def local_meshes(num_meshes: int, devices_per_mesh: int, axis: str = "data") -> list[Mesh]:
    """``num_meshes`` meshes of consecutive local devices, one axis each.

    Raises:
        CalibrationError: fewer than ``num_meshes * devices_per_mesh`` devices.
    """
    devs = jax.devices()
    need = num_meshes * devices_per_mesh
    if len(devs) < need:
        raise CalibrationError(f"calibration needs {need} devices, JAX has {len(devs)}; set "
                               f"jax.config.update('jax_num_cpu_devices', {need}) before using JAX")
    return [Mesh(np.array(devs[i * devices_per_mesh:(i + 1) * devices_per_mesh]), (axis,))
            for i in range(num_meshes)]


# --------------------------------------------------------------------------- measurements
def measure_fragments(mesh: Mesh, samples: Sequence[int] = (2, 4, 8), *, model: str = "llama-tiny",
                      repeats: int = 5, progress: Progress | None = None,
                      layout: str = "dp") -> list[FragmentTiming]:
    """Time F and B of the zoo model's embed, block and head layers on ``mesh``'s devices under
    ``layout`` (``"dp"``: batch split, parameters replicated; ``"tp"``: Megatron tensor parallel;
    ``"fsdp"``: batch and parameters split; the shardings ``mpmd run`` gives them,
    :mod:`runtime.train.layouts`).

    Each fragment is compiled, then all are timed in ``max(9, repeats)`` interleaved rounds
    (after two untimed ones), each round calling every fragment once: the median over the
    rounds. A burst of load on a shared host then falls on one round of every fragment rather
    than on all the calls of one, which tilted the fitted rates (as it did the small block's
    intercept, :func:`measure_small_block`).

    ``progress`` (if given) is told each fragment before it is compiled: ``"block B, 4 samples
    (8 of 18)"``.
    """
    cfg = get_config(model)
    lay = layout_of(layout, mesh.devices.size)
    mesh = layout_mesh(list(mesh.devices.flat), lay)
    bat = NamedSharding(mesh, batch_spec(lay))
    key = jax.random.PRNGKey(0)
    params = {n: placed_params(cfg, s(cfg), mesh, lay, key)
              for n, s in (("embed", embed_shapes), ("block", block_shapes), ("head", head_shapes))}
    calls: list[tuple[FragmentTiming, Callable[..., Any], tuple]] = []
    total, done = 2 * 3 * len(samples), 0

    def tell(name: str, kind: str, b: int) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(f"{name} {kind}, {b} samples ({done} of {total})")

    for b in samples:
        tok = jax.device_put(jnp.zeros((b, cfg.seq_len), jnp.int32), bat)
        x = jax.device_put(jnp.ones((b, cfg.seq_len, cfg.hidden), cfg.jnp_dtype) * 0.1, bat)
        layers = {
            "embed": (lambda p, t: embed_fn(cfg)(p, t), (params["embed"], tok), (0,)),
            "block": (lambda p, h: block_fn(cfg)(p, h), (params["block"], x), (0, 1)),
            "head": (lambda p, h: head_fn(cfg)(p, h, tok), (params["head"], x), (0, 1)),
        }
        for name, (fn, args, diff) in layers.items():
            def fwd_vjp(*a, fn=fn, diff=diff):
                d = [a[i] for i in diff]

                def g(*dd):
                    full = list(a)
                    for i, v in zip(diff, dd):
                        full[i] = v
                    return fn(*full)
                return jax.vjp(g, *d)

            # the forward a training step runs: it keeps its residuals for the backward
            tell(name, "F", b)
            fwd = jax.jit(fwd_vjp)
            f_flops, f_bytes = _cost(fwd.lower(*args).compile())
            calls.append((FragmentTiming(name, "F", b, f_flops, f_bytes, 0.0, layout), fwd, args))
            tell(name, "B", b)
            y, vjp_fn = fwd(*args)
            ct = jnp.ones_like(y)
            bwd = jax.jit(lambda f, c: f(c))
            b_flops, b_bytes = _cost(bwd.lower(vjp_fn, ct).compile())
            calls.append((FragmentTiming(name, "B", b, b_flops, b_bytes, 0.0, layout), bwd,
                          (vjp_fn, ct)))
    # interleaved rounds, each timing every fragment once (two untimed rounds first)
    seconds = time_interleaved([(fn, args) for _, fn, args in calls], max(9, repeats) + 2, skip=2)
    return [dataclasses.replace(f, seconds=s) for (f, _, _), s in zip(calls, seconds)]


def measure_overhead(mesh: Mesh, calls: int = 200) -> float:
    """Seconds per step of :func:`compiler.runtime.run_program` for one-element calls on ``mesh``."""
    rep = NamedSharding(mesh, P())
    fn = jax.jit(lambda a: (a + 1.0,))
    steps = tuple(Call("inc", f"c{i}", "F", 0, i, (f"v{i}",), (f"v{i + 1}",)) for i in range(calls))
    prog = ExportedProgram({"m": MeshProgram("m", steps)}, {"inc": Executable("inc", "m", fn)},
                           (("v0", "m", rep),), ((f"v{calls}", "m"),))
    x = jnp.zeros((1,), jnp.float32)
    run_program(prog, (x,))
    walls = [run_program(prog, (x,)).wall_s / calls for _ in range(3)]
    return statistics.median(walls)


def measure_bandwidth(mesh: Mesh, mib_per_device: int = 64, repeats: int = 5
                      ) -> tuple[float, float]:
    """(bytes per device, seconds) of a memory-bound ``a + b`` fragment on ``mesh``."""
    n = mesh.devices.size * mib_per_device * 2**20 // 4
    sh = NamedSharding(mesh, P(mesh.axis_names[0]))
    a = jax.device_put(jnp.ones((n,), jnp.float32), sh)
    b = jax.device_put(jnp.ones((n,), jnp.float32), sh)
    f = jax.jit(lambda a, b: a + b)
    _, nbytes = _cost(f.lower(a, b).compile())
    return nbytes, time_call(f, a, b, repeats=repeats)


def measure_weight_stream(mesh: Mesh, mib_per_device: int = WEIGHT_STREAM_MIB, repeats: int = 5
                          ) -> tuple[float, float]:
    """(weight bytes per device, seconds) of a matrix-vector product ``x @ W`` on ``mesh``: one
    row ``x [1, 1024]`` against float32 weights ``W [1024, f]`` split by column over the mesh,
    ``mib_per_device`` MiB per device (past the caches): what a matmul of one token per device
    does, stream each weight once, read-only."""
    h = 1024
    cols = mesh.devices.size * (mib_per_device * 2**20 // 4 // h)
    w = jax.device_put(jnp.ones((h, cols), jnp.float32),
                       NamedSharding(mesh, P(None, mesh.axis_names[0])))
    x = jax.device_put(jnp.ones((1, h), jnp.float32), NamedSharding(mesh, P()))
    f = jax.jit(lambda x, w: x @ w)
    return h * cols * 4 / mesh.devices.size, time_call(f, x, w, repeats=repeats)


def measure_decode_layer(mesh: Mesh, *, model: str = "llama-tiny", repeats: int = 5,
                         cache_tokens: int = DECODE_CACHE_TOKENS,
                         layers: tuple[int, int] = DECODE_LAYERS) -> FragmentTiming:
    """Time what one more decoder block adds to a decode fragment on one token per device under
    tensor parallelism, as ``mpmd run`` executes it (:func:`zoo.kv_decode.block_decode_fn`: the
    token's keys and values written into a cache of ``cache_tokens`` positions, attention over
    it, the updated caches returned): fragments of ``layers[0]`` and ``layers[1]`` blocks are
    timed, cycling over enough copies of the block's weights (:data:`DECODE_ROTATION_MIB`) that
    each call streams its weights from memory, not from a cache, and the difference per block is
    returned. A fragment's own cost per call (dispatch, its many buffers) is left out: one block
    alone took 1.2-1.3x what one more block adds to a fragment (llama-tiny, 2 CPU devices).

    Returns: a ``tp`` :class:`FragmentTiming` of ``seq_len`` 1 and one sample whose ``seconds``
    are that marginal time per block: the median over ``max(15, 3 x repeats)`` pairs of sweeps
    (one over each fragment size, back to back, so load that comes and goes falls on both) of
    their difference; FLOP and bytes 0 until :func:`layout_costs` fills them.

    Raises:
        CalibrationError: ``layers`` not two increasing counts of at least 1.
    """
    few, many = layers
    if not 1 <= few < many:
        raise CalibrationError(f"decode fragments of {few} and {many} blocks: give two "
                               f"increasing counts of at least 1")
    cfg = get_config(model)
    lay = layout_of("tp", mesh.devices.size)
    mesh = layout_mesh(list(mesh.devices.flat), lay)
    shapes = block_shapes(cfg)
    block_bytes = sum(math.prod(v) for v in shapes.values()) * jnp.dtype(cfg.jnp_dtype).itemsize
    copies = max(many, math.ceil(DECODE_ROTATION_MIB * 2**20 / block_bytes))
    copies = math.ceil(copies / many) * many        # whole groups of the larger fragment
    params = [placed_params(cfg, shapes, mesh, lay, jax.random.PRNGKey(k)) for k in range(copies)]
    row = batch_spec(lay)[0]
    x = jax.device_put(jnp.ones((1, 1, cfg.hidden), cfg.jnp_dtype) * 0.1,
                       NamedSharding(mesh, P(row)))
    cache = jax.device_put(jnp.zeros(kv_decode.cache_shape(cfg, 1, cache_tokens), cfg.jnp_dtype),
                           NamedSharding(mesh, P(row, None, MODEL, None)))
    pos = jnp.int32(cache_tokens // 2)
    block = kv_decode.block_decode_fn(cfg)

    def fragment(ps, h, c, i):
        caches = []
        for p in ps:
            h, k_c, v_c = block(p, h, c, c, i)
            caches += [k_c, v_c]
        return h, caches
    step = jax.jit(fragment)

    def groups(k: int) -> list[list[dict]]:
        return [params[i:i + k] for i in range(0, copies - k + 1, k)]

    def sweep(gs: list[list[dict]]) -> float:
        t0 = time.perf_counter()
        for g in gs:
            _block(step(g, x, cache, pos))
        return (time.perf_counter() - t0) / len(gs)
    small, large = groups(few), groups(many)
    sweep(small), sweep(large)              # compile and warm both
    # paired sweeps, the median of their differences: load that comes and goes falls on both
    diffs = [sweep(large) - sweep(small) for _ in range(max(15, 3 * repeats))]
    seconds = statistics.median(diffs) / (many - few)
    return FragmentTiming("block", "F", 1, 0.0, 0.0, max(seconds, 1e-9), "tp", seq_len=1)


def measure_stream(mib: int = 256, repeats: int = 5) -> float:
    """The host's copy bandwidth (bytes read + written per second) with numpy, B/s."""
    a = np.ones(mib * 2**20 // 8)
    b = np.empty_like(a)
    t = time_call(lambda: np.copyto(b, a), repeats=repeats)
    return 2 * a.nbytes / t


def measure_link(src: Any, dst: Any, big_mib: int = 16, repeats: int = 5) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of ``jax.device_put`` from sharding ``src`` to ``dst``."""
    small = jax.device_put(jnp.zeros((1,), jnp.float32), src)
    lat = time_call(lambda: jax.device_put(small, dst), repeats=repeats * 4)
    big = jax.device_put(jnp.ones((big_mib * 2**20 // 4,), jnp.float32), src)
    t = time_call(lambda: jax.device_put(big, dst), repeats=repeats)
    return big.nbytes / max(t - lat, 1e-9), lat


def measure_allreduce(mesh: Mesh, big_mib: int = 16, repeats: int = 5) -> tuple[float, float]:
    """(bandwidth B/s, latency s) of the link inside ``mesh`` as its all-reduce sees it.

    Times XLA's all-reduce of a ``big_mib`` MiB buffer per device (a sum over the ``data`` axis
    into a replicated result, the collective a data-parallel backward runs) and of a 4-byte one,
    and inverts the ring model the simulator charges (``hardware_profiles.collectives``):
    ``t = 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth``.
    """
    n = mesh.devices.size
    axis = mesh.axis_names[0]
    f = jax.jit(lambda x: x.sum(0), out_shardings=NamedSharding(mesh, P()))

    def timed(elems: int) -> float:
        x = jax.device_put(jnp.ones((n, elems), jnp.float32), NamedSharding(mesh, P(axis)))
        return time_call(f, x, repeats=repeats)

    small, big = timed(1), timed(big_mib * 2**20 // 4)
    steps = 2 * (n - 1)
    latency = small / steps
    bandwidth = (steps / n) * big_mib * 2**20 / max(big - small, 1e-9)
    return bandwidth, latency


def measure_concurrency(meshes: Sequence[Mesh], samples: int = 4, repeats: int = 5) -> float:
    """Speed-up of ``len(meshes)`` equal block forwards dispatched together over one at a time."""
    cfg = get_config("llama-tiny")
    fn = jax.jit(block_fn(cfg))
    args = []
    for m in meshes:
        rep, bat = NamedSharding(m, P()), NamedSharding(m, P(m.axis_names[0]))
        p = jax.device_put(init_from_shapes(block_shapes(cfg), cfg.jnp_dtype, jax.random.PRNGKey(0)), rep)
        x = jax.device_put(jnp.ones((samples, cfg.seq_len, cfg.hidden), cfg.jnp_dtype), bat)
        args.append((p, x))

    def serial():
        for a in args:
            _block(fn(*a))

    def together():
        _block([fn(*a) for a in args])

    return time_call(serial, repeats=repeats) / time_call(together, repeats=repeats)


def measure_runtime_concurrency(meshes: Sequence[Mesh], fragments: int = 6, samples: int = 2
                                ) -> float:
    """Fragments the runtime keeps running at once on average: busy time summed over meshes / wall.

    Runs ``fragments`` independent block forwards on each of ``meshes`` through
    :func:`compiler.runtime.run_program` (recorded, as ``mpmd run`` does).
    """
    cfg = get_config("llama-tiny")
    p0 = init_from_shapes(block_shapes(cfg), cfg.jnp_dtype, jax.random.PRNGKey(0))
    leaves, tree = jax.tree.flatten(p0)
    n = len(leaves)
    fn = jax.jit(lambda *a: (block_fn(cfg)(jax.tree.unflatten(tree, a[:n]), a[n]),))
    progs, execs, inputs, outputs, args = {}, {}, [], [], []
    x0 = jnp.ones((samples, cfg.seq_len, cfg.hidden), cfg.jnp_dtype) * 0.1
    for i, m in enumerate(meshes):
        name = f"m{i}"
        pn = tuple(f"p{i}.{j}" for j in range(n))
        execs[name] = Executable(name, name, fn)
        progs[name] = MeshProgram(name, tuple(
            Call(name, f"F{i}.{k}", "F", i, k, pn + (f"x{i}.{k}",), (f"x{i}.{k + 1}",))
            for k in range(fragments)))
        inputs += [(v, name, NamedSharding(m, P())) for v in pn]
        inputs.append((f"x{i}.0", name, NamedSharding(m, P(m.axis_names[0]))))
        outputs.append((f"x{i}.{fragments}", name))
        args += list(leaves) + [x0]
    prog = ExportedProgram(progs, execs, tuple(inputs), tuple(outputs))
    run_program(prog, args)
    ex = run_program(prog, args)
    busy = sum(e.duration_s for e in ex.timeline.events)
    return busy / ex.wall_s


CALIBRATION_STEPS = ("fragments", "fragment overhead", "small block (fixed time per layer)",
                     "memory bandwidth", "host copy bandwidth",
                     "weight stream (matrix-vector)", "decode-shaped layer",
                     "all-reduce inside a mesh", "link between meshes", "XLA concurrency",
                     "runtime concurrency", "routed block (time per routed pair)")


def small_block_ops() -> tuple[int, int]:
    """The small block's (:data:`SMALL_BLOCK`) primitive ops, forward and whole backward, as
    ``zoo.costing`` counts every layer's (``LayerCost.fwd_ops`` / ``bwd_ops``)."""
    c = workload(get_config("llama-tiny", **SMALL_BLOCK), 2).costs[LAYER_BODY["block"]]
    return c.fwd_ops, c.bwd_ops


SMALL_BLOCK_CALLS = 7
"""Calls of the small block per round of :func:`measure_small_block` (the median is kept)."""


def measure_small_block(mesh: Mesh, samples: Sequence[int] = (2, 4, 8), *, repeats: int = 5
                        ) -> list[FragmentTiming]:
    """Time a small decoder block's training forward (keeping its residuals, as a training step
    runs it) and whole backward (:data:`SMALL_BLOCK`) on ``mesh`` under data parallelism at each
    of ``samples``, in ``max(15, 3 x repeats)`` interleaved rounds (each round times every sample
    count and kind, median of :data:`SMALL_BLOCK_CALLS` calls each): the median over the rounds.
    Interleaving keeps a burst of load on the host from landing on one sample count, which tilts
    the line the intercept comes from (timed one sample count after another, the forward's
    intercept moved from 0 to 694 us between four calibrations on a 2-core machine; interleaved,
    from 265 to 291 us). FLOP and bytes are left 0: only the times enter the fit
    (:func:`runtime.calibration.fit.fit_layer_overhead`)."""
    cfg = get_config("llama-tiny", **SMALL_BLOCK)
    lay = layout_of("dp", mesh.devices.size)
    mesh = layout_mesh(list(mesh.devices.flat), lay)
    params = placed_params(cfg, block_shapes(cfg), mesh, lay, jax.random.PRNGKey(0))
    # the forward a training step runs (keeping its residuals), and the backward on them
    fwd_vjp = jax.jit(lambda p, h: jax.vjp(lambda p, h: block_fn(cfg)(p, h), p, h))
    bwd = jax.jit(lambda f, c: f(c))
    calls: dict[tuple[int, str], tuple[Callable[..., Any], tuple]] = {}
    for b in samples:
        x = jax.device_put(jnp.ones((b, cfg.seq_len, cfg.hidden), cfg.jnp_dtype) * 0.1,
                           NamedSharding(mesh, batch_spec(lay)))
        y, vjp_fn = fwd_vjp(params, x)
        calls[(b, "F")] = (fwd_vjp, (params, x))
        calls[(b, "B")] = (bwd, (vjp_fn, jnp.ones_like(y)))
    seconds = dict(zip(calls, time_interleaved(list(calls.values()), max(15, 3 * repeats),
                                               per_round=SMALL_BLOCK_CALLS, warmup=1)))
    return [FragmentTiming("small_block", kind, b, 0.0, 0.0, seconds[(b, kind)], "dp",
                           cfg.seq_len) for b in samples for kind in ("F", "B")]


def calibrate(host: HostInfo, *, num_meshes: int = 4, devices_per_mesh: int = 2,
              samples: Sequence[int] = (2, 4, 8), repeats: int = 5,
              progress: Progress | None = None) -> Calibration:
    """Run every measurement on the local devices and fit the profile (see the module docstring).

    Args:
        host: this machine's cores, CPU description, memory and date (:func:`read_host`, read once
            by the caller): the nominal peak and the files' host figures come from it, not from
            the machine.
        progress: told each step before it runs, ``"[3/8] memory bandwidth"`` (and each fragment:
            ``"[1/8] fragments: block B, 4 samples (8 of 18)"``).

    Raises:
        CalibrationError: too few devices.
    """
    n = len(CALIBRATION_STEPS)

    def step(i: int, what: str = "") -> None:
        if progress:
            progress(f"[{i + 1}/{n}] {CALIBRATION_STEPS[i]}{': ' + what if what else ''}")

    meshes = local_meshes(num_meshes, devices_per_mesh)
    step(0)
    timed: list[FragmentTiming] = []
    for lay in LAYOUTS:     # data parallel, tensor parallel, FSDP: the layouts plans run
        timed += measure_fragments(meshes[0], samples, repeats=repeats, layout=lay,
                                   progress=lambda m, lay=lay: step(0, f"{lay} {m}"))
    frags = layout_costs(timed, devices_per_mesh)
    step(1)
    overhead = measure_overhead(meshes[0])
    step(2)
    small = measure_small_block(meshes[0], repeats=repeats)
    fixed_f, fixed_b = fit_layer_overhead(small, overhead)
    step(3)
    nbytes, t_mem = measure_bandwidth(meshes[0], repeats=repeats)
    achievable_bw = nbytes / max(t_mem - overhead, 1e-9)
    step(4)
    stream = measure_stream(repeats=repeats) / devices_per_mesh
    step(5)
    w_bytes, t_w = measure_weight_stream(meshes[0], repeats=repeats)
    weight_bw = w_bytes / max(t_w - overhead, 1e-9)
    step(6)
    decode = measure_decode_layer(meshes[0], repeats=repeats)
    step(7)
    intra_bw, intra_lat = measure_allreduce(meshes[0], repeats=repeats)
    # the rates are fitted on what each one-layer fragment took beyond its fixed time per layer
    small_ops = small_block_ops()
    rest = [dataclasses.replace(f, seconds=max(f.seconds - fixed_share(f, fixed_f, fixed_b,
                                                                        small_ops), 1e-9))
            for f in frags]
    fit = fit_calibration(rest, overhead, achievable_bw, devices_per_mesh, intra_lat)
    peak, peak_src, _ = nominal_peaks(devices_per_mesh, host.cores, host.cpuinfo)
    rep0, rep1 = NamedSharding(meshes[0], P()), NamedSharding(meshes[1], P())
    step(8)
    link_bw, link_lat = measure_link(rep0, rep1, repeats=repeats)
    step(9)
    speed = measure_concurrency(meshes[:2], repeats=repeats)
    step(10)
    achieved = measure_runtime_concurrency(meshes[:2])
    # the decode-shaped layer again, now that the calibration's other work is done, and the
    # mean of the two (each a median of paired differences; the lower of the two ran 20-35%
    # under the typical value on a noisy host and put the decode step 28% under its measurement)
    again = measure_decode_layer(meshes[0], repeats=repeats)
    decode = dataclasses.replace(decode, seconds=(decode.seconds + again.seconds) / 2)
    cal = Calibration(
        peak_flops=peak, achievable_flops=fit["achievable_flops"],
        memory_bandwidth=max(stream, achievable_bw, weight_bw),
        achievable_bandwidth=achievable_bw, weight_bandwidth=weight_bw,
        fragment_overhead=overhead, link_bandwidth=link_bw,
        link_latency=link_lat, intra_bandwidth=min(fit["allreduce_bandwidth"], intra_bw),
        intra_latency=intra_lat, standalone_allreduce_bandwidth=intra_bw,
        roofline=fit["roofline"], roofline_errors=fit["roofline_errors"],
        concurrency_speedup=speed, runtime_concurrency=achieved,
        backward_efficiency=fit["backward_efficiency"],
        host_slots=max(1, int(round(achieved))),
        devices_per_mesh=devices_per_mesh, cores=host.cores, fragments=tuple(frags),
        fit_rel_error=fit["rel_error"], date=host.date, peak_source=peak_src,
        memory_bytes=host.memory_bytes, host_devices=len(jax.devices()),
        cpu_model=cpu_model(host.cpuinfo), forward_layer_overhead=fixed_f,
        backward_layer_overhead=fixed_b, small_block=tuple(small), small_block_ops=small_ops)
    decode = layout_costs([decode], devices_per_mesh)[0]
    cal = dataclasses.replace(cal, decode_layer_overhead=fit_decode_overhead(cal, decode),
                              decode_fragment=decode)
    step(11)
    routed = measure_routed_block(meshes[0], repeats=repeats)
    with tempfile.TemporaryDirectory() as d:    # the profile so far, as the simulator loads it
        _, cluster_path = write_profiles(cal, Path(d) / "cpu-host.yaml", Path(d) / "cpu4x2.yaml")
        mesh = next(iter(load_cluster(cluster_path).meshes.values()))
        forward, backward = fit_routing_pairs(routed, mesh, overhead)
    return dataclasses.replace(cal, forward_routing_pair=forward, backward_routing_pair=backward,
                               routed_block=tuple(routed))


def print_calibration(cal: Calibration, console: Any) -> None:
    """The fragment table (measured against the fitted model) and a one-paragraph summary."""
    t = Table(title="fragment timings (per device of a mesh)")
    for c in ("layout", "layer", "kind", "samples", "GFLOP", "MB", "measured ms", "model ms"):
        t.add_column(c, justify="right")
    for f in cal.fragments:
        t.add_row(f.layout, f.layer, f.kind, str(f.samples), f"{f.flops / 1e9:.3f}", f"{f.bytes / 1e6:.2f}",
                  f"{f.seconds * 1e3:.3f}", f"{model_seconds(cal, f) * 1e3:.3f}")
    console.print(t)
    console.print(
        f"achievable {cal.achievable_flops / 1e9:.2f} GFLOP/s/device (efficiency "
        f"{cal.matmul_efficiency:.3f}), {cal.achievable_bandwidth / 1e9:.2f} GB/s/device "
        f"(efficiency {cal.memory_efficiency:.3f}), "
        + (f"one-token matmuls stream weights at {cal.weight_bandwidth / 1e9:.2f} GB/s/device, "
           if cal.weight_bandwidth > 0 else "")
        + (f"decode layer overhead {cal.decode_layer_overhead * 1e6:.1f} us, "
           if cal.decode_layer_overhead is not None else "")
        + (f"routing {cal.forward_routing_pair * 1e9:.0f} ns forward, "
           f"{cal.backward_routing_pair * 1e9:.0f} ns backward per routed pair, "
           if cal.routed_block else "")
        + f"overhead {cal.fragment_overhead * 1e6:.1f} us, fixed time per layer "
        f"{cal.forward_layer_overhead * 1e6:.1f} us forward, "
        f"{cal.backward_layer_overhead * 1e6:.1f} us backward, "
        f"link {cal.link_bandwidth / 1e9:.2f} GB/s + {cal.link_latency * 1e6:.1f} us, host_slots "
        f"{cal.host_slots} (runtime concurrency {cal.runtime_concurrency:.2f}, XLA concurrency "
        f"speed-up {cal.concurrency_speedup:.2f}), fit error {cal.fit_rel_error:.3f} (roofline "
        + ", ".join(f"{k} {e:.3f}" for k, e in cal.roofline_errors) + f": {cal.roofline})")


def calibrate_command(out: str = "calibrated", *, device_out: str | None = None,
                      cluster_out: str | None = None, repeats: int = 5, write: bool = True,
                      console: Any = None, host: HostInfo | None = None) -> Calibration:
    """``mpmd calibrate --out DIR``: measure (with a progress line), fit, print a table and (by
    default) write ``DIR/cpu-host.yaml`` and ``DIR/cpu4x2.yaml``, the cluster naming its device
    ``cpu-host.yaml`` (:func:`runtime.calibration.files.profile_paths`; ``device_out`` /
    ``cluster_out`` replace either path, e.g. to refresh the bundled files).

    The host (cores, /proc/cpuinfo, memory, date) is read here, once (:func:`read_host`), unless
    ``host`` is given.

    Raises:
        CalibrationError: too few devices; an output path that cannot be written (checked
            before measuring).
    """
    console = console or Console()
    device_path, cluster_path = profile_paths(out, device_out, cluster_out)
    if write:
        check_writable(device_path, cluster_path)
    host = host or read_host()
    shown: list[str] = []

    def progress(msg: str, status: Any) -> None:
        status.update(f"calibrating: {msg}")
        step = msg.partition(":")[0]
        if not console.is_terminal and step not in shown:   # no spinner in a log: one line a step
            shown.append(step)
            console.print(f"calibrating: {step}", highlight=False)

    with console.status("calibrating") as status:
        cal = calibrate(host, repeats=repeats, progress=lambda m: progress(m, status))
    print_calibration(cal, console)
    if write:
        write_profiles(cal, device_path, cluster_path)
        console.print(f"wrote {device_path} and {cluster_path}; plan with --cluster {cluster_path}",
                      highlight=False)
    return cal


if __name__ == "__main__":  # python -m runtime.calibration.measure
    jax.config.update("jax_num_cpu_devices", 8)
    calibrate_command()
