"""What a model costs: :class:`LayerCost` per unique fragment body and the :class:`Workload` of a model
(traced from JAX by ``zoo.costing``). Units are SI: seconds, bytes, FLOP."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Mapping

from ir.errors import IRError
from ir.precision import RECIPES
from ir.shards import ShardDims


@dataclass(frozen=True, slots=True)
class LayerCost:
    """The cost of one unique fragment body (a named computation), traced from XLA.

    All ``*_per_sample`` figures are per sequence (one sample of ``seq_len`` tokens) and scale
    linearly with the microbatch size; ``*_fixed`` figures do not depend on it (weights read once).

    Attributes:
        name: the named computation, e.g. ``"decoder_block"``.
        fwd_flops_per_sample: forward FLOP for one sample (XLA ``cost_analysis()['flops']``).
        bwd_flops_per_sample: whole backward (input + weight gradient) FLOP for one sample.
        bwd_input_flops_per_sample: the input-gradient part of the backward (B of zero-bubble);
            the weight-gradient part (W) is ``bwd_flops_per_sample - bwd_input_flops_per_sample``.
        fwd_bytes_fixed / fwd_bytes_per_sample: bytes accessed by the forward, split into the part
            independent of the batch (weights) and the per-sample part.
        bwd_bytes_fixed / bwd_bytes_per_sample: the same for the backward.
        param_count: parameters of this layer.
        param_bytes: bytes of those parameters in the compute dtype.
        activation_bytes_per_sample: bytes of the layer's output (what a stage boundary transfers).
        residual_bytes_per_sample: bytes the forward keeps for the backward, parameters excluded.
        tp_allreduce_bytes_per_sample: bytes all-reduced over the tensor-parallel axis per forward
            (Megatron layout; the backward all-reduces the same amount), 0 for no tensor parallel.
        fwd_other_bytes_per_sample / bwd_other_bytes_per_sample / bwd_input_other_bytes_per_sample:
            HBM bytes of the ops other than matmuls and the attention core (norms, activations,
            residual adds, loss), counted unfused (every op reads its operands and writes its
            result), in the forward, the whole backward and the input-gradient part B; the cost
            model charges a device-specific fraction of them as memory-bound time outside the
            roofline (see ``simulator.cost_model.layer_time``). 0 when not traced.
        attention_fwd_flops_per_sample / attention_bwd_flops_per_sample: of the forward's and the
            backward's FLOP, those of a fused attention kernel's core (``"flash"``: the score
            blocks it computes, the backward's recomputed scores included; all input-gradient
            FLOP, the core has no weights). The cost model runs them at the device's attention
            kernel rate (``DeviceProfile.attention_rate``) rather than its GEMM rate. 0 for
            a layer without attention or an unfused core (its matmuls are ordinary GEMMs).
        fwd_ops / bwd_ops: primitive operations of the forward and the whole backward.
    """

    name: str
    fwd_flops_per_sample: float
    bwd_flops_per_sample: float
    bwd_input_flops_per_sample: float
    fwd_bytes_fixed: float
    fwd_bytes_per_sample: float
    bwd_bytes_fixed: float
    bwd_bytes_per_sample: float
    param_count: int
    param_bytes: float
    activation_bytes_per_sample: float
    residual_bytes_per_sample: float
    tp_allreduce_bytes_per_sample: float
    fwd_other_bytes_per_sample: float = 0.0
    bwd_other_bytes_per_sample: float = 0.0
    bwd_input_other_bytes_per_sample: float = 0.0
    experts: int = 0
    """Experts of the layer's mixture of experts (0: a dense layer)."""
    expert_param_count: int = 0
    """Of ``param_count``, the parameters in the experts: what expert parallelism shards."""
    attention_fwd_flops_per_sample: float = 0.0
    attention_bwd_flops_per_sample: float = 0.0
    attention_kernel: str = ""
    """Which fused kernel runs those attention FLOP: ``""``, the device's own (the one its
    profile's attention figures describe), or ``"flash2"``, FlashAttention-2
    (``DeviceProfile.flash2_attention``; :data:`ATTENTION_KERNELS`)."""
    alltoall_bytes_per_sample: float = 0.0
    """Bytes one sample's tokens send to their experts in one dispatch (``seq x top_k x h x dtype
    bytes x capacity factor``); the combine sends as many back. What an expert-parallel layout
    moves by all-to-all, per direction."""
    expert_fwd_flops_per_sample: float = 0.0
    """Of ``fwd_flops_per_sample``, the routed experts' matmuls (at their capacity): the part that
    streams the experts' weights once per microbatch and so runs at the roofline of its own
    intensity (tokens per expert), apart from the rest of the layer. Their backward is twice it."""
    routed_pairs_per_sample: float = 0.0
    """(token, expert) pairs one sample routes in a mixture-of-experts layer (``seq x top_k``):
    what its token permutations (dispatch into the experts' slots, combine back) move, row by row.
    A device whose gathers cost more than their bytes (XLA:CPU) pays its measured time per pair
    (``DeviceProfile.forward_routing_pair`` / ``backward_routing_pair``). 0 for a dense layer."""
    low_precision: bool = False
    """Whether a low-precision recipe (``Workload.precision``, :mod:`ir.precision`) runs this
    layer's GEMMs in its format: True for a decoder block's linear layers, False for the
    embedding and the LM head, which recipes keep in the compute dtype."""
    experts_per_token: float = 0.0
    """Experts each token is routed to (top-k; 0 for a dense layer or not known): the copies of
    a token a dispatch makes, which a two-hop dispatch (``Layout.expert_dispatch`` ``"deepep"``)
    sends once per remote node instead of once per expert."""
    context_kv_bytes_per_sample: float = 0.0
    """Bytes of one sample's attention keys and values over its whole sequence (key/value heads x
    their widths x tokens x dtype bytes; latent attention's per-head keys and values as its
    kernel receives them): what a ring or all-gather context-parallel attention
    (``Layout.context``) moves, per direction. 0 for a layer without attention."""
    context_qkvo_bytes_per_sample: float = 0.0
    """Bytes of one sample's attention queries, keys, values and output over its whole sequence:
    what DeepSpeed-Ulysses' four all-to-alls (``Layout.context_method`` ``"alltoall"``) move.
    0 for a layer without attention."""
    expert_width: int = 0
    """Each routed expert's inner (FFN) width, elements (0: a dense layer or not known)."""
    shared_expert_width: int = 0
    """The shared experts' inner width together (shared experts x their width; 0: none)."""
    expert_latent: int = 0
    """LatentMoE's latent width, elements: the routed tokens and experts run at it, between a
    down- and an up-projection of the hidden state (0: none, the experts run at the hidden
    width; NVIDIA Nemotron 3 Super, Megatron-Core ``--moe-latent-size``)."""
    mla_q_rank: int = 0
    """Latent attention's query down-projection rank (DeepSeek-V2 Sec. 2.1 ``q_lora_rank``; 0:
    a full query projection, or no latent attention)."""
    mla_kv_rank: int = 0
    """Latent attention's key/value latent rank (``kv_lora_rank``; 0: no latent attention)."""
    mla_nope_dim: int = 0
    mla_rope_dim: int = 0
    mla_v_dim: int = 0
    """Latent attention's per-head query/key width without and with its rotary part and its value
    width (``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``; 0: no latent attention).
    These seven fields give Megatron-Core's named-module recompute
    (:mod:`simulator.remat`) the shapes the traced costs do not carry; 0 where unknown."""
    host_offload: float = 0.0
    """Fraction, 0..1, of what the layer keeps for its backward (its residuals, or under full
    recomputation its input) held in host memory between its forward and its backward instead of
    on the device: activation offloading (Megatron-Core's ``--cpu-offloading-num-layers``,
    averaged over the blocks; MaxText remat policies that offload ``decoder_layer_input``).
    Memory only (:func:`simulator.cost_model.stage_memory`): the copies run beside compute."""
    logits_per_sample: float = 0.0
    """Logit elements one sample's losses compute (tokens x vocabulary, per loss pass) in a
    training head; 0 for every other layer. ``residual_bytes_per_sample`` leaves them out: what
    the loss keeps of them, and holds beyond that at its peak, is the workload's
    (:data:`CROSS_ENTROPY`, :func:`simulator.cost_model.stage_memory`); a head keeps its
    residuals under full recomputation, which reruns the blocks only."""
    fwd_ops: int = 0
    bwd_ops: int = 0
    """Primitive operations of the forward and of the whole backward (the pullback on the kept
    residuals): the traced program's equations, nested calls expanded, at one sample. A device
    that dispatches ops one by one at a fixed cost each (XLA:CPU) pays its measured fixed time per
    layer in proportion (``DeviceProfile.layer_overhead_ops``). 0 when not traced."""

    def __post_init__(self) -> None:
        for f in ("fwd_flops_per_sample", "bwd_flops_per_sample", "bwd_input_flops_per_sample",
                  "fwd_bytes_fixed", "fwd_bytes_per_sample", "bwd_bytes_fixed",
                  "bwd_bytes_per_sample", "param_bytes", "activation_bytes_per_sample",
                  "residual_bytes_per_sample", "tp_allreduce_bytes_per_sample",
                  "fwd_other_bytes_per_sample", "bwd_other_bytes_per_sample",
                  "bwd_input_other_bytes_per_sample", "context_kv_bytes_per_sample",
                  "context_qkvo_bytes_per_sample", "logits_per_sample"):
            v = getattr(self, f)
            if not v >= 0:
                raise IRError(f"LayerCost {self.name!r}: {f}={v!r} must be >= 0")
        if not 0 <= self.expert_param_count <= self.param_count or self.experts < 0 \
                or not self.alltoall_bytes_per_sample >= 0 \
                or not self.routed_pairs_per_sample >= 0 \
                or not 0 <= self.expert_fwd_flops_per_sample <= self.fwd_flops_per_sample:
            raise IRError(f"LayerCost {self.name!r}: experts={self.experts}, expert_param_count="
                          f"{self.expert_param_count} (of {self.param_count}), alltoall bytes "
                          f"{self.alltoall_bytes_per_sample!r}, expert FLOP "
                          f"{self.expert_fwd_flops_per_sample!r}: counts must be >= 0 and within "
                          "the layer's")
        if self.bwd_input_flops_per_sample > self.bwd_flops_per_sample:
            raise IRError(f"LayerCost {self.name!r}: input-gradient FLOP exceed the backward's")
        if not (0 <= self.attention_fwd_flops_per_sample <= self.fwd_flops_per_sample
                and 0 <= self.attention_bwd_flops_per_sample <= self.bwd_input_flops_per_sample):
            raise IRError(f"LayerCost {self.name!r}: attention core FLOP (forward "
                          f"{self.attention_fwd_flops_per_sample!r}, backward "
                          f"{self.attention_bwd_flops_per_sample!r}) must be >= 0 and within the "
                          f"forward's and the input gradient's FLOP")
        if self.bwd_input_other_bytes_per_sample > self.bwd_other_bytes_per_sample:
            raise IRError(f"LayerCost {self.name!r}: input-gradient other bytes exceed the backward's")
        if self.attention_kernel not in ("", "flash2"):
            raise IRError(f"LayerCost {self.name!r}: attention_kernel {self.attention_kernel!r} "
                          f"is not '' (the device's fused kernel) or 'flash2'")
        if not 0 <= self.host_offload <= 1:
            raise IRError(f"LayerCost {self.name!r}: host_offload={self.host_offload!r} must be a "
                          f"fraction in [0, 1]")



