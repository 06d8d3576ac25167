"""Device profiles and cluster specs as immutable values in SI units (seconds, bytes, FLOP/s, B/s).

Files use human units in their key names (``memory_gb``, ``bandwidth_gbit_per_s``); the loader
(``hardware_profiles.loader``) converts once, on load, into these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping
import math

from ir.precision import RECIPES


class ProfileError(ValueError):
    """Base error of ``hardware_profiles``: a bad device profile or cluster spec.

    Messages are one line naming the bad value and the fix.
    """


@dataclass(frozen=True, slots=True)
class Alternative:
    """A published figure that disagrees with the one the model uses (kept for ranges in reports)."""

    field: str
    value: float
    source: str
    note: str = ""


MODEL_DTYPES: dict[str, str] = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
"""A model's compute dtype (its JAX name: ``zoo.config.ModelConfig.dtype``, a YAML model spec's
``dtype``) -> the precision key a plan asks a device for (``ir.Workload.dtype``)."""

DEFAULT_PRECISION: dict[str, tuple[str, ...]] = {
    "bf16": ("bf16",), "fp16": ("fp16",), "fp32": ("tf32", "fp32")}
"""The ``peak_flops`` entries a model dtype's matmuls run at, the first the profile lists, where
its ``precision_rules`` name none (:meth:`DeviceProfile.matmul_precision`):

- ``bf16`` and ``fp16``: their own entry only. Neither stands in for the other: a V100's tensor
  cores take fp16 and no bf16 (NVIDIA Tesla V100 GPU Architecture whitepaper, "Tensor Cores": FP16
  inputs), so a bfloat16 model on it is refused rather than costed at the fp16 rate.
