"""Serving (LLM inference) as plan-level data: what a forward step costs per token, the requests a
deployment serves, its service-level objectives and one step of a continuous batch.

Units are SI (seconds, bytes, FLOP). Built by ``zoo.inference`` (the model's side) and read by the
simulator (``simulator.serving_cost`` prices a step on a device, ``simulator.serving`` runs the
requests over time) and the planner (``planner.serving`` searches deployments).

Vocabulary (as vLLM, SGLang and tt-metal use it):

- *prefill*: the forward over a request's prompt, writing its KV cache; ends with the first token.
- *decode*: one forward per further token, reading the whole KV cache (memory-bound at small batch).
- *TTFT*: time to first token (arrival to the end of the prefill). *TPOT*: time per output token
  after the first (the mean inter-token gap of one request).
- *continuous batching*: every step runs the decodes of the running requests plus (chunked) prefills
  of newly admitted ones (Yu et al. 2022, "Orca", OSDI; Agrawal et al. 2024, "Sarathi-Serve").
- *disaggregated serving*: prefill and decode on different replicas (possibly different device
  kinds), the KV cache moved between them (Zhong et al. 2024, "DistServe", OSDI; Patel et al. 2024,
  "Splitwise", ISCA).
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import IRError
from ir.shards import ShardDims

WEIGHT_FORMATS: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    # Tenstorrent block floats: 16 mantissas share one 8-bit exponent per 16-value row of a 32x32
    # tile, 8 or 4 bits each (tt-metal tech_reports/data_formats: bfp8_b is 1088 bytes per
    # 1024-value tile = 1.0625 B/value, bfp4_b 576 bytes = 0.5625 B/value).
    "bfp8": 1088 / 1024,
    "bfp4": 576 / 1024,
    "int4": 0.5,
}
"""Bytes per stored value of each weight / KV-cache format a device runs."""

MATMUL_DTYPE: dict[str, str] = {"fp32": "fp32", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8",
                                "int8": "fp8", "bfp8": "bf16", "bfp4": "bfp8", "int4": "bf16"}
"""The peak-rate entry (``DeviceProfile.peak_flops`` key) a weight format's matmuls run at: fp8 and
int8 on the 8-bit tensor cores; on Tenstorrent, bfp8 weights at math fidelity HiFi2 (the profiles'
``bf16`` entry) and bfp4 at LoFi (their ``bfp8`` entry), as tt-transformers pairs them
(``models/tt_transformers/tt/model_config.py``: bfp4 MLP matmuls at LoFi, bfp8 at HiFi2); int4
weight-only kernels dequantize to bf16. A compute format (fp32, bf16, fp16) runs at the precision
the device runs it at (``DeviceProfile.matmul_precision``: fp32 at TF32 on an A100, one bfloat16
pass on a TPU) and is refused on a device without one (bf16 on a V100); a weight-only format the
device has no matmul for (fp8 on an A100) runs at its bf16 rate, dequantized."""


def format_bytes(fmt: str) -> float:
    """Bytes per value of ``fmt``.

    Raises:
        IRError: an unknown format (names the known ones).
    """
    try:
        return WEIGHT_FORMATS[fmt]
    except KeyError:
        raise IRError(f"unknown weight format {fmt!r}; fix: use one of "
                      f"{', '.join(WEIGHT_FORMATS)}") from None


@dataclass(frozen=True, slots=True)
class InferenceModel:
    """A decoder's per-token costs for serving, at one weight and KV-cache format.

    Attributes:
        name: model name.
        layers, hidden, vocab: as :class:`zoo.ModelConfig`.
        kv_heads: key/value heads of a layer (1 for multi-head latent attention, whose latent
            cache every head shares): a tensor-parallel group of more devices than this keeps a
            copy of each head's cache on several devices.
        weight_format / kv_format: the precision (``"bf16"``, ``"bfp8,gate_up=bfp4"``, see
            ``zoo.inference``) and the KV-cache format (a key of :data:`WEIGHT_FORMATS`).
        dense_weight_bytes: bytes of every weight read on each forward whatever the batch (attention,
            dense MLPs, shared experts, norms, the router, the output head), bytes.
        expert_weight_bytes: bytes of all routed experts (0 for a dense model), bytes.
        experts / experts_per_token / moe_layers: routed experts per MoE block, the top-k, and the
            blocks with routed experts (0 / 0 / 0 dense).
        flops_per_token: ``(peak-rate key, FLOP)`` pairs: one token's forward through the weights
            (2 FLOP per weight it uses, routed experts at the top-k, the input embedding left out:
            a lookup), split by the ``DeviceProfile.peak_flops`` entry its format runs at
            (:data:`MATMUL_DTYPE`), FLOP.
        attention_flops_per_pair: FLOP per (query token, cached key token) pair, summed over the
            layers (QK^T and PV: ``2 x heads x (qk width + v width)`` per layer), FLOP.
        kv_bytes_per_token: KV-cache bytes one token leaves in every layer together, bytes.
        tp_allreduce_bytes_per_token: activation bytes (bf16) a tensor-parallel group all-reduces
            per token, two all-reduces per block (Megatron-LM, Shoeybi et al. 2019), bytes.
        embedding_bytes: the input embedding's bytes (looked up, not streamed; 0 when tied to the
            head), bytes.
        shards: what a tensor-parallel replica splits (:class:`ir.shards.ShardDims`), which
            decides the degrees that can serve it (:func:`ir.shards.layout_problem`); None: any.
    """

    name: str
    layers: int
    hidden: int
    vocab: int
    kv_heads: int
    weight_format: str
    kv_format: str
    dense_weight_bytes: float
    expert_weight_bytes: float
    experts: int
    experts_per_token: int
    moe_layers: int
    flops_per_token: tuple[tuple[str, float], ...]
    attention_flops_per_pair: float
    kv_bytes_per_token: float
    tp_allreduce_bytes_per_token: float
    embedding_bytes: float
    shards: ShardDims | None = None

    @property
    def matmul_flops_per_token(self) -> float:
        """All of :attr:`flops_per_token`, FLOP."""
        return sum(f for _, f in self.flops_per_token)

    @property
    def weight_bytes(self) -> float:
        """Every weight held in device memory (the embedding included), bytes."""
        return self.dense_weight_bytes + self.expert_weight_bytes + self.embedding_bytes

    def expert_bytes_read(self, tokens: int) -> float:
        """Expected routed-expert bytes one forward over ``tokens`` tokens reads: in each block an
        expert is read when at least one token picks it, ``E (1 - (1 - k/E)^tokens)`` of the
        ``E`` experts under uniform routing, bytes (0 for a dense model)."""
        if self.experts == 0 or tokens <= 0:
            return 0.0
        e, k = self.experts, self.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)
        return self.expert_weight_bytes * touched / e


@dataclass(frozen=True, slots=True)
class RequestMix:
    """The requests a deployment serves.

    Attributes:
        prompt_tokens: mean prompt length, tokens.
        output_tokens: mean output length (the first token included), tokens.
        rate_per_s: mean arrival rate (Poisson), requests/s; 0 means "as fast as served" (a closed
            loop of ``concurrency`` users).
        concurrency: users in the closed loop when ``rate_per_s`` is 0.
        spread: lengths are drawn uniformly in ``[mean (1 - spread), mean (1 + spread)]``; 0 fixes
            them.
    """

    prompt_tokens: int
    output_tokens: int
    rate_per_s: float = 0.0
    concurrency: int = 1
    spread: float = 0.0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise IRError(f"request lengths must be >= 1 token, got prompt {self.prompt_tokens}, "
                          f"output {self.output_tokens}; fix: pass positive lengths")
        if self.rate_per_s < 0 or self.concurrency < 1:
            raise IRError(f"bad load: rate {self.rate_per_s}/s, concurrency {self.concurrency}; "
                          "fix: a rate >= 0 and a concurrency >= 1")
        if not 0.0 <= self.spread < 1.0:
            raise IRError(f"length spread {self.spread} is outside [0, 1); fix: e.g. 0.5")


@dataclass(frozen=True, slots=True)
class ServiceObjectives:
    """Service-level objectives at a percentile of requests.

    Attributes:
        ttft_s: time-to-first-token bound, s (inf: none).
        tpot_s: time-per-output-token bound, s (inf: none).
        percentile: the percentile both bounds hold at (e.g. 99).
    """

    ttft_s: float = float("inf")
    tpot_s: float = float("inf")
    percentile: float = 99.0

    def __post_init__(self) -> None:
        if self.ttft_s <= 0 or self.tpot_s <= 0 or not 0 < self.percentile <= 100:
            raise IRError(f"bad objectives: TTFT {self.ttft_s} s, TPOT {self.tpot_s} s at "
                          f"p{self.percentile}; fix: positive bounds, a percentile in (0, 100]")


@dataclass(frozen=True, slots=True)
class BatchStep:
    """One forward step of a continuous batch on one replica.

    Attributes:
        prefill: ``(start, length)`` of each prefill chunk: ``length`` prompt tokens of a request
            whose first ``start`` tokens are already in its KV cache (chunked prefill).
        decode: the context length (KV-cache tokens, the new one included) of each decoding request.
    """

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    @property
    def tokens(self) -> int:
        """Tokens this step runs through the weights."""
        return sum(n for _, n in self.prefill) + len(self.decode)

    @property
    def attention_pairs(self) -> float:
        """(query, key) pairs the attention computes: a chunk of ``n`` tokens after ``s`` cached
        ones attends ``n s + n (n + 1) / 2`` pairs (causal); a decode token its whole context."""
        pre = sum(n * s + n * (n + 1) / 2 for s, n in self.prefill)
        return pre + float(sum(self.decode))

    @property
    def kv_tokens_read(self) -> int:
        """KV-cache tokens the step reads (each request's cache once)."""
        return sum(s + n for s, n in self.prefill) + sum(self.decode)
