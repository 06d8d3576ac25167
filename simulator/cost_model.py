"""The cost model: a fragment on a mesh under an SPMD layout -> seconds and bytes.

Everything the planner predicts and the simulator replays is costed here, from a traced
:class:`~ir.LayerCost` and a :class:`~hardware_profiles.types.MeshSpec`.

Formulas (all per device of the mesh; ``b`` = samples of one microbatch, ``d``/``t`` = data/tensor
parallel degrees, so each device holds ``b/d`` samples and ``1/t`` of each weight matrix):

- compute time   = FLOP / (d * t) / (achievable FLOP/s x wave utilisation)   (Megatron tensor
  parallel splits every matmul ``t`` ways: Shoeybi et al. 2019, Narayanan et al. 2021). The wave
  utilisation (:func:`gemm_utilisation`, only for a device whose profile gives ``gemm_tiling``)
  is NVIDIA's tile / wave quantisation (NVIDIA "Matrix Multiplication Background User's Guide",
  sections "Tile Quantization" and "Wave Quantization"): a GEMM's output is cut into tiles, run in
  waves of one tile per SM, and the last wave's idle SMs are lost, so small per-device GEMMs (a
  narrow ``h / t``, few tokens per microbatch) run below the large-matrix rate
- memory time    = (fixed bytes / t + per-sample bytes * b / (d * t)) / achievable bandwidth
- fragment time  = max(compute, memory)  (the roofline, Williams et al. 2009; compute + memory for
  a device whose profile says ``roofline: sum``, i.e. XLA:CPU, where they do not overlap)
  + elementwise time = the profile's ``elementwise_traffic`` x the layer's unfused non-matmul bytes
  / achievable bandwidth (norms, activations, residual adds and the loss run as memory-bound kernels
  between the matmuls on a GPU stream, so they add to the matmul time instead of hiding under it)
  + tensor-parallel all-reduces of the activation over ``t`` devices (ring, ``collectives``)
  + the device's fixed dispatch overhead per fragment
  + a fixed time per layer where the profile measured one (``forward_layer_overhead``,
  ``backward_layer_overhead``: XLA:CPU dispatches a layer's ops one after another), in
  proportion to the layer's primitive ops (``DeviceProfile.layer_fixed_time``)
- transfer time  = link latency + bytes / link bandwidth
- gradient sync  = Megatron-LM's distributed optimizer with ``overlap_grad_reduce`` (Megatron-LM
  ``DistributedDataParallel``: gradients reduce-scattered in buckets while the backward still runs):
  one bucket per layer, a ring reduce-scatter of its fp32 gradients over ``d`` devices on the
  mesh's collective stream, ready once the last microbatch's backward has passed that layer
  (:func:`grad_buckets`); after the optimizer, a ring all-gather of the updated weights in the
  compute dtype (:func:`param_gather_time`). With ``fsdp`` the backward's reduce-scatters already
  sync gradients; with ``hsdp`` replicas their shards are all-reduced across replicas in the
  same buckets (PyTorch HSDP; MaxText's data parallelism across slices over the data-center
  network).
- optimizer step = memory-bound Adam update over the device's shard of optimizer state
- a low-precision recipe (``Workload.precision``, :mod:`ir.precision`) runs a block's GEMMs at
  its format's rate (``DeviceProfile.format_rate``), leaves the attention core and the elementwise
  work at the compute dtype's, reads the weights in the format, and adds the casts of every GEMM
  input (:func:`quantized_elements` x ``Recipe.cast_bytes``) as memory-bound time beside the
  elementwise time; its memory adds the weights' low-precision copies and saves the GEMM inputs
  a forward keeps in the format (:func:`stage_memory`)

Memory per device (mixed-precision Adam with a distributed optimizer, ZeRO stage 1: Rajbhandari et al.
2020, Megatron-LM's ``--use-distributed-optimizer``): weights in the compute dtype and fp32 gradients
replicated over data parallel, fp32 master weights + Adam m and v (12 bytes per parameter, 8 when the
compute dtype is already fp32; less with low-precision state, :func:`optimizer_bytes`) sharded over
data parallel; all of it split ``t`` ways by tensor parallel.
A layout with ``fsdp`` (ZeRO stage 3) shards weights and gradients over data parallel too.
Residuals (activations a forward keeps for its backward) are held per microbatch in flight.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ir import LayerCost, Layout, Workload
from ir.precision import RECIPES, Recipe
from ir.schedule import FragmentKind
from hardware_profiles.collectives import ring_all_reduce as all_reduce_time
from hardware_profiles.collectives import span_collective, span_two_hop_all_to_all
from hardware_profiles.types import DeviceProfile, Link, MeshSpec
from simulator.context_parallel import context_parallel_comm, context_working_bytes

GRAD_BYTES_PER_PARAM = 4.0
"""fp32 gradient accumulation buffer (Megatron-LM mixed precision; Micikevicius et al. 2018)."""

GRAD_BYTES = {"fp32": GRAD_BYTES_PER_PARAM, "bf16": 2.0}
"""Bytes a parameter's gradient takes in the buffer data parallel reduces, by
:attr:`ir.Layout.grad_reduce`."""


def grad_bytes(layout: Layout) -> float:
    """Bytes per parameter of ``layout``'s gradient buffer, held and reduced (:data:`GRAD_BYTES`)."""
    return GRAD_BYTES[layout.grad_reduce]


ADAM_BYTES_PER_PARAM_BF16 = 12.0
"""fp32 master weights + Adam first and second moments (ZeRO paper, Rajbhandari et al. 2020, sec. 3.1)."""

ADAM_BYTES_PER_PARAM_FP32 = 8.0
"""Adam m and v only: an fp32 model's weights are their own master copy."""

ADAM_UPDATE_BYTES_PER_PARAM = 2 * 16.0
"""Bytes an Adam step reads and writes per parameter it owns (master, m, v, grad read; master, m, v,
weight written): about 2 x 16 bytes, memory-bound, with fp32 state (:func:`optimizer_update_bytes`
scales it with the state)."""

OPTIMIZER_STATE_BYTES = {"fp32": ADAM_BYTES_PER_PARAM_BF16, "bf16-moments": 8.0, "bf16": 4.0}
"""Bytes of Adam state per parameter of a bf16 (or fp16) model, by
:attr:`ir.Layout.optimizer_state`: fp32 master + m + v (4 + 4 + 4), fp32 master + bf16 m + v
(4 + 2 + 2), bf16 m + v with the weights as their own master (2 + 2)."""


def optimizer_bytes(layout: Layout, dtype_bytes: int) -> float:
    """Bytes of optimizer state per parameter that data parallel shards under ``layout``
    (:data:`OPTIMIZER_STATE_BYTES`); a model computing in fp32 (``dtype_bytes`` 4) keeps no
    separate master copy: its moments only, 8 bytes in fp32 and 4 in bf16."""
    if dtype_bytes != 2:
        return ADAM_BYTES_PER_PARAM_FP32 if layout.optimizer_state == "fp32" else 4.0
    return OPTIMIZER_STATE_BYTES[layout.optimizer_state]