ATTENTION_KERNELS = {
    "flash": "a fused attention kernel (FlashAttention-2/3, cuDNN / Transformer Engine fused "
             "attention, PyTorch SDPA, JAX splash attention): the scores never reach HBM, a causal "
             "mask skips the key blocks above the diagonal, the backward recomputes the scores "
             "(Dao et al. 2022, 2023)",
    "flash2": "FlashAttention-2 itself (the flash-attn 2 package, PyTorch SDPA's FLASH_ATTENTION "
              "backend, which torchtitan pins under context parallelism): computes and moves what "
              "'flash' does, at FlashAttention-2's rate (DeviceProfile.flash2_attention: 0.62 of "
              "cuDNN's on Hopper, Shah et al. 2024)",
    "unfused": "the softmax materialized between two batched matmuls (Megatron-LM's fused "
               "scale-mask-softmax, the attention of runs before FlashAttention): every score "
               "computed and moved through HBM",
}
"""The attention kernels the cost model knows (``ModelConfig.attention_kernel``), with what each
computes and moves (``zoo.costing.body_cost``; the ``attention`` column of a validation row)."""


FLASH_BLOCK = 128
"""Query and key block size of a fused attention kernel: FlashAttention-2 tiles the scores in
128 x 128 blocks for head widths up to 128 (Dao 2023, "FlashAttention-2", Sec. 3.3 and its
released kernels; FlashAttention-3 and cuDNN's fused attention use 128-row tiles on Hopper too).
Under a causal mask a block wholly above the diagonal is skipped."""


