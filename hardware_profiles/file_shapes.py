"""The shapes of the YAML files (device profiles, cluster specs) as pydantic models, with the limits
on every figure; :mod:`hardware_profiles.loader` validates files against them and converts once to
SI units. Human units live in the key names, so the unit factors are here too.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from ir.files import NAME_PATTERN

MAX_DEVICES = 2**20
"""Most devices in one mesh (and along one mesh axis): about a million, far above any machine built."""
MAX_FIGURE = 1e6
"""Largest figure in human units: TFLOP/s, GB, GB/s, W, USD per device-hour (no device is near)."""
MIN_FIGURE = 1e-3
"""Smallest figure in human units (TFLOP/s, GB, GB/s, Gbit/s, W) and smallest efficiency: a
tinier one makes step times overflow the planner's integer microseconds (a profile with
1e-300 TFLOP/s crashed the CP-SAT model)."""
MAX_GBIT = 8e6
"""Largest bandwidth in Gbit/s (= :data:`MAX_FIGURE` GB/s)."""
MAX_US = 1e6
"""Largest latency or per-fragment overhead, us (one second)."""
MAX_MESHES = 512
"""Most meshes in one cluster (16x the largest bundled one; the planner's search grows with the
mesh count: about 10 s at 64 meshes and minutes at 4096, measured on 2 cores)."""
MAX_NODES = 16384
"""Most nodes in a node-group cluster: 131,072 devices at 8 per node, five times Meta's
24,576-GPU Llama 3 clusters (Llama Team, "The Llama 3 Herd of Models", 2024, Sec. 3.3.1) and
twice the 65,536 devices the planner is benchmarked on; no machine built is near. A node group
is shaped by counting nodes, not listing them, so the search does not grow with this figure."""

MAX_TOTAL_DEVICES = 2**20
"""Most devices in one cluster, all meshes or node groups together: 1,048,576, 16x the 65,536 the
planner is benchmarked on. The search's work grows with the device count (the divisors and
carvings it tries): on the project's 2-core machine ``mpmd plan --model llama3-70b
--global-batch 1024 --time-limit 2`` on one node group took 5.9 s at 2**20 devices, 88 s at
2**26 and over 300 s at 2**34 (measured 2026-11-28 under a 3 GiB address-space cap)."""

TFLOPS = 1e12
GB = 1e9
GIB = 2.0**30
GBIT = 1e9 / 8
US = 1e-6


# ----------------------------------------------------------------------------- file shapes
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _Figure(_Strict):
    value: float = Field(ge=MIN_FIGURE, le=MAX_FIGURE)
    source: str = Field(min_length=1)
    note: str = ""


class _Latency(_Strict):
    value: float = Field(ge=0, le=MAX_US)
    source: str = Field(min_length=1)
    note: str = ""


class _Efficiency(_Strict):
    value: float = Field(ge=MIN_FIGURE, le=1)
    origin: str = Field(min_length=1)


class _Overhead(_Strict):
    value: float = Field(ge=0, le=MAX_US)
    origin: str = Field(min_length=1)


class _LayerOverhead(_Overhead):
    ops: int | None = Field(default=None, ge=1)
    """Primitive ops of the block the fixed time was measured on (``LayerCost.fwd_ops`` /
    ``bwd_ops``): a layer pays the fixed time times its own ops over these. None: per layer."""


class _Roofline(_Strict):
    value: Literal["max", "sum"]
    origin: str = Field(min_length=1)


class _Fraction(_Strict):
    value: float = Field(ge=0, le=1)
    origin: str = Field(min_length=1)


class _Tokens(_Strict):
    value: float = Field(ge=0, le=MAX_US)
    origin: str = Field(min_length=1)


class _GradSyncOverlap(_Strict):
    value: Literal["bucketed", "after_backward"]
    origin: str = Field(min_length=1)


class _Efficiencies(_Strict):
    matmul: _Efficiency
    memory: _Efficiency
    fragment_overhead_us: _Overhead
    weight_stream: _Efficiency | None = None
    backward: _Efficiency | None = None
    attention: _Efficiency | None = None
    attention_backward: _Efficiency | None = None
    attention_half_tokens: _Tokens | None = None
    attention_backward_half_tokens: _Tokens | None = None
    flash2_attention: _Efficiency | None = None
    roofline: _Roofline | None = None
    elementwise_traffic: _Fraction | None = None
    scale_out: _Efficiency | None = None
    comm_interference: _Fraction | None = None
    grad_sync_overlap: _GradSyncOverlap | None = None
    sync_jitter: _Fraction | None = None
    decode_layer_overhead_us: _Overhead | None = None
    forward_layer_overhead_us: _LayerOverhead | None = None
    backward_layer_overhead_us: _LayerOverhead | None = None
    prefill_layer_overhead_us: _Overhead | None = None
    logit_overhead_ns: _Overhead | None = None
    forward_routing_pair_ns: _Overhead | None = None
    backward_routing_pair_ns: _Overhead | None = None
    routed_element_ps: _Overhead | None = None
    dropless_routing_pair_ns: _Overhead | None = None


class _OneHop(_Strict):
    value: bool
    source: str = Field(min_length=1)


class _TorusDims(_Strict):
    value: int = Field(ge=1, le=3)
    source: str = Field(min_length=1)


class _GemmTiling(_Strict):
    compute_units: int = Field(ge=1, le=100000)
    tile_m: int = Field(ge=1, le=4096)
    tile_n: int = Field(ge=1, le=4096)
    source: str = Field(min_length=1)


class _Chip(_Strict):
    value: str = Field(min_length=1, max_length=100)
    source: str = Field(min_length=1)


class _LockstepDevices(_Strict):
    value: int = Field(ge=1, le=1 << 20)
    source: str = Field(min_length=1)


class _ScaleUp(_Strict):
    bandwidth_gb_per_s_per_direction: _Figure
    latency_us: _Latency
    topology: str = ""
    torus_dimensions: _TorusDims | None = None
    one_hop: _OneHop | None = None
    domain: _LockstepDevices | None = None
    """Devices one scale-up fabric joins as the part is sold (72 for a GB200 NVL72 rack), when
    that is more than one host; None: one host's devices."""