def optimizer_update_bytes(layout: Layout, dtype_bytes: int) -> float:
    """Bytes an Adam step reads and writes per parameter it owns: :data:`ADAM_UPDATE_BYTES_PER_PARAM`
    in proportion to the state it streams (:func:`optimizer_bytes` against fp32 state's 12)."""
    return (ADAM_UPDATE_BYTES_PER_PARAM * optimizer_bytes(layout, dtype_bytes)
            / ADAM_BYTES_PER_PARAM_BF16)


@functools.lru_cache(maxsize=1 << 16)
def collective(mesh: MeshSpec, op: str, nbytes: float, group: int, stride: int = 1) -> float:
    """Seconds of collective ``op`` (``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``,
    ``"all_to_all"``) of ``nbytes`` per device over ``group`` devices of ``mesh`` spaced
    ``stride`` apart, costed level by level over the fabric the group really crosses
    (:meth:`MeshSpec.collective_span`, :func:`hardware_profiles.collectives.span_collective`:
    NCCL's ring or tree, whichever is faster, for an all-reduce)."""
    if group <= 1 or nbytes <= 0:
        return 0.0
    return span_collective(op, nbytes, mesh.collective_span(group, stride))


def expert_share(cost: LayerCost) -> float:
    """The fraction of a layer's parameters in its experts (0 for a dense layer)."""
    return cost.expert_param_count / cost.param_count if cost.param_count > 0 else 0.0


def held_fraction(cost: LayerCost, layout: Layout) -> float:
    """A device's parameters of a layer under ``layout``, as a fraction of ``1 / tensor`` of
    them (what the dense parameters' tensor split leaves each device): all its dense ones and
    ``tensor / (expert x etp)`` of the experts' (each device holds ``1 / expert`` of the experts,
    split ``etp`` ways: :class:`ir.Layout`); 1 for a dense layer or ``expert == 1``."""
    if layout.expert <= 1:
        return 1.0
    return 1.0 - expert_share(cost) * (1.0 - layout.tensor / (layout.expert * layout.etp))


def expert_alltoall_bytes(cost: LayerCost, per_dev: float, layout: Layout) -> float:
    """Bytes one device sends in one of a layer's expert all-to-alls: the tokens of its
    ``per_dev`` samples, split over tensor parallel as sequence parallelism splits them."""
    return cost.alltoall_bytes_per_sample * per_dev / layout.tensor


def expert_alltoall(cost: LayerCost, kind: str, per_dev: float, mesh: MeshSpec,
                    layout: Layout) -> float:
    """Seconds of a mixture-of-experts layer's token exchange under expert parallelism in one
    fragment of ``kind``: the forward's dispatch and combine all-to-alls over the ``expert``
    devices (stride ``tensor``; each device's ``per_dev`` samples' tokens, split over tensor
    parallel as sequence parallelism splits them), and their two transposes in the backward's
    input gradient (Lepikhin et al. 2021, "GShard", Sec. 3.2). On the critical path: the experts
    wait for the dispatch and the next layer for the combine. The group's stride is the expert
    tensor degree (``layout.etp``: Megatron-Core's expert ranks run ETP innermost, then EP), so
    under MoE parallel folding with ``etp`` 1 an EP group of 8 fills one 8-GPU node. With
    ``layout.expert_dispatch`` ``"deepep"`` each all-to-all runs in two hops
    (:func:`hardware_profiles.collectives.span_two_hop_all_to_all`). 0 for ``W``, a dense layer
    or ``expert == 1``."""
    if layout.expert <= 1 or cost.alltoall_bytes_per_sample <= 0 or kind == FragmentKind.W:
        return 0.0
    nbytes = expert_alltoall_bytes(cost, per_dev, layout)
    if layout.expert_dispatch == "deepep" and cost.experts_per_token >= 1:
        # two hops: once per remote node over RDMA, then NVLink to the experts
        span = mesh.collective_span(layout.expert, layout.etp)
        return 2.0 * span_two_hop_all_to_all(nbytes, span, cost.experts_per_token)
    return 2.0 * collective(mesh, "all_to_all", nbytes, layout.expert, layout.etp)


MOE_TP_SHARE = 0.5
"""The share of a mixture-of-experts block's tensor-parallel traffic that belongs to its MLP:
a Megatron block has two tensor-parallel all-reduces (or all-gather + reduce-scatter pairs with
sequence parallelism) per forward, one after attention and one after the MLP, of the same bytes
(Shoeybi et al. 2019, "Megatron-LM", Sec. 3; Korthikanti et al. 2022, Sec. 4.2.2). Under MoE
parallel folding the MLP's runs over the expert tensor group instead (none with ``etp`` 1: the
tokens stay split as sequence parallelism left them and reach the experts by the all-to-all)."""


def tensor_parallel_comm(cost: LayerCost, mesh: MeshSpec, layout: Layout, nbytes: float) -> float:
    """Seconds of a layer's tensor-parallel all-reduces of ``nbytes`` per device: over the
    ``tensor`` devices, except a folded mixture of experts' MLP share (:data:`MOE_TP_SHARE`),
    which runs over its ``etp`` devices. A shared expert's own all-reduce (Megatron overlaps it
    with the all-to-all, ``--moe-shared-expert-overlap``) is not charged apart."""
    t = layout.tensor
    if t <= 1 and layout.etp <= 1:
        return 0.0
    if not (layout.folded and layout.expert > 1 and cost.experts > 0):
        return collective(mesh, "all_reduce", nbytes, t)
    return (collective(mesh, "all_reduce", nbytes * (1.0 - MOE_TP_SHARE), t)
            + collective(mesh, "all_reduce", nbytes * MOE_TP_SHARE, layout.etp))


def overlaps_tensor_parallel(device: DeviceProfile) -> bool:
    """Whether the stack of ``device`` runs tensor-parallel collectives beside the GEMMs that
    produce and consume them (``Layout.tp_overlap``) by default: on an NVIDIA GPU, where
    Transformer Engine's userbuffers overlap (``tp_comm_overlap``) is on in 25 of NVIDIA's 33 dense
    Megatron-Bridge pre-training recipes at tp > 1 (``src/megatron/bridge/perf_recipes/llama/*/``
    at commit 067f987) and the validation rows that state it fit with it; not on a device that
    overlaps nothing inside a fragment (``roofline`` ``"sum"``) nor on the TPU and other stacks,
    whose rows fit without it; nor on a Volta part (Transformer Engine runs from Ampere on: the
    NVIDIA parts with a bf16 rate)."""
    return (device.vendor == "NVIDIA" and device.roofline != "sum"
            and device.peak_flops.get("bf16", 0.0) > 0)


