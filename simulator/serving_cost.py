"""What one serving step costs on one replica: the roofline of a continuous batch's forward, its
tensor-parallel all-reduces and its per-layer fixed time.

A *replica* is ``tp`` devices of one kind running one copy of the model, its weights, heads and MLP
width split ``tp`` ways (Megatron-LM tensor parallel, Shoeybi et al. 2019; what vLLM, SGLang,
TensorRT-LLM and tt-metal run inside a box). One step (:class:`ir.BatchStep`) on one device costs

    roofline(compute, memory) + 2 x layers x all_reduce(tokens x hidden x 2 B) + layers x overhead
        + sampled x vocab x logit_overhead

- compute: ``tokens x flops_per_token / tp`` at each weight format's peak rate times the profile's
  ``matmul_efficiency``, plus the attention's ``pairs x attention_flops_per_pair / tp`` at the bf16
  rate (:data:`ATTENTION_RATE` where the device has it) (Kaplan et al. 2020 for ``2 N`` FLOP per token; the causal pairs as ``BatchStep`` counts);
- memory: the weights once per step (routed experts as far as the step's tokens touch them), the
  KV cache the step reads and writes, over ``memory_bandwidth x memory_efficiency``; a device keeps
  ``1 / min(tp, kv_heads)`` of each token's cache (a head is never split; Pope et al. 2022, Sec. 3);
- the two all-reduces per block sit on the critical path (a decode step has nothing to overlap them
  with): :func:`tp_all_reduce`;
- the fixed time per layer: ``DeviceProfile.decode_layer_overhead`` for a decode-only step (a
  captured graph / trace replayed), ``prefill_layer_overhead`` for a step with a prefill chunk,
  each ``fragment_overhead`` when the profile has no fitted value.

The roofline combine is the profile's (``"max"``: Williams et al. 2009). Activations' own HBM
traffic is left out: a decode step's is ``tokens x hidden`` per matmul, under 1% of its weights at
any batch that fits, and a prefill is compute-bound.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hardware_profiles.collectives import one_hop_all_reduce, span_all_reduce
from hardware_profiles.types import (DEFAULT_PRECISION, DeviceProfile, Link, NodeGroup,
                                     ProfileError, Span)
from ir import BatchStep, InferenceModel
from simulator.program import SimError

KV_FRACTION = 0.9
"""Fraction of the device memory left after the weights that a serving engine gives its KV cache
(TensorRT-LLM's ``kv_cache_free_gpu_mem_fraction`` default, 0.9; the rest is activations and
workspace)."""

ATTENTION_RATE = "bf16_hifi4"
"""The ``DeviceProfile.peak_flops`` entry attention runs at when a device has it (Tenstorrent:
tt-transformers runs scaled-dot-product attention at math fidelity HiFi4,
``models/tt_transformers/tt/model_config.py: compute_kernel_config_sdpa``); bf16 otherwise."""

ACTIVATION_BYTES = 2.0
"""Bytes per activation value a tensor-parallel all-reduce moves (bf16)."""


@dataclass(frozen=True, slots=True)
class StepCost:
    """One step's time on one device of a replica, by part, s (``total`` is what the step takes)."""

    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class Replica:
    """``tp`` devices of ``device`` serving ``model``.

    Attributes:
        model: the model's per-token costs (``zoo.inference.inference_model``).
        device: the device profile.
        tp: tensor-parallel degree (devices in the replica).
        span: where the tensor-parallel group sits on the fabric (:func:`tp_span`).
        kv_fraction: of each device's memory left after the weights, what the KV cache may use.
    """

    model: InferenceModel
    device: DeviceProfile
    tp: int
    span: Span
    kv_fraction: float = KV_FRACTION

    def __post_init__(self) -> None:
        if self.tp < 1 or self.span.ranks != self.tp:
            raise SimError(f"replica of tp={self.tp} over a span of {self.span.ranks} devices; "
                           "fix: a tensor-parallel degree >= 1 equal to the span's devices")

    @property
    def kv_share(self) -> float:
        """Fraction of one token's KV cache each device keeps: ``1 / min(tp, kv_heads)``."""
        return 1.0 / min(self.tp, max(1, self.model.kv_heads))

    @property
    def weight_bytes_per_device(self) -> float:
        """Weights each device holds, bytes."""
        return self.model.weight_bytes / self.tp

    @property
    def kv_capacity_tokens(self) -> int:
        """KV-cache tokens the replica holds once its weights are in, all requests together (0 when
        the weights alone overflow)."""
        free = (self.device.memory_bytes - self.weight_bytes_per_device) * self.kv_fraction
        per_token = self.model.kv_bytes_per_token * self.kv_share
        return max(0, int(free // per_token)) if per_token > 0 else 0

    def check_fits(self) -> None:
        """Raises SimError (one line) when the replica cannot hold its weights and one token."""
        if self.kv_capacity_tokens < 1:
            need = self.weight_bytes_per_device / 1e9
            have = self.device.memory_bytes / 1e9
            raise SimError(f"{self.model.name} ({self.model.weight_format}) needs {need:.1f} GB of "
                           f"weights per device at tp={self.tp} but a {self.device.name} offers "
                           f"{have:.1f} GB; fix: a larger tensor-parallel degree or a smaller "
                           "weight format")


def tp_span(group: NodeGroup, tp: int) -> Span:
    """The span of a tensor-parallel group of ``tp`` devices of ``group``: one scale-up fabric
    when it fits in one (``NodeGroup.domain_devices``: a node, or a GB200 NVL72 rack's NVLink
    domain), else also the scale-out network (``tp / domain_devices`` domains).

    Raises:
        SimError: ``tp`` < 1 or more than the group's devices.
    """
    if not 1 <= tp <= group.num_devices:
        raise SimError(f"tp={tp} does not fit node group {group.name!r} of {group.num_devices} "
                       "devices; fix: a degree between 1 and its devices")
    if tp <= group.domain_devices:
        return Span(tp, 1, group.intra_link)
    nodes = math.ceil(tp / group.domain_devices)
    eff = group.device.scale_out_efficiency
    so = group.scale_out_link
    return Span(tp, nodes, group.intra_link, Link(so.bandwidth * eff, so.latency, so.source))


def layer_overhead(device: DeviceProfile, prefill: bool) -> float:
    """Fixed time per decoder layer of a serving step, s: the profile's fitted
    ``prefill_layer_overhead`` / ``decode_layer_overhead``, else its ``fragment_overhead``."""
    got = device.prefill_layer_overhead if prefill else device.decode_layer_overhead
    return device.fragment_overhead if got is None else got


def mesh_shape(n: int) -> tuple[int, int]:
    """The most square ``a x b`` (``a >= b``) layout of ``n`` devices on a 2D fabric."""
    b = max(d for d in range(1, math.isqrt(n) + 1) if n % d == 0)
    return n // b, b


def mesh_all_reduce(nbytes: float, n: int, link: Link) -> float:
    """An all-reduce of ``nbytes`` per device over ``n`` devices of a 2D mesh or torus, axis by
    axis on its :func:`mesh_shape` ``a x b``: a ring reduce-scatter along ``a``, then along ``b``
    on the ``1/a`` left, and the all-gathers back (per-axis rings, as XLA runs them on TPU ICI,
    jax-ml/scaling-book "How to think about TPUs", and as tt-metal's Galaxy all-reduce runs along
    the rows then the columns of its 8x4 mesh, ``models/demos/llama3_70b_galaxy``), s:
    ``2 ((a-1)/a + (b-1)/(a b)) nbytes / B + 2 ((a-1) + (b-1)) latency``."""
    if n == 1 or nbytes == 0:
        return 0.0
    a, b = mesh_shape(n)
    return (2 * ((a - 1) / a + (b - 1) / (a * b)) * nbytes / link.bandwidth
            + 2 * ((a - 1) + (b - 1)) * link.latency)


def tp_all_reduce(nbytes: float, replica: Replica) -> float:
    """One all-reduce of ``nbytes`` per device over the replica's tensor-parallel group, s: NCCL's
    ring or tree (:func:`hardware_profiles.collectives.span_all_reduce`), and inside one node the
    direct algorithms of a one-hop fabric (:func:`one_hop_all_reduce`) or the per-axis rings of a
    mesh fabric (:func:`mesh_all_reduce`), whichever is fastest."""
    span = replica.span
    ring = span_all_reduce(nbytes, span)[0]
    if span.nodes > 1:
        return ring
    if replica.device.scale_up_one_hop:
        return min(ring, one_hop_all_reduce(nbytes, span.ranks, span.intra)[0])
    return min(ring, mesh_all_reduce(nbytes, span.ranks, span.intra))


def _rate(device: DeviceProfile, dtype: str) -> float:
    """Achievable FLOP/s of ``device``'s matmuls for the ``peak_flops`` entry ``dtype``
    (``ir.serving.MATMUL_DTYPE`` of a weight format): a compute dtype (bf16, fp16, fp32) at the
    precision it runs at (:meth:`DeviceProfile.matmul_precision`: fp32 at TF32 on an A100); a
    weight-only format the device has no matmul for (fp8 weights on an A100) dequantized to bf16,
    as ``ir.serving.MATMUL_DTYPE`` says.

    Raises:
        SimError: the device has no rate for ``dtype`` (nor bf16 for a weight-only format).
    """
    if device.peak(dtype) <= 0 and dtype not in DEFAULT_PRECISION:
        dtype = "bf16"
    try:
        return device.achievable_flops(dtype)
    except ProfileError as e:
        raise SimError(str(e)) from None


def step_cost(replica: Replica, step: BatchStep) -> StepCost:
    """The time of ``step`` on ``replica``, by part (see the module docstring).

    Raises:
        SimError: an empty step, or a device without a usable matmul rate.
    """
    if step.tokens < 1:
        raise SimError("a serving step with no tokens; fix: give it a prefill chunk or a decode")
    return load_cost(replica, step.tokens, step.attention_pairs, step.kv_tokens_read,
                     1.0 if step.prefill else 0.0, len(step.decode) + len(step.prefill))


def load_cost(replica: Replica, tokens: float, pairs: float, kv_read: float,
              prefill_share: float, sampled: float) -> StepCost:
    """:func:`step_cost` of a step given by its totals, which may be averages over many steps
    (:func:`saturation_throughput`): ``tokens`` through the weights, attention ``pairs``,
    ``kv_read`` cached tokens read, the fraction ``prefill_share`` of steps that prefill (their
    per-layer overhead is the prefill one), and ``sampled`` logit vectors handed to sampling
    (``DeviceProfile.logit_overhead`` per logit)."""
    m, dev, tp = replica.model, replica.device, replica.tp
    compute = sum(f * tokens / tp / _rate(dev, dtype) for dtype, f in m.flops_per_token)
    attention = ATTENTION_RATE if dev.peak(ATTENTION_RATE) > 0 else "bf16"
    compute += m.attention_flops_per_pair * pairs / tp / _rate(dev, attention)
    weights = (m.dense_weight_bytes + m.expert_bytes_read(math.ceil(tokens))) / tp
    kv = m.kv_bytes_per_token * replica.kv_share * (kv_read + tokens)
    memory = weights / dev.weight_bandwidth(tokens) + kv / dev.achievable_bandwidth
    body = compute + memory if dev.roofline == "sum" else max(compute, memory)
    comm = 2 * m.layers * tp_all_reduce(tokens * m.hidden * ACTIVATION_BYTES, replica)
    overhead = m.layers * (prefill_share * layer_overhead(dev, prefill=True)
                           + (1 - prefill_share) * layer_overhead(dev, prefill=False))
    overhead += sampled * m.vocab * dev.logit_overhead
    return StepCost(compute, memory, comm, overhead, body + comm + overhead)


def saturation_throughput(replica: Replica, prompt: int, output: int, *, max_batch: int,
                          chunk_tokens: int) -> float:
    """Output tokens/s of one replica under unbounded load (every slot busy, as an offline
    benchmark such as ``trtllm-bench`` measures), in steady state, tokens/s.

    ``C = min(max_batch, kv_capacity // (prompt + output))`` requests are resident. In steady
    state each step decodes ``d`` of them and prefills ``r`` new prompts (``r`` requests finish
    per step), with ``d = r (output - 1)``: ``d = C`` unless the prefill budget binds
    (``r prompt <= chunk_tokens``), then ``r = chunk_tokens / prompt``. A step costs
    :func:`load_cost` of ``d + r prompt`` tokens (decodes at the mean context
    ``prompt + output / 2``, each prompt's ``prompt (prompt + 1) / 2`` causal pairs) and yields
    ``d + r`` tokens.

    Raises:
        SimError: lengths < 1, or not one request fits the replica's memory.
    """
    if prompt < 1 or output < 1 or max_batch < 1 or chunk_tokens < 1:
        raise SimError(f"bad load: prompt {prompt}, output {output}, max_batch {max_batch}, "
                       f"chunk {chunk_tokens}; fix: positive values")
    replica.check_fits()
    resident = min(max_batch, replica.kv_capacity_tokens // (prompt + output))
    if resident < 1:
        raise SimError(f"one request of {prompt + output} tokens does not fit the KV cache of "
                       f"{replica.kv_capacity_tokens} tokens; fix: more devices per replica")
    r = (chunk_tokens / prompt if output == 1
         else min(resident / (output - 1), chunk_tokens / prompt))
    return r * output / steady_cost(replica, prompt, output, r).total_s


def steady_cost(replica: Replica, prompt: int, output: int, r: float) -> StepCost:
    """The average step of a replica in steady state that prefills ``r`` new ``prompt``-token
    requests per step and so decodes ``d = r (output - 1)`` running ones, at the mean context
    ``prompt + output / 2`` (:func:`load_cost` of ``d + r prompt`` tokens, each prompt's
    ``prompt (prompt + 1) / 2`` causal pairs, ``d + r`` logit vectors sampled); it yields
    ``r output`` tokens."""
    d = r * (output - 1)
    ctx = prompt + output / 2
    return load_cost(replica, d + r * prompt, d * ctx + r * prompt * (prompt + 1) / 2,
                     d * ctx + r * prompt, min(1.0, r), d + r)


def step_time(replica: Replica, step: BatchStep) -> float:
    """:func:`step_cost`'s total, s."""
    return step_cost(replica, step).total_s


def kv_transfer_time(model: InferenceModel, tokens: int, link: Link) -> float:
    """Seconds to move a ``tokens``-token KV cache from a prefill replica to a decode replica over
    ``link`` (its bandwidth the aggregate the two replicas have between them): one latency plus
    ``tokens x kv_bytes_per_token / bandwidth`` (DistServe, Zhong et al. 2024, Sec. 4)."""
    if tokens < 0:
        raise SimError(f"a KV transfer of {tokens} tokens; fix: a count >= 0")
    return link.latency + tokens * model.kv_bytes_per_token / link.bandwidth