class _ScaleOut(_Strict):
    bandwidth_gbit_per_s_per_direction: _Figure


class _Price(_Strict):
    low: float = Field(gt=0, le=MAX_FIGURE)
    high: float = Field(gt=0, le=MAX_FIGURE)
    source: str = Field(min_length=1)
    note: str = ""


class _AltFile(_Strict):
    field: str
    value: float
    source: str = Field(min_length=1)
    note: str = ""


class _PrecisionRule(_Strict):
    value: str = Field(min_length=1, max_length=64)
    """The ``peak_tflops`` entry the model dtype's matmuls run at."""
    source: str = Field(min_length=1)


class _TrainingFormat(_Strict):
    efficiency: float = Field(gt=0, le=1.5)
    """The format's GEMM efficiency relative to the compute dtype's (its fraction of its own peak
    over the BF16 GEMMs' fraction of theirs)."""
    origin: str = Field(min_length=1)


class _DeviceFile(_Strict):
    name: str = Field(pattern=NAME_PATTERN, max_length=200)
    vendor: str
    description: str = ""
    peak_tflops: dict[str, _Figure] = Field(min_length=1)
    precision_rules: dict[Literal["bf16", "fp16", "fp32"], _PrecisionRule] = {}
    """A model compute dtype -> the ``peak_tflops`` entry its matmuls run at, where that is not
    the default (:data:`hardware_profiles.types.DEFAULT_PRECISION`), with its source."""
    training_formats: dict[str, _TrainingFormat] = {}
    """Low-precision training recipes (``ir.precision.RECIPES``) the device's tensor cores run,
    with each one's GEMM efficiency relative to BF16 and its origin."""
    memory_gb: _Figure | None = None
    memory_gib: _Figure | None = None
    memory_bandwidth_gb_per_s: _Figure
    scale_up: _ScaleUp
    scale_out: _ScaleOut
    tdp_w: _Figure
    price_usd_per_device_hour: _Price | None = None
    efficiency: _Efficiencies
    gemm_tiling: _GemmTiling | None = None
    lockstep_devices: _LockstepDevices | None = None
    chip: _Chip | None = None
    alternatives: list[_AltFile] = []