def overlapped(work: float, comm: float, interference: float) -> float:
    """Seconds of ``work`` seconds of compute with ``comm`` seconds of communication running
    beside it on another stream: ``max(work + interference x min(work, comm), comm)``. The
    communication kernels take SMs and memory bandwidth from the compute for as long as both
    run (``DeviceProfile.comm_interference``; e.g. NCCL's channels each occupy one SM: Rashidi
    et al., "Themis"/"Enabling Compute-Communication Overlap in Distributed Deep Learning
    Training Platforms", ISCA 2021, measure the slow-down of overlapped GEMMs)."""
    return max(work + interference * min(work, comm), comm)


def compute_dtype(workload: Workload) -> str:
    """The precision key of the workload's compute dtype (``"bf16"``, ``"fp16"``, ``"fp32"``):
    ``Workload.dtype``, or from its bytes per element (2: bf16, 4: fp32) where it names none. A
    device runs it at the ``peak_flops`` entry :meth:`DeviceProfile.matmul_precision` names (an
    fp32 model at TF32 on an A100, as JAX does by default; one bfloat16 pass on a TPU)."""
    return workload.dtype or ("bf16" if workload.dtype_bytes == 2 else "fp32")


DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
"""Bytes per element of each compute dtype (:func:`compute_dtype`)."""


def _flops_rate(mesh: MeshSpec, dtype: str) -> float:
    """The achievable matmul FLOP/s of one device of ``mesh`` for ``dtype``: its own rate for the
    precision ``dtype`` runs at (:meth:`DeviceProfile.achievable_flops`); a dtype the device has
    no rate for raises ``ProfileError`` (one line: the device, the dtype and the fix), never a
    stand-in."""
    return mesh.device.achievable_flops(dtype)


def fastest_rate(device: DeviceProfile, workload: Workload) -> float:
    """The fastest FLOP/s any of ``workload``'s FLOP runs at on ``device``: its low-precision
    recipe's GEMM rate where it has one (:meth:`DeviceProfile.format_rate`), else the compute
    dtype's achievable rate. Lower bounds divide FLOP by it (the cost model charges no FLOP
    faster).

    Raises:
        ProfileError: the device does not run the workload's dtype or recipe.
    """
    dtype = compute_dtype(workload)
    rate = device.achievable_flops(dtype)
    low = RECIPES.get(workload.precision or "bf16")
    if low is not None and low.low_precision:
        rate = max(rate, device.format_rate(low.name, dtype))
    return rate


def peak_rate(device: DeviceProfile, workload: Workload) -> float:
    """The dense peak FLOP/s MFU and the roofline bound are measured against: the peak of the
    format ``workload``'s blocks' GEMMs run in (FP8's for an FP8 recipe, FP4's for NVFP4), else the
    compute dtype's (:meth:`DeviceProfile.matmul_peak`), so a plan's MFU never exceeds 1.

    Raises:
        ProfileError: the device has no rate for the workload's dtype.
    """
    peak = device.matmul_peak(compute_dtype(workload))
    low = RECIPES.get(workload.precision or "bf16")
    if low is not None and low.low_precision and low.peak in device.peak_flops:
        peak = max(peak, device.peak_flops[low.peak])
    return peak


def combine_work(compute: float, memory: float, roofline: str = "max") -> float:
    """A fragment's compute and memory seconds combined per its device's ``roofline``:
    ``"max"`` (they overlap: the roofline, Williams et al. 2009) or ``"sum"`` (they do not)."""
    return max(compute, memory) if roofline == "max" else compute + memory


def wave_utilisation(rows: float, cols: float, tiling: tuple[int, int, int]) -> float:
    """The fraction of a device's matmul units a GEMM with a ``rows x cols`` output keeps busy:
    ``tiles / (waves x units)``, ``tiles = ceil(rows / tile_m) x ceil(cols / tile_n)``,
    ``waves = ceil(tiles / units)`` (NVIDIA "Matrix Multiplication Background User's Guide",
    "Wave Quantization"; tile padding of a partial tile is charged the same way). 1 for an empty
    GEMM."""
    units, tm, tn = tiling
    if rows <= 0 or cols <= 0:
        return 1.0
    tiles = math.ceil(rows / tm - 1e-9) * math.ceil(cols / tn - 1e-9)
    return tiles / (math.ceil(tiles / units) * units)


def gemm_utilisation(cost: LayerCost, tokens: float, tensor: int, seq_len: int,
                     dtype_bytes: int, tiling: tuple[int, int, int] | None) -> float:
    """The wave utilisation of one layer's GEMMs on one device (1 = no quantisation loss).

    The layer's shapes come from its own costs: width ``h`` = output bytes per token / dtype
    bytes; its weights (``param_count = h x 2n``) are taken as Megatron's pairs of equal FLOP
    (Shoeybi et al. 2019): a column-parallel GEMM with output ``tokens x n / t`` and a
    row-parallel one with output ``tokens x h``. A training step runs them three times: the
    forward and the input gradient on outputs of those shapes (2/3 of the FLOP), the weight
    gradient on outputs ``h x n / t`` (1/3). The figure is their FLOP-weighted harmonic mean, one
    per layer, so the traced forward / input-gradient / weight-gradient split of a layer (what the
    zero-bubble schedules balance) is kept. ``tokens`` = tokens of the microbatch on one device.
    1 without ``tiling``, ``seq_len`` or a layer width (e.g. a loss head)."""
    if tiling is None or seq_len <= 0 or cost.activation_bytes_per_sample <= 0 or tokens <= 0:
        return 1.0
    h = cost.activation_bytes_per_sample / (seq_len * dtype_bytes)
    if h < 1 or cost.param_count <= 0:
        return 1.0
    return _layer_utilisation(h, cost.param_count / (2.0 * h) / tensor, tokens, tiling)


@functools.lru_cache(maxsize=4096)
def _layer_utilisation(h: float, n: float, tokens: float, tiling: tuple[int, int, int]) -> float:
    """:func:`gemm_utilisation` for width ``h``, per-device column width ``n`` (cached: the
    planner costs the same few shapes many times)."""
    inv_act = (1.0 / wave_utilisation(tokens, n, tiling) + 1.0 / wave_utilisation(tokens, h, tiling)) / 2
    inv_w = 1.0 / wave_utilisation(h, n, tiling)
    return 1.0 / (2.0 / 3.0 * inv_act + 1.0 / 3.0 * inv_w)