- ``fp32``: the device's TF32 rate where it lists one, else its FP32 rate. This is JAX's default,
  the runtime ``mpmd run`` compiles to: "By default, JAX leans toward speed: float32 dot products
  may be computed with reduced-precision arithmetic internally (bfloat16 on TPU, TF32 on recent
  GPUs)" (JAX documentation, "Matmul precision", docs.jax.dev/en/latest/201/precision.html): on
  CUDA, XLA asks cuBLAS to compute a float32 GEMM of default (or high) precision as TF32
  (``kTF32AsF32``) while TensorFloat-32 execution is enabled, its default
  (``xla/stream_executor/gpu/gpu_blas_lt.cc``, ``GetBlasComputationType``), and TF32 tensor cores
  exist from Ampere on (A100, L40S, H100/H200/H800, B200), so a V100, which lists no tf32, runs
  them at FP32. PyTorch differs
  (``torch.get_float32_matmul_precision()`` is ``"highest"``, true FP32, by default): a profile
  copy with ``precision_rules: {fp32: {value: fp32, ...}}`` plans that. Devices whose float32
  matmuls run some other way say so in ``precision_rules`` (TPU: one bfloat16 pass;
  Tenstorrent: TF32 operands at math fidelity HiFi4; AMD MI300X: FP32, XLA's TF32 path being
  CUDA-only)."""

_DTYPE_NAME = {key: name for name, key in MODEL_DTYPES.items()}


@dataclass(frozen=True, slots=True)
class DeviceProfile:
    """One accelerator type.

    Attributes:
        name: profile id, the YAML file's stem (e.g. ``"h100-sxm"``).
        peak_flops: dense peak per precision the device publishes (``"bf16"``, ``"fp16"``,
            ``"tf32"``, ``"fp32"``, ``"fp8"``, Tenstorrent's ``"bfp8"``, ...), FLOP/s. Only the
            precisions it really has: a V100 lists fp16 (its tensor cores) and fp32, no bf16.
        format_efficiency: low-precision training recipe (``ir.precision.RECIPES``: ``"fp8"``,
            ``"fp8-blockwise"``, ``"mxfp8"``, ``"nvfp4"``) -> its GEMMs' efficiency relative to
            the compute dtype's (:meth:`format_rate`); the recipes the device runs. Empty: BF16
            only.
        precision_rules: a model compute dtype (``"bf16"``, ``"fp16"``, ``"fp32"``) -> the
            ``peak_flops`` entry its matmuls run at, where that is not the default of
            :data:`DEFAULT_PRECISION` (a TPU runs float32 matmuls as one bfloat16 pass); the
            source of each is ``sources["precision_rules.<dtype>"]``.
        memory_bytes: device memory capacity, bytes.
        memory_bandwidth: device memory bandwidth, B/s.
        scale_up_bandwidth: per-device, per-direction bandwidth of the scale-up fabric, B/s.
        scale_up_latency: per-hop latency of the scale-up fabric, s.
        scale_out_bandwidth: per-device, per-direction scale-out (NIC) bandwidth, B/s.
        tdp_watts: board power, W.
        price_per_hour: (low, high) USD per device-hour, or None when unknown.
        matmul_efficiency: achievable fraction of ``peak_flops`` for large matmuls (profile data).
        memory_efficiency: achievable fraction of ``memory_bandwidth``.
        weight_stream_efficiency: achievable fraction of ``memory_bandwidth`` at which a
            matrix-vector product (a matmul of one token per device: a decode step of one
            sequence) streams its weights, read once, or None for ``memory_efficiency``. The
            profiles of accelerators leave it None (HBM serves both at one rate); on XLA:CPU
            the matrix-vector kernel streams weights several times faster than elementwise
            loops and matrix-matrix kernels (which pack their weights first) move bytes, and
            ``mpmd calibrate`` times it.
        fragment_overhead: fixed dispatch cost per fragment launch, s.
        backward_efficiency: the backward's (B, W) achieved matmul rate relative to the forward's
            (1.0 unless measured otherwise: e.g. XLA:CPU's backward kernels run slower).
        attention_efficiency / attention_backward_efficiency: a fused attention kernel's
            (FlashAttention, cuDNN fused attention) FLOP rate on long sequences relative to the
            device's GEMM rate, forward and backward; applied to
            ``LayerCost.attention_*_flops_per_sample`` only (:meth:`attention_rate`). 1.0 unless
            measured: the kernel runs at the GEMM rate (the backward's: ``backward_efficiency``;
            ``attention_backward_efficiency`` None).
        attention_half_tokens / attention_backward_half_tokens: the sequence length at which the
            kernel reaches half that rate: at ``s`` tokens it runs at
            ``efficiency x s / (s + half)`` (each query block's fixed work, loading it and
            rescaling its output, amortised over the key blocks it visits). 0: no such loss.
        flash2_attention: FlashAttention-2's rate (the flash-attn 2 package, PyTorch SDPA's
            ``FLASH_ATTENTION`` backend) relative to the fused kernel the attention figures
            describe, forward and backward alike (:meth:`attention_rate` with ``kernel``
            ``"flash2"``). 1.0 where that kernel is FlashAttention-2 itself or nothing measured
            the two apart; on Hopper, where the figures are cuDNN's, FlashAttention-2 runs at
            0.62 of them (Shah et al. 2024, "FlashAttention-3", arXiv:2407.08608, Figs. 5-6).
        roofline: how a fragment's compute and memory times combine: ``"max"`` (they overlap:
            the roofline, Williams et al. 2009; accelerators) or ``"sum"`` (they do not: fitted
            for XLA:CPU by ``mpmd calibrate``).
        elementwise_traffic: the fraction of a layer's unfused non-matmul HBM traffic
            (``LayerCost.*_other_bytes_per_sample``) that the device's software stack still moves,
            charged as memory-bound time after the roofline (kernels run one after another);
            0 (the default) charges none, i.e. assumes every elementwise op fused into a matmul.
        torus_dims: dimensions of the scale-up fabric's torus (TPU ICI: 2 on v5e / v6e, 3 on v4
            / v5p), 0 for a switched fabric (NVSwitch). ``scale_up_bandwidth`` is then the
            chip's total over all its torus ports, per direction.
        gemm_tiling: ``(compute units, tile rows, tile columns)`` of the device's matmul kernels
            (e.g. 108 SMs and 256 x 128 output tiles on an A100), or None: a GEMM's output is cut
            into tiles run in waves of one tile per unit, and the last wave's idle units are lost
            (wave quantisation, see :func:`simulator.cost_model.wave_utilisation`). None charges
            no quantisation (``matmul_efficiency`` alone).
        scale_out_efficiency: the achieved fraction of the scale-out line rate a collective's
            bandwidth term sees (NIC, InfiniBand, RoCE, a TPU host's data-center-network share);
            1.0 (line rate) unless fitted on multi-node rows.
        comm_interference: how much a collective running beside compute slows that compute, as a
            fraction of the overlapped collective's time (communication kernels take SMs and HBM
            bandwidth from the matmuls they overlap): an overlapped pair of ``work`` and ``comm``
            seconds takes ``max(work + comm_interference x min(work, comm), comm)``. 0 charges
            none (perfect overlap).
        grad_sync_overlap: how the software stack overlaps the data-parallel gradient sync with
            the backward: ``"bucketed"`` (PyTorch DDP / FSDP, Megatron-LM's
            ``overlap_grad_reduce``: each bucket starts as soon as its layers' gradients exist,
            so only the last bucket is exposed) or ``"after_backward"`` (the sync starts once the
            step's last backward ends, as XLA schedules the cross-slice gradient all-reduce of a
            multi-slice TPU job over the data-center network).
        sync_jitter: the relative spread (standard deviation / mean) of one host's compute time
            per step: noise from clocks, power and thermal management, the OS and the network
            that a synchronous step cannot average out, because every gradient sync waits for
            the slowest of the plan's hosts (see :func:`straggler_factor`); 0 (the default)
            charges none. Fitted on runs of one model at several scales.
        lockstep_devices: devices that run in lock-step as one straggler unit, the unit
            :func:`straggler_factor` counts: a GPU host's 8 GPUs (each host's CPU launches its
            own kernels, so OS, clock and network noise differ from host to host); a whole TPU
            ICI domain (a slice's chips run one program in lock-step on ICI, their hosts only
            feed them, so slices joined over the data-center network are the independent
            units). A mesh spanning several nodes counts its nodes instead.
        chip: the accelerator chip (die) the device is built on (``"wormhole"`` for the n150 and
            n300 cards, ``"gh100"`` for H100, H800 and H200); kinds on one chip share their
            efficiencies' physics, so a serving fit fits them together. The profile's name when
            the file names none.
        scale_up_one_hop: every pair of devices in a node is one hop apart (a switch such as
            NVSwitch, or a full mesh), so a small all-reduce can run in one step: each device
            reads its peers' buffers directly (TensorRT-LLM's one-shot custom all-reduce, NCCL's
            NVLS); False for rings of cards and tori (Tenstorrent Ethernet, TPU ICI).
        scale_up_domain: devices one scale-up fabric joins as the part is sold, when more than
            one host's (72: a GB200 NVL72 rack's NVLink Switch fabric); None: one host's. A
            cluster file's node group says the same for its own hardware
            (``NodeGroup.scale_up_domain``); the validation rows default to it.
        decode_layer_overhead / prefill_layer_overhead: a serving step's fixed time per decoder
            layer, s, on top of its roofline and its collectives: kernel launches, host dispatch
            and synchronisation of a decode step (captured once and replayed: CUDA graphs,
            tt-metal traces) and of a step that prefills (run op by op in most engines). None:
            ``fragment_overhead`` per layer (:func:`simulator.serving_cost.layer_overhead`).
        forward_layer_overhead / backward_layer_overhead: a training or prefill fragment's
            fixed time per layer it runs, s, forward and whole backward, on top of its roofline:
            the layer's ops dispatched one after another, each paying a fixed cost whatever its
            size (XLA:CPU's thunk executor), measured by ``mpmd calibrate`` as the intercept of a
            small block's time against its microbatch; 0 where no profile measured one (an
            accelerator's stream hides its kernel launches behind the running kernels).
        layer_overhead_ops: (forward, backward) primitive ops of that small block
            (``LayerCost.fwd_ops`` / ``bwd_ops``): a layer pays the fixed time in proportion to
            its own ops (:meth:`layer_fixed_time`; measured on XLA:CPU, a mixture-of-experts
            block of 2x the dense block's forward ops has 2.4-3x its forward intercept);
            (0, 0): per layer.
        forward_routing_pair / backward_routing_pair: a mixture-of-experts layer's time per
            (token, expert) pair it routes, s, in a forward and in a whole backward (the input
            gradient's), beyond what its bytes and FLOP cost: the permutations that move each
            token's row into its experts' slots and back, gathered row by row (XLA:CPU runs a
            gather as a scalar loop: 6-8 us a pair of 128 float32 values on a 2-core host),
            measured by ``mpmd calibrate`` on a small routed block. On an accelerator the
            gathers stream at its memory bandwidth (an H100 moved Qwen3-235B's 32,768 pairs of
            4,096 bf16 values through both of a sample's gathers in 0.2 ms); its figure is the
            token path's fixed time per pair (router, sort, permute launches), fitted with
            ``routed_element`` by ``mpmd validate --fit-moe`` (a third forward, the rest in
            the backward); 0 where neither was measured or fitted.
        routed_element: a mixture-of-experts layer's token-path time per (token, expert,
            hidden) element it routes, s, forward and backward together, beyond its bytes, FLOP
            and all-to-alls (permutations, the all-to-all's achieved bandwidth, the dispatcher's
            sort, padding and host synchronisation: ``simulator.cost_model.token_path_time``),
            fitted on the kind's published MoE runs by ``mpmd validate --fit-moe``; 0 where none
            was fitted
        dropless_routing_pair: a dropless dispatch's extra time per routed (token, expert)
            pair, s, forward and backward together (a third in the forward, the rest in the
            input gradient), beyond ``forward_routing_pair`` / ``backward_routing_pair``:
            Megatron-Core's dropless ``alltoall`` dispatcher (``Layout.expert_dispatch``
            ``"alltoall"``) reads each layer's tokens-per-expert counts back to the host to size
            its all-to-all, so its permutations and grouped GEMMs run at shapes known only then
            (no CUDA-graph capture, the host unable to run ahead). A token-dropping dispatch
            padded to capacity (``"tokendrop"``) has static shapes, and the two-hop
            DeepEP/HybridEP dispatch (``"deepep"``, Megatron-Core's ``flex`` dispatcher) sizes
            its buffers on the device; neither pays it (NVIDIA's 25.11 GB200 and GB300 HybridEP
            rows run as fast per token as its 25.09 token-dropping ones). Fitted with the token
            path by ``mpmd validate --fit-moe`` where a kind has rows that pay it and rows that
            do not (NVIDIA's Megatron-Bridge 25.09 summary ran Qwen3-30B-A3B token-dropping at
            1.9-2.0x the tokens/s its 25.11 summary gives dropless on H100 and B200; fitted
            2026-11-29: H100 215 ns, B200 134 ns, GB200 84 ns and GB300 84 ns, the last two
            each from its one ``alltoall`` row, gpt-oss-120b, and each other's check); 0 where
            none was fitted.
        logit_overhead: a serving step's time per logit it hands to sampling, s: a stack that
            reads each step's ``batch x vocab`` logits back to the host and samples there pays
            it (a decode step of 32 users costs a Wormhole n150 ~8 ms more than one user's, for
            1B to 70B models alike: tt-metal's published rows); 0 for on-device sampling.
        sources: field name -> citation for every published figure and the origin of every
            efficiency factor.
        alternatives: figures from other sources that disagree with the ones used.
    """

    name: str
    vendor: str
    description: str
    peak_flops: Mapping[str, float]
    memory_bytes: float
    memory_bandwidth: float
    scale_up_bandwidth: float
    scale_up_latency: float
    scale_out_bandwidth: float
    tdp_watts: float
    price_per_hour: tuple[float, float] | None
    matmul_efficiency: float
    memory_efficiency: float
    fragment_overhead: float
    sources: Mapping[str, str] = field(default_factory=dict)
    alternatives: tuple[Alternative, ...] = ()
    backward_efficiency: float = 1.0
    attention_efficiency: float = 1.0
    attention_backward_efficiency: float | None = None
    attention_half_tokens: float = 0.0
    attention_backward_half_tokens: float = 0.0
    flash2_attention: float = 1.0
    roofline: str = "max"
    elementwise_traffic: float = 0.0
    torus_dims: int = 0
    gemm_tiling: tuple[int, int, int] | None = None
    scale_out_efficiency: float = 1.0
    comm_interference: float = 0.0
    grad_sync_overlap: str = "bucketed"
    sync_jitter: float = 0.0
    lockstep_devices: int = 8
    scale_up_one_hop: bool = False
    scale_up_domain: int | None = None
    chip: str = ""
    decode_layer_overhead: float | None = None
    prefill_layer_overhead: float | None = None
    logit_overhead: float = 0.0
    weight_stream_efficiency: float | None = None
    forward_layer_overhead: float = 0.0
    backward_layer_overhead: float = 0.0
    layer_overhead_ops: tuple[int, int] = (0, 0)
    forward_routing_pair: float = 0.0
    backward_routing_pair: float = 0.0
    routed_element: float = 0.0
    dropless_routing_pair: float = 0.0
    precision_rules: Mapping[str, str] = field(default_factory=dict)
    format_efficiency: Mapping[str, float] = field(default_factory=dict)

    def layer_fixed_time(self, kind: str, ops: int) -> float:
        """The fixed time, s, a layer of ``ops`` primitive operations pays in a forward (``kind``
        ``"F"``) or a whole backward (any other kind): ``forward_layer_overhead`` (or
        ``backward_layer_overhead``) times ``ops`` over the measured block's
        (``layer_overhead_ops``); the overhead itself where either count is 0 (not traced, or
        measured per layer)."""
        if kind == "F":
            return layer_fixed_share(self.forward_layer_overhead, ops, self.layer_overhead_ops[0])
        return layer_fixed_share(self.backward_layer_overhead, ops, self.layer_overhead_ops[1])

    def attention_rate(self, seq_len: int, backward: bool = False, kernel: str = "") -> float:
        """The fused attention kernel's FLOP rate relative to the GEMM rate at ``seq_len`` tokens
        per sample: ``efficiency x s / (s + half_tokens)`` (forward, or the backward's with
        ``backward``); the long-sequence efficiency when ``seq_len`` is 0 (unknown). ``kernel``
        ``"flash2"`` (``ir.LayerCost.attention_kernel``): FlashAttention-2's, that rate times
        :attr:`flash2_attention`; ``""``: the kernel the figures describe."""
        scale = self.flash2_attention if kernel == "flash2" else 1.0
        if backward and self.attention_backward_efficiency is None:
            return self.backward_efficiency * scale  # unmeasured: the backward's GEMM rate
        eff, half = ((self.attention_backward_efficiency, self.attention_backward_half_tokens)
                     if backward else (self.attention_efficiency, self.attention_half_tokens))
        return scale * (eff * seq_len / (seq_len + half) if seq_len > 0 and half > 0 else eff)

    def _precision(self, dtype: str) -> str | None:
        """:meth:`matmul_precision`, or None where the device has no rate for ``dtype``."""
        rule = self.precision_rules.get(dtype)
        if rule is not None:
            return rule
        for entry in DEFAULT_PRECISION.get(dtype, (dtype,)):
            if entry in self.peak_flops:
                return entry
        return None

    def matmul_precision(self, dtype: str = "bf16") -> str:
        """The ``peak_flops`` entry the device runs matmuls of ``dtype`` at: for a model's compute
        dtype (``"bf16"``, ``"fp16"``, ``"fp32"``) the profile's ``precision_rules`` entry, else
        the first of :data:`DEFAULT_PRECISION` it lists (an fp32 model runs at TF32 where the
        device has it: JAX's default); any other name (``"fp8"``, ``"bfp8"``) is its own entry.

        Raises:
            ProfileError: the device has no rate for ``dtype`` (one line: the device, the dtype,
                its rates and the fix). Nothing stands in silently.
        """
        got = self._precision(dtype)
        if got is not None:
            return got
        rates = ", ".join(sorted(self.peak_flops))
        if dtype in DEFAULT_PRECISION:
            runs = " or ".join(_DTYPE_NAME[k] for k in DEFAULT_PRECISION if self._precision(k))
            fix = (f"set the model's dtype to {runs} (a YAML model spec's 'dtype') or plan on "
                   f"devices that run {dtype}")
        else:
            fix = "use one of its matmul rates"
        raise ProfileError(f"device {self.name!r} has no {dtype} rate (its matmul rates: {rates}); "
                           f"fix: {fix}")

    @property
    def training_formats(self) -> tuple[str, ...]:
        """The training precision recipes the device runs (``ir.precision.PRECISIONS`` order):
        ``"bf16"`` and each low-precision recipe its profile lists."""
        return tuple(r for r in RECIPES if r == "bf16" or r in self.format_efficiency)

    def format_rate(self, name: str, dtype: str = "bf16") -> float:
        """Achievable GEMM FLOP/s of a low-precision recipe's matmuls: the peak of its format
        (``peak_flops[recipe.peak]``) x matmul_efficiency x the recipe's efficiency relative to
        the compute dtype's GEMMs (``format_efficiency``); ``"bf16"`` (or ``""``) is
        :meth:`achievable_flops` of ``dtype``.

        Raises:
            ProfileError: the device does not run the recipe (one line: the device, the
                recipes it runs and the fix), or has no rate for ``dtype``.
        """
        got = RECIPES.get(name or "bf16")
        if got is None or not got.low_precision:
            return self.achievable_flops(dtype)
        if name not in self.format_efficiency:
            raise ProfileError(f"device {self.name!r} does not run {name} GEMMs (it runs: "
                               f"{', '.join(self.training_formats)}); fix: choose one of those "
                               f"with --precision, or plan on devices that run {name}")
        return self.peak_flops[got.peak] * self.matmul_efficiency * self.format_efficiency[name]

    @property
    def model_dtypes(self) -> tuple[str, ...]:
        """The model compute dtypes (keys of :data:`DEFAULT_PRECISION`) the device has a rate for."""
        return tuple(k for k in DEFAULT_PRECISION if self._precision(k) is not None)

    def peak(self, dtype: str = "bf16") -> float:
        """Dense peak FLOP/s the device runs ``dtype``'s matmuls at (the ``peak_flops`` entry
        :meth:`matmul_precision` names: an fp32 model's is the TF32 rate on an A100), 0 when it
        has none (see :meth:`matmul_peak` for the refusal)."""
        got = self._precision(dtype)
        return self.peak_flops[got] if got is not None else 0.0

    def matmul_peak(self, dtype: str = "bf16") -> float:
        """:meth:`peak` of ``dtype``, the denominator of MFU and of the roofline bound of a plan
        computing in it, FLOP/s.

        Raises:
            ProfileError: the device has no rate for ``dtype`` (:meth:`matmul_precision`).
        """
        return self.peak_flops[self.matmul_precision(dtype)]

    def achievable_flops(self, dtype: str = "bf16") -> float:
        """Achievable matmul FLOP/s for ``dtype`` (:meth:`matmul_peak` x matmul_efficiency).

        Raises:
            ProfileError: the device has no rate for ``dtype`` (:meth:`matmul_precision`).
        """
        return self.matmul_peak(dtype) * self.matmul_efficiency

    @property
    def achievable_bandwidth(self) -> float:
        """Achievable memory bandwidth, B/s."""
        return self.memory_bandwidth * self.memory_efficiency

    def weight_bandwidth(self, tokens: float) -> float:
        """Achievable bandwidth at which a matmul over ``tokens`` tokens per device streams its
        weights, B/s: ``weight_stream_efficiency`` for a matrix-vector product (``0 < tokens <=
        1``; 0 means unknown) when the profile has one, else :attr:`achievable_bandwidth`."""
        eff = self.weight_stream_efficiency
        if eff is None or not 0 < tokens <= 1:
            return self.achievable_bandwidth
        return self.memory_bandwidth * eff


@dataclass(frozen=True, slots=True)
class Link:
    """A point-to-point or fabric link: per-direction bandwidth (B/s) and latency (s)."""

    bandwidth: float
    latency: float
    source: str = ""


def layer_fixed_share(fixed: float, ops: int, measured_ops: int) -> float:
    """A layer's share of a fixed time per layer measured on a block of ``measured_ops`` primitive
    ops, s: ``fixed x ops / measured_ops`` (XLA:CPU dispatches each op at a cost of its own), or
    ``fixed`` where either count is 0 (not traced, or measured per layer)."""
    return fixed * ops / measured_ops if ops > 0 and measured_ops > 0 else fixed


def straggler_factor(hosts: int, jitter: float) -> float:
    """The expected slow-down of a synchronous step over ``hosts`` hosts whose per-step compute
    times vary independently with relative standard deviation ``jitter``: the step waits for the
    slowest host, and the expected maximum of ``H`` independent normal draws is at most
    ``mean + sigma sqrt(2 ln H)`` (the standard extreme-value bound for Gaussian maxima, e.g.
    Boucheron, Lugosi & Massart, "Concentration Inequalities", 2013, sec. 2.5), so the factor is
    ``1 + jitter x sqrt(2 ln H)`` (1 for a single host or no jitter). Grattafiori et al., "The
    Llama 3 Herd of Models", 2024, sec. 3.3.4, report exactly this: at 16K GPUs the slowest
    hosts and their network set the pace of every synchronous step."""
    if hosts <= 1 or jitter <= 0:
        return 1.0

    return 1.0 + jitter * math.sqrt(2.0 * math.log(hosts))


def straggler_hosts(specs: Iterable["MeshSpec"]) -> int:
    """Independent straggler units of a plan over meshes ``specs`` (each mesh once): per mesh,
    its nodes when it spans several (``MeshSpec.devices_per_node``), else its devices over its
    device's ``lockstep_devices`` (rounded up), summed (:func:`straggler_factor`'s ``hosts``)."""
    total = 0
    for spec in specs:
        unit = spec.devices_per_node if spec.devices_per_node else spec.device.lockstep_devices
        total += -(-spec.num_devices // max(1, min(unit, spec.device.lockstep_devices)))
    return total


@dataclass(frozen=True, slots=True)
class Span:
    """Where a collective's group of ``ranks`` devices sits on the fabric, level by level.

    Attributes:
        ranks: devices in the group (``n``).
        nodes: scale-up domains (NVLink nodes, TPU slices, Tenstorrent boxes) the group spans
            (``N``; 1 = the group stays inside one).
        intra: the per-device link between members inside one domain, with the bandwidth the
            group's rings see there (a torus's share of the chip's ports on TPU ICI).
        inter: the per-device link between domains (one NIC per device on a rail-optimised
            fabric; a TPU host's data-center-network share per chip), at the achieved fraction
            of its line rate (``DeviceProfile.scale_out_efficiency``), or None when ``nodes``
            is 1.
        rails: members of the group in each domain (``n / N``): each brings its own NIC, so
            a ring through the domains runs ``rails`` channels side by side (NCCL's multi-ring
            over the rails of a rail-optimised fabric).
    """

    ranks: int
    nodes: int
    intra: Link
    inter: Link | None = None

    @property
    def rails(self) -> int:
        return max(1, self.ranks // max(1, self.nodes))

    @property
    def bus_bandwidth(self) -> float:
        """The bottleneck per-device bandwidth of a ring over the group, B/s: the intra-domain
        link, or across domains ``rails`` NICs side by side, capped by the intra-domain link."""
        if self.nodes <= 1 or self.inter is None:
            return self.intra.bandwidth
        return min(self.intra.bandwidth, self.inter.bandwidth * self.rails)


def torus_shape(devices: int, dims: int) -> tuple[int, ...]:
    """The axis sizes of a ``dims``-dimensional torus of ``devices`` chips, innermost first, as
    even as powers of two allow (16x16 for 256 chips in 2D; 4x4x4 for 64 and 4x4x8 for 128 in
    3D, as Google's v5p slice shapes are); ``(devices,)`` when ``devices`` is not a power of two."""
    if devices < 1 or devices & (devices - 1):
        return (devices,)
    bits = devices.bit_length() - 1
    base, extra = divmod(bits, dims)
    return tuple(2 ** (base + (k >= dims - extra)) for k in range(dims))


def torus_axes_spanned(devices: int, dims: int, group: int, stride: int = 1) -> int:
    """How many axes of the ``dims``-D torus of ``devices`` chips (:func:`torus_shape`) a group
    of ``group`` chips spaced ``stride`` apart in row-major order (innermost axis first) spans."""
    used, below = 0, 1
    for a in torus_shape(devices, dims):
        above = below * a
        if stride < above and stride * group > below:
            used += 1
        below = above
    return used


@dataclass(frozen=True, slots=True)
class MeshSpec:
    """A mesh: ``num_devices`` devices of one type running one SPMD program.

    Attributes:
        axes: ordered axis name -> size; the sizes multiply to ``num_devices``.
        intra_link: the link collectives inside the mesh use (per device, per direction).
        price_per_device_hour: USD, overriding the device profile's price when set.
        power_watts_per_device: W, overriding the profile's TDP when set.
        host: name of the host whose compute this mesh shares with other meshes (None: its own
            devices). Meshes on one host run at most ``Cluster.host_slots[host]`` fragments at a
            time (e.g. 8 CPU "devices" that share one machine's cores).
        devices_per_node / scale_out_link: for a mesh spanning several nodes, the devices of one
            node (a host: what straggler counting, :func:`straggler_hosts`, counts) and the
            per-device link between scale-up domains.
        scale_up_domain: the mesh's devices that share one scale-up fabric, in aligned blocks of
            consecutive devices (a multiple of ``devices_per_node``): a GB200 NVL72 rack joins
            18 hosts of 4 GPUs on one NVLink fabric, so a mesh of 4 of its hosts has a domain of
            16. None: one node (``devices_per_node``), as on DGX boxes and TPU slices. Which
            link a collective takes (:meth:`collective_link`, :meth:`collective_span`) is
            decided by the domain, not the host (:attr:`domain_devices`).
    """

    name: str
    device: DeviceProfile
    num_devices: int
    axes: Mapping[str, int]
    intra_link: Link
    price_per_device_hour: float | None = None
    power_watts_per_device: float | None = None
    host: str | None = None
    devices_per_node: int | None = None
    scale_out_link: Link | None = None
    scale_up_domain: int | None = None

    def __hash__(self) -> int:
        # equal meshes hash equal (a subset of the fields ``__eq__`` compares): the cost model
        # memoises per-mesh costs (``axes`` is a mapping, so the generated hash cannot be used)
        return hash((self.name, self.device.name, self.num_devices, self.devices_per_node,
                     self.intra_link, self.scale_out_link, self.host, self.scale_up_domain))

    @property
    def domain_devices(self) -> int | None:
        """Devices of the mesh on one scale-up fabric (aligned blocks of consecutive devices):
        ``scale_up_domain``, else ``devices_per_node``; None for a mesh inside one node."""
        return self.scale_up_domain or self.devices_per_node

    def collective_link(self, group: int, stride: int = 1) -> Link:
        """The effective link of a collective over ``group`` devices spaced ``stride`` apart.

        Tensor parallel takes the innermost devices (stride 1), data parallel the outer ones
        (stride = tensor degree). A group within one scale-up domain (:attr:`domain_devices`:
        one node, or several hosts on one fabric such as a GB200 NVL72 rack's NVLink) uses
        ``intra_link``. A group spanning domains crosses the scale-out network; with ``k`` of its
        members in each domain, NCCL runs ``k`` rings side by side, one per network card, so the
        collective sees ``k`` x the per-device scale-out bandwidth, capped by the intra-domain link
        (NCCL's multi-ring all-reduce; NVIDIA, "NCCL: Optimized primitives for collective
        multi-GPU communication", 2017 talk; Narayanan et al. 2021, sec. 4).

        On a torus fabric (``device.torus_dims`` > 0, TPU ICI) a group inside one node (a
        slice) runs bidirectional rings along the torus axes it spans, so it gets that share of
        the chip's ports: ``intra_link`` bandwidth x axes spanned / torus dimensions
        (:func:`torus_axes_spanned`; jax-ml/scaling-book, "How to think about TPUs": collectives
        over ``k`` axes of a torus use ``2k`` of the chip's links).
        """
        domain = self.domain_devices
        node = domain or self.num_devices
        if domain is None or self.scale_out_link is None or group * stride <= domain:
            dims = self.device.torus_dims
            if dims and group > 1:
                used = torus_axes_spanned(node, dims, group, stride)
                if used:
                    ln = self.intra_link
                    return Link(ln.bandwidth * used / dims, ln.latency, ln.source)
            return self.intra_link
        per_node = max(1, min(group, domain // max(1, stride)))
        so = self.scale_out_link
        return Link(min(self.intra_link.bandwidth, so.bandwidth * per_node), so.latency, so.source)

    def collective_span(self, group: int, stride: int = 1) -> Span:
        """The levels a collective over ``group`` devices spaced ``stride`` apart crosses
        (:class:`Span`): inside a scale-up domain (:attr:`domain_devices`: a node, or a GB200
        NVL72 rack's hosts) only the scale-up fabric (a TPU slice's ICI at the share of the
        chip's ports its torus axes give it, see :meth:`collective_link`); across domains also
        the scale-out network, per device at ``device.scale_out_efficiency`` of its line rate,
        with ``domain // stride`` members (rails) per domain."""
        node = self.domain_devices
        if node is None or self.scale_out_link is None or group * stride <= node:
            return Span(group, 1, self.collective_link(group, stride))
        rails = max(1, min(group, node // max(1, stride)))
        nodes = -(-group // rails)
        intra = self.intra_link
        dims = self.device.torus_dims
        if dims and rails > 1:
            used = torus_axes_spanned(node, dims, rails, stride)
            if used:
                intra = Link(intra.bandwidth * used / dims, intra.latency, intra.source)
        so = self.scale_out_link
        eff = self.device.scale_out_efficiency
        inter = Link(so.bandwidth * eff, so.latency, so.source) if eff != 1.0 else so
        return Span(group, nodes, intra, inter)

    @property
    def price_per_hour(self) -> tuple[float, float] | None:
        """(low, high) USD per hour for the whole mesh, or None when no price is known."""
        if self.price_per_device_hour is not None:
            p = self.price_per_device_hour * self.num_devices
            return (p, p)
        if self.device.price_per_hour is None:
            return None
        lo, hi = self.device.price_per_hour
        return (lo * self.num_devices, hi * self.num_devices)

    @property
    def power_watts(self) -> float:
        per = self.power_watts_per_device or self.device.tdp_watts
        return per * self.num_devices


@dataclass(frozen=True, slots=True)
class InterMeshLink:
    """The link between two meshes (symmetric): aggregate per-direction bandwidth and latency."""

    a: str
    b: str
    link: Link

    @property
    def name(self) -> str:
        return f"{self.a}<->{self.b}"


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """Hardware as bought and cabled: ``nodes`` identical nodes (DGX boxes, TPU slices, Tenstorrent
    LoudBoxes) of ``devices_per_node`` devices of one kind.

    Attributes:
        intra_link: per device, per direction, inside a node (NVLink, ICI, card-to-card Ethernet).
        scale_out_link: per device, per direction, between nodes (the node's NICs divided by its
            devices: a DGX H100 has one 400 Gb/s NIC per GPU).
        price_per_device_hour / power_watts_per_device: overrides of the device profile's figures.
        scale_up_domain: devices that share the scale-up fabric (``intra_link``), a multiple of
            ``devices_per_node``: consecutive nodes, ``scale_up_domain / devices_per_node`` at a
            time from the group's first, form one domain (18 compute trays of 4 GPUs on a GB200
            NVL72 rack's NVLink Switch fabric: 72). None: one node, as in a DGX box.
    """

    name: str
    device: DeviceProfile
    nodes: int
    devices_per_node: int
    intra_link: Link
    scale_out_link: Link
    price_per_device_hour: float | None = None
    power_watts_per_device: float | None = None
    host: str | None = None
    """The host whose compute every node of the group shares (``MeshSpec.host``: the CPU devices
    of one machine), or None."""
    scale_up_domain: int | None = None

    @property
    def num_devices(self) -> int:
        return self.nodes * self.devices_per_node

    @property
    def domain_devices(self) -> int:
        """Devices on one scale-up fabric: ``scale_up_domain``, else one node's."""
        return self.scale_up_domain or self.devices_per_node

    @property
    def nodes_per_domain(self) -> int:
        """Nodes on one scale-up fabric (1 unless ``scale_up_domain`` joins several)."""
        return max(1, self.domain_devices // self.devices_per_node)

    def same_domain(self, first: int, count: int) -> bool:
        """Whether nodes ``first`` .. ``first + count - 1`` of the group all share one scale-up
        domain (domains are ``nodes_per_domain`` consecutive nodes from node 0)."""
        per = self.nodes_per_domain
        return first // per == (first + max(1, count) - 1) // per


@dataclass(frozen=True, slots=True)
class Cluster:
    """Named meshes plus the links between them.

    Attributes:
        meshes: ordered mesh name -> spec.
        links: explicit inter-mesh links.
        default_link: the link used between meshes with no explicit entry, or None.
        path: the file it was loaded from.
        host_slots: host name -> fragments that may run at once on it (see ``MeshSpec.host``).
        groups: for a cluster described as hardware (node groups), group name -> group; the
            planner carves logical meshes out of them (``hardware_profiles.carve``). Empty for a
            cluster file that lists its meshes. ``meshes`` of a node-group cluster are its nodes, one
            mesh each, until a carving says otherwise.
        group_links: caps on the aggregate per-direction bandwidth between two node groups
            (``InterMeshLink`` naming groups), when the fabric between them is narrower than their NICs.
        p2p: how the software on this cluster moves activations between pipeline stages:
            ``"overlapped"`` (default: a transfer runs on the send/receive streams while compute
            goes on) or ``"blocking"`` (the sender's compute stream waits for each send to finish
            and the receiver's for each receive, as in Megatron-LM's pipeline schedules, whose
            point-to-point ops are waited for before the next compute:
            ``p2p_communication._communicate``).
        link_rule: for a carving with too many meshes to list every pair (``hardware_profiles.carve``),
            the rule that gives the link between two of its meshes on demand (``(a, b) ->
            InterMeshLink``, named in mesh order); :meth:`link_between` asks it when ``links`` has
            no entry.
        carve_fixed: the file says ``carve: fixed``: plan its meshes exactly as listed (the
            mesh-level search), never as the node groups they describe
            (:func:`hardware_profiles.carve.node_groups_of`).
    """

    name: str
    meshes: Mapping[str, MeshSpec]
    links: tuple[InterMeshLink, ...]
    default_link: Link | None = None
    path: str = ""
    description: str = ""
    host_slots: Mapping[str, int] = field(default_factory=dict)
    p2p: str = "overlapped"
    groups: Mapping[str, NodeGroup] = field(default_factory=dict)
    group_links: tuple[InterMeshLink, ...] = ()
    carve_fixed: bool = False
    link_rule: Callable[[str, str], InterMeshLink] | None = field(default=None, repr=False, compare=False)
    _link_index: dict = field(default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def link_between(self, a: str, b: str) -> InterMeshLink:
        """The link joining meshes ``a`` and ``b``.

        Raises:
            ProfileError: no explicit link and no ``default_link``.
        """
        if len(self._link_index) != len(self.links):      # built once, on first use
            self._link_index.clear()
            self._link_index.update({frozenset((ln.a, ln.b)): ln for ln in self.links})
        ln = self._link_index.get(frozenset((a, b)))
        if ln is not None:
            return ln
        if self.link_rule is not None and a in self.meshes and b in self.meshes and a != b:
            return self.link_rule(a, b)
        if self.default_link is not None:
            x, y = sorted((a, b))
            return InterMeshLink(x, y, self.default_link)
        raise ProfileError(f"cluster {self.name!r} has no link between meshes {a!r} and {b!r}; "
                           f"add one under 'links' or set 'default_link'")

    @property
    def num_devices(self) -> int:
        return sum(m.num_devices for m in self.meshes.values())

    def peak_flops(self, dtype: str = "bf16") -> float:
        """Sum of the meshes' dense peak FLOP/s at which each runs ``dtype``'s matmuls
        (:meth:`DeviceProfile.matmul_peak`: an fp32 model's TF32 rate on an A100, its FP32 rate
        on a V100), FLOP/s.

        Raises:
            ProfileError: a mesh's device has no rate for ``dtype``.
        """
        return sum(m.device.matmul_peak(dtype) * m.num_devices for m in self.meshes.values())