def causal_fraction(seq: int, block: int = FLASH_BLOCK) -> float:
    """Fraction of a ``seq x seq`` causal score matrix's FLOPs a blocked kernel computes:
    ``n (n + 1) / 2`` of ``n^2`` blocks, ``n = ceil(seq / block)`` (the blocks on and below the
    diagonal; a diagonal block is computed whole and masked inside). 1 for one block.

    Raises:
        IRError: ``seq`` or ``block`` is not positive.
    """
    if seq <= 0 or block <= 0:
        raise IRError(f"causal_fraction(seq={seq}, block={block}): both must be positive")
    n = math.ceil(seq / block)
    return (n + 1) / (2 * n)

PRECISIONS = ("bf16", "fp16", "fp32")
"""The compute dtypes a :class:`Workload` may name (``Workload.dtype``)."""

SAVED_INPUTS = ("format", "compute")
"""What a low-precision recipe's GEMMs keep of their inputs for the weight gradient
(``Workload.saved_inputs``): the quantized copy (Transformer Engine's ``Linear`` saves its FP8 or
FP4 input; NVIDIA's recipes), or the compute-dtype input, cast again in the backward (torchao's
``Float8Linear`` at eab345c, December 2024: ``ctx.save_for_backward(input_hp, weight_hp_t)``)."""


