"""Training precision recipes: the number format a step's GEMMs run in, beside its compute dtype.

A recipe says which tensor-core rate a decoder block's linear layers run at and what low precision
adds or saves around them. What every recipe keeps in the compute dtype (BF16) is the same, as
Transformer Engine and Megatron-Core do it: the attention core (scores, softmax, the two batched
matmuls), norms, activations' elementwise work, the router, the embedding and the LM head
(Megatron's output layer is not a Transformer Engine module), the master weights, gradients and
optimizer state. ``LayerCost.low_precision`` marks the layers whose GEMMs a recipe takes.

Cost terms a recipe adds (``simulator.cost_model.layer_time``, ``stage_memory``):

- GEMM time: the layer's non-attention FLOP at ``DeviceProfile.format_rate(recipe)``: the peak of
  the recipe's tensor-core format (``peak_flops[recipe.peak]``) times the profile's matmul
  efficiency times the recipe's efficiency relative to BF16 GEMMs
  (``DeviceProfile.format_efficiency``; measured on an H100 with
  ``benchmarks/bench_device_precision.py``: ``reports/validation/device/h100_precision.csv``).
- Quantization traffic: every GEMM input is cast to the format before it is read (the forward's
  activations, the backward's output gradients), ``cast_bytes`` HBM bytes per element beyond the
  BF16 path (the cast is fused into the kernel that produces the tensor where Transformer Engine
  fuses it; what remains is written here), charged at the device's achievable bandwidth.
- Memory: a low-precision copy of each block weight (``weight_copies`` x ``element_bytes`` +
  scales), and the GEMM inputs a forward keeps for the weight gradient saved in the format
  (``element_bytes`` + scales per element instead of the compute dtype's bytes).

Sources: Micikevicius et al., "FP8 Formats for Deep Learning", 2022 (E4M3 forward, E5M2
gradients: the hybrid format); NVIDIA Transformer Engine documentation, "Using FP8 with Transformer
Engine" (delayed and current per-tensor scaling; FP8 weight and transposed copies on Hopper, whose
FP8 tensor cores read only the K-major layout); DeepSeek-AI, "DeepSeek-V3 Technical Report", 2024,
Sec. 3.3 (1 x 128 activation tiles and 128 x 128 weight blocks, each with its own scale);
Open Compute Project, "OCP Microscaling Formats (MX) Specification v1.0", 2023 (MXFP8: 32 elements
share one 8-bit power-of-two scale); NVIDIA, "Pretraining Large Language Models with NVFP4", 2025
(NVFP4: 16 E2M1 elements share an FP8 E4M3 scale plus a per-tensor FP32 scale; all three GEMMs of
a linear layer in NVFP4, random Hadamard transforms on the weight-gradient inputs).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import IRError


@dataclass(frozen=True, slots=True)
class Recipe:
    """One training precision recipe.

    Attributes:
        name: the recipe's name (``--precision``, the plan JSON's ``precision``).
        peak: the ``DeviceProfile.peak_flops`` entry its GEMMs run at (``"fp8"``, ``"fp4"``);
            ``""``: the compute dtype's own (BF16: no low-precision GEMMs).
        element_bytes: bytes of one low-precision element (1 for FP8, 0.5 for FP4).
        scale_block: elements sharing one scale along a GEMM's reduction (0: one per tensor).
        scale_bytes: bytes of one scale (FP32 per tensor or per block; E8M0 for MX; E4M3 for NVFP4).
        cast_bytes: HBM bytes per quantized element beyond the BF16 path, per cast: the
            low-precision write, the second (transposed or column-wise) copy the weight gradient
            reads, and a read pass for the absolute maximum where the scale needs the whole tensor
            first (current scaling).
        weight_copies: low-precision copies of each weight a device keeps during a step (weight
            and transpose on Hopper; row- and column-wise quantized copies for microscaling).
        hardware_scaling: the tensor cores apply the block scales (Blackwell's microscaling
            formats); False: per-tensor scales, or block scales applied by the GEMM kernel's
            epilogue in software (DeepSeek-V3's blockwise FP8 on Hopper).
        describe: one line for ``--help`` and reports.
    """

    name: str
    peak: str
    element_bytes: float
    scale_block: int
    scale_bytes: float
    cast_bytes: float
    weight_copies: int
    hardware_scaling: bool
    describe: str

    @property
    def low_precision(self) -> bool:
        """Whether the recipe runs any GEMM below the compute dtype."""
        return bool(self.peak)

    @property
    def saved_bytes_per_element(self) -> float:
        """Bytes a saved GEMM input takes per element, its scales included."""
        scales = self.scale_bytes / self.scale_block if self.scale_block else 0.0
        return self.element_bytes + scales


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("bf16", "", 2.0, 0, 0.0, 0.0, 0, False,
           "every GEMM in the compute dtype (BF16 mixed precision)"),
    Recipe("fp8", "fp8", 1.0, 0, 4.0, 2.0, 2, False,
           "FP8 E4M3/E5M2 with one scale per tensor (Transformer Engine's delayed or current "
           "scaling; torchtitan's float8 tensorwise)"),
    Recipe("fp8-blockwise", "fp8", 1.0, 128, 4.0, 2.0, 2, False,
           "FP8 E4M3 with 1 x 128 activation and 128 x 128 weight scales (DeepSeek-V3)"),
    Recipe("mxfp8", "fp8", 1.0, 32, 1.0, 2.0, 2, True,
           "MXFP8: 32 E4M3 elements share a power-of-two scale (Blackwell tensor cores)"),
    Recipe("nvfp4", "fp4", 0.5, 16, 1.0, 2.5, 2, True,
           "NVFP4: 16 E2M1 elements share an E4M3 scale, random Hadamard transforms on the "
           "weight-gradient inputs (Blackwell tensor cores)"),
)}
"""The recipes by name. ``cast_bytes``: FP8 per tensor writes the E4M3 copy and, for the weight
gradient, its transpose (Transformer Engine's fused cast-transpose) = 2 bytes; blockwise and
microscaling compute tile-local scales in the cast kernel and write the row-wise and column-wise
copies the two backward GEMMs read (2 bytes); NVFP4 writes two half-byte copies plus their
scales and runs the Hadamard transform's read and write of the weight-gradient inputs (about 2.5
bytes per element)."""

PRECISIONS = tuple(RECIPES)
"""Recipe names in order of decreasing element width (``--precision`` choices besides ``auto``)."""


PRECISION_ALIASES = {
    "fp8-cs": "fp8", "fp8cs": "fp8", "fp8-ds": "fp8", "fp8ds": "fp8", "fp8-current": "fp8",
    "fp8-delayed": "fp8", "fp8-tensorwise": "fp8", "fp8-hybrid": "fp8",
    "fp8-mx": "mxfp8", "fp8mx": "mxfp8", "mx-fp8": "mxfp8",
    "fp8-sc": "fp8-blockwise", "fp8sc": "fp8-blockwise", "fp8-subchannel": "fp8-blockwise",
    "fp8-block": "fp8-blockwise", "fp8-blockwise-scaling": "fp8-blockwise",
    "fp8-bs": "fp8-blockwise", "fp4": "nvfp4", "nv-fp4": "nvfp4", "fp4-nv": "nvfp4"}
"""Other spellings of the recipes, after :func:`canonical_precision`'s normalising, as published
tables and recipe names print them: NVIDIA's Megatron-Bridge performance summary writes
``FP8-CS`` (per-tensor current scaling), ``FP8-DS`` (delayed scaling: the same GEMMs and casts,
the scale from the amax history), ``FP8-MX`` and ``NVFP4``; its recipe names ``fp8cs``,
``fp8ds``, ``fp8mx`` and ``fp8sc`` (sub-channel: DeepSeek-V3's blockwise scaling)."""


def canonical_precision(name: str) -> str:
    """``name`` as a :data:`RECIPES` key where it spells one (lower case, spaces and underscores
    as hyphens, then :data:`PRECISION_ALIASES`: ``"FP8-CS"`` -> ``"fp8"``, ``"FP8_MX"`` ->
    ``"mxfp8"``), else ``name`` normalised (the caller says it is unknown)."""
    key = "-".join(str(name).strip().lower().replace("_", " ").split())
    return PRECISION_ALIASES.get(key, key)


def recipe(name: str) -> Recipe:
    """The recipe named ``name`` (``""``: BF16).

    Raises:
        IRError: unknown name (one line, the names and the fix).
    """
    got = RECIPES.get(name or "bf16")
    if got is None:
        raise IRError(f"unknown precision {name!r}; fix: use one of {', '.join(PRECISIONS)}")
    return got