class _IntraLink(_Strict):
    bandwidth_gb_per_s: float = Field(ge=MIN_FIGURE, le=MAX_FIGURE)
    latency_us: float = Field(ge=0, le=MAX_US)
    source: str = ""


class _DefaultLinkFile(_Strict):
    bandwidth_gbit_per_s: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_GBIT)
    bandwidth_gb_per_s: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_FIGURE)
    latency_us: float = Field(ge=0, le=MAX_US)
    source: str = ""


class _MeshFile(_Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)
    device: str = Field(min_length=1, max_length=4096)
    num_devices: int = Field(ge=1, le=MAX_DEVICES)
    axes: dict[str, int] | None = None
    intra_link: _IntraLink | None = None
    price_usd_per_device_hour: float | None = Field(default=None, ge=0, le=MAX_FIGURE)
    power_w_per_device: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_FIGURE)
    host: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=200)
    devices_per_node: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    scale_out_link: _DefaultLinkFile | None = None
    scale_up_domain: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    """Devices of the mesh on one scale-up fabric (a multiple of ``devices_per_node``, which it
    needs); default: one node."""


class _LinkFile(_Strict):
    between: tuple[str, str]
    bandwidth_gbit_per_s: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_GBIT)
    bandwidth_gb_per_s: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_FIGURE)
    latency_us: float = Field(ge=0, le=MAX_US)
    source: str = ""


class _ScaleOutLinkFile(_DefaultLinkFile):
    """A node group's per-device link between nodes: bandwidth optional (the device profile's),
    source required."""

    source: str = Field(min_length=1)


class _GroupFile(_Strict):
    name: str = Field(min_length=1, max_length=200, pattern=NAME_PATTERN)
    device: str = Field(min_length=1, max_length=4096)
    nodes: int = Field(ge=1, le=MAX_NODES)
    devices_per_node: int = Field(ge=1, le=MAX_DEVICES)
    intra_link: _IntraLink | None = None
    scale_out_link: _ScaleOutLinkFile
    price_usd_per_device_hour: float | None = Field(default=None, ge=0, le=MAX_FIGURE)
    power_w_per_device: float | None = Field(default=None, ge=MIN_FIGURE, le=MAX_FIGURE)
    host: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=200)
    description: str = ""
    scale_up_domain: int | None = Field(default=None, ge=1, le=MAX_DEVICES)
    """Devices that share the scale-up fabric (``intra_link``), a multiple of ``devices_per_node``:
    72 for a GB200 NVL72 rack of 18 nodes of 4 GPUs on one NVLink Switch fabric. Default: one node
    (``devices_per_node``), as in a DGX box."""


class _ClusterFile(_Strict):
    name: str | None = Field(default=None, pattern=NAME_PATTERN, max_length=200)
    description: str = ""
    meshes: list[_MeshFile] = Field(default=[], max_length=MAX_MESHES)
    node_groups: list[_GroupFile] = Field(default=[], max_length=64)
    group_links: list[_LinkFile] = []
    links: list[_LinkFile] = []
    default_link: _DefaultLinkFile | None = None
    host_slots: dict[str, int] = {}
    p2p: Literal["overlapped", "blocking"] = "overlapped"
    carve: Literal["auto", "fixed"] = "auto"
    """``fixed``: plan a mesh listing exactly as written; ``auto`` (default): a listing of whole
    nodes of one kind per group is planned as the node groups it describes
    (:func:`hardware_profiles.carve.node_groups_of`)."""
