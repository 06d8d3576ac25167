"""The ``cpu-host`` device profile and ``cpu4x2`` cluster files written from a calibration
(:mod:`runtime.calibration.measure` measures and fits; this module renders the loader's YAML format).

Pure: every figure comes from the :class:`~runtime.calibration.fit.Calibration` (the host's own
figures included, read once by :func:`runtime.calibration.fit.read_host`), so the same
calibration always renders the same files. ``mpmd calibrate --out DIR`` writes
``DIR/cpu-host.yaml`` and ``DIR/cpu4x2.yaml`` (:func:`profile_paths`); the cluster names its
device by the path relative to the cluster file (the loader resolves a relative device path
against the cluster file's folder), or by the bundled id ``cpu-host`` when the device file is the
bundled one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from runtime.calibration.fit import (DECODE_CACHE_TOKENS, DECODE_LAYERS, DECODE_ROTATION_MIB,
                                     ROUTED_MODEL, SMALL_BLOCK, WEIGHT_STREAM_MIB, Calibration,
                                     CalibrationError)
from hardware_profiles.loader import DEVICES_DIR
from ir.files import write_atomic

DEVICE_ID = "cpu-host"
CLUSTER_ID = "cpu4x2"
DEVICE_FILE = f"{DEVICE_ID}.yaml"
CLUSTER_FILE = f"{CLUSTER_ID}.yaml"
DEFAULT_OUT = "calibrated"
COMMAND = "mpmd calibrate (runtime.calibration.measure.calibrate_command)"


def profile_paths(out: str | Path = DEFAULT_OUT, device_out: str | Path | None = None,
                  cluster_out: str | Path | None = None) -> tuple[Path, Path]:
    """(device file, cluster file) that ``mpmd calibrate`` writes: ``out/cpu-host.yaml`` and
    ``out/cpu4x2.yaml``, either replaced by an explicit ``device_out`` / ``cluster_out``."""
    return (Path(device_out) if device_out else Path(out) / DEVICE_FILE,
            Path(cluster_out) if cluster_out else Path(out) / CLUSTER_FILE)


def check_writable(*paths: str | Path) -> None:
    """Fail before calibrating (which takes a minute), not after, when a file cannot be written:
    each path's nearest existing ancestor must be a writable folder, and the path itself, if it
    exists, a file.

    Raises:
        CalibrationError: a path is a folder, lies under a file, or its folder is not writable.
    """
    for path in map(Path, paths):
        if path.is_dir():
            raise CalibrationError(f"{path} is a folder; name a file (or use --out FOLDER)")
        parent = Path(os.path.abspath(path)).parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise CalibrationError(f"cannot write {path}: {parent} is a file, not a folder; "
                                   f"choose another --out")
        try:        # a real probe (os.access says yes to root even on read-only file systems)
            tempfile.TemporaryFile(dir=parent).close()
        except OSError as e:
            raise CalibrationError(f"cannot write {path}: folder {parent} is not writable "
                                   f"({e.strerror}); choose another --out") from None


def device_reference(device_path: str | Path, cluster_path: str | Path) -> str:
    """How the cluster file at ``cluster_path`` names the device file at ``device_path``: the
    bundled id ``cpu-host`` for the bundled profile, else the path relative to the cluster file's
    folder (POSIX separators; what ``hardware_profiles.loader`` resolves device paths against),
    else (no relative path, e.g. another drive) the absolute path."""
    dev = Path(os.path.abspath(device_path))
    if dev == Path(os.path.abspath(DEVICES_DIR / DEVICE_FILE)):
        return DEVICE_ID
    try:
        return Path(os.path.relpath(dev, Path(os.path.abspath(cluster_path)).parent)).as_posix()
    except ValueError:
        return dev.as_posix()


def _where(cal: Calibration) -> str:
    date = f" {cal.date}" if cal.date else ""
    return (f"measured{date} on this machine ({cal.cores} cores shared by {cal.host_devices} JAX "
            f"CPU devices) by {COMMAND}")


def device_yaml(cal: Calibration, name: str = DEVICE_ID) -> dict[str, Any]:
    """The ``cpu-host`` device profile (the loader's file format) from a calibration, called
    ``name`` (the loader wants a device file's stem as its name).

    Raises:
        CalibrationError: the calibration lacks the host's peak or memory (``peak_flops`` or
            ``memory_bytes`` not positive).
    """
    if not cal.peak_flops > 0 or not cal.memory_bytes > 0:
        raise CalibrationError(f"calibration has peak_flops {cal.peak_flops} and memory_bytes "
                               f"{cal.memory_bytes}; both must be positive (pass the host's "
                               f"figures: runtime.calibration.fit.read_host)")
    peak, mem_total = cal.peak_flops, cal.memory_bytes
    peak_src = cal.peak_source or "the calibration's nominal peak"
    blocks = sorted({(f.layer, f.kind) for f in cal.fragments})
    where = _where(cal)
    return {
        "name": name,
        "vendor": "local",
        "description": (f"One JAX CPU device of this machine ({cal.cores} cores, "
                        f"{cal.host_devices} CPU devices), "
                        f"as used in meshes of {cal.devices_per_mesh}; figures per device while its "
                        f"mesh runs one fragment on the whole host."),
        "peak_tflops": {
            "fp32": {"value": round(peak / 1e12, 6), "source": peak_src},
            "bf16": {"value": round(peak / 1e12, 6),
                     "source": "the fp32 figure: XLA:CPU runs these fragments' dots in float32"},
        },
        "memory_gb": {"value": round(mem_total / cal.host_devices / 1e9, 3),
                      "source": f"this machine's RAM (os.sysconf) / {cal.host_devices} CPU devices"},
        "memory_bandwidth_gb_per_s": {
            "value": round(cal.memory_bandwidth / 1e9, 4),
            "source": (f"{where}: the faster of a numpy copy of 256 MiB (read + write) / "
                       f"{cal.devices_per_mesh} devices per mesh and the matrix-vector weight "
                       f"stream (efficiency.weight_stream)")},
        "scale_up": {
            "bandwidth_gb_per_s_per_direction": {
                "value": round(cal.intra_bandwidth / 1e9, 4),
                "source": _allreduce_source(cal, where)},
            "latency_us": {"value": round(cal.intra_latency * 1e6, 2),
                           "source": f"{where}: XLA all-reduce of 4 bytes per device, / 2(n-1) "
                                     f"ring steps"},
            "topology": "shared memory of one host",
        },
        "scale_out": {"bandwidth_gbit_per_s_per_direction": {
            "value": round(cal.link_bandwidth * 8 / 1e9, 4),
            "source": f"{where}: jax.device_put of 16 MiB between two meshes"}},
        "tdp_w": {"value": 10.0, "source": (
            f"unknown: a nominal 10 W per device, not for power reports (CPU "
            f"{repr(cal.cpu_model) if cal.cpu_model else 'model not named by /proc/cpuinfo'})")},
        "efficiency": {
            "matmul": {"value": round(cal.matmul_efficiency, 5), "origin": (
                f"{where}: achievable {cal.achievable_flops / 1e9:.2f} GFLOP/s per device fitted "
                f"(least squares in seconds, relative rms error {cal.fit_rel_error:.3f}) to "
                f"{len(cal.fragments)} fragments ({', '.join(f'{l} {k}' for l, k in blocks)} of "
                f"llama-tiny at {sorted({f.samples for f in cal.fragments})} samples, "
                f"{'/'.join(sorted({f.layout for f in cal.fragments}))} over "
                f"{cal.devices_per_mesh} devices; FLOP and bytes as the simulator charges them: "
                f"zoo.costing workload) with "
                f"overhead + {cal.roofline}(flops/F, bytes/B), B the measured a + b bandwidth")},
            "backward": {"value": round(cal.backward_efficiency, 5), "origin": (
                f"{where}: the backward fragments' fitted rate over the forward's (fitted "
                f"together with the all-reduce of each layer's fp32 gradients inside the backward:"
                f" runtime.calibration.fit."
                f"{'fit_backward' if cal.roofline == 'max' else 'fit_additive'}; XLA:CPU's "
                f"backward kernels run slower than "
                f"its forward ones)")},
            "memory": {"value": round(cal.memory_efficiency, 5), "origin": (
                f"{where}: a + b over 64 MiB per device on a {cal.devices_per_mesh}-device mesh "
                f"reached {cal.achievable_bandwidth / 1e9:.2f} GB/s per device")},
            **({"weight_stream": {"value": round(cal.weight_stream_efficiency, 5), "origin": (
                f"{where}: a matrix-vector product x @ W, one row against "
                f"{WEIGHT_STREAM_MIB} MiB of float32 weights per device split over a "
                f"{cal.devices_per_mesh}-device mesh (what a matmul of one token per device, a "
                f"decode step's, does: read each weight once), reached "
                f"{cal.weight_bandwidth / 1e9:.2f} GB/s per device")}}
               if cal.weight_bandwidth > 0 else {}),
            "roofline": {"value": cal.roofline, "origin": (
                f"{where}: the better fit over the timed fragments of compute and memory time "
                f"overlapping (max) or adding (sum); relative rms error "
                + ", ".join(f"{k} {e:.3f}" for k, e in cal.roofline_errors))},
            "fragment_overhead_us": {"value": round(cal.fragment_overhead * 1e6, 2), "origin": (
                f"{where}: compiler.runtime.run_program per step, 200 one-element calls")},
            **({key: {"value": round(value * 1e6, 2), "ops": ops, "origin": (
                f"{where}: the intercept of a least-squares line through a small decoder block's "
                f"{what} times (width {SMALL_BLOCK['hidden']}, {SMALL_BLOCK['seq_len']} tokens per "
                f"sample, data parallel over {cal.devices_per_mesh} devices) against its "
                f"microbatch of " + ", ".join(str(f.samples) for f in cal.small_block if f.kind == kind)
                + f" samples, less the fragment overhead: its {ops} ops dispatched one after "
                f"another, each at a cost that does not grow with the microbatch; a layer pays "
                f"it in proportion to its own ops (runtime.calibration.fit.fit_layer_overhead)")}
                for key, value, what, kind, ops in (
                    ("forward_layer_overhead_us", cal.forward_layer_overhead, "forward", "F",
                     cal.small_block_ops[0] or None),
                    ("backward_layer_overhead_us", cal.backward_layer_overhead, "backward", "B",
                     cal.small_block_ops[1] or None))}
               if cal.small_block else {}),
            **({key: {"value": round(value * 1e9, 1), "origin": (
                f"{where}: a small mixture of experts' block ({ROUTED_MODEL}: 4 experts, "
                f"top 2, width 128, 64 tokens per sample) timed {what} under "
                + " and ".join(f"{'data' if lay == 'dp' else 'expert'} parallel"
                               for lay in dict.fromkeys(f.layout for f in cal.routed_block))
                + f" over {cal.devices_per_mesh} devices at "
                + ", ".join(str(b) for b in dict.fromkeys(f.samples for f in cal.routed_block))
                + " samples; what it took beyond the cost model's charge on this profile and the "
                "fragment overhead, per (token, expert) pair of a device's tokens (least squares "
                "in relative error): its tokens' rows gathered into the experts' slots and back "
                "one by one (runtime.calibration.routing.fit_routing_pairs)")}
                for key, value, what in (
                    ("forward_routing_pair_ns", cal.forward_routing_pair, "forward"),
                    ("backward_routing_pair_ns", cal.backward_routing_pair, "whole backward"))}
               if cal.routed_block else {}),
            **({"decode_layer_overhead_us": {
                "value": round(cal.decode_layer_overhead * 1e6, 2), "origin": (
                    f"{where}: one more decoder block's decode step (one token per device, "
                    f"its {DECODE_CACHE_TOKENS}-position KV cache written and attended over) in "
                    f"a fragment on a {cal.devices_per_mesh}-device tensor-parallel mesh, "
                    f"fragments of {DECODE_LAYERS[0]} and {DECODE_LAYERS[1]} blocks cycling over "
                    f"{DECODE_ROTATION_MIB} MiB of blocks' weights (streamed from memory, as a "
                    f"decode step streams each layer once), added "
                    f"{cal.decode_fragment.seconds * 1e6:.1f} us; this is what it added beyond the "
                    f"cost model's charge for it (weights at the weight-stream rate, FLOP, "
                    f"tensor-parallel all-reduces): its small ops dispatched one by one "
                    f"(runtime.calibration.fit.fit_decode_overhead)")}}
               if cal.decode_layer_overhead is not None and cal.decode_fragment is not None
               else {}),
        },
    }


def _allreduce_source(cal: Calibration, where: str) -> str:
    inside = ("the gradient all-reduce inside data-parallel backward fragments"
              if {f.layout for f in cal.fragments} <= {"dp"} or cal.roofline == "max" else
              "the collectives inside data-parallel, tensor-parallel and FSDP fragments (gradient "
              "and activation all-reduces, parameter all-gathers, gradient reduce-scatters)")
    return (f"{where}: {inside} over a "
            f"{cal.devices_per_mesh}-device mesh, fitted with the compute rates (compiler."
            f"calibration.fit.{'fit_backward' if cal.roofline == 'max' else 'fit_additive'}, ring "
            f"model); XLA's all-reduce of 16 MiB timed "
            f"alone reached {cal.standalone_allreduce_bandwidth / 1e9:.2f} GB/s")


def cluster_yaml(cal: Calibration, num_meshes: int = 4, device: str = DEVICE_FILE
                 ) -> dict[str, Any]:
    """The ``cpu4x2`` cluster: ``num_meshes`` meshes of ``devices_per_mesh`` CPU devices, one host,
    each of ``device`` (a bundled id, or a device file's path relative to the cluster file)."""
    where = f"measured{f' {cal.date}' if cal.date else ''} by {COMMAND}"
    return {
        "name": CLUSTER_ID,
        "description": (
            f"{num_meshes} meshes of {cal.devices_per_mesh} JAX CPU devices, all on this machine's "
            f"{cal.cores} cores (host 'local'). host_slots = {cal.host_slots}: the runtime keeps "
            f"{cal.runtime_concurrency:.2f} fragments running on average (it times one step at a "
            f"time); XLA alone ran 2 meshes' fragments {cal.concurrency_speedup:.2f}x faster "
            f"together than one after the other ({where})."),
        "meshes": [{"name": f"m{i}", "device": device, "num_devices": cal.devices_per_mesh,
                    "axes": {"data": cal.devices_per_mesh}, "host": "local",
                    "intra_link": {"bandwidth_gb_per_s": round(cal.intra_bandwidth / 1e9, 4),
                                   "latency_us": round(cal.intra_latency * 1e6, 2),
                                   "source": _allreduce_source(cal, where)}}
                   for i in range(num_meshes)],
        "default_link": {"bandwidth_gb_per_s": round(cal.link_bandwidth / 1e9, 4),
                         "latency_us": round(cal.link_latency * 1e6, 2),
                         "source": f"{where}: device_put between two meshes' shardings"},
        "host_slots": {"local": cal.host_slots},
    }


def write_profiles(cal: Calibration, device_path: str | Path, cluster_path: str | Path
                   ) -> tuple[Path, Path]:
    """Write :func:`device_yaml` (named as the file's stem) to ``device_path`` and
    :func:`cluster_yaml` (naming the device by :func:`device_reference`) to ``cluster_path``;
    return the two paths. Both texts are rendered first, then each is written atomically
    (``write_atomic``: a temporary file beside the target, then a rename; missing folders are
    made), so a failure leaves the old files whole.

    Raises:
        CalibrationError: see :func:`device_yaml`.
    """
    device_path, cluster_path = Path(device_path), Path(cluster_path)
    ref = device_reference(device_path, cluster_path)
    texts = [(path, f"# {head}: calibrated on this machine by {COMMAND}; regenerate, do not edit.\n"
              + yaml.safe_dump(data, sort_keys=False, width=100))
             for path, data, head in ((device_path, device_yaml(cal, device_path.stem),
                                       f"Device profile {device_path.stem}"),
                                      (cluster_path, cluster_yaml(cal, device=ref),
                                       f"Cluster {CLUSTER_ID}"))]
    for path, text in texts:
        write_atomic(path, text)
    return device_path, cluster_path
