"""Activation rematerialisation (recompute) policies a validation row may name, and what each
costs.

A policy says, for one transformer layer, which of its activations the forward keeps in device
memory, which it moves to host memory and back (``*_offloaded``), and which matmuls the backward
therefore reruns. The activations are MaxText's checkpoint names (``MaxText/layers/decoders.py``,
``Decoder.get_remat_policy``, repository AI-Hypercomputer/maxtext; ``src/MaxText/configs/base.yml``
lists them): ``qkv`` (``query_proj``, ``key_proj``, ``value_proj``), ``context`` (the attention
core's output, ``softmax(Q K^T) V``), ``out_proj``, ``mlpwi`` (``mlpwi_0``/``mlpwi_1`` of a gated
MLP) and ``mlpwo``; the layer input (``decoder_layer_input``) is always kept. Under
``jax.checkpoint`` an activation neither saved nor offloaded is recomputed in the backward, so the
matmul producing it is rerun: :func:`policy` turns that into fractions of the layer's forward FLOPs
and bytes for one layer shape (:class:`LayerShape`).

The cost model charges recomputation one of three ways today (``validation_setup.row_setup``):
``none``; ``selective`` (the attention core ``Q K^T``, ``softmax . V`` rerun in the backward,
Korthikanti et al. 2022: :func:`simulator.validation_setup.selective_recompute`); ``full`` (the
whole forward rerun: the plan's per-mesh ``recompute`` flag). A policy is costed as the one of
the three whose rerun fraction is nearest its own (ties: the one rerunning more), printed with the
row. Offloaded bytes cross the host link (:data:`HOST_LINK_BYTES_PER_S`) once each way per step;
:func:`offload_seconds` gives that time, which ``simulator.validate.evaluate`` adds to the row's
step time exposed (not overlapped with compute: an upper bound, XLA overlaps host transfers where
it can).
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.plan_costs import CostError


PARTS = ("qkv", "context", "out_proj", "mlpwi", "mlpwo")
"""A layer's activations, in forward order, by MaxText's checkpoint names (see the module doc)."""

ACTIVATION_BYTES = 2
"""Bytes per activation element: bf16 (MaxText's default ``dtype: bfloat16``)."""


class RematError(CostError):
    """An unknown policy, or a device with no host-link figure (the message names the fix)."""


@dataclass(frozen=True, slots=True)
class Spec:
    """One policy: the activations kept on device, moved to host, and whose matmuls are rerun."""

    saved: frozenset[str]
    offloaded: frozenset[str] = frozenset()
    rerun: frozenset[str] | None = None      # None: every part neither saved nor offloaded
    doc: str = ""

    def reruns(self) -> frozenset[str]:
        return self.rerun if self.rerun is not None else frozenset(PARTS) - self.saved - self.offloaded


def _s(*parts: str) -> frozenset[str]:
    return frozenset(parts)


ALL = _s(*PARTS)
DOTS = _s("qkv", "out_proj", "mlpwi", "mlpwo")

SPECS: dict[str, Spec] = {
    "none": Spec(ALL, doc="no jax.checkpoint: every activation kept"),
    "selective": Spec(ALL, rerun=_s("context"), doc="Korthikanti et al. 2022: the attention core "
                      "is rerun, its output and every matmul output kept"),
    "full": Spec(_s(), doc="only the layer input kept: the whole forward rerun"),
    "minimal": Spec(DOTS, doc="checkpoint_dots_with_no_batch_dims / every weight matmul's output "
                    "kept; the attention core rerun"),
    "minimal_with_context": Spec(ALL, doc="every matmul output and the context kept"),
    "minimal_flash": Spec(ALL, doc="minimal_with_context's older name"),
    "save_dot_with_context_except_mlp": Spec(_s("qkv", "context", "out_proj"),
                                             doc="the MLP's matmuls rerun"),
    "save_dot_except_mlpwi": Spec(_s("qkv", "out_proj", "mlpwo"),
                                  doc="the attention core and the MLP's input matmuls rerun"),
    "save_dot_except_mlp": Spec(_s("qkv", "out_proj"), doc="the attention core and the MLP rerun"),
    "save_qkv_proj": Spec(_s("qkv"), doc="all but the QKV projections rerun"),
    "save_out_proj": Spec(_s("out_proj"), doc="all but the output projection rerun"),
    "qkv_proj_offloaded": Spec(_s(), offloaded=_s("qkv"),
                               doc="the QKV projections offloaded to host, the rest rerun"),
    "minimal_offloaded": Spec(_s(), offloaded=DOTS, doc="every weight matmul's output offloaded "
                              "to host; the attention core rerun"),
    "op": Spec(ALL, rerun=_s(), doc="torchtitan's op-level selective activation checkpointing "
               "(activation_checkpoint.mode 'selective', selective_ac_option 'op'): every second "
               "weight matmul and every non-matmul op rerun, the attention core's output kept; "
               "costed exactly by simulator.validation_setup.op_recompute, not by its parts"),
    "layer": Spec(ALL, rerun=_s(), doc="torchtitan's layer-wise selective activation checkpointing "
                  "(activation_checkpoint.mode 'selective', selective_ac_option '2', its default): "
                  "every second block fully checkpointed, the others keep everything; costed "
                  "exactly by simulator.validation_setup.layer_recompute"),
    "custom": Spec(_s(), doc="base.yml's per-tensor defaults (every tensor 'remat', the layer "
                   "input 'device'): as full; a run that set tensors_on_device / tensors_to_offload "
                   "should name the policy nearest to them"),
}
"""Every policy name the ``recompute`` column accepts (case-insensitive), with its MaxText meaning
(``Decoder.get_remat_policy``; ``custom`` read at ``base.yml``'s defaults)."""

NAMES = tuple(SPECS)

COST_MODEL = ("none", "selective", "full")
"""How the cost model can charge recomputation today (module doc)."""

TPU_V5_PCIE_BYTES_PER_S = 1.5e10
"""TPU v5e / v5p host link, per chip, each way: "PCIe bandwidth is typically around 1.5e10 bytes /
second per chip" (Austin et al., "How to Scale Your Model", 2025, part 2 "How to Think About
TPUs", repository jax-ml/scaling-book ``tpus.md``; Google's TPU pages do not publish it)."""

TPU_V6E_PCIE_BYTES_PER_S = 3.2e10
"""TPU v6e (Trillium): "32GB/s, about 2x higher than v5" (the same page)."""

TPU_V4_PCIE_BYTES_PER_S = 1.6e10
"""TPU v4: "16GB / second each way" (the same page)."""

A100_PCIE_GEN4_X16_BYTES_PER_S = 32e9
"""A100: PCIe Gen4 x16, 64 GB/s both directions = 32 GB/s each way (NVIDIA A100 datasheet)."""

H100_PCIE_GEN5_X16_BYTES_PER_S = 64e9
"""H100 / H200 SXM: PCIe Gen5 x16, 128 GB/s both directions = 64 GB/s each way (NVIDIA H100 and
H200 datasheets)."""

HOST_LINK_BYTES_PER_S = {"tpu-v4": TPU_V4_PCIE_BYTES_PER_S, "tpu-v5e": TPU_V5_PCIE_BYTES_PER_S,
                         "tpu-v5p": TPU_V5_PCIE_BYTES_PER_S, "tpu-v6e": TPU_V6E_PCIE_BYTES_PER_S,
                         "a100-80gb-sxm": A100_PCIE_GEN4_X16_BYTES_PER_S,
                         "h100-sxm": H100_PCIE_GEN5_X16_BYTES_PER_S,
                         "h200-sxm": H100_PCIE_GEN5_X16_BYTES_PER_S}
"""Device profile id -> host link bandwidth per device, each way, B/s."""


@dataclass(frozen=True, slots=True)
class LayerShape:
    """One decoder layer: width ``hidden``, ``heads`` query and ``kv_heads`` key/value heads of
    ``head_dim``, MLP width ``ffn`` (gated: ``glu``), ``seq_len`` tokens per sample."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    glu: bool
    seq_len: int

    def flops(self) -> dict[str, float]:
        """Forward FLOPs per token of the matmul producing each part (attention core: ``4 s H d``,
        no causal saving, as MaxText and Megatron count it)."""
        h, H, kv, d, f = self.hidden, self.heads, self.kv_heads, self.head_dim, self.ffn
        return {"qkv": 2.0 * h * (H + 2 * kv) * d, "context": 4.0 * self.seq_len * H * d,
                "out_proj": 2.0 * H * d * h, "mlpwi": 2.0 * h * f * (2 if self.glu else 1),
                "mlpwo": 2.0 * f * h}

    def elements(self) -> dict[str, float]:
        """Elements per token of each part; ``input`` is the layer input."""
        H, kv, d, f = self.heads, self.kv_heads, self.head_dim, self.ffn
        return {"input": float(self.hidden), "qkv": float((H + 2 * kv) * d),
                "context": float(H * d), "out_proj": float(self.hidden),
                "mlpwi": float(f * (2 if self.glu else 1)), "mlpwo": float(self.hidden)}


@dataclass(frozen=True, slots=True)
class RematPolicy:
    """A policy evaluated for one layer shape (:func:`policy`).

    Attributes:
        name: the policy's name (lower case).
        recompute_fraction: fraction of the layer's forward FLOPs rerun in the backward, 0..1.
        saved_fraction: fraction of the no-remat residual bytes (every part and the layer input)
            kept in device memory, 0..1.
        offload_bytes_fraction: fraction of those bytes moved to host and back, 0..1.
        offload_bytes_per_token: bytes per token per layer moved each way.
        cost_model: how it is charged: ``"none"``, ``"selective"`` or ``"full"`` (:data:`COST_MODEL`).
        costed_as: the one-line assumption printed with the row.
    """

    name: str
    recompute_fraction: float
    saved_fraction: float
    offload_bytes_fraction: float
    offload_bytes_per_token: float
    cost_model: str
    costed_as: str


def _fraction(parts, weights: dict[str, float]) -> float:
    total = sum(weights[p] for p in PARTS)
    if set(parts) == set(PARTS):
        return 1.0
    return sum(weights[p] for p in PARTS if p in parts) / total


def policy(name: str, layer: LayerShape) -> RematPolicy:
    """The policy ``name`` (case-insensitive, :data:`NAMES`) for ``layer``, with the cost-model
    option nearest its rerun fraction (module doc).

    ``modules:<name>[,<name>]`` is Megatron-Core's named-module recompute (:func:`parse_modules`),
    costed exactly per block by ``simulator.validation_setup.module_recompute`` (cost model
    ``"modules"``; its fractions here are placeholders: 0 rerun, everything saved).

    Raises:
        RematError: an unknown name or module (the message lists the known ones).
    """
    key = name.strip().lower()
    if key.startswith(MODULES_PREFIX):
        mods = parse_modules(key)
        return RematPolicy(MODULES_PREFIX + ",".join(mods), 0.0, 1.0, 0.0, 0.0, "modules",
                           f"Megatron-Core selective recompute of modules {', '.join(mods)} "
                           f"(saved bytes dropped and forward rerun per module: "
                           f"simulator.remat.module_cost)")
    if key not in SPECS:
        raise RematError(f"recompute {name[:40]!r} unknown; fix: use one of {', '.join(NAMES)} "
                         f"or leave it blank")
    spec, flops, elems = SPECS[key], layer.flops(), layer.elements()
    frac = _fraction(spec.reruns(), flops)
    options = {o: _fraction(SPECS[o].reruns(), flops) for o in COST_MODEL}
    option = min(reversed(COST_MODEL), key=lambda o: abs(options[o] - frac))
    total = elems["input"] + sum(elems[p] for p in PARTS)
    saved = (elems["input"] + sum(elems[p] for p in spec.saved)) / total
    off = sum(elems[p] for p in spec.offloaded)
    rerun = ", ".join(p for p in PARTS if p in spec.reruns()) or "nothing"
    text = (f"remat {key}{' (base.yml defaults)' if key == 'custom' else ''}: reruns "
            f"{frac * 100:.0f}% of the layer's forward ({rerun}), costed as {option} recompute")
    if off:
        text += f"; offloads {', '.join(p for p in PARTS if p in spec.offloaded)} to host"
    return RematPolicy(key, frac, saved, off / total, off * ACTIVATION_BYTES, option, text)


def host_link(device: str) -> float:
    """Host link bandwidth of profile ``device``, per device, each way, B/s.

    Raises:
        RematError: no figure for ``device`` in :data:`HOST_LINK_BYTES_PER_S`.
    """
    if device not in HOST_LINK_BYTES_PER_S:
        raise RematError(f"no host-link bandwidth for device {device!r}, which an offloading remat "
                         f"policy needs; fix: add it to simulator.remat.HOST_LINK_BYTES_PER_S "
                         f"with its source, or name a policy that does not offload")
    return HOST_LINK_BYTES_PER_S[device]


def offload_seconds(p: RematPolicy, tokens_per_device: float, layers_per_device: int,
                    device: str) -> float:
    """Seconds per step to move ``p``'s offloaded activations to host in the forward and back in
    the backward (one one-way transfer each) over ``device``'s host link: ``2 x bytes per token x
    tokens_per_device x layers_per_device / bandwidth``; 0 when nothing is offloaded.
    ``tokens_per_device`` is a device's share of a step's tokens (batch over data parallelism,
    activations over tensor parallelism).

    Raises:
        RematError: ``p`` offloads and ``device`` has no host-link figure (:func:`host_link`).
    """
    if not p.offload_bytes_per_token:
        return 0.0
    moved = p.offload_bytes_per_token * tokens_per_device * layers_per_device
    return 2.0 * moved / host_link(device)


def op_sac_saved_elements(hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                          glu: bool) -> float:
    """Elements per token one decoder block keeps under torchtitan's op-level selective
    activation checkpointing (``selective_ac_option = 'op'``; ``torchtitan/models/llama3/
    infra/parallelize.py``, ``_apply_ac_to_transformer_block``: an ``mm`` output is saved when
    its count in the block's forward is odd, the attention kernels' outputs always, everything
    else recomputed): the block input, the outputs of the matmuls at odd positions of the forward
    order (Llama: ``wq``, ``wv``, ``w1``, ``w2`` of ``wq, wk, wv, wo, w1, w3, w2``; GPT: ``wq``,
    ``wv``, ``w1`` of ``wq, wk, wv, wo, w1, w2``), and the attention kernel's output with its
    float32 log-sum-exp (two bf16 elements per head). Llama 3 8B: 31,808 elements (63.6 kB in
    bf16) against 73,792 traced without checkpointing (:mod:`zoo.costing`'s residuals)."""
    h, H, kv, d, f = hidden, heads, kv_heads, head_dim, ffn
    outs = [H * d, kv * d, kv * d, h] + ([f, f, h] if glu else [f, h])
    return float(h + sum(outs[0::2]) + H * d + 2 * H)


# --- Megatron-Core's named-module recompute -------------------------------------------------

MODULES = ("core_attn", "mlp", "moe", "moe_act", "layernorm", "shared_experts", "mla_up_proj")
"""Megatron-Core's ``--recompute-granularity selective --recompute-modules`` names this model
costs (``megatron/core/transformer/transformer_config.py``, ``recompute_modules``; repository
NVIDIA/Megatron-LM @ d98e8a6). Its hybrid-model names (``gdn_norm_out``, ``gdp_*``, ``mhc``)
are not modelled."""

MODULES_PREFIX = "modules:"
"""The ``recompute`` column's form for named modules: ``modules:core_attn,moe_act``."""


def parse_modules(text: str) -> tuple[str, ...]:
    """The module names of ``modules:a,b,...`` (case-insensitive, deduplicated, in
    :data:`MODULES` order).

    Raises:
        RematError: no module, or a name not in :data:`MODULES` (named, with the valid ones).
    """
    body = text.strip()
    if body.lower().startswith(MODULES_PREFIX):
        body = body[len(MODULES_PREFIX):]
    names = [n.strip().lower() for n in body.split(",") if n.strip()]
    if not names:
        raise RematError(f"recompute {text[:60]!r} names no module; fix: modules:<name>[,<name>] "
                         f"with names from {', '.join(MODULES)}")
    bad = [n for n in names if n not in MODULES]
    if bad:
        raise RematError(f"recompute module {bad[0][:40]!r} unknown; fix: use modules from "
                         f"{', '.join(MODULES)} (Megatron-Core's recompute_modules)")
    return tuple(m for m in MODULES if m in names)


@dataclass(frozen=True, slots=True)
class ModuleShape:
    """One transformer block's shapes as Megatron-Core's modules see them (elements; per token).

    ``hidden`` width; ``heads`` query heads; ``ffn`` the dense MLP's inner width (``glu``: gated,
    fc1 ``2 ffn`` wide); ``moe``: the block's MLP is a mixture of experts of ``experts`` routed
    experts, ``top_k`` per token, each ``expert_ffn`` wide, plus shared experts ``shared_ffn``
    wide together, the routed experts at LatentMoE's ``latent`` width when set (0: ``hidden``);
    latent attention (``kv_rank`` > 0) with query rank ``q_rank`` (0: a full
    query projection), per-head ``nope`` + ``rope`` query/key widths and ``v_dim`` values;
    ``attention_flops`` the attention core's forward FLOP per token; ``dtype_bytes`` the saved
    activations' element size (2: bf16)."""

    hidden: int
    heads: int
    ffn: int
    glu: bool
    moe: bool = False
    experts: int = 0
    top_k: float = 0.0
    expert_ffn: int = 0
    shared_ffn: int = 0
    latent: int = 0
    q_rank: int = 0
    kv_rank: int = 0
    nope: int = 0
    rope: int = 0
    v_dim: int = 0
    attention_flops: float = 0.0
    dtype_bytes: int = 2


@dataclass(frozen=True, slots=True)
class ModuleCost:
    """What recomputing one module does to one block, per token: the saved activation bytes it
    drops, the forward FLOP rerun before the backward, and the memory-bound bytes the rerun's
    elementwise ops move (read + write)."""

    dropped_bytes: float
    rerun_flops: float
    rerun_traffic_bytes: float


def module_cost(module: str, s: ModuleShape) -> ModuleCost:
    """:class:`ModuleCost` of recomputing ``module`` (:data:`MODULES`) in a block of shape ``s``.

    What each keeps and drops is read at Megatron-Core's code (NVIDIA/Megatron-LM @ d98e8a6):
    ``moe_act``, ``layernorm`` and ``mla_up_proj`` use output-discarding checkpointing
    (``tensor_parallel.CheckpointWithoutOutput``: the module's inputs are kept, its output is
    freed once the consumer has saved nothing else of it and is rerun before that consumer's
    backward); ``core_attn``, ``mlp``, ``moe`` and ``shared_experts`` normal checkpointing (the
    module's input is kept, everything saved inside it dropped). ``g`` = 2 for a gated MLP, else 1.

    - ``layernorm`` (``transformer_layer.py``: ``input_layernorm_checkpoint``,
      ``pre_mlp_norm_checkpoint``): drops both norms' outputs, which the next linear (QKV or the
      latent down-projections; fc1 or the router) saves: ``2 h``; reruns two RMSNorms
      (read ``h``, write ``h`` each: ``4 h`` elements of traffic).
    - ``moe_act`` (``moe/experts.py``, ``activation_checkpoint``): drops the routed experts'
      activation output, fc2's saved input, ``top_k x expert_ffn``; the activation's input (fc1's
      output, ``g x expert_ffn`` per copy) stays as the checkpoint's input. Reruns the activation
      (read ``g fe``, write ``fe`` per routed copy). 0 on a dense block.
    - ``mla_up_proj`` (``multi_latent_attention.py``, ``qkv_up_checkpoint``): drops the query,
      key and value the up-projections and RoPE produce, which the attention core saves:
      ``heads x (2 (nope + rope) + v_dim)``; reruns the query and key/value up-projections,
      ``2 heads (q_rank or h)(nope + rope) + 2 heads kv_rank (nope + v_dim)`` FLOP. 0 without
      latent attention.
    - ``mlp`` (``transformer_layer.py``: only on a layer that is not a mixture of experts):
      drops the activation's input and fc2's input, ``(g + 1) ffn``; reruns the MLP,
      ``2 h ffn (g + 1)`` FLOP and the activation's traffic.
    - ``shared_experts`` (``moe/moe_layer.py``): as ``mlp`` for the shared experts' width.
    - ``moe`` (``moe/moe_layer.py``, ``moe_layer_recompute``): drops everything inside the layer
      but its input: the permuted tokens (fc1's input, ``top_k h``; ``top_k latent`` under
      LatentMoE, plus the down-projected tokens, ``latent``), fc1's output and fc2's input
      (``top_k (g + 1) fe``), the shared experts' (as above) and the router's fp32 probabilities
      (``4 experts`` bytes); reruns the router, LatentMoE's down- and up-projections, the routed
      and the shared experts' matmuls (the dispatch all-to-all rerun is not charged).
    - ``core_attn``: with a fused (flash) kernel the checkpoint keeps Q, K, V as its inputs and the
      output is saved by the output projection, so nothing of size is dropped (the ``s x s``
      scores Korthikanti et al. drop are never saved); reruns the attention core
      (``attention_flops``).
    """
    b, h, g = s.dtype_bytes, s.hidden, (2 if s.glu else 1)
    zero = ModuleCost(0.0, 0.0, 0.0)
    if module == "layernorm":
        return ModuleCost(2.0 * h * b, 0.0, 4.0 * h * b)
    if module == "core_attn":
        return ModuleCost(0.0, s.attention_flops, 0.0)
    if module == "mla_up_proj":
        if not s.kv_rank:
            return zero
        qk = s.nope + s.rope
        flops = 2.0 * s.heads * ((s.q_rank or h) * qk + s.kv_rank * (s.nope + s.v_dim))
        return ModuleCost(float(s.heads * (2 * qk + s.v_dim) * b), flops, 0.0)
    if module == "mlp":
        if s.moe:
            return zero
        return ModuleCost(float((g + 1) * s.ffn * b), 2.0 * h * s.ffn * (g + 1),
                          float((g + 1) * s.ffn * b))
    if module == "shared_experts":
        f = s.shared_ffn if s.moe else 0
        return ModuleCost(float((g + 1) * f * b), 2.0 * h * f * (g + 1), float((g + 1) * f * b))
    if module == "moe_act":
        if not s.moe:
            return zero
        return ModuleCost(s.top_k * s.expert_ffn * b, 0.0, s.top_k * (g + 1) * s.expert_ffn * b)
    if module == "moe":
        if not s.moe:
            return zero
        shared = module_cost("shared_experts", s)
        w = s.latent or h                       # the width the routed tokens run at
        routed = s.top_k * (w + (g + 1) * s.expert_ffn) + (s.latent or 0)
        return ModuleCost(routed * b + 4.0 * s.experts + shared.dropped_bytes,
                          2.0 * h * s.experts + 2.0 * s.top_k * w * s.expert_ffn * (g + 1)
                          + 4.0 * h * (s.latent or 0) + shared.rerun_flops,
                          s.top_k * (g + 1) * s.expert_ffn * b + shared.rerun_traffic_bytes)
    raise RematError(f"recompute module {module[:40]!r} unknown; fix: use modules from "
                     f"{', '.join(MODULES)}")


def modules_cost(modules: tuple[str, ...], s: ModuleShape) -> ModuleCost:
    """The sum of :func:`module_cost` over ``modules`` (``moe`` subsumes ``moe_act`` and
    ``shared_experts``: they are not counted twice)."""
    ms = [m for m in modules if not ("moe" in modules and m in ("moe_act", "shared_experts"))]
    parts = [module_cost(m, s) for m in ms]
    return ModuleCost(sum(p.dropped_bytes for p in parts), sum(p.rerun_flops for p in parts),
                      sum(p.rerun_traffic_bytes for p in parts))