def expert_matmul_work(cost: LayerCost, kind: str, per_dev: float, layout: Layout,
                       split_backward: bool = False) -> tuple[float, float]:
    """(FLOP, weight bytes) of a mixture-of-experts layer's routed expert matmuls in one fragment
    of ``kind`` on one device: ``per_dev`` samples' routed rows (FLOP before tensor parallelism
    divides them; :attr:`LayerCost.expert_fwd_flops_per_sample`; the backward twice it, half input
    and half weight gradient) against the expert weights the device holds (``1 / (expert x etp)``
    of them: :class:`ir.Layout`),
    whose weights the forward reads once and the backward reads (input gradient) and writes (weight
    gradient) once each. Their intensity is the tokens each expert gets: at a few hundred tokens
    per expert the weight stream, not the FLOP, sets the time (measured on an H100:
    ``reports/validation/device/README.md``, "Mixture of experts"). (0, 0) for a dense layer."""
    if cost.expert_fwd_flops_per_sample <= 0 or cost.param_count <= 0:
        return 0.0, 0.0
    weights = cost.param_bytes * expert_share(cost) / (layout.expert * layout.etp)
    flops = cost.expert_fwd_flops_per_sample * per_dev
    if kind in (FragmentKind.F, FragmentKind.W) or split_backward:
        return flops, weights
    return 2.0 * flops, 2.0 * weights


def layer_recipe(cost: LayerCost, precision: str) -> Recipe | None:
    """The low-precision recipe ``precision`` names where it applies to ``cost``'s GEMMs (a
    block's, not the embedding's or the LM head's), else None (the compute dtype's GEMMs)."""
    got = RECIPES.get(precision or "bf16")
    return got if got is not None and got.low_precision and cost.low_precision else None


def quantized_elements(cost: LayerCost, seq_len: int, dtype_bytes: int) -> float:
    """Elements one sample's forward casts to a low-precision format before its GEMMs read them
    (the backward casts as many output-gradient elements): the GEMM inputs, ``sum(K)`` per token
    over the layer's linear layers, and what Transformer Engine keeps of them in the format for
    the weight gradient (:func:`low_precision_saving`).

    Dense GEMMs: estimated from their traced FLOP as ``FLOP / (4 h)`` per token (``h`` = the
    layer's width). For a Llama block (fused QKV, output projection, fused gate/up, down:
    ``sum(K) = 3h + ffn``; FLOP per token ``2 (2.5 h^2 + 3 h ffn)`` with 8 KV heads of 32) it gives
    ``1.25 h + 1.5 ffn``: exact at ``ffn = 3.5 h`` (Llama 3 8B: 26,624 both). Routed experts
    (``LayerCost.expert_width`` ``f``): each routed (token, expert) row is quantised for its
    up (or fused gate/up) projection, ``K = h``, and its down projection, ``K = f``:
    ``routed pairs x (h + f)``, exact whatever the experts' width (the FLOP estimate would give
    ``1.5 f`` a row: half the true count for Qwen3-30B-A3B's 768-wide experts at ``h`` 2,048,
    a quarter too many for Grok-1's 32,768 at 6,144). 0 without a width."""
    if seq_len <= 0 or cost.activation_bytes_per_sample <= 0:
        return 0.0
    h = cost.activation_bytes_per_sample / (seq_len * dtype_bytes)
    if h < 1:
        return 0.0
    dense = cost.fwd_flops_per_sample - cost.attention_fwd_flops_per_sample
    routed = 0.0
    if cost.expert_fwd_flops_per_sample > 0 and cost.expert_width > 0 \
            and cost.routed_pairs_per_sample > 0:
        dense -= cost.expert_fwd_flops_per_sample
        routed = cost.routed_pairs_per_sample * (h + cost.expert_width)
    return max(dense, 0.0) / (4.0 * h) + routed