@dataclass(frozen=True, slots=True)
class CrossEntropy:
    """How a training step computes its loss: the copies of the logits it keeps for the backward
    and the extra ones it holds beside them at its peak, in the compute dtype and in fp32."""

    kept_compute: int
    kept_fp32: int
    extra_compute: int
    extra_fp32: int
    describe: str


CROSS_ENTROPY = {
    "fused": CrossEntropy(1, 0, 0, 0, "Transformer Engine's parallel cross-entropy "
                          "(Megatron-Bridge's cross_entropy_fusion_impl 'te', which its Llama, "
                          "Qwen and DeepSeek providers set) writes the gradient over the logits in "
                          "place in the forward and keeps that; XLA keeps the compute-dtype logits "
                          "(MaxText's logits_dot_in_fp32 false) and feeds its fusions straight to "
                          "the output layer's GEMMs"),
    "fp32": CrossEntropy(0, 1, 1, 0, "Megatron-Core's vocab-parallel cross-entropy "
                         "(tensor_parallel/cross_entropy.py): the logits upcast to fp32, "
                         "exponentiated and turned into the gradient in place and kept, the "
                         "compute-dtype logits (forward) or their gradient (backward) beside them"),
    "eager": CrossEntropy(0, 1, 0, 2, "PyTorch's cross_entropy on the fp32 logits, op by op "
                          "(torchtitan's of 2024: self.output(h).float(), then cross_entropy): it "
                          "keeps the fp32 log-probabilities, and its backward holds nll_loss's and "
                          "log_softmax's fp32 gradients beside them, each its own allocation"),
}
"""The ``Workload.cross_entropy`` values: how the loss is computed, by name."""


