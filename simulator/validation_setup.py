"""Validation setups: a published row -> the workload, cluster and plan it is simulated as.

Rows and their metrics are :mod:`simulator.validation_rows`. A blank field gets one practitioner's
rule (:data:`RULES`), printed with the row as an assumption.

Layering: the simulator may not import ``compiler`` beyond its IR, so the workload is built by a
callable the caller passes in (``workload_fn(row) -> Workload``; the CLI builds the row's decoder
through the model zoo). Everything here is a pure function of its inputs.

Cluster (synthetic, per row): ``pp`` meshes ``stage0..stage{pp-1}`` of ``tp*dp`` devices of the
row's device each, axes ``{data: dp, tensor: tp}``, placed in Megatron's rank order (tensor
innermost, then data, then pipeline) on nodes of ``devices_per_node`` devices (the scale-up
fabric inside: NVLink/NVSwitch, or a TPU slice's ICI torus), joined by the scale-out network at
``scale_out_gbit_per_device`` (blank: the device profile's NIC / data-center-network figure). A
link between two pipeline meshes is the scale-up fabric when both lie in one node, else the
scale-out network; its bandwidth is aggregate: every device of the mesh sends its slice of the
activation (Megatron's scatter/gather optimisation, Narayanan et al. Sec. 4.1, and sequence
parallelism split it over tensor parallel). Point-to-point transfers are blocking
(``Cluster.p2p = "blocking"``): Megatron-LM's pipeline schedules wait for each send/receive before
the next compute (``p2p_communication._communicate``; Qi et al.'s runs pass
``--no-overlap-p2p-communication``), so the sending and the receiving stage's compute streams are
both held for the transfer. A row whose devices ran under a power cap (``power_limit_w``, or a cap its
note states) gets the profile with its peak rates scaled to the capped clock (:func:`power_capped`):
the cap belongs to the row's hosts, not to the device kind, so the profile stays right for a
device at its TDP. Likewise a run in PyTorch eager mode (``eager``, or "eager" in its note) moves
every unfused non-matmul op's traffic (elementwise traffic 1) whatever the profile's fitted
fraction, which describes a compiled / fused-kernel stack. Layout: ``Layout(dp, tp)``, with ``fsdp`` when the row says so and, across
``slices`` > 1, hybrid sharding (each slice shards, slices all-reduce: MaxText's
``dcn_data_parallelism``).

Context parallelism (``cp``) is the layout's ``context`` degree (:class:`ir.Layout`: each
sequence split ``cp`` ways, ``dp`` excluding it) with Megatron-Core's default exchange, the ring
(``--cp-comm-type p2p``); each pipeline runs ``global_batch / (micro_batch x dp)`` microbatches,
as Megatron does. A published
``vp`` fixes the interleaved chunk count (never tuned); a published ``pipeline_layout``
(Megatron-Core's layout string, :mod:`simulator.pipeline_layout`) fixes which blocks each stage
holds, and without one NVIDIA's recipes' split is used (:func:`stage_blocks`). Expert parallelism (``ep``, ``etp``) is the
layout's ``expert`` and ``expert_tensor`` degrees (Megatron-Core's MoE parallel folding: EP x ETP
over the dp x cp x tp devices, :class:`ir.Layout`); a layout the devices cannot hold (``ep x
etp`` not dividing ``dp x cp x tp``) or ``ep`` with ``fsdp`` skips the row
(:func:`expert_problem`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Callable

from ir import LayerCost, Layout, Plan, StagePlan, Workload
from ir.workload import causal_fraction, keep_blocks_in_compute_dtype
from hardware_profiles.types import Cluster, DeviceProfile, InterMeshLink, Link, MeshSpec
from simulator import remat
from simulator.cost_model import overlaps_tensor_parallel
from simulator.pipeline_layout import LayoutError, parse_layout, recipe_split, split_summary
from simulator.schedules import generate
from simulator.validation_rows import (DEFAULT_VOCAB, DEVICES_PER_NODE, INTERLEAVED, SCHEDULE_MAP, Row,
                                       ValidationError)


SCALE_OUT_LATENCY_S = 5e-6
"""Per-message latency of the scale-out network (InfiniBand / RoCE / data-center network): an
estimate (a few us for RDMA send/recv through one switch tier, NCCL inter-node small-message
figures), not a datasheet number."""

LAYERS_PER_CHUNK_MAX = 4
"""Interleaved 1F1B with no published chunk count and no step function to tune it with
(:func:`row_setup` without ``step_fn``): one layer per chunk when a rank holds at most this many
layers (Megatron-LM's ``--num-layers-per-virtual-pipeline-stage 1``, the finest interleaving), else
2 chunks per rank (Narayanan et al. 2021, Sec. 2.2's example). With a step function the count is
tuned instead (:func:`tune_virtual_stages`)."""


def virtual_stage_candidates(row: Row) -> list[int]:
    """Chunk counts ``v`` a practitioner would try for ``row``'s interleaved schedule: every
    ``v >= 2`` that divides the layers of a rank (``ceil(layers / pp)``) evenly, as Megatron-LM's
    ``--num-layers-per-virtual-pipeline-stage`` requires, and whose ``pp x v`` stages the layers
    can fill (:func:`simulator.pipeline_layout.recipe_split`: 61 blocks on 16 ranks take v 2, not
    4); ``[2]`` when none does."""
    per_rank = -(-row.layers // row.pp)
    return [v for v in range(2, per_rank + 1)
            if per_rank % v == 0 and split_fits(row.layers, row.pp * v)] or [2]


def split_fits(blocks: int, stages: int) -> bool:
    """Whether ``blocks`` decoder blocks fill ``stages`` stages by the recipes' split (no stage
    left without a block, embedding or head: :func:`simulator.pipeline_layout.recipe_split`)."""
    try:
        recipe_split(blocks, stages)
    except LayoutError:
        return False
    return True


RULES = {
    "vocab": f"{DEFAULT_VOCAB} (Megatron-LM's padded GPT-2 vocabulary)",
    "ffn": "4 x hidden",
    "kv_heads": "heads (multi-head attention)",
    "head_dim": "hidden / heads",
    "glu": "0 (a GeLU MLP, GPT-style: LayerNorm, biases, learned positions)",
    "fsdp": "0 (replicated weights; ZeRO-1 distributed optimizer)",
    "recompute": "none",
    "slices": "1",
    "devices_per_node": f"gpus / slices when slices are given, else the device profile's "
                        f"scale-up domain (72 on a GB200 NVL72 rack), else {DEVICES_PER_NODE}",
    "scale_up_domain": "devices_per_node (one host's NVLink / ICI fabric)",
    "scale_out_gbit_per_device": "the device profile's scale-out figure",
    "memory_bandwidth_gb_per_s": "the device profile's (the row's part is the profile's part)",
    "power_limit_w": "the note's \"N W power limit\" when it states one, else none (the "
                     "profile's TDP)",
    "eager": "1 when the note says the run was eager (e.g. \"eager (no torch.compile)\"), else "
             "0.45 when it names a 2020 NGC container (20.06-py3 to 20.12-py3: "
             "SOFTWARE_2020_ELEMENTWISE_TRAFFIC), else the device profile's elementwise traffic",
    "attention": "flash (a fused kernel skipping the causal mask's blocks, as every current stack "
                 "runs) unless the note says \"unfused\" or \"fused softmax\"",
    "tp_overlap": "1 on an NVIDIA GPU for a model without expert parallelism at tp > 1 "
                  "(default_tp_overlap: what NVIDIA's Megatron-Bridge recipes run), else 0 "
                  "(tensor-parallel collectives on the critical path)",
    "grad_reduce": "fp32 (Megatron-Core's fp32 main gradients, 4 bytes a parameter held and "
                   "reduced)",
    "optimizer_state": "fp32 (fp32 master weights and Adam moments, 12 bytes a parameter "
                       "sharded over data parallel)",
    "cross_entropy": "fused (Megatron-Core's vocab-parallel cross-entropy, XLA's fusions: the loss "
                     "holds one compute-dtype copy of the logits beside the fp32 ones it saves)",
    "micro_batch": "1",
    "schedule": "1f1b-interleaved when pp > 1 (Megatron-LM's), else gradient accumulation; with "
                "vp given: 1f1b-interleaved for vp > 1, 1f1b for vp 1",
    "model_config": "the model of the shape columns (a GPT-style block, or a Llama-style one with "
                    "glu 1)",
    "cp": "1 (no context parallelism); cp > 1 exchanges keys and values by the ring (Megatron-"
          "Core's default --cp-comm-type p2p) unless cp_comm says otherwise",
    "cp_comm": "ring (the overlapped point-to-point exchange, Megatron-Core's p2p)",
    "saved_inputs": "format (a low-precision recipe keeps its GEMMs' quantized inputs for the "
                    "weight gradient, as Transformer Engine does)",
    "vp": "the fastest interleaved chunk count (tune_virtual_stages), or the "
          "LAYERS_PER_CHUNK_MAX rule without a step function",
    "ep": "1 (every replica holds every expert)",
    "dispatcher": "HybridEP (deepep: two hops, dropless) on the devices of HYBRIDEP_DEVICES "
                  "(GB200, GB300, B300: what NVIDIA's recipes for them run) and DeepEP where the "
                  "expert-parallel group spans scale-up domains on a Hopper or later GPU, else "
                  "alltoall (Megatron-Core's default token dispatcher)",
    "pipeline_layout": "NVIDIA's recipes' split of the blocks over the pp x vp stages "
                       "(simulator.pipeline_layout.recipe_split: even; else the embedding and "
                       "loss counted as layers, Qwen3 MoE recipes; else the first stages full, "
                       "DeepSeek-V3's recipe), printed when uneven",
    "etp": "1 (the experts not tensor-split: Megatron-Bridge's MoE recipes' "
           "expert_tensor_parallel_size default, recipes/qwen/qwen3_moe.py)",
}
"""The practitioner's rule applied to each blank optional field (printed with the row)."""

POWER_LIMIT_NOTE = re.compile(r"(\d+(?:\.\d+)?)\s*W power limit")
"""How a row's ``note`` states a power cap (e.g. "at a 500 W power limit"): read when the
``power_limit_w`` column is blank or absent."""

POWER_CLOCK_EXPONENT = 1.0
"""Sustained clock under a power cap = nominal x (cap / TDP) ** 1. Dynamic CMOS power is
``C V^2 f`` (Hennessy & Patterson, "Computer Architecture: A Quantitative Approach", 6th ed.,
Sec. 1.5). Over the DVFS range the voltage scales with the clock (power ~ ``f^3``), but a GPU running
dense matmuls at its power limit already sits at the low end of its voltage-frequency curve (an
H100 SXM's matmul kernels throttle well below its 1.98 GHz boost at 700 W), where the voltage is
at its floor and only the clock can give: power ~ ``f``. Static and memory power, which do not fall
with the clock, would make the slow-down steeper still; they are not modelled. Checked on the
torchtitan-h100 rows (500 W on a 700 W part): the cube-root law predicted the compiled rows 18.7%
fast and the eager rows 11.5% fast; the linear law 1.7% fast and 4.4% slow, before any refit
(``reports/validation/README.md``)."""


def power_limit(row: Row) -> tuple[float | None, str | None]:
    """(the row's per-device power cap in W or None, the assumption to print or None): the
    ``power_limit_w`` column, else the cap its ``note`` states (:data:`POWER_LIMIT_NOTE`)."""
    if row.power_limit_w is not None:
        return row.power_limit_w, None
    m = POWER_LIMIT_NOTE.search(row.note)
    if m:
        return float(m.group(1)), f"power_limit_w: {float(m.group(1)):g} W (from the note)"
    return None, None


def power_capped(device: DeviceProfile, cap_w: float | None) -> DeviceProfile:
    """``device`` run under a ``cap_w`` power limit: every peak rate x
    ``(cap / tdp) ** POWER_CLOCK_EXPONENT`` (:data:`POWER_CLOCK_EXPONENT`); unchanged when there
    is no cap or it is at or above the TDP. Memory bandwidth is kept (HBM's clock is not the
    core's)."""
    if cap_w is None or cap_w >= device.tdp_watts:
        return device
    f = (cap_w / device.tdp_watts) ** POWER_CLOCK_EXPONENT
    return replace(device, peak_flops={k: v * f for k, v in device.peak_flops.items()},
                   tdp_watts=cap_w,
                   description=f"{device.description} (power-capped at {cap_w:g} W: clock x {f:.3f})")


EAGER_NOTE = re.compile(r"\beager\b", re.IGNORECASE)
"""How a row's ``note`` says its framework ran op by op (PyTorch eager mode, no ``torch.compile``):
read when the ``eager`` column is blank or absent."""

EAGER_ELEMENTWISE_TRAFFIC = 1.0
"""The elementwise-traffic fraction of an eager run: PyTorch eager launches every non-matmul op as
its own kernel, each reading its operands from HBM and writing its result, which is exactly the
unfused traffic ``zoo.costing`` counts (``LayerCost.*_other_bytes_per_sample``)."""


SOFTWARE_2020_NOTE = re.compile(r"\b20\.(?:0[6-9]|1[0-2])-py3\b")
"""How a row's ``note`` names an NGC container of 2020's second half (``20.06-py3`` to
``20.12-py3``: the first CUDA 11 releases, the first for Ampere), whose kernels fused less of a
block's non-matmul work than the stacks the profiles' elementwise-traffic fractions describe."""

SOFTWARE_2020_ELEMENTWISE_TRAFFIC = 0.45
"""The elementwise-traffic fraction of a run on a 2020 NGC container (:data:`SOFTWARE_2020_NOTE`):
fitted on the 12 a100-40gb-sxm rows of NVIDIA DeepLearningExamples' BERT-Large pre-training
(PyTorch and TensorFlow, 20.06-py3; ``reports/validation/README.md``) with the GA100's matmul
efficiency held at the value ``mpmd validate --fit`` fits on the A100 80GB's current-stack runs
(0.662, the same die): the best of 0.30-0.50 in steps of 0.05 (MAPE 5.4%; the profile's 0.2 gives
39.1%, eager's 1.0 gives 38.4%). The mechanism: that era's BERT code ran the attention softmax,
the dropouts (the attention probabilities' among them), bias adds and residuals as separate kernels
(the PyTorch code's ``modeling.py`` at commit 78ec680: apex fuses only the LayerNorm,
``FusedLayerNormAffineFunction``, and the optimizer, ``FusedLAMB``; the GeLU's bias add is an op
of its own), so more of each block's unfused traffic reached HBM than with later fused kernels. The same
benchmark in the 21.11 container ran 1.40x faster on an A100 80GB (580 against 415 sequences/s
at sequence 128) and 1.42x on a V100 32GB (224 against 158): a software gain of the same size on
both chips, as a property of the run (not of the device kind) predicts. Checked by leaving one
source out (``reports/validation/README.md``)."""


def software_2020(row: Row) -> tuple[bool, str | None]:
    """(whether the row ran on a 2020 NGC container, the assumption to print or None): its note
    names one (:data:`SOFTWARE_2020_NOTE`) and the run was not eager (eager's traffic is all of
    it)."""
    if eager(row)[0] or not SOFTWARE_2020_NOTE.search(row.note):
        return False, None
    return True, (f"2020 NGC container (from the note): elementwise traffic "
                  f"{SOFTWARE_2020_ELEMENTWISE_TRAFFIC:g}")


def eager(row: Row) -> tuple[bool, str | None]:
    """(whether the row's run was eager, the assumption to print or None): the ``eager`` column,
    else whether its ``note`` says so (:data:`EAGER_NOTE`)."""
    if row.eager is not None:
        return row.eager, None
    if EAGER_NOTE.search(row.note):
        return True, f"eager: 1 (from the note: elementwise traffic {EAGER_ELEMENTWISE_TRAFFIC:g})"
    return False, None


UNFUSED_NOTE = re.compile(r"\bunfused attention\b|\bfused (?:scale-mask-)?softmax\b|"
                          r"\bno flash", re.IGNORECASE)
"""How a row's ``note`` says its attention materialized the softmax (no fused attention kernel):
read when the ``attention`` column is blank or absent."""


def attention_kernel(row: Row) -> tuple[str, str | None]:
    """(the row's attention kernel, ``"flash"`` or ``"unfused"``; the assumption to print or
    None): the ``attention`` column, else ``"unfused"`` when the note says so
    (:data:`UNFUSED_NOTE`), else ``"flash"`` (:data:`RULES`)."""
    if row.attention is not None:
        return row.attention, None
    if UNFUSED_NOTE.search(row.note):
        return "unfused", "attention: unfused (from the note)"
    return "flash", None


def row_precision(row: Row, device: DeviceProfile) -> tuple[str, str | None]:
    """(the row's ``precision`` as it is simulated on ``device``, the assumption to print or
    None): the column's value when it was given; blank: ``"bf16"`` where the device has a bf16
    rate, else ``"fp16"`` where it has an fp16 one (a V100: no bf16 Tensor Cores, so its 16-bit
    training is FP16 mixed precision with loss scaling, Micikevicius et al., ICLR 2018), stated.

    Raises:
        ValidationError: the device has no rate for the row's compute dtype (one line: the
            precision, the device's rates and the fix), or, blank, for neither bf16 nor fp16.
    """
    from hardware_profiles.types import ProfileError

    if not row.precision_given and row.precision == "bf16" and device.peak("bf16") <= 0:
        if device.peak("fp16") > 0:
            return "fp16", (f"precision fp16 (not published; {device.name} has no bf16 rate: "
                            f"16-bit mixed precision on it is fp16 with loss scaling)")
    try:
        device.matmul_precision(row.dtype)
    except ProfileError:
        rates = ", ".join(sorted(device.peak_flops))
        runs = [k for k in device.model_dtypes if k != row.dtype]
        fix = f"precision {' or '.join(runs)}" if runs else "a device that runs it"
        via = f" (it computes in {row.dtype})" if row.precision != row.dtype else ""
        raise ValidationError(f"row {row.line}: precision {row.precision}{via} but device "
                              f"{device.name!r} has no {row.dtype} rate (its rates: {rates}); "
                              f"fix: {fix}") from None
    return row.precision, None


def row_device(row: Row, device: DeviceProfile) -> DeviceProfile:
    """``device`` as the row's hosts ran it: under the row's power cap (:func:`power_capped`), with
    the row's memory bandwidth when its part's differs from the profile's
    (``memory_bandwidth_gb_per_s``: e.g. an H100 built with HBM2e instead of HBM3) and, for an
    eager run, with every unfused non-matmul op's traffic charged
    (:data:`EAGER_ELEMENTWISE_TRAFFIC`), for a run on a 2020 NGC container, with that era's
    fraction (:data:`SOFTWARE_2020_ELEMENTWISE_TRAFFIC`). All are properties of the run, not of
    the device kind."""
    device = power_capped(device, power_limit(row)[0])
    if row.memory_bandwidth_gb_per_s is not None:
        bw = row.memory_bandwidth_gb_per_s * 1e9
        device = replace(device, memory_bandwidth=bw,
                         description=f"{device.description} (memory {bw / 1e12:.2f} TB/s)")
    if eager(row)[0]:
        device = replace(device, elementwise_traffic=EAGER_ELEMENTWISE_TRAFFIC)
    elif software_2020(row)[0]:
        device = replace(device, elementwise_traffic=SOFTWARE_2020_ELEMENTWISE_TRAFFIC)
    return device


ADAPTIVE = ("zb-1p", "zb-2p")
"""Simulator schedules built from the row's costs, and timed with post-validation (see
:func:`post_validation_step`)."""

# --------------------------------------------------------------------------- setup choices
@dataclass(frozen=True, slots=True)
class Setup:
    """What a row is simulated as: the plan, its workload, and every assumption made."""

    row: Row
    micro_batch: int
    microbatches: int
    schedule: str            # simulator schedule name
    virtual_stages: int
    recompute: str           # how it is costed: "none", "selective" or "full" (simulator.remat)
    assumptions: tuple[str, ...]
    workload: Workload
    plan: Plan
    offload_s: float = 0.0   # host-offload seconds per step, charged exposed (simulator.remat)


def _choices(row: Row) -> tuple[int, str, int, str, list[str]]:
    """(micro_batch, simulator schedule, virtual_stages, recompute, assumptions) for ``row``:
    its own fields, and the :data:`RULES` rule for each blank one (listed in the assumptions)."""
    notes: list[str] = []
    for k in ("vocab", "ffn", "kv_heads", "head_dim", "glu", "fsdp", "recompute",
              "devices_per_node", "scale_out_gbit_per_device"):
        if getattr(row, k) is None:
            if k == "kv_heads" and row.glu is None:
                continue                      # a GPT-style row: multi-head attention is implied
            if k == "devices_per_node" and row.scale_up_domain:
                continue                      # the row's scale-up domain decides the fabric
            if k == "devices_per_node" and row.slices:
                notes.append(f"{row.node_size} devices per slice")
                continue
            if k in ("glu", "fsdp") or (k == "scale_out_gbit_per_device" and row.gpus <= row.node_size):
                continue                      # the defaults of the format; one node: no network
            notes.append(f"{k}: {RULES[k]}")
    for why in (power_limit(row)[1], eager(row)[1], software_2020(row)[1],
                attention_kernel(row)[1]):
        if why:
            notes.append(why)
    if row.global_batch_derived:
        notes.append(f"global batch {row.global_batch} = per_device_batch {row.per_device_batch:g} "
                     f"x {row.gpus} devices")
    if row.microbatches_published:
        notes.append(f"microbatches {row.microbatches_published} as published disagree with "
                     f"global_batch / (micro_batch x dp) = {row.global_batch // (row.dp * (row.micro_batch or 1))}"
                     f": the published global batch kept")
    mb = row.micro_batch
    if mb is None and row.per_device_batch is not None and row.pp == 1 and not row.microbatches:
        mb = row.global_batch // row.dp
        notes.append(f"micro batch {mb} = per_device_batch x tp (one microbatch)")
    if mb is None:
        mb = 1
        notes.append("micro batch 1 (not published)")
    sched = row.schedule
    if sched is None and row.vp is not None and row.pp > 1:
        sched = "1f1b-interleaved" if row.vp > 1 else "1f1b"
        notes.append(f"{sched} (vp {row.vp}; schedule not published)")
    if sched is None:
        sched = "1f1b-interleaved" if row.pp > 1 else "1f1b"
        notes.append(f"{sched} (not published)" if row.pp > 1 else "no pipeline: grad accumulation")
    name = SCHEDULE_MAP[sched]
    v = 1
    if name in INTERLEAVED and row.vp is not None:
        v = row.vp                                   # published: used as is, never tuned
    elif name in INTERLEAVED:
        per_rank = -(-row.layers // row.pp)
        v = max(2, per_rank) if per_rank <= LAYERS_PER_CHUNK_MAX else 2
        if not split_fits(row.layers, row.pp * v):   # too few blocks: the largest v that fits
            v = max((c for c in virtual_stage_candidates(row) if c < v), default=2)
        notes.append(f"{v} virtual stages")          # replaced when tuned (row_setup)
    if sched in ("zb-1p", "zb-2p"):
        notes.append("auto schedule from the row's costs; post-validation")
    p = row_remat(row)
    recompute = p.cost_model
    if p.name == "op":
        recompute = "op"
        notes.append("op-level selective recompute (torchtitan): every second weight matmul and "
                     "every non-matmul op rerun, the attention core kept")
    elif p.name == "layer":
        recompute = "layer"
        notes.append(f"layer-wise selective recompute (torchtitan): every {LAYER_AC_EVERY}nd "
                     f"block's forward rerun")
    elif p.cost_model == "modules":
        recompute = "modules"
        notes.append(p.costed_as)
    elif p.name in ("selective", "full"):
        notes.append(f"{p.name} recompute")
    elif p.name != "none":
        notes.append(p.costed_as)
    if row.fsdp and (row.slices or 1) > 1:
        notes.append(f"hybrid sharding: fsdp within each of {row.slices} slices")
    return mb, name, v, recompute, notes


def row_remat(row: Row) -> remat.RematPolicy:
    """The row's recompute policy (blank: none) evaluated for its layer shape
    (:func:`simulator.remat.policy`)."""
    shape = remat.LayerShape(row.hidden, row.heads, row.kv_heads or row.heads,
                             row.head_dim or row.hidden // row.heads, row.ffn or 4 * row.hidden,
                             bool(row.glu), row.seq_len)
    return remat.policy(row.recompute or "none", shape)


def row_offload_s(row: Row, plan: Plan | None = None) -> float:
    """Seconds per step the row's policy moves activations to host and back
    (:func:`simulator.remat.offload_seconds`): a device's share of the tokens (the batch over
    ``dp``, the activations over ``tp``) through the layers of its busiest pipeline rank (in
    ``plan`` when given, else :func:`split_layers`'s)."""
    tokens = row.global_batch * row.seq_len / (row.replicas * row.tp)
    if plan is not None:
        per: dict[str, int] = {}
        last = len(plan.stages) - 1
        for st in plan.stages:
            n = st.last - st.first - (st.index == 0) - (st.index == last)
            per[st.mesh] = per.get(st.mesh, 0) + n
        busiest = max(per.values())
    else:
        busiest = max(split_layers(row.layers, row.pp))
    return remat.offload_seconds(row_remat(row), tokens, busiest, row.device)


def split_layers(n: int, parts: int) -> list[int]:
    """``n`` layers over ``parts`` stages as evenly as possible; the extra layers go to the
    middle stages first, so the first and last stages (which also hold the embedding and the
    head) get the fewer (Qi et al.'s 22 = 3*8 - 2 and 46 = 3*16 - 2 layer models are this split).

    Raises:
        ValidationError: fewer layers than stages.
    """
    if n < parts:
        raise ValidationError(f"{n} layers cannot fill {parts} pipeline stages; use fewer stages")
    base, rem = divmod(n, parts)
    counts = [base] * parts
    for s in sorted(range(parts), key=lambda s: (-min(s, parts - 1 - s), s))[:rem]:
        counts[s] += 1
    return counts


def _same_node(a: int, b: int, n: int, node: int) -> bool:
    """Meshes ``a`` and ``b`` of ``n`` devices each (Megatron rank order) lie in one node of
    ``node`` devices."""
    ranks = [r for m in (a, b) for r in (m * n, (m + 1) * n - 1)]
    return len({r // node for r in ranks}) == 1


def cluster_name(row: Row) -> str:
    return f"{row.source}-{row.model}-{row.device}x{row.gpus}"


def node_devices(row: Row, device: DeviceProfile) -> int:
    """Devices of one scale-up domain in the row's cluster: :attr:`Row.node_size` when the row
    says (``scale_up_domain``, ``devices_per_node`` or ``slices``), else the device profile's
    ``scale_up_domain`` (a fabric over several hosts, as the part is sold: 72 for a GB200
    NVL72 rack), else :data:`DEVICES_PER_NODE`."""
    if row.scale_up_domain or row.devices_per_node or row.slices:
        return row.node_size
    return device.scale_up_domain or DEVICES_PER_NODE


def build_cluster(row: Row, device: DeviceProfile) -> Cluster:
    """The row's synthetic cluster of ``device`` (see the module docstring), as the row's hosts
    ran it (:func:`row_device`: power cap, eager mode)."""
    device = row_device(row, device)
    n, node = row.tp * row.replicas, node_devices(row, device)
    fabric = "ICI torus (profile)" if device.torus_dims else "NVLink / NVSwitch (profile)"
    intra = Link(device.scale_up_bandwidth, device.scale_up_latency, fabric)
    if row.scale_out_gbit_per_device is not None:
        out = Link(row.scale_out_gbit_per_device * 1e9 / 8, SCALE_OUT_LATENCY_S,
                   f"{row.scale_out_gbit_per_device:g} Gb/s per device (the row's)")
    else:
        out = Link(device.scale_out_bandwidth, SCALE_OUT_LATENCY_S,
                   f"{device.name} scale-out (profile; not published for the row)")
    meshes = {}
    for k in range(row.pp):
        big = n > node
        meshes[f"stage{k}"] = MeshSpec(
            name=f"stage{k}", device=device, num_devices=n,
            axes={"data": row.replicas, "tensor": row.tp},
            intra_link=intra, devices_per_node=node if big else None,
            scale_out_link=out if big else None)
    links = []
    pairs = {(k, k + 1) for k in range(row.pp - 1)} | ({(0, row.pp - 1)} if row.pp > 2 else set())
    for a, b in sorted(pairs):
        per = intra if _same_node(a, b, n, node) else out
        links.append(InterMeshLink(f"stage{a}", f"stage{b}",
                                   Link(per.bandwidth * n, per.latency, per.source)))
    return Cluster(name=cluster_name(row), meshes=meshes, links=tuple(links),
                   description=f"synthetic {device.name} cluster for validation", p2p="blocking")


def row_layout(row: Row) -> Layout:
    """``Layout(dp, tp, context=cp)`` (the exchange ``cp_comm`` names, the ring by default;
    tensor-parallel collectives overlapped
    when the row says ``tp_overlap``); with ``fsdp``, sharded over each
    slice's devices and replicated across slices (hybrid sharding) when ``slices`` > 1; with
    ``ep`` > 1, the experts split ``ep`` ways and each ``etp`` ways (blank: 1, :data:`DEFAULTS`)
    over the ``dp x cp x tp`` devices (:func:`expert_problem` says when that cannot express the
    row)."""
    data = row.dp
    fsdp = bool(row.fsdp) and row.replicas > 1
    hsdp = (row.slices or 1) if fsdp else 1
    moe = row.ep > 1 and expert_problem(row) is None
    return Layout(data, row.tp, fsdp=fsdp, hsdp=hsdp if data % hsdp == 0 else 1,
                  context=row.cp, context_method=row.cp_comm,
                  tp_overlap=row_tp_overlap(row),
                  expert=row.ep if moe else 1, expert_tensor=row_etp(row) if moe else 0,
                  expert_dispatch=(row.dispatcher or default_dispatcher(row)) if moe
                  else "alltoall", grad_reduce=row.grad_reduce,
                  optimizer_state=row.optimizer_state)


HYBRIDEP_DEVICES = ("gb200", "gb300", "b300")
"""Devices on which a mixture-of-experts row with a blank ``dispatcher`` runs HybridEP
(``deepep``: RDMA once per remote node, then NVLink; dropless; no host read-back), as a
practitioner on them would: NVIDIA's Megatron-Bridge performance recipes set the flex dispatcher
(with ``moe_flex_dispatcher_backend = "hybridep"`` in every GB200 and GB300 setting of the
backend) in 33 of 42 dispatcher settings for GB200, 28 of 38 for GB300 and 18 of 18 for B300,
against 8 of 19 for B200 and 6 of 16 for H100 (``src/megatron/bridge/perf_recipes/*/<device>/
*.py`` at commit 067f987), so those two keep Megatron-Core's default, ``alltoall``."""


def default_tp_overlap(row: Row) -> bool:
    """Whether a row that leaves ``tp_overlap`` blank overlaps its tensor-parallel collectives
    with its GEMMs: at ``tp`` > 1 without expert parallelism (``ep`` <= 1) on a device whose stack
    does (:func:`simulator.cost_model.overlaps_tensor_parallel`: an NVIDIA GPU), as
    NVIDIA's Megatron-Bridge recipes run dense models (Transformer Engine's userbuffers
    ``tp_comm_overlap``: on in 25 and off in 8 of the dense pre-training recipes at ``tp`` > 1 in
    ``src/megatron/bridge/perf_recipes/llama/*/*.py`` at commit 067f987). Their
    mixture-of-experts recipes at ``tp`` > 1 mostly turn it off (every Qwen3 and Qwen3.5 one on
    H100), and TPU stacks have no such switch on by default, so those stay off. A row from an
    older stack (Megatron-LM before Transformer Engine, 2023) says ``tp_overlap`` 0."""
    return row.tp > 1 and row.ep <= 1 and _overlaps(row.device)


@functools.lru_cache(maxsize=64)
def _overlaps(device: str) -> bool:
    """:func:`simulator.cost_model.overlaps_tensor_parallel` of the bundled profile ``device``
    (cached: layouts are built many times)."""
    from hardware_profiles.loader import load_device

    return overlaps_tensor_parallel(load_device(device))


def row_tp_overlap(row: Row) -> bool:
    """The row's ``tp_overlap``, or :func:`default_tp_overlap` when blank; never at ``tp`` 1."""
    if row.tp <= 1:
        return False
    return row.tp_overlap if row.tp_overlap is not None else default_tp_overlap(row)


def default_dispatcher(row: Row) -> str:
    """The token dispatcher of a row that states none: ``deepep`` (HybridEP/DeepEP, two hops,
    dropless) on the devices of :data:`HYBRIDEP_DEVICES`, and on any other part DeepEP runs on
    (an NVIDIA GPU from Hopper on: one with an fp8 rate) when the expert-parallel group reaches
    past one scale-up domain (:func:`crosses_scale_up`); else ``alltoall``, Megatron-Core's
    default. DeepEP's internode kernels exist for the second case: a token bound for several
    experts on one remote node crosses the scale-out network once (DeepSeek-AI, "DeepSeek-V3
    Technical Report", arXiv:2412.19437, Sec. 3.2.2), and NVIDIA's recipes turn it on there:
    Megatron-Bridge's DeepSeek-V3 H100 settings at EP 64 (``moe_flex_dispatcher_backend``
    ``"deepep"`` in ``scripts/performance/configs/deepseek/`` at fa0315ae2 and 08968b3,
    ``"hybridep"`` in ``recipes/deepseek/h100/deepseek_v3.py`` at 067f987), and at 067f987 every
    B200 setting at EP 16 or 32 and the H100 Qwen3 ones at EP 16; three H100 Qwen3 settings at EP 32
    and 128 keep ``alltoall``."""
    if row.device in HYBRIDEP_DEVICES:
        return "deepep"
    return "deepep" if crosses_scale_up(row) and _runs_deepep(row.device) else "alltoall"


def crosses_scale_up(row: Row) -> bool:
    """Whether the row's expert-parallel group spans more devices than one scale-up domain
    (:func:`node_devices`): Megatron-Core lays an EP group's ``ep`` members ``etp`` ranks apart,
    so it covers ``ep x etp`` consecutive devices."""
    return row.ep * row_etp(row) > _node_devices(row)


def _node_devices(row: Row) -> int:
    """:func:`node_devices` on the bundled profile of ``row.device``."""
    if row.scale_up_domain or row.devices_per_node or row.slices:
        return row.node_size
    return _profile_domain(row.device) or DEVICES_PER_NODE


@functools.lru_cache(maxsize=64)
def _profile_domain(device: str) -> int | None:
    """The bundled profile ``device``'s ``scale_up_domain`` (cached: layouts are built many
    times)."""
    from hardware_profiles.loader import load_device

    return load_device(device).scale_up_domain


@functools.lru_cache(maxsize=64)
def _runs_deepep(device: str) -> bool:
    """Whether DeepEP's kernels run on the bundled profile ``device``: an NVIDIA GPU with an fp8
    rate (Hopper and later; DeepEP needs SM90's TMA and NVSHMEM)."""
    from hardware_profiles.loader import load_device

    d = load_device(device)
    return d.vendor == "NVIDIA" and d.peak_flops.get("fp8", 0.0) > 0


def row_etp(row: Row) -> int:
    """The row's expert tensor-parallel degree: ``etp``, or 1 when blank (:data:`DEFAULTS`)."""
    return row.etp if row.etp is not None else 1


def expert_problem(row: Row) -> str | None:
    """Why :class:`ir.Layout` cannot express the row's expert layout (``ep``, ``etp``), as one
    line with the fix; None when it can (always for ``ep`` 1). Megatron-Core's MoE parallel
    folding (Liu et al. 2025, arXiv:2504.14960) lays the experts' ``ep x etp`` grid over the
    ``dp x cp x tp`` devices of a pipeline stage, so ``ep x etp`` must divide them; expert
    parallelism is not combined with hybrid sharding (``fsdp`` over several ``slices``)."""
    if row.ep <= 1:
        return None
    devices, etp = row.replicas * row.tp, row_etp(row)
    if devices % (row.ep * etp):
        return (f"ep x etp = {row.ep} x {etp} does not divide dp x cp x tp = {devices}; fix ep or "
                f"etp (their product divides a stage's devices)")
    if row.fsdp and row.replicas > 1 and (row.slices or 1) > 1:
        return (f"ep={row.ep} with fsdp over {row.slices} slices: expert parallelism beside "
                f"hybrid sharding is not modelled (ir.Layout); fix: fsdp 0, ep 1, or one slice")
    return None


Rerun = Callable[[LayerCost], tuple[float, float, float, float]]
"""A recompute policy's rerun for one decoder block: ``block -> (FLOP per sample, fixed bytes,
bytes per sample, unfused bytes per sample)`` of what it reruns before the backward."""


def rerun_before_backward(workload: Workload, rerun: Rerun) -> Workload:
    """``workload`` with each decoder block's backward also doing ``rerun(block)``: its FLOPs and
    unfused traffic go to the whole backward and to its input-gradient part B (the rerun precedes
    it), its bytes to the whole backward (a mixture of experts' dense first blocks,
    ``dense_block``, likewise). Other layers are unchanged."""
    costs = {}
    for name, c in workload.costs.items():
        if name in ("decoder_block", "dense_block"):
            flops, fixed, per_sample, other = rerun(c)
            c = replace(c, bwd_flops_per_sample=c.bwd_flops_per_sample + flops,
                        bwd_input_flops_per_sample=c.bwd_input_flops_per_sample + flops,
                        bwd_bytes_fixed=c.bwd_bytes_fixed + fixed,
                        bwd_bytes_per_sample=c.bwd_bytes_per_sample + per_sample,
                        bwd_other_bytes_per_sample=c.bwd_other_bytes_per_sample + other,
                        bwd_input_other_bytes_per_sample=c.bwd_input_other_bytes_per_sample + other)
        costs[name] = c
    return replace(workload, costs=costs)


def selective_recompute(workload: Workload, width: int, fraction: float = 1.0) -> Workload:
    """The workload under Korthikanti et al.'s selective recomputation: each decoder block's
    backward first recomputes its attention core (``Q K^T`` and ``softmax . V``: ``4 s^2 w`` FLOP
    per sample, ``w`` = heads x head width, Korthikanti et al. 2022 Sec. 5), times ``fraction``
    of the score blocks the kernel computes (1 for an unfused softmax; a fused kernel's causal
    share, :func:`ir.workload.causal_fraction`). The residuals are unchanged: the traced ones
    already exclude the ``s x s`` scores (flash-attention style), which is exactly what selective
    recomputation drops."""
    extra = 4.0 * workload.seq_len ** 2 * width * fraction
    return rerun_before_backward(workload, lambda c: (extra, 0.0, 0.0, 0.0))


def op_recompute(workload: Workload, row: Row) -> Workload:
    """The workload under torchtitan's op-level selective activation checkpointing
    (``selective_ac_option = 'op'``, ``torchtitan/models/llama/parallelize_llama.py``
    ``_apply_ac_to_transformer_block``: the output of every second ``mm`` is saved and every op
    outside its save list recomputed; the save list holds the attention kernels and the
    collectives). Each decoder block's backward first reruns the matmuls at even positions of
    the block's forward order (Llama: ``wq, wk, wv, wo, w1, w3, w2`` -> ``wk``, ``wo``, ``w3``;
    GPT: ``wq, wk, wv, wo, w1, w2`` -> ``wk``, ``wo``, ``w2``), ``2 s x params`` FLOP per
    sample each, and every non-matmul op of the forward (its unfused traffic again); the
    attention core is kept. Added to the backward and to its input-gradient part B (the rerun
    precedes it). Each such block keeps only what the policy saves
    (:func:`simulator.remat.op_sac_saved_elements` per token, at the model's dtype), where that is
    less than its traced residuals."""
    h, H = row.hidden, row.heads
    d = row.head_dim or h // H
    kv = row.kv_heads or H
    f = row.ffn or 4 * h
    mats = [h * H * d, h * kv * d, h * kv * d, H * d * h]
    mats += [h * f, h * f, f * h] if row.glu else [h * f, f * h]
    extra = 2.0 * row.seq_len * sum(mats[1::2])
    w = rerun_before_backward(workload, lambda c: (extra, 0.0, 0.0, c.fwd_other_bytes_per_sample))
    kept = remat.op_sac_saved_elements(h, H, kv, d, f, bool(row.glu)) * row.seq_len * w.dtype_bytes
    return _keep_residuals(w, lambda c: min(c.residual_bytes_per_sample, kept))


MAXTEXT_POLICIES = tuple(n for n in remat.NAMES
                         if n not in ("none", "selective", "full", "op", "layer"))
"""The ``recompute`` names that are MaxText remat policies (:data:`simulator.remat.SPECS`): under
``jax.checkpoint`` a block keeps exactly what its policy saves (:func:`policy_residuals`)."""


def policy_residuals(workload: Workload, row: Row) -> Workload:
    """The workload with each decoder block keeping what the row's MaxText remat policy saves:
    ``jax.checkpoint`` with a policy (``Decoder.get_remat_policy``: ``minimal`` is
    ``checkpoint_dots_with_no_batch_dims``) keeps the block's input (the scan carry) and the
    tensors the policy names, and reruns every other intermediate (norm outputs, activation
    inputs, the attention core's softmax) in the backward: per token the input and the policy's
    saved parts (:meth:`simulator.remat.LayerShape.elements`) at
    :data:`simulator.remat.ACTIVATION_BYTES`, where that is less than the traced residuals
    (which count Megatron's ``34 s b h``-style intermediates: Korthikanti et al. 2022, Sec. 4.1)."""
    shape = remat.LayerShape(row.hidden, row.heads, row.kv_heads or row.heads,
                             row.head_dim or row.hidden // row.heads, row.ffn or 4 * row.hidden,
                             bool(row.glu), row.seq_len)
    el = shape.elements()
    saved = el["input"] + sum(el[part] for part in remat.SPECS[row_remat(row).name].saved)
    kept = saved * row.seq_len * remat.ACTIVATION_BYTES
    return _keep_residuals(workload, lambda c: min(c.residual_bytes_per_sample, kept))


def _keep_residuals(workload: Workload, kept: Callable[[LayerCost], float]) -> Workload:
    """``workload`` with each decoder block (``decoder_block``, ``dense_block``) keeping
    ``kept(block)`` residual bytes per sample; other layers unchanged."""
    return replace(workload, costs={
        name: replace(c, residual_bytes_per_sample=kept(c))
        if name in ("decoder_block", "dense_block") else c
        for name, c in workload.costs.items()})


def offload_activations(workload: Workload, row: Row) -> tuple[Workload, str]:
    """``workload`` with ``row.offload_layers`` of its decoder blocks' saved activations held in
    host memory between their forward and backward, and the assumption line: Megatron-Core's
    activation CPU offloading (``--cpu-offloading-num-layers``, with ``cpu_offloading_weights``
    off as NVIDIA's recipes set it: Megatron-Bridge fa0315ae2
    ``scripts/performance/utils/helpers.py`` ``set_recompute_overrides``), or every block's input
    under full recomputation where a MaxText remat policy offloads ``decoder_layer_input``
    (``offload_layers`` = the blocks). Charged on average over the blocks: each keeps ``1 - N /
    blocks`` of what it keeps on the device (``LayerCost.host_offload``). Memory only: the copies
    run on their own streams under the next layers' compute (a Llama 3 70B block's 16,384 tokens
    keep ~4.6 GB, ``34 h`` bytes a token (Korthikanti et al. 2022, Sec. 4.1), moved each way over
    GB200's 450 GB/s NVLink-C2C direction in ~10 ms, against the block's ~3e13 FLOP forward,
    ~25 ms at 1.2 PFLOP/s of FP8), so no time is charged."""
    blocks = sum(1 for n in workload.layers if n in ("decoder_block", "dense_block"))
    k = min(row.offload_layers / blocks, 1.0) if blocks else 0.0
    w = replace(workload, costs={
        name: replace(c, host_offload=k) if name in ("decoder_block", "dense_block") else c
        for name, c in workload.costs.items()})
    return w, (f"activations of {row.offload_layers} of {blocks} blocks offloaded to host "
               f"(memory only: the copies overlap compute)")


LAYER_AC_EVERY = 2
"""torchtitan's layer-wise selective activation checkpointing wraps every ``N``-th transformer block
in full checkpointing (``selective_ac_option = 'N'``); ``'2'`` is its default
(``torchtitan/config_manager.py``, ``--activation_checkpoint.selective_ac_option``)."""


def layer_recompute(workload: Workload, hidden: int, every: int = LAYER_AC_EVERY) -> Workload:
    """The workload under torchtitan's layer-wise selective checkpointing: one block in ``every``
    reruns its whole forward before its backward, charged on average over the blocks (each decoder
    block's backward and its input-gradient part B gain ``1 / every`` of the block's forward FLOPs,
    bytes and unfused traffic). A checkpointed block keeps only its input (``hidden x seq_len``
    elements), the others all their residuals: each block keeps that average."""
    k = 1.0 / every
    w = rerun_before_backward(workload, lambda c: (
        k * c.fwd_flops_per_sample, k * c.fwd_bytes_fixed, k * c.fwd_bytes_per_sample,
        k * c.fwd_other_bytes_per_sample))
    block_input = float(w.seq_len * w.dtype_bytes * hidden)
    return _keep_residuals(w, lambda c: (1 - k) * c.residual_bytes_per_sample
                           + k * min(block_input, c.residual_bytes_per_sample))


MODULE_BODIES = ("decoder_block", "dense_block", "sliding_block", "attention_block", "moe_block")
"""The transformer-block bodies Megatron-Core's named-module recompute applies to (the embedding
and the output head, a multi-token-prediction head's block included, are left as traced)."""


def block_shape(row: Row, c: LayerCost, dtype_bytes: int = 2) -> remat.ModuleShape:
    """Block ``c``'s :class:`simulator.remat.ModuleShape`: the dense shape from the row's columns
    (``ffn`` blank: ``4 hidden``), the experts, shared experts and latent attention from the
    block's own fields, the attention core's forward FLOP per token from the trace (else
    ``4 s heads head_dim``, unfused)."""
    s, d = row.seq_len, row.head_dim or row.hidden // row.heads
    attn = c.attention_fwd_flops_per_sample / s if c.attention_fwd_flops_per_sample else (
        4.0 * s * row.heads * d)
    return remat.ModuleShape(
        hidden=row.hidden, heads=row.heads, ffn=row.ffn or 4 * row.hidden, glu=bool(row.glu),
        moe=c.experts > 0, experts=c.experts, top_k=c.experts_per_token,
        expert_ffn=c.expert_width, shared_ffn=c.shared_expert_width, latent=c.expert_latent,
        q_rank=c.mla_q_rank,
        kv_rank=c.mla_kv_rank, nope=c.mla_nope_dim, rope=c.mla_rope_dim, v_dim=c.mla_v_dim,
        attention_flops=attn, dtype_bytes=dtype_bytes)


def module_recompute(workload: Workload, row: Row) -> Workload:
    """The workload under Megatron-Core's ``--recompute-granularity selective
    --recompute-modules`` (the row's ``modules:...`` recompute): each block of
    :data:`MODULE_BODIES` keeps ``dropped bytes per token x seq_len`` fewer residual bytes per
    sample (at most its residuals less its input, ``hidden x seq_len`` elements, which every
    checkpoint keeps), and its backward and input-gradient part B first rerun the modules'
    forward (their matmul FLOP, and their elementwise traffic as unfused bytes), per module as
    :func:`simulator.remat.module_cost` derives it. Other layers are unchanged.

    Raises:
        simulator.remat.RematError: a module name that is not Megatron-Core's.
    """
    mods = remat.parse_modules(row.recompute or "")
    s, db = workload.seq_len, workload.dtype_bytes
    costs = {}
    for name, c in workload.costs.items():
        if name in MODULE_BODIES:
            mc = remat.modules_cost(mods, block_shape(row, c, db))
            floor = float(row.hidden * s * db)
            drop = min(mc.dropped_bytes * s, max(c.residual_bytes_per_sample - floor, 0.0))
            flops, other = mc.rerun_flops * s, mc.rerun_traffic_bytes * s
            c = replace(c, residual_bytes_per_sample=c.residual_bytes_per_sample - drop,
                        bwd_flops_per_sample=c.bwd_flops_per_sample + flops,
                        bwd_input_flops_per_sample=c.bwd_input_flops_per_sample + flops,
                        bwd_other_bytes_per_sample=c.bwd_other_bytes_per_sample + other,
                        bwd_input_other_bytes_per_sample=c.bwd_input_other_bytes_per_sample
                        + other)
        costs[name] = c
    return replace(workload, costs=costs)


def build_plan(row: Row, workload: Workload, *, schedule: str, micro_batch: int,
               virtual_stages: int = 1, recompute: bool = False) -> Plan:
    """The row's plan: ``pp * virtual_stages`` stages holding the decoder blocks
    :func:`stage_blocks` gives them (the row's ``pipeline_layout``, else NVIDIA's recipes' split;
    embedding with the first stage, head with the last), stage ``s`` on the mesh of the
    schedule's rank for it (``stage{s % pp}`` when interleaved, V-shaped for zb-v), layout
    :func:`row_layout` per mesh, ``global_batch / (micro_batch * dp)`` microbatches.

    Raises:
        ValidationError: the batch does not divide into microbatches; the blocks cannot fill the
            stages, or the row's layout does not fit the schedule or the model
            (:func:`stage_blocks`).
        simulator.schedules.ScheduleError: the schedule does not support the sizes.
    """
    per_pipe, rem = divmod(row.global_batch, micro_batch * row.dp)
    if rem or per_pipe < 1:
        raise ValidationError(f"{row.key}: global batch {row.global_batch} is not a multiple of "
                              f"micro_batch*dp = {micro_batch * row.dp}; fix micro_batch")
    if row.microbatches is not None and row.microbatches != per_pipe:
        raise ValidationError(f"{row.key}: microbatches={row.microbatches} but global_batch/"
                              f"(micro_batch*dp) = {per_pipe}; fix the row")
    table = generate(schedule, row.pp, per_pipe, virtual_stages=max(virtual_stages, 2))
    S = table.num_stages
    blocks = len(workload.layers) - 2
    if blocks != row.layers:
        raise ValidationError(f"{row.key}: workload has {blocks} blocks, row says {row.layers}")
    counts = stage_blocks(row, workload, table.stage_rank)[0]
    stages, first = [], 0
    for s, c in enumerate(counts):
        last = first + c + (1 if s == 0 else 0) + (1 if s == S - 1 else 0)
        stages.append(StagePlan(s, first, last, f"stage{table.stage_rank[s]}"))
        first = last
    meshes = tuple(f"stage{r}" for r in range(row.pp))
    return Plan(model=workload.model, cluster=cluster_name(row),
                stages=tuple(stages), layouts={m: row_layout(row) for m in meshes},
                schedule=table, rank_mesh=meshes, merge_last_stage=False,
                global_batch=row.global_batch, seq_len=row.seq_len,
                devices={m: (row.device, row.tp * row.replicas) for m in meshes},
                recompute={m: recompute for m in meshes})


def stage_blocks(row: Row, workload: Workload, stage_rank: tuple[int, ...]
                 ) -> tuple[tuple[int, ...], str | None]:
    """(decoder blocks of each stage in model order, the assumption to print or None) for
    ``row``'s plan whose stage ``s`` runs on rank ``stage_rank[s]``; the first stage also holds
    the embedding, the last the head (and a model's MTP, which the zoo costs with it).

    - The row's ``pipeline_layout`` (:mod:`simulator.pipeline_layout`), stage by stage; it must
      have one stage per schedule stage, and name ``m`` exactly when the model has MTP (the
      zoo's head then carries the MTP block's experts, ``zoo.costing``).
    - Else, when stage ``s`` runs on rank ``s % pp`` (Megatron-LM's map: 1F1B, interleaved,
      GPipe, ZB-H1/H2, ZB-1p/2p), NVIDIA's recipes' split,
      :func:`simulator.pipeline_layout.recipe_split` (even; else the embedding and loss counted
      as layers; else the first stages full), printed when uneven. Every row the CSV held before
      layouts were read gets the split it had.
    - Else (V-shaped schedules: ZB-V, DualPipe-V, which Megatron-LM's layouts do not describe)
      the blocks over ranks by :func:`split_layers`, then each rank's blocks evenly over its
      stages (the embedding's stage taking the fewest).

    Raises:
        ValidationError: a layout of another stage count or whose ``m`` disagrees with the
            model, or blocks that cannot fill the stages (a stage left with no block, embedding
            or head; the message names the row and the fix).
    """
    S, blocks = len(stage_rank), len(workload.layers) - 2
    if row.pipeline_layout is not None:
        parsed = parse_layout(row.pipeline_layout)
        text = row.pipeline_layout[:60]
        if len(parsed) != S:
            raise ValidationError(f"row {row.line}: pipeline_layout {text!r} has {len(parsed)} "
                                  f"stages, the schedule runs {S} (pp {row.pp} x "
                                  f"{S // row.pp}); fix the layout, vp or the schedule")
        head = workload.costs.get(workload.layers[-1])
        mtp, has = any(st.mtp for st in parsed), bool(head is not None and head.experts)
        if mtp != has:
            fix = ("name the model with MTP in model_config (e.g. deepseek-v3-mtp) or drop m"
                   if mtp else "add m before L (or name the model without MTP)")
            raise ValidationError(f"row {row.line}: pipeline_layout {text!r} "
                                  f"{'has' if mtp else 'has no'} MTP layer (m) but model "
                                  f"{workload.model} {'has none' if mtp else 'has MTP'}; fix: "
                                  f"{fix}")
        return tuple(st.blocks for st in parsed), None
    if all(r == s % row.pp for s, r in enumerate(stage_rank)):
        try:
            counts, rule = recipe_split(blocks, S)
        except LayoutError as e:
            raise ValidationError(f"row {row.line}: {e}") from None
        if rule == "even":
            return counts, None
        return counts, (f"blocks per stage {split_summary(counts)} ({rule}; no "
                        f"pipeline_layout)")
    per = [0] * S
    for r, n in enumerate(split_layers(blocks, row.pp)):  # rank r's stages, in pipeline order
        mine = [s for s in range(S) if stage_rank[s] == r]
        base, rem = divmod(n, len(mine))
        within = [base + (c < rem) for c in range(len(mine))]
        if r == 0:                                       # the embedding's chunk takes the fewest
            within.reverse()
        for s, k in zip(mine, within):
            per[s] = k
    empty = next((s for s in range(1, S - 1) if not per[s]), None)
    if empty is not None:
        raise ValidationError(f"row {row.line}: {blocks} decoder blocks leave stage {empty} of "
                              f"{S} with none; fix: fewer stages (vp) or a smaller pipeline")
    return tuple(per), None


StepFn = Callable[[Plan, Workload, Cluster], float]
"""``step_fn(plan, workload, cluster) -> seconds`` of one training step."""


def tune_virtual_stages(row: Row, workload: Workload, micro_batch: int, recompute: str,
                        step_fn: StepFn, device: DeviceProfile) -> tuple[int, float, list[int]]:
    """(v, step seconds, candidates): the interleaved chunk count among
    :func:`virtual_stage_candidates` whose plan ``step_fn`` times fastest on ``row``'s cluster of
    ``device`` (ties keep the smaller v). Practitioners tune this knob per model and pipeline depth
    (Narayanan et al. 2021, Sec. 3.1: more chunks shrink the bubble by ``v`` and multiply the
    point-to-point traffic by ``v``), so a row that does not publish it is simulated at its best.
    """
    cluster = build_cluster(row, device)
    best: tuple[float, int] | None = None
    cands = virtual_stage_candidates(row)
    for v in cands:
        plan = build_plan(row, workload, schedule="interleaved-1f1b", micro_batch=micro_batch,
                          virtual_stages=v, recompute=recompute == "full")
        t = step_fn(plan, workload, cluster)
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, v)
    assert best is not None
    return best[1], best[0], cands


def row_setup(row: Row, workload_fn: Callable[[Row], Workload], *,
              step_fn: StepFn | None = None, device: DeviceProfile | None = None) -> Setup:
    """Build the :class:`Setup` of ``row``; ``workload_fn(row)`` costs its model (see module doc).

    The row's precision is resolved on ``device`` (default: its device's bundled profile) by
    :func:`row_precision`: the setup's row carries it (``fp16`` on a device without bf16 when
    the column is blank, stated in the assumptions).

    With ``step_fn`` and ``device``, an interleaved row that does not publish its chunk count
    (``vp``) gets the fastest one (:func:`tune_virtual_stages`, listed in the assumptions); without
    them, the :data:`LAYERS_PER_CHUNK_MAX` rule; a published ``vp`` is used as is.

    Raises:
        ValidationError: besides :func:`build_plan`'s: a precision the device has no rate for
            (:func:`row_precision`), ``ep`` > 1 or ``etp`` != ``tp`` on a model
            that is not a mixture of experts, ``ep`` that does not divide its experts, an expert
            layout :class:`ir.Layout` cannot express (:func:`expert_problem`), or a metric counted
            from a dense model's shape (``tflops_per_gpu``, ``tflops_per_device``, ``mfu``) on a
            mixture of experts.
    """
    tune = step_fn is not None and device is not None
    if device is None:
        from hardware_profiles.loader import load_device

        device = load_device(row.device)
    prec, why = row_precision(row, device)       # ValidationError: a dtype the device lacks
    row = replace(row, precision=prec)
    mb, name, v, rc, notes = _choices(row)
    if why:
        notes.append(why)
    w = workload_fn(row)
    _check_experts(row, w)
    if row.tp_overlap is None and row.tp > 1:
        notes.append(f"tp_overlap {int(default_tp_overlap(row))} (not published: "
                     + ("Megatron-Bridge's TP communication overlap, on in NVIDIA's dense recipes)"
                        if default_tp_overlap(row) else "collectives on the critical path)"))
    if row.ep > 1 and row.dispatcher is None and expert_problem(row) is None:
        why = ("HybridEP, as NVIDIA runs on " + row.device if row.device in HYBRIDEP_DEVICES
               else "DeepEP: the expert-parallel group spans scale-up domains"
               if default_dispatcher(row) == "deepep" else "Megatron-Core default")
        notes.append(f"dispatcher {default_dispatcher(row)} (not published: {why})")
    if rc == "selective":
        kernel = attention_kernel(row)[0]
        w = selective_recompute(w, row.heads * (row.head_dim or row.hidden // row.heads),
                                causal_fraction(row.seq_len) if kernel != "unfused" else 1.0)
    elif rc == "op":
        w = op_recompute(w, row)
    elif rc == "layer":
        w = layer_recompute(w, row.hidden)
    elif rc == "modules":
        w = module_recompute(w, row)
    if rc != "full" and row_remat(row).name in MAXTEXT_POLICIES:
        w = policy_residuals(w, row)
    if row.offload_layers:
        w, offloaded = offload_activations(w, row)
        notes.append(offloaded)
    if row.bf16_first_layers or row.bf16_last_layers:
        w = keep_blocks_in_compute_dtype(w, row.bf16_first_layers, row.bf16_last_layers)
        notes.append(f"blocks in BF16: first {row.bf16_first_layers}, last "
                     f"{row.bf16_last_layers} (the rest {row.recipe})")
    if name in INTERLEAVED and tune and step_fn is not None and row.vp is None:
        v, _, cands = tune_virtual_stages(row, w, mb, rc, step_fn, device)
        why = (f"the fastest of v in {{{', '.join(map(str, cands))}}}" if len(cands) > 1
               else "the only even split of a rank's layers")
        notes = [f"{v} virtual stages ({why})" if n.endswith(" virtual stages") else n
                 for n in notes]
    plan = build_plan(row, w, schedule=name, micro_batch=mb, virtual_stages=v,
                      recompute=rc == "full")
    split = stage_blocks(row, w, plan.schedule.stage_rank)[1]
    if split:
        notes.append(split)
    off = row_offload_s(row, plan)
    if off:
        notes.append(f"host offload {off * 1e3:.3g} ms per step over "
                     f"{remat.host_link(row.device) / 1e9:g} GB/s each way (exposed)")
    return Setup(row, mb, plan.microbatches, name, v, rc, tuple(notes), w, plan, off)


FLOP_METRICS = ("tflops_per_gpu", "tflops_per_device", "mfu")
"""Metrics converted with a FLOP count of the row's shape columns (a dense decoder's:
:mod:`simulator.validation_rows`), which a mixture of experts' does not follow."""


def _check_experts(row: Row, workload: Workload) -> None:
    """The row's expert columns against its costed model (``workload``: its layers' experts).

    Raises:
        ValidationError: see :func:`row_setup`.
    """
    experts = max((c.experts for c in workload.costs.values()), default=0)
    dense_etp = row.etp is not None and row.etp != row.tp
    if not experts and (row.ep > 1 or dense_etp):
        col = f"ep={row.ep}" if row.ep > 1 else f"etp={row.etp}"
        raise ValidationError(f"row {row.line}: {col} but model {workload.model} is not a mixture "
                              f"of experts; fix: leave {col.split('=')[0]} blank")
    if experts and row.ep > 1 and experts % row.ep:
        raise ValidationError(f"row {row.line}: ep={row.ep} does not divide model "
                              f"{workload.model}'s {experts} experts; fix ep")
    why = expert_problem(row)
    if why:
        raise ValidationError(f"row {row.line}: {why}")
    width = workload.shards.expert_width if workload.shards is not None else 0
    if experts and row.ep > 1 and width and width % row_etp(row):
        raise ValidationError(f"row {row.line}: etp={row_etp(row)} does not divide model "
                              f"{workload.model}'s expert width {width}; fix etp")
    if experts and row.metric in FLOP_METRICS:
        raise ValidationError(f"row {row.line}: metric {row.metric} is counted from a dense "
                              f"model's shape columns, not a mixture of experts' ({workload.model}); "
                              f"fix: give the run's step time or throughput (iteration_s, "
                              f"tokens_per_gpu_s, samples_per_gpu_s)")


def with_efficiency(device: DeviceProfile, matmul: float | None = None,
                    memory: float | None = None, overhead_s: float | None = None,
                    elementwise: float | None = None) -> DeviceProfile:
    """``device`` with the given efficiency values (None keeps the profile's)."""
    return replace(device,
                   matmul_efficiency=device.matmul_efficiency if matmul is None else matmul,
                   memory_efficiency=device.memory_efficiency if memory is None else memory,
                   fragment_overhead=device.fragment_overhead if overhead_s is None else overhead_s,
                   elementwise_traffic=(device.elementwise_traffic if elementwise is None
                                        else elementwise))