@functools.lru_cache(maxsize=1 << 16)
def layer_time(cost: LayerCost, kind: str, samples: float, mesh: MeshSpec, layout: Layout,
               dtype: str = "bf16", *, split_backward: bool = False, recompute: bool = False,
               seq_len: int = 0, alltoall_hidden: bool = False, precision: str = "") -> float:
    """Seconds one device of ``mesh`` spends on ``kind`` of one layer for a ``samples`` microbatch.

    Args:
        kind: ``"F"``, ``"B"`` (the whole backward, or only the input gradient when
            ``split_backward``) or ``"W"`` (weight gradient).
        samples: samples in the microbatch (the whole mesh's share, before data parallel).
        recompute: full activation recomputation: the B reruns the forward first (Chen et al.
            2016, "Training Deep Nets with Sublinear Memory Cost"; Megatron-LM's full recompute).
        seq_len: tokens per sample (the workload's); with the profile's ``gemm_tiling`` it sizes
            the layer's GEMMs for wave quantisation (:func:`gemm_utilisation`); 0 charges none.
            A forward of one token per device (``samples / data x seq_len <= 1``: a decode step
            of one sequence) is a matrix-vector product: its weights stream at the profile's
            weight-stream rate (:func:`fragment_memory_time`) and a layer with matmuls pays the
            profile's ``decode_layer_overhead`` (its small ops dispatched one by one), as
            :mod:`simulator.serving_cost` charges a decode step. Any other layer with FLOP pays
            the profile's ``forward_layer_overhead`` in a forward and
            ``backward_layer_overhead`` in a backward (split between B and W by their FLOP),
            scaled by the layer's ops over those of the block they were measured on
            (``LayerCost.fwd_ops`` / ``bwd_ops``, ``DeviceProfile.layer_fixed_time``).
            A mixture-of-experts layer pays the profile's ``forward_routing_pair`` (or
            ``backward_routing_pair``, all in the input gradient) for each (token, expert) pair
            of the device's tokens (``LayerCost.routed_pairs_per_sample``), and Megatron-Core's
            dropless all-to-all dispatch (``layout.expert_dispatch`` ``"alltoall"``, which reads
            its counts back to the host) the profile's ``dropless_routing_pair`` per pair on
            top (a third in a forward, the rest in the input gradient).
        precision: the workload's training precision recipe (:mod:`ir.precision`): a block's
            GEMMs (not its attention core) run at ``DeviceProfile.format_rate``, read their
            weights in the format, and its forward (backward) pays the casts of its GEMM inputs
            (output gradients): :func:`quantized_elements` x ``cast_bytes`` at the achievable
            bandwidth. ``""`` or ``"bf16"``: the compute dtype's GEMMs.
        alltoall_hidden: a schedule that runs a mixture of experts' all-to-alls under another
            microbatch's compute (``ScheduleKind.hides_alltoall``: DualPipe): the expert-parallel
            all-to-all (:func:`expert_alltoall`) is overlapped with the layer's work, slowed by the
            device's ``comm_interference``, instead of added to it.

    With ``layout.fsdp`` (ZeRO-3, Rajbhandari et al. 2020; PyTorch FSDP, Zhao et al. 2023) a
    forward all-gathers the layer's parameters over the data axis and a backward gathers them again
    and reduce-scatters the fp32 gradients (the W does the reduce-scatter when the backward is
    split); prefetching overlaps that traffic with compute, so the layer takes the longer of the two
    (on a device whose ``roofline`` is ``"sum"``, which overlaps nothing inside a fragment, the sum).

    No dispatch overhead is included (see :func:`fragment_overhead`). Memoised: the planner
    costs the same few (layer, mesh, layout, microbatch) combinations many times; every argument
    is immutable.
    """
    d, t = layout.data, layout.tensor
    # each device holds 1/data of the samples and, under context parallelism, 1/context of each
    # one's tokens: every token-local term scales with the share (the attention core's too, by
    # the causal zig-zag split); the exchange is context_parallel_comm
    per_dev = samples / (d * layout.context)
    util = gemm_utilisation(cost, per_dev * seq_len, t, seq_len, DTYPE_BYTES.get(dtype, 2),
                            mesh.device.gemm_tiling)
    dev = mesh.device
    if kind == FragmentKind.F:
        flops = cost.fwd_flops_per_sample * per_dev
        attention = cost.attention_fwd_flops_per_sample * per_dev
        attention_rate = dev.attention_rate(seq_len, kernel=cost.attention_kernel)
        fixed, varying = cost.fwd_bytes_fixed, cost.fwd_bytes_per_sample * per_dev
        tp_bytes = cost.tp_allreduce_bytes_per_sample * per_dev
        other = cost.fwd_other_bytes_per_sample
    elif kind == FragmentKind.B or kind == FragmentKind.W:
        bwd = cost.bwd_flops_per_sample
        part = (cost.bwd_input_flops_per_sample if kind == FragmentKind.B
                else bwd - cost.bwd_input_flops_per_sample)
        share = ((part / bwd if bwd > 0 else 0.0) if split_backward or kind == FragmentKind.W
                 else 1.0)
        flops = bwd * share * per_dev
        # the attention core is all input gradient (B): none of it in a W
        attention = cost.attention_bwd_flops_per_sample * per_dev if kind == FragmentKind.B else 0.0
        attention_rate = dev.attention_rate(seq_len, backward=True, kernel=cost.attention_kernel)
        fixed, varying = cost.bwd_bytes_fixed * share, cost.bwd_bytes_per_sample * per_dev * share
        tp_bytes = cost.tp_allreduce_bytes_per_sample * per_dev if kind == FragmentKind.B else 0.0
        x, total = cost.bwd_input_other_bytes_per_sample, cost.bwd_other_bytes_per_sample
        other = ((x if kind == FragmentKind.B else total - x)
                 if split_backward or kind == FragmentKind.W else total)
    else:
        raise ValueError(f"unknown fragment kind {kind!r}; use F, B or W")
    if layout.expert > 1:       # a device reads only the experts it holds
        fixed *= held_fraction(cost, layout)
    gemm = _flops_rate(mesh, dtype)
    low = layer_recipe(cost, precision)
    weight_scale, cast = 1.0, 0.0
    if low is not None:
        weight_scale = low.saved_bytes_per_element / DTYPE_BYTES.get(dtype, 2)
        fixed *= weight_scale     # the weights read in the format
        if kind != FragmentKind.W:
            cast = (quantized_elements(cost, seq_len, DTYPE_BYTES.get(dtype, 2)) * per_dev / t
                    * low.cast_bytes / dev.achievable_bandwidth)
    rate = ((dev.format_rate(low.name, dtype) if low is not None else gemm)
            * (1.0 if kind == FragmentKind.F else dev.backward_efficiency))
    # the attention core's FLOP run at the fused kernel's own rate (relative to the GEMMs')
    compute = ((flops - attention) / util / rate + attention / (gemm * attention_rate)) / t
    tokens = per_dev * seq_len if kind == FragmentKind.F else 0.0   # a backward is never matrix-vector
    memory = fragment_memory_time(fixed / t, varying / t, mesh.device, tokens)
    elementwise = (mesh.device.elementwise_traffic * other * per_dev / t
                   / mesh.device.achievable_bandwidth)
    comm = tensor_parallel_comm(cost, mesh, layout, tp_bytes)
    context = 0.0
    if layout.context > 1:
        attention_s = (0.0 if dev.roofline == "sum"
                       else attention / (gemm * attention_rate) / t)
        context = context_parallel_comm(cost, kind, per_dev, mesh, layout, attention_s,
                                        dev.comm_interference)
    if layout.tp_overlap and mesh.device.roofline != "sum":
        # the tensor-parallel traffic runs beside the GEMMs (decomposed collective matmuls)
        compute, comm = overlapped(compute, comm, mesh.device.comm_interference), 0.0
    shard = 0.0
    if layout.fsdp and layout.shard > 1:
        gather, scatter = fsdp_traffic(cost, mesh, layout)
        by_kind: dict[str, float] = {FragmentKind.F: gather, FragmentKind.W: scatter}
        shard = by_kind.get(kind, gather + (0.0 if split_backward else scatter))
    if cost.expert_fwd_flops_per_sample > 0 and mesh.device.roofline == "max":
        # the routed experts' matmuls are kernels of their own intensity: their own roofline
        e_flops, e_bytes = expert_matmul_work(cost, kind, per_dev, layout, split_backward)
        e_compute = e_flops / util / rate / t
        e_memory = fragment_memory_time(e_bytes * weight_scale, 0.0, dev, tokens)
        work = (max(compute - e_compute, max(memory - e_memory, 0.0))
                + max(e_compute, e_memory))
    else:
        work = combine_work(compute, memory, mesh.device.roofline)
    # prefetching overlaps FSDP's gathers with compute (slowed by the collectives beside it);
    # a device that overlaps nothing inside a fragment (roofline "sum": XLA:CPU runs a
    # fragment's ops one after another) adds them
    a2a = expert_alltoall(cost, kind, per_dev, mesh, layout)
    body = ((work + shard if mesh.device.roofline == "sum"
             else overlapped(work, shard, mesh.device.comm_interference))
            + elementwise + cast + comm + context)
    if alltoall_hidden and a2a > 0 and mesh.device.roofline != "sum":
        body = overlapped(body, a2a, mesh.device.comm_interference)
    else:
        body += a2a
    if cost.routed_pairs_per_sample > 0 and kind != FragmentKind.W:
        # a fixed time per routed (token, expert) pair: the token path's per-row work (router
        # top-k, sort, index and permute launches, padding), fitted per GPU kind beside the
        # per-element term (token_path_time); on XLA:CPU the row-by-row gathers, measured
        pair = (dev.forward_routing_pair if kind == FragmentKind.F else dev.backward_routing_pair)
        if layout.expert_dispatch == "alltoall":
            # a host-synchronised dropless dispatch (DeviceProfile.dropless_routing_pair)
            pair += dev.dropless_routing_pair * (
                TOKEN_PATH_FORWARD_SHARE if kind == FragmentKind.F
                else 1.0 - TOKEN_PATH_FORWARD_SHARE)
        body += cost.routed_pairs_per_sample * per_dev / t * pair
    body += token_path_time(cost, kind, per_dev / t, dev, DTYPE_BYTES.get(dtype, 2))
    if 0 < tokens <= 1 and flops > 0:
        # a decode step's layer: its small ops dispatched one by one (serving_cost charges the same)
        body += mesh.device.decode_layer_overhead or 0.0
    elif flops > 0:
        # the layer's ops dispatched one after another, each at a fixed cost (measured: XLA:CPU)
        # (in proportion to the layer's ops: DeviceProfile.layer_fixed_time)
        body += (mesh.device.layer_fixed_time(FragmentKind.F, cost.fwd_ops)
                 if kind == FragmentKind.F
                 else mesh.device.layer_fixed_time(FragmentKind.B, cost.bwd_ops) * share)
    if recompute and kind == FragmentKind.B:
        return body + layer_time(cost, FragmentKind.F, samples, mesh, layout, dtype,
                                 seq_len=seq_len, alltoall_hidden=alltoall_hidden,
                                 precision=precision)
    return body