@dataclass(frozen=True, slots=True)
class Workload:
    """A model's step, as a sequence of layers (each an instance of a unique :class:`LayerCost`).

    Attributes:
        model: zoo name, e.g. ``"llama3-70b"``.
        layers: the layer sequence in program order, as names into ``costs`` (length L).
        costs: unique fragment bodies by name.
        seq_len: tokens per sample.
        global_batch: samples per step.
        training: True for a training step (forward, backward, optimizer), False for forward only.
        dtype_bytes: bytes per element of the compute dtype (2 for bfloat16).
        dtype: the compute dtype as the precision key a device's rate is looked up by
            (:data:`PRECISIONS`: ``"bf16"``, ``"fp16"``, ``"fp32"``;
            ``hardware_profiles.types.DeviceProfile.matmul_precision``); ``""`` derives it from
            ``dtype_bytes`` (2: bf16, 4: fp32).
        source: citation of the model's published config.
        shards: the dimensions tensor and expert parallelism split (:class:`ir.shards.ShardDims`),
            which decide the layouts that can run it (:func:`ir.shards.layout_problem`); None: any.
        precision: the training precision recipe its blocks' GEMMs run in
            (:data:`ir.precision.PRECISIONS`: ``"bf16"``, ``"fp8"``, ``"fp8-blockwise"``,
            ``"mxfp8"``, ``"nvfp4"``); ``""`` is ``"bf16"``: every GEMM in the compute dtype.
        cross_entropy: how the loss is computed (:data:`CROSS_ENTROPY`: ``"fused"``, Transformer
            Engine's and XLA's, the default; ``"fp32"``, Megatron-Core's own; ``"eager"``,
            PyTorch's op by op): what the loss keeps of the logits and holds beside them.
        saved_inputs: how a low-precision recipe keeps its GEMMs' inputs for the weight gradient
            (:data:`SAVED_INPUTS`): ``"format"``, the quantized copy (Transformer Engine), or
            ``"compute"``, the compute-dtype inputs, cast again in the backward (torchao's
            ``Float8Linear`` of late 2024, which saves ``input_hp``).
    """

    model: str
    layers: tuple[str, ...]
    costs: Mapping[str, LayerCost]
    seq_len: int
    global_batch: int
    training: bool = True
    dtype_bytes: int = 2
    source: str = ""
    shards: ShardDims | None = None
    dtype: str = ""
    precision: str = ""
    cross_entropy: str = "fused"
    saved_inputs: str = "format"

    def __post_init__(self) -> None:
        if not self.layers:
            raise IRError(f"Workload {self.model!r} has no layers")
        missing = sorted({n for n in self.layers if n not in self.costs})
        if missing:
            raise IRError(f"Workload {self.model!r}: layers {missing} have no LayerCost")
        if self.seq_len <= 0 or self.global_batch <= 0:
            raise IRError(f"Workload {self.model!r}: seq_len and global_batch must be positive")
        if self.dtype and self.dtype not in PRECISIONS:
            raise IRError(f"Workload {self.model!r}: dtype {self.dtype!r} is not one of {PRECISIONS}")
        if self.precision and self.precision not in RECIPES:
            raise IRError(f"Workload {self.model!r}: precision {self.precision!r} is not one of "
                          f"{tuple(RECIPES)}")
        if self.saved_inputs not in SAVED_INPUTS:
            raise IRError(f"Workload {self.model!r}: saved_inputs {self.saved_inputs!r} is not "
                          f"one of {SAVED_INPUTS}")
        if self.cross_entropy not in CROSS_ENTROPY:
            raise IRError(f"Workload {self.model!r}: cross_entropy {self.cross_entropy!r} is not "
                          f"one of {tuple(CROSS_ENTROPY)}")

    @property
    def loss_kept_bytes_per_logit(self) -> float:
        """Bytes per logit element the loss keeps for its backward (:data:`CROSS_ENTROPY`)."""
        ce = CROSS_ENTROPY[self.cross_entropy]
        return ce.kept_compute * self.dtype_bytes + ce.kept_fp32 * 4.0

    @property
    def loss_working_bytes_per_logit(self) -> float:
        """Bytes per logit element the loss holds beyond what it keeps, at its peak
        (:data:`CROSS_ENTROPY`)."""
        ce = CROSS_ENTROPY[self.cross_entropy]
        return ce.extra_compute * self.dtype_bytes + ce.extra_fp32 * 4.0

    def layer(self, i: int) -> LayerCost:
        return self.costs[self.layers[i]]

    @property
    def param_count(self) -> int:
        return sum(self.costs[n].param_count for n in self.layers)

    @property
    def step_flops(self) -> float:
        """Model FLOP of one step (forward, plus backward when training), no recomputation."""
        per = sum(self.costs[n].fwd_flops_per_sample
                  + (self.costs[n].bwd_flops_per_sample if self.training else 0.0)
                  for n in self.layers)
        return per * self.global_batch


