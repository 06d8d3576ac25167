"""Small synthetic workloads and clusters for planner tests (no tracing: fast and exact)."""

from __future__ import annotations

import pytest

from ir import LayerCost, Workload
from hardware_profiles.types import Cluster, DeviceProfile, InterMeshLink, Link, MeshSpec


def device(name: str, tflops: float, mem_gb: float, bw_gbs: float = 2000.0) -> DeviceProfile:
    return DeviceProfile(name=name, vendor="test", description="", peak_flops={"bf16": tflops * 1e12},
                         memory_bytes=mem_gb * 1e9, memory_bandwidth=bw_gbs * 1e9,
                         scale_up_bandwidth=100e9, scale_up_latency=1e-6, scale_out_bandwidth=25e9,
                         tdp_watts=500.0, price_per_hour=(1.0, 2.0), matmul_efficiency=0.5,
                         memory_efficiency=0.8, fragment_overhead=20e-6)


def layer(name: str, gflop: float, params_m: float, act_mb: float = 8.0, resid_mb: float = 64.0
          ) -> LayerCost:
    return LayerCost(name, gflop * 1e9, 2 * gflop * 1e9, gflop * 1e9, params_m * 2e6, act_mb * 1e6,
                     params_m * 4e6, act_mb * 2e6, int(params_m * 1e6), params_m * 2e6, act_mb * 1e6,
                     resid_mb * 1e6, 2 * act_mb * 1e6)


def workload(blocks: int = 12, batch: int = 32, training: bool = True) -> Workload:
    costs = {"embed": layer("embed", 1.0, 50.0, resid_mb=1.0), "block": layer("block", 200.0, 100.0),
             "head": layer("head", 150.0, 50.0)}
    return Workload("toy", ("embed",) + ("block",) * blocks + ("head",), costs, seq_len=1024,
                    global_batch=batch, training=training)


def cluster(specs: list[tuple[str, DeviceProfile, int]], bw_gbs: float = 50.0) -> Cluster:
    meshes = {n: MeshSpec(n, d, k, {"x": k}, Link(d.scale_up_bandwidth, d.scale_up_latency))
              for n, d, k in specs}
    return Cluster("toy", meshes, (), default_link=Link(bw_gbs * 1e9, 5e-6))


@pytest.fixture
def fast_slow_cluster() -> Cluster:
    fast, slow = device("fast", 400.0, 80.0), device("slow", 100.0, 80.0)
    return cluster([("f0", fast, 2), ("s0", slow, 2)])