TOKEN_PATH_FORWARD_SHARE = 1.0 / 3.0
"""The forward's share of a mixture-of-experts layer's token-path time
(:func:`token_path_time`): the forward routes each token's rows once (permute, dispatch, combine,
unpermute), the backward's input gradient runs the same path in reverse and adds the gradient of
the gating weights on every routed row (Lepikhin et al. 2021, "GShard", Sec. 3.2: the backward's
all-to-alls are the forward's transposes), so the backward takes twice the forward's share, as its
matmuls do."""


def token_path_time(cost: LayerCost, kind: str, samples: float, device: DeviceProfile,
                    dtype_bytes: int) -> float:
    """Seconds one device spends on a mixture-of-experts layer's token path in one fragment of
    ``kind`` beyond what its bytes, FLOP and all-to-alls already cost: ``samples`` (the device's
    share of the microbatch, after data, context and tensor parallelism) x the (token, expert,
    hidden) elements one sample routes (``LayerCost.alltoall_bytes_per_sample / dtype_bytes``:
    ``seq x top_k x h x capacity factor``) x ``device.routed_element`` (seconds per routed
    element, forward and backward together, fitted per device kind on published MoE runs by
    ``mpmd validate --fit-moe``), the forward's share :data:`TOKEN_PATH_FORWARD_SHARE` and the
    backward's the rest (all of it in the input gradient ``B``; none in a ``W``).

    What it stands for, per routed element: the permutations into the experts' slots and back,
    the all-to-all's achieved bandwidth below the fabric's, the dispatcher's sort and padding, the
    FP8 quantisation of the dispatched rows and the host synchronisation a dropless dispatcher
    makes to size its all-to-all (Megatron-Core's ``MoEAlltoAllTokenDispatcher``); its scaling with
    ``top_k x h`` is what the published runs support (NVIDIA, "Scalable Training of
    Mixture-of-Experts Models with Megatron Core", arXiv:2603.07685, 2026, Sec. 1: all-to-all
    communication 20-60% of MoE training time). 0 for a dense layer, a ``W`` or a profile without
    the figure.

    The token path's second term, a fixed time per routed (token, expert) pair whatever the
    hidden size, is charged by :func:`layer_time` (``LayerCost.routed_pairs_per_sample`` x the
    device's share x ``DeviceProfile.forward_routing_pair``, or ``backward_routing_pair`` in the
    input gradient, a third and two thirds of the pair's time as here). Per-element only, one
    figure per kind over-charged the large-hidden models (DeepSeek-V3 and Qwen3-235B, hidden
    7,168 and 4,096: predicted 15-35% slow) and under-charged the small ones (Qwen3-30B-A3B,
    gpt-oss-120b, hidden 2,048 and 2,880: up to 55% fast): per element a pair costs ``h`` times
    the element's figure, while the router, the sort and the permutation launches cost the same
    per row at any width. Fitted by ``mpmd validate --fit-moe`` (both figures per kind,
    :func:`simulator.token_path_fit.fit_token_path`) on the 54 MoE rows of the published-training
    CSV on 2026-11-28: the mean of the kinds' leave-one-source-out MAPEs (each source fitted on the
    others) fell from 18.6% (per element only) to 13.8% on the rows' linear models (H100 10.1 ->
    10.5, GB200 18.9 -> 9.9, B200 41.0 -> 29.9; GB300 has one source); a per-peer all-to-all latency
    (small messages below the link rate) and a hidden share on interleaved schedules were tried
    the same way and lowered it less (18.7% and 15.5%)."""
    if device.routed_element <= 0 or cost.alltoall_bytes_per_sample <= 0 \
            or kind == FragmentKind.W:
        return 0.0
    share = TOKEN_PATH_FORWARD_SHARE if kind == FragmentKind.F else 1.0 - TOKEN_PATH_FORWARD_SHARE
    return cost.alltoall_bytes_per_sample / dtype_bytes * samples * device.routed_element * share


def fragment_memory_time(fixed_bytes: float, varying_bytes: float, device: DeviceProfile,
                         tokens: float) -> float:
    """Seconds one device spends moving a fragment's bytes: the part that does not grow with the
    microbatch (the weights its matmuls stream, and their gradients) at
    ``device.weight_bandwidth(tokens)`` and the rest (activations) at
    ``device.achievable_bandwidth``. ``tokens``: the fragment's tokens per device (0 when the
    caller does not know them: then both at the achievable bandwidth). The two rates differ only
    for a matrix-vector product (one token per device) on a profile that measured one
    (``DeviceProfile.weight_stream_efficiency``: XLA:CPU)."""
    return (fixed_bytes / device.weight_bandwidth(tokens)
            + varying_bytes / device.achievable_bandwidth)


def fsdp_traffic(cost: LayerCost, mesh: MeshSpec, layout: Layout) -> tuple[float, float]:
    """(all-gather, reduce-scatter) seconds of one layer under FSDP (ZeRO-3) on ``mesh``: the
    gather of its compute-dtype parameters and the reduce-scatter of its gradients (fp32, or
    bf16 by ``layout.grad_reduce``) over
    the ``layout.shard`` devices of a shard group (stride = the tensor degree), each device
    holding ``1 / tensor`` of the layer. Under expert parallelism the experts' part is gathered
    and scattered instead over each expert shard's ``expert_data`` replicas (stride ``expert x
    etp``), a device gathering only the experts it runs (Megatron-FSDP beside EP). (0, 0)
    without fsdp."""
    g, t = layout.shard, layout.tensor
    if not layout.fsdp or g <= 1:
        return 0.0, 0.0
    share = expert_share(cost) if layout.expert > 1 else 0.0
    gather = collective(mesh, "all_gather", cost.param_bytes * (1 - share) / t, g, t)
    scatter = collective(mesh, "reduce_scatter",
                         cost.param_count * (1 - share) * grad_bytes(layout) / t, g, t)
    if share > 0 and layout.expert_data > 1:
        k = layout.expert * layout.etp
        gather += collective(mesh, "all_gather", cost.param_bytes * share / k, layout.expert_data, k)
        scatter += collective(mesh, "reduce_scatter",
                              cost.param_count * share * grad_bytes(layout) / k,
                              layout.expert_data, k)
    return gather, scatter