HIGH_PRECISION_SUFFIX = "_bf16"
"""Suffix of the body name :func:`keep_blocks_in_compute_dtype` gives the blocks it takes out of a
low-precision recipe (``"decoder_block_bf16"``)."""


def keep_blocks_in_compute_dtype(workload: Workload, first: int, last: int) -> Workload:
    """``workload`` with its first ``first`` and last ``last`` decoder blocks' GEMMs in the compute
    dtype (BF16) under its low-precision recipe: Megatron-Bridge's ``first_last_layers_bf16`` with
    ``num_layers_at_start_in_bf16`` / ``num_layers_at_end_in_bf16`` (``MixedPrecisionConfig``,
    ``src/megatron/bridge/training/mixed_precision.py``), which NVFP4 runs use for stability
    (NVIDIA, "Pretraining Large Language Models with NVFP4", 2025: the last layers in BF16).

    The blocks are the layers between the first (embedding) and the last (head); each kept one
    runs a copy of its body named ``<body>_bf16`` with ``low_precision`` False (its GEMM rate,
    weight copies and saved inputs then those of BF16, ``simulator.cost_model``).

    Raises:
        IRError: ``first`` or ``last`` negative, or together not fewer than the blocks.
    """
    blocks = len(workload.layers) - 2
    if first < 0 or last < 0 or first + last >= blocks:
        raise IRError(f"Workload {workload.model!r}: {first} first and {last} last blocks in the "
                      f"compute dtype leave none of its {blocks} blocks to the recipe; fix: keep "
                      f"fewer than {blocks} blocks")
    if not first and not last:
        return workload
    layers, costs = list(workload.layers), dict(workload.costs)
    for i in [*range(1, 1 + first), *range(len(layers) - 1 - last, len(layers) - 1)]:
        body = layers[i]
        kept = body + HIGH_PRECISION_SUFFIX
        if kept not in costs:
            costs[kept] = replace(costs[body], name=kept, low_precision=False)
        layers[i] = kept
    return replace(workload, layers=tuple(layers), costs=costs)
