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

    Raises:
        RematError: an unknown name (the message lists the known ones).
    """
    key = name.strip().lower()
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