def fsdp_exposed(workload: Workload, first: int, last: int, kind: str, mesh: MeshSpec,
                 layout: Layout, split_backward: bool = False) -> float:
    """Seconds of FSDP traffic that no prefetch can hide in one fragment over layers
    ``[first, last)``: FSDP prefetches the next layer's gather while the current layer computes
    (PyTorch FSDP's ``forward_prefetch`` / ``backward_prefetch=BACKWARD_PRE``, FSDP2's implicit
    one-layer prefetch: Zhao et al., "PyTorch FSDP", VLDB 2023, sec. 3.3), so the steady state is
    the per-layer overlap :func:`layer_time` charges, but the fragment's first gather has no
    compute before it and its last reduce-scatter none after it:

    - ``F``: the first layer's gather;
    - ``B``: the gather of the last layer (the backward runs last to first) and, unless the
      backward is split, the reduce-scatter of the first;
    - ``W`` (split backward): the reduce-scatter of the first layer.

    0 without fsdp, or on a device whose ``roofline`` is ``"sum"`` (it already adds every
    gather and scatter)."""
    if not layout.fsdp or layout.shard <= 1 or mesh.device.roofline == "sum" or last <= first:
        return 0.0
    with_params = [i for i in range(first, last) if workload.layer(i).param_count > 0]
    if not with_params:
        return 0.0
    head, tail = workload.layer(with_params[0]), workload.layer(with_params[-1])
    if kind == FragmentKind.F:
        return fsdp_traffic(head, mesh, layout)[0]
    if kind == FragmentKind.B:
        return fsdp_traffic(tail, mesh, layout)[0] + (0.0 if split_backward
                                                      else fsdp_traffic(head, mesh, layout)[1])
    if kind == FragmentKind.W:
        return fsdp_traffic(head, mesh, layout)[1]
    raise ValueError(f"unknown fragment kind {kind!r}; use F, B or W")


def fragment_overhead(mesh: MeshSpec) -> float:
    """Fixed dispatch cost of launching one fragment on ``mesh``, seconds (profile data)."""
    return mesh.device.fragment_overhead


def transfer_time(nbytes: float, link: Link) -> float:
    """Seconds to move ``nbytes`` over ``link``: latency + bytes / bandwidth."""
    return link.latency + nbytes / link.bandwidth if nbytes > 0 else 0.0


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Per-device bytes of a stage: static (weights, grads, optimizer), residuals per microbatch,
    the largest activation of one microbatch, (fsdp) the gathered parameters of one layer, and
    the loss's copies of one microbatch's logits (a stage with the training head)."""

    static_bytes: float
    residual_bytes_per_microbatch: float
    activation_bytes_per_microbatch: float
    gathered_bytes: float = 0.0
    loss_bytes: float = 0.0

    @property
    def working_bytes(self) -> float:
        """Transient bytes while a fragment runs: its input and output activations, with fsdp two
        gathered layers (the one in use and the one prefetched), and the loss's working set."""
        return (2 * self.activation_bytes_per_microbatch + 2 * self.gathered_bytes
                + self.loss_bytes)


def stage_memory(workload: Workload, first: int, last: int, layout: Layout, samples: float,
                 recompute: bool = False) -> StageMemory:
    """Per-device memory of layers ``[first, last)`` on a mesh with ``layout``.

    ``samples`` is the microbatch size (the whole mesh's share). The activation term is the
    stage's working set while a fragment runs: its largest layer output, for one microbatch.
    With ``recompute`` a forward keeps only each block's input, split over tensor parallel as
    sequence parallelism does (Korthikanti et al. 2022); a loss head keeps its residuals (full
    recomputation wraps the blocks: Megatron-Core's ``recompute_granularity=full``, torchtitan's
    ``apply_ac``), its logits kept as ``Workload.cross_entropy`` keeps them
    (``LayerCost.logits_per_sample`` x ``Workload.loss_kept_bytes_per_logit``), and while the loss
    runs its working set holds the extra copies it makes
    (``Workload.loss_working_bytes_per_logit``), split over tensor parallel like the
    vocab-parallel logits. A layer's ``LayerCost.host_offload``
    share of what it keeps (its residuals, or that input) waits in host memory instead (activation
    offloading). Under context parallelism a device holds
    ``1 / context`` of each sample's tokens (residuals and activations divided by it, the
    optimizer state sharded over ``data x context``: :attr:`ir.Layout.replicas`), and the
    exchange's transient keys and values join the working set (:func:`context_working_bytes`).
    """
    d, t = layout.replicas, layout.tensor
    params = sum(workload.layer(i).param_count for i in range(first, last))
    weight_bytes = sum(workload.layer(i).param_bytes for i in range(first, last))
    if workload.training:
        adam = optimizer_bytes(layout, workload.dtype_bytes)
        if layout.fsdp:
            static = (weight_bytes + params * (grad_bytes(layout) + adam)) / layout.shard / t
        else:
            # expert parallelism: a device holds 1/expert of the experts (weights, gradients);
            # their optimizer state is split over the data axis as the dense state is
            layers = [workload.layer(i) for i in range(first, last)]
            held_params = sum(c.param_count * held_fraction(c, layout) for c in layers)
            held_bytes = sum(c.param_bytes * held_fraction(c, layout) for c in layers)
            static = (held_bytes + held_params * grad_bytes(layout) + params * adam / d) / t
        # full recomputation reruns the blocks; a loss head keeps what it saves, its logits in
        # the form the workload's cross-entropy keeps them
        per_layer = [(workload.layer(i - 1).activation_bytes_per_sample if i > 0 else 0.0)
                     if recompute and not workload.layer(i).logits_per_sample
                     else workload.layer(i).residual_bytes_per_sample
                     + workload.layer(i).logits_per_sample * workload.loss_kept_bytes_per_logit
                     for i in range(first, last)]
        static += low_precision_weight_bytes(workload, first, last, layout)
        if not recompute:
            per_layer = [r - low_precision_saving(workload, i) for r, i in
                         zip(per_layer, range(first, last))]
        # what a layer keeps in host memory until its backward is not on the device
        per_layer = [r * (1.0 - workload.layer(i).host_offload) for r, i in
                     zip(per_layer, range(first, last))]
        resid = sum(per_layer) * samples / d / t
    else:
        static = weight_bytes / t
        resid = 0.0
    act = max(workload.layer(i).activation_bytes_per_sample for i in range(first, last)) * samples / d
    # the loss's copies of the logits, split like them (vocab-parallel over tensor parallel)
    loss = (max(workload.layer(i).logits_per_sample for i in range(first, last))
            * workload.loss_working_bytes_per_logit * samples / d / t) if workload.training else 0.0
    if layout.context > 1:
        act += max(context_working_bytes(workload.layer(i), samples / d, layout)
                   for i in range(first, last))
    gathered = (max(workload.layer(i).param_bytes * held_fraction(workload.layer(i), layout)
                    for i in range(first, last)) / t
                if layout.fsdp and workload.training else 0.0)
    return StageMemory(static, resid, act, gathered, loss)


