"""The ``cpu-host`` device profile and ``cpu4x2`` cluster files written from a calibration
(:mod:`compiler.calibrate` measures and fits; this module renders the loader's YAML format)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from compiler.calibration_fit import Calibration, nominal_peaks

DEVICE_ID = "cpu-host"
CLUSTER_ID = "cpu4x2"
COMMAND = "mpmd calibrate (compiler.calibrate.calibrate_command)"


def device_yaml(cal: Calibration) -> dict[str, Any]:
    """The ``cpu-host`` device profile (the loader's file format) from a calibration."""
    peak, peak_src, _ = nominal_peaks(cal.devices_per_mesh, cal.cores)
    mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    blocks = sorted({(f.layer, f.kind) for f in cal.fragments})
    where = (f"measured {cal.date} on this machine ({cal.cores} cores shared by 8 JAX CPU devices) "
             f"by {COMMAND}")
    return {
        "name": DEVICE_ID,
        "vendor": "local",
        "description": (f"One JAX CPU device of this machine ({cal.cores} cores, 8 CPU devices), "
                        f"as used in meshes of {cal.devices_per_mesh}; figures per device while its "
                        f"mesh runs one fragment on the whole host."),
        "peak_tflops": {
            "fp32": {"value": round(peak / 1e12, 6), "source": peak_src},
            "bf16": {"value": round(peak / 1e12, 6),
                     "source": "the fp32 figure: XLA:CPU runs these fragments' dots in float32"},
        },
        "memory_gb": {"value": round(mem_total / 8 / 1e9, 3),
                      "source": "this machine's RAM (os.sysconf) / 8 CPU devices"},
        "memory_bandwidth_gb_per_s": {
            "value": round(cal.memory_bandwidth / 1e9, 4),
            "source": (f"{where}: numpy copy of 256 MiB (read + write) / {cal.devices_per_mesh} "
                       f"devices per mesh")},
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
        "tdp_w": {"value": 10.0, "source": ("unknown: this virtual machine names no CPU model; a "
                                            "nominal 10 W per device, not for power reports")},
        "efficiency": {
            "matmul": {"value": round(cal.matmul_efficiency, 5), "origin": (
                f"{where}: achievable {cal.achievable_flops / 1e9:.2f} GFLOP/s per device fitted "
                f"(least squares in seconds, relative rms error {cal.fit_rel_error:.3f}) to "
                f"{len(cal.fragments)} fragments ({', '.join(f'{l} {k}' for l, k in blocks)} of "
                f"llama-tiny at {sorted({f.samples for f in cal.fragments})} samples, data-parallel "
                f"over {cal.devices_per_mesh} devices; FLOP and bytes as the simulator charges them: "
                f"compiler.costing workload) with "
                f"overhead + {cal.roofline}(flops/F, bytes/B), B the measured a + b bandwidth")},
            "backward": {"value": round(cal.backward_efficiency, 5), "origin": (
                f"{where}: the backward fragments' fitted rate over the forward's (fitted "
                f"together with the all-reduce of each layer's fp32 gradients inside the backward:"
                f" compiler.calibration_fit."
                f"{'fit_backward' if cal.roofline == 'max' else 'fit_additive'}; XLA:CPU's "
                f"backward kernels run slower than "
                f"its forward ones)")},
            "memory": {"value": round(cal.memory_efficiency, 5), "origin": (
                f"{where}: a + b over 64 MiB per device on a {cal.devices_per_mesh}-device mesh "
                f"reached {cal.achievable_bandwidth / 1e9:.2f} GB/s per device")},
            "roofline": {"value": cal.roofline, "origin": (
                f"{where}: the better fit over the timed fragments of compute and memory time "
                f"overlapping (max) or adding (sum); relative rms error "
                + ", ".join(f"{k} {e:.3f}" for k, e in cal.roofline_errors))},
            "fragment_overhead_us": {"value": round(cal.fragment_overhead * 1e6, 2), "origin": (
                f"{where}: compiler.runtime.run_program per step, 200 one-element calls")},
        },
    }


def _allreduce_source(cal: Calibration, where: str) -> str:
    return (f"{where}: the gradient all-reduce inside data-parallel backward fragments over a "
            f"{cal.devices_per_mesh}-device mesh, fitted with the backward rate (compiler."
            f"calibration_fit.{'fit_backward' if cal.roofline == 'max' else 'fit_additive'}, ring "
            f"model); XLA's all-reduce of 16 MiB timed "
            f"alone reached {cal.standalone_allreduce_bandwidth / 1e9:.2f} GB/s")


def cluster_yaml(cal: Calibration, num_meshes: int = 4) -> dict[str, Any]:
    """The ``cpu4x2`` cluster: ``num_meshes`` meshes of ``devices_per_mesh`` CPU devices, one host."""
    where = f"measured {cal.date} by {COMMAND}"
    return {
        "name": CLUSTER_ID,
        "description": (
            f"{num_meshes} meshes of {cal.devices_per_mesh} JAX CPU devices, all on this machine's "
            f"{cal.cores} cores (host 'local'). host_slots = {cal.host_slots}: the runtime keeps "
            f"{cal.runtime_concurrency:.2f} fragments running on average (it times one step at a "
            f"time); XLA alone ran 2 meshes' fragments {cal.concurrency_speedup:.2f}x faster "
            f"together than one after the other ({where})."),
        "meshes": [{"name": f"m{i}", "device": DEVICE_ID, "num_devices": cal.devices_per_mesh,
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


def write_profiles(cal: Calibration, device_path: str, cluster_path: str) -> None:
    """Write :func:`device_yaml` and :func:`cluster_yaml` to the given paths: both texts are
    rendered first, then each is written atomically (``mpmd.cli.output.write_atomic``: a temporary file
    beside the target, then a rename), so a failure leaves the old files whole."""
    from mpmd.cli.output import write_atomic

    texts = [(path, f"# {head}: calibrated on this machine by {COMMAND}; regenerate, do not edit.\n"
              + yaml.safe_dump(data, sort_keys=False, width=100))
             for path, data, head in ((device_path, device_yaml(cal), f"Device profile {DEVICE_ID}"),
                                      (cluster_path, cluster_yaml(cal), f"Cluster {CLUSTER_ID}"))]
    for path, text in texts:
        write_atomic(Path(path), text)