def low_precision_weight_bytes(workload: Workload, first: int, last: int,
                               layout: Layout) -> float:
    """Per-device bytes the low-precision weight copies of layers ``[first, last)`` add to (or,
    negative, save on) the compute-dtype weights: a recipe keeps ``Recipe.weight_copies`` copies
    in its format (scales included; Transformer Engine's FP8 weight and its transpose) in place
    of the compute-dtype copy, as Megatron-Core's ``--fp8-param-gather`` (set by NeMo's FP8
    mixed-precision recipes) does; the fp32 master weights stay with the optimizer. Split like the
    weights (tensor, expert and, with ``fsdp``, data parallel). 0 without a recipe."""
    total = 0.0
    for i in range(first, last):
        c = workload.layer(i)
        low = layer_recipe(c, workload.precision)
        if low is not None:     # fsdp shards every parameter, the experts' too, over its devices
            total += c.param_count * (1.0 if layout.fsdp else held_fraction(c, layout)) * (
                low.weight_copies * low.saved_bytes_per_element - workload.dtype_bytes)
    return total / layout.tensor / (layout.shard if layout.fsdp else 1)


def low_precision_saving(workload: Workload, i: int) -> float:
    """Residual bytes per sample layer ``i`` saves when a recipe keeps its GEMM inputs for the
    weight gradient in the format (:func:`quantized_elements` x (compute-dtype bytes - the
    format's bytes per element)), at most half the layer's residuals (the rest, attention and
    norm inputs, stay in the compute dtype). 0 without a low-precision recipe, and where the
    workload's GEMMs keep their compute-dtype inputs (``Workload.saved_inputs`` ``"compute"``)."""
    c = workload.layer(i)
    low = layer_recipe(c, workload.precision)
    if low is None or workload.saved_inputs == "compute":
        return 0.0
    saved = quantized_elements(c, workload.seq_len, workload.dtype_bytes) * (
        workload.dtype_bytes - low.saved_bytes_per_element)
    return min(max(saved, 0.0), c.residual_bytes_per_sample / 2)


def _sync_op(layout: Layout) -> str | None:
    """The data-parallel gradient collective of a layout: ``"reduce_scatter"`` (distributed
    optimizer over ``data x context``), ``"all_reduce"`` (HSDP replicas) or None (nothing to
    sync)."""
    if layout.fsdp:
        return "all_reduce" if layout.hsdp > 1 else None
    # under MoE parallel folding an expert shard can have replicas with no data parallel
    return ("reduce_scatter" if layout.replicas > 1 or (layout.expert > 1 and layout.expert_data > 1)
            else None)


def layer_grad_sync(cost: LayerCost, mesh: MeshSpec, layout: Layout) -> tuple[str, float, float] | None:
    """(collective, per-device bytes, seconds) that syncs one layer's gradients across data
    parallel, or None: a ring reduce-scatter of the gradients (``layout.grad_reduce``: fp32 or
    bf16) over ``data x context`` (ZeRO-1;
    the context ranks hold the same parameters: Megatron-Core reduces over its data-parallel
    group with context parallel), or with
    ``hsdp`` a ring all-reduce of the device's gradient shard over the replicas (stride
    ``shard x tensor``: across slices / nodes)."""
    op = _sync_op(layout)
    if op is None or cost.param_count == 0:
        return None
    t = layout.tensor
    if op == "reduce_scatter":
        e = layout.expert
        experts = cost.expert_param_count if e > 1 else 0
        nbytes = (cost.param_count - experts) * grad_bytes(layout) / t
        seconds = collective(mesh, op, nbytes, layout.replicas, t)
        if experts:   # each expert shard over the replicas that hold it (stride expert x etp)
            local = experts * grad_bytes(layout) / (e * layout.etp)
            seconds += collective(mesh, op, local, layout.expert_data, e * layout.etp)
            nbytes += local
        return op, nbytes, seconds
    g = layout.shard
    nbytes = cost.param_count * grad_bytes(layout) / t / g
    return op, nbytes, collective(mesh, op, nbytes, layout.hsdp, g * t)


def grad_sync_time(workload: Workload, first: int, last: int, mesh: MeshSpec, layout: Layout
                   ) -> float:
    """Seconds of the data-parallel gradient sync of layers ``[first, last)`` if nothing hid it:
    the sum of :func:`layer_grad_sync` over the layers (one bucket per layer) plus the parameter
    all-gather after the optimizer (:func:`param_gather_time`)."""
    if not workload.training:
        return 0.0
    total = 0.0
    for i in range(first, last):
        x = layer_grad_sync(workload.layer(i), mesh, layout)
        total += x[2] if x else 0.0
    return total + param_gather_time(workload, first, last, mesh, layout)


def param_gather_time(workload: Workload, first: int, last: int, mesh: MeshSpec, layout: Layout
                      ) -> float:
    """The distributed optimizer's all-gather of updated weights (compute dtype) over ``data``
    after the optimizer step, seconds (ring over ``data x context``; 0 with fsdp, whose forward
    gathers them, and for a single replica). Megatron-LM's ``overlap_param_gather`` hides it behind the next step's
    forward, which one step's replay does not show; it is charged in full."""
    if not workload.training or layout.fsdp or (layout.replicas <= 1 and layout.expert_data <= 1):
        return 0.0
    e, t = layout.expert, layout.tensor
    layers = [workload.layer(i) for i in range(first, last)]
    expert = sum(c.param_bytes * expert_share(c) for c in layers) if e > 1 else 0.0
    dense = sum(c.param_bytes for c in layers) - expert
    out = collective(mesh, "all_gather", dense / t, layout.replicas, t)
    if expert > 0:
        out += collective(mesh, "all_gather", expert / (e * layout.etp), layout.expert_data,
                          e * layout.etp)
    return out


def optimizer_time(workload: Workload, first: int, last: int, mesh: MeshSpec, layout: Layout
                   ) -> float:
    """Adam step over the device's shard of layers ``[first, last)``, memory-bound, seconds."""
    if not workload.training:
        return 0.0
    params = sum(workload.layer(i).param_count for i in range(first, last))
    owned = params / ((layout.shard if layout.fsdp else layout.replicas) * layout.tensor)
    return (owned * optimizer_update_bytes(layout, workload.dtype_bytes)
            / mesh.device.achievable_bandwidth)


def usable_bytes(mesh: MeshSpec, headroom: float) -> float:
    """Per-device memory a plan may use: capacity x (1 - headroom)."""
    return mesh.device.memory_bytes * (1.0 - headroom)
