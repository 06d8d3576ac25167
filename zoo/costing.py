"""Workload costing: each unique fragment body of a zoo model, costed from JAX/XLA's own analysis.

``workload(name_or_cfg, global_batch, seq_len=None, **overrides) -> ir.Workload``.

Method (all abstract: ``jax.ShapeDtypeStruct`` inputs, no weights in memory):

* One representative layer per unique body (:func:`zoo.body_of`) is traced at microbatch
  1 and 2; a linear fit gives the per-sample part (``f(2) - f(1)``) and the fixed part
  (``f(1) - per_sample``, clipped at 0). Results are cached per (config, body).
* FLOPs: ``jax.jit(f).lower(...).cost_analysis()['flops']`` (XLA's HloCostAnalysis). The lowered
  (pre-optimization) and the compiled figure agree within 0.1% for FLOPs (measured: llama3-70b block,
  1.6250e13 vs 1.6260e13), and lowering is ~10x faster than compiling, so the lowered figure is used.
* Bytes: ``jax.experimental.roofline``'s ``hbm_bytes`` (operands and results of dots, reductions,
  gathers; elementwise chains fused away), with the attention core's softmax matrix replaced by
  FlashAttention's HBM traffic (reads q, k, v, writes o; backward reads q, k, v, o, do, lse and
  writes dq, dk, dv; Dao et al. 2022). Why not XLA's ``bytes accessed``: the lowered (pre-fusion)
  count charges every elementwise op's operands (llama3-70b block, seq 8192: 433 GB per sample) and
  the compiled CPU count reflects the CPU backend (dots fused into each other, bf16 upcast to f32:
  160 GB), neither of which a GPU/TPU does; the roofline model with flash attention gives 4.7 GB
  (1.7 GB of it the weights). Known limit: it is a fusion model, not a measurement of a GPU binary.
* Other bytes (``*_other_bytes_per_sample``): the unfused HBM traffic of every non-matmul op
  (``roofline``'s ``unfused_hbm_bytes`` minus the ``dot_general`` operands and results), minus the
  attention core's, which FlashAttention fuses; the cost model charges a per-device fraction of it.
* Backward: ``jax.vjp`` is evaluated abstractly (``jax.eval_shape``); its closure's leaves are the
  residuals, and the backward alone is the function ``(residuals, cotangent) -> gradients`` rebuilt
  from the closure's treedef, costed like the forward (so no forward recomputation is counted).
  The input-gradient part B (zero-bubble, Qi et al. 2023) is the same construction with the vjp taken
  w.r.t. the layer's float inputs only (parameters held constant); the weight-gradient part W is
  ``bwd - B``. The embedding has no float input, so its B is 0.
* Residual bytes: ``saved_residuals`` (``jax._src.ad_checkpoint``, the function behind the public
  ``jax.ad_checkpoint.print_saved_residuals``) of the layer with flash attention (what a production training
  run keeps: q, k, v, o and the log-sum-exp instead of the ``heads x s x s`` softmax), excluding the
  layer's parameters.
* Activation bytes: the layer output's bytes (the loss scalar for a training head counts 0).
  A language model's training head gives its logits per sample (tokens x vocabulary) and leaves
  them out of its residual bytes: what the loss keeps of them, and holds at its peak, depends on
  how it is computed (``ir.workload.CROSS_ENTROPY``), which the cost model applies.
* Tensor-parallel all-reduce bytes per forward (Megatron-LM, Shoeybi et al. 2019, section 3): two
  all-reduces of the block output per transformer block (after attention and after the MLP; Mochi:
  both streams, the final block only the visual stream, as the Tenstorrent guide lists), one of the
  embedding output for the vocab-parallel embedding, and for the vocab-parallel cross-entropy three
  float32 values per token (max, sum of exponentials, target logit). Mochi's embed and head are
  replicated (0). T5 encoder: two per block, one for the vocab-parallel embedding, none for the
  final RMSNorm. Mochi VAE decoder: 0 everywhere (convolutions and GroupNorm are not split by
  tensor parallelism: the Tenstorrent guide, shared/reference/004 Sec. 6).
* Modules: :mod:`zoo.tracing` (FLOPs, bytes and the backward of a traced function) and
  :mod:`zoo.attention_cost` (the attention core under a fused kernel); this one puts them
  together per fragment body and builds the workload.
* The Mochi VAE decoder's layers are traced like any other, each at the input the layers before
  it produce (:func:`_component_inputs`); its convolutions' operands and results are HBM bytes as
  matmuls' are (:func:`_costs` ``convs``). Nothing else: no halo or spatial-sharding figure, and
  no attention, expert or context-parallel fields (none applies).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax._src.ad_checkpoint import saved_residuals

from ir import LayerCost, Workload
from hardware_profiles.types import MODEL_DTYPES
from zoo import gated_deltanet, hybrid, models
from zoo.config import ModelConfig, ZooError, get_config, shard_dims
from zoo.attention_cost import ATTENTION_BODIES, attention_kernel_correction, window_fraction
from zoo.layers import expert_capacity
from zoo.tracing import nbytes as _nbytes, trace_costs as _costs, vjp_parts as _vjp_parts

__all__ = ["workload", "body_cost", "analytic_training_flops", "window_fraction", "mean_cost"]


COMPONENTS = ("t5", "mochi_vae")
"""Families whose layers pass their output to the next whatever its shape (the T5 encoder's
``(x, bias)``, the Mochi VAE decoder's growing video) and whose embed takes the batch."""


def _component_inputs(cfg: ModelConfig, layer: str, b: int) -> tuple[tuple, tuple]:
    """:func:`_layer_inputs` of a :data:`COMPONENTS` model: the embed's input is the batch,
    any other layer's the output of the layers before it (shapes only, each body evaluated
    once per input shape)."""
    batch = models.batch_spec(cfg, b)
    if layer == "embed":
        return (), (batch,)
    fns, names = models.layer_fns(cfg), models.layer_names(cfg)
    x = jax.eval_shape(fns["embed"], models.layer_param_shapes(cfg, "embed"), batch)
    seen: dict[tuple, Any] = {}
    for name in names[1:names.index(layer)]:
        key = (models.body_of(cfg, name), str(jax.tree.map(lambda a: (a.shape, a.dtype), x)))
        if key not in seen:
            seen[key] = jax.eval_shape(fns[name], models.layer_param_shapes(cfg, name), x)
        x = seen[key]
    return (x,), ()


def _layer_inputs(cfg: ModelConfig, layer: str, b: int) -> tuple[tuple, tuple]:
    """(differentiable inputs, other inputs) of ``layer`` at microbatch ``b``."""
    if cfg.family in COMPONENTS:
        return _component_inputs(cfg, layer, b)
    batch = models.batch_spec(cfg, b)
    fns = models.layer_fns(cfg)
    if layer == "embed":
        return (), ((batch,) if cfg.family == "mochi" else (batch["tokens"],))
    emb = jax.eval_shape(fns["embed"], models.layer_param_shapes(cfg, "embed"),
                         batch if cfg.family == "mochi" else batch["tokens"])
    if layer == "head" and cfg.family != "mochi":
        return (emb,), (batch["targets"],)
    return (emb,), ()


def _probe(cfg: ModelConfig, body: str, b: int) -> dict[str, float]:
    layer = next(n for n in models.layer_names(cfg) if models.body_of(cfg, n) == body)
    fn = models.layer_fns(cfg)[layer]
    p = models.layer_param_shapes(cfg, layer)
    diff, other = _layer_inputs(cfg, layer, b)
    out = jax.eval_shape(fn, p, *diff, *other)
    r: dict[str, float] = {}
    r["fwd_flops"], r["fwd_bytes"], r["fwd_other"], r["fwd_ops"] = _costs(
        fn, p, *diff, *other, floor=_nbytes((diff, other, out)), convs=cfg.family == "mochi_vae")
    r["out_bytes"] = 0.0 if (cfg.training and layer == "head") else _nbytes(out)
    r["bwd_ops"] = 0
    for k in ("bwd_flops", "bwd_bytes", "bwdx_flops", "resid_bytes", "bwd_other", "bwdx_other",
              "attn_fwd_flops", "attn_bwd_flops"):
        r[k] = 0.0
    if cfg.training:
        bwd, leaves, ct = _vjp_parts(fn, p, diff, other, wrt_params=True)
        grads = jax.eval_shape(bwd, leaves, ct)
        r["bwd_flops"], r["bwd_bytes"], r["bwd_other"], r["bwd_ops"] = _costs(
            bwd, leaves, ct, floor=_nbytes((ct, grads)))
        if diff:
            bwdx, leaves_x, ct = _vjp_parts(fn, p, diff, other, wrt_params=False)
            r["bwdx_flops"], _, r["bwdx_other"], _ = _costs(bwdx, leaves_x, ct)
        flash_fn = models.layer_fns(get_config(cfg, attention="flash"))[layer]
        kept: list[Any] = [a for a, why in saved_residuals(flash_fn, p, *diff, *other)
                           if not why.startswith("from the argument p")]
        r["resid_bytes"] = float(sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize
                                     for a in kept))
    fix = attention_kernel_correction(cfg, body, b, cfg.training)
    if body == "head" and mtp_attention_runs(cfg) != 1:     # one core per attention run
        fix = {k: v * mtp_attention_runs(cfg) for k, v in fix.items()}
    for k, v in (*fix.items(), *gated_deltanet.kernel_correction(cfg, body, b, cfg.training).items(),
                 *hybrid.kernel_correction(cfg, body, b, cfg.training).items()):
        if cfg.training or not k.startswith("bwd"):
            r[k] = max(r[k] + v, 0.0)
    return r


def _tp_allreduce_bytes(cfg: ModelConfig, body: str) -> float:
    """Megatron tensor-parallel all-reduce bytes per sample per forward (see module doc)."""
    db = cfg.dtype_bytes
    if cfg.family == "mochi_vae":
        return 0.0      # no tensor parallelism of a convolution (Tenstorrent guide, Sec. 6)
    if cfg.family == "t5":       # vocab-parallel embedding; the final RMSNorm is replicated
        return {"embed": cfg.seq_len * cfg.hidden * db, "t5_block": 2.0 * cfg.seq_len * cfg.hidden
                * db, "head": 0.0}[body]
    if cfg.family == "mochi":
        if body == "asymm_dit_block":
            return 2.0 * (cfg.visual_tokens * cfg.hidden + cfg.text_tokens * cfg.hidden_y) * db
        if body == "asymm_dit_block_final":
            return 2.0 * cfg.visual_tokens * cfg.hidden * db
        return 0.0
    block = 2.0 * cfg.seq_len * cfg.hidden * db
    # a multi-token-prediction head: a second vocab-parallel cross-entropy, the vocab-parallel
    # lookup of the next tokens' embeddings and its block's two all-reduces
    # (a hybrid's passes each run its mtp_pattern's sublayers, one all-reduce each)
    blocks = cfg.mtp_layers * (len(cfg.mtp_pattern) / 2 if cfg.hybrid else 1)
    mtp = cfg.mtp_layers * (3.0 * cfg.seq_len * 4 + cfg.seq_len * cfg.hidden * db) + block * blocks
    return {"embed": cfg.seq_len * cfg.hidden * db, "decoder_block": block,
            "sliding_block": block, "dense_block": block, "linear_block": block,
            # a hybrid layer is one sublayer: one all-reduce of its output (Megatron's Mamba
            # mixer splits heads like attention, its out-projection reduced once)
            "mamba_block": block / 2, "attention_block": block / 2, "mlp_block": block / 2,
            "moe_block": block / 2,
            "head": 3.0 * cfg.seq_len * 4 + mtp}[body]


@functools.lru_cache(maxsize=None)
def body_cost(cfg: ModelConfig, body: str) -> LayerCost:
    """The :class:`LayerCost` of fragment body ``body`` of ``cfg`` (at ``cfg.seq_len``), cached.

    Raises:
        ZooError: ``body`` is not a body of ``cfg``.
    """
    bodies = {models.body_of(cfg, n) for n in models.layer_names(cfg)}
    if body not in bodies:
        raise ZooError(f"{cfg.name!r} has no fragment body {body!r}; bodies: {sorted(bodies)}")
    one, two = _probe(cfg, body, 1), _probe(cfg, body, 2)
    ops = {k: int(one.pop(k)) for k in ("fwd_ops", "bwd_ops")}
    for k in ops:
        two.pop(k)
    per = {k: max(two[k] - one[k], 0.0) for k in one}
    fixed = {k: max(one[k] - per[k], 0.0) for k in one}
    layer = next(n for n in models.layer_names(cfg) if models.body_of(cfg, n) == body)
    pspec = models.layer_param_shapes(cfg, layer)
    return LayerCost(
        name=body,
        fwd_flops_per_sample=per["fwd_flops"],
        bwd_flops_per_sample=per["bwd_flops"],
        bwd_input_flops_per_sample=min(per["bwdx_flops"], per["bwd_flops"]),
        fwd_bytes_fixed=fixed["fwd_bytes"], fwd_bytes_per_sample=per["fwd_bytes"],
        bwd_bytes_fixed=fixed["bwd_bytes"], bwd_bytes_per_sample=per["bwd_bytes"],
        param_count=sum(math.prod(s.shape) for s in pspec.values()),
        param_bytes=float(_nbytes(pspec)),
        activation_bytes_per_sample=per["out_bytes"],
        # the loss's saved logits are the workload's (its cross_entropy), not the trace's
        residual_bytes_per_sample=max(per["resid_bytes"] - TRACED_LOGIT_BYTES
                                      * _logits_per_sample(cfg, body), 0.0),
        tp_allreduce_bytes_per_sample=_tp_allreduce_bytes(cfg, body),
        fwd_other_bytes_per_sample=per["fwd_other"],
        bwd_other_bytes_per_sample=per["bwd_other"],
        bwd_input_other_bytes_per_sample=min(per["bwdx_other"], per["bwd_other"]),
        attention_fwd_flops_per_sample=min(per["attn_fwd_flops"], per["fwd_flops"]),
        attention_bwd_flops_per_sample=min(per["attn_bwd_flops"], per["bwdx_flops"],
                                           per["bwd_flops"]),
        attention_kernel=("flash2" if cfg.attention_kernel == "flash2"
                          and per["attn_fwd_flops"] > 0 else ""),
        fwd_ops=ops["fwd_ops"], bwd_ops=ops["bwd_ops"],
        logits_per_sample=_logits_per_sample(cfg, body),
        low_precision=body not in ("embed", "head"), **_expert_fields(cfg, body),
        **_context_fields(cfg, body), **_mla_fields(cfg, body))


TRACED_LOGIT_BYTES = 4.0
"""Bytes a traced training head saves per logit: ``zoo.decoder.head_fn`` computes the logits in
fp32 (``preferred_element_type``) and its cross-entropy keeps them."""


def _logits_per_sample(cfg: ModelConfig, body: str) -> float:
    """Logit elements of one sample's losses (tokens x vocabulary, once per loss: the
    multi-token-prediction passes add one each) for a language model's training head; 0 for any
    other body, an inference head and the models without a token loss (Mochi, T5's encoder, the
    VAE)."""
    if body != "head" or not cfg.training or cfg.family in ("mochi", "t5", "mochi_vae"):
        return 0.0
    return float(cfg.seq_len * cfg.vocab * (1 + cfg.mtp_layers))


CONTEXT_BODIES = (*ATTENTION_BODIES, "asymm_dit_block", "asymm_dit_block_final")
"""The fragment bodies with an attention layer whose tokens context parallelism splits: the
decoders' (:data:`ATTENTION_BODIES`) and Mochi's joint attention."""


def _context_fields(cfg: ModelConfig, body: str) -> dict[str, float]:
    """An attention block's :class:`LayerCost` context-parallel fields: the bytes of one
    sample's keys and values, and of its queries, keys, values and output, over the whole
    sequence (Mochi: the visual and text tokens of its joint attention). Keys and values are
    what the attention kernel receives: grouped-query attention's ``kv_heads``; latent
    attention's per-head keys (``head_size + qk_rope_head_dim``) and values (``v_head_dim``),
    as Megatron-Core's context-parallel MLA exchanges them. Empty for other bodies (a Mamba
    mixer's state passing is not modelled)."""
    if body not in CONTEXT_BODIES:
        return {}
    tokens = cfg.visual_tokens + cfg.text_tokens if cfg.family == "mochi" else cfg.seq_len
    db = cfg.dtype_bytes
    if cfg.mla:
        q = k = cfg.heads * (cfg.head_dim + cfg.qk_rope_head_dim)
        v = o = cfg.heads * cfg.v_head_dim
    else:
        q = o = cfg.heads * cfg.head_dim
        k = v = cfg.kv_heads * cfg.head_dim
    return {"context_kv_bytes_per_sample": float(tokens * (k + v) * db),
            "context_qkvo_bytes_per_sample": float(tokens * (q + k + v + o) * db)}


def _expert_fields(cfg: ModelConfig, body: str) -> dict[str, Any]:
    """A mixture-of-experts block's :class:`LayerCost` expert fields: its experts, their
    parameters, the FLOP of their matmuls for one sample (every capacity row of every expert:
    ``zoo.layers.moe_swiglu`` computes the empty rows too), the bytes one sample's tokens send
    to them in one dispatch and the (token, expert) pairs it routes, all at the width the tokens
    enter the experts at (``ModelConfig.expert_input``: LatentMoE's latent where set); a
    multi-token-prediction head carries its one block's."""
    if not cfg.moe or body not in ("decoder_block", "sliding_block", "linear_block", "head",
                                   "moe_block"):
        return {}
    runs = mtp_moe_runs(cfg) if body == "head" else 1   # a head's MoE blocks run per pass
    if runs == 0:
        return {}
    routed = cfg.experts * expert_capacity(cfg.seq_len, cfg.experts_per_token, cfg.experts,
                                           cfg.capacity_factor)     # token rows per sample
    return {"experts": cfg.experts, "expert_param_count": models.expert_param_count(cfg),
            # gate (none for relu2), up and down projections of every routed row (shared experts are dense work)
            "expert_fwd_flops_per_sample": (4.0 if cfg.mlp == "relu2" else 6.0) * runs
                                           * routed * cfg.expert_input * cfg.expert_ffn,
            "alltoall_bytes_per_sample": (runs * cfg.seq_len * cfg.experts_per_token
                                          * cfg.expert_input * cfg.dtype_bytes
                                          * cfg.capacity_factor),
            "routed_pairs_per_sample": float(runs * cfg.seq_len * cfg.experts_per_token),
            "experts_per_token": float(cfg.experts_per_token),
            "expert_width": cfg.expert_ffn, "shared_expert_width": cfg.shared_experts * cfg.expert_ffn,
            "expert_latent": cfg.moe_latent}


def mtp_moe_runs(cfg: ModelConfig) -> int:
    """How many mixture-of-experts blocks a multi-token-prediction head runs per sample: one
    (DeepSeek-V3's module), a hybrid's ``mtp_pattern`` E layers times its ``mtp_layers`` passes,
    0 without multi-token prediction."""
    if not cfg.mtp_layers:
        return 0
    return cfg.mtp_layers * cfg.mtp_pattern.count("E") if cfg.hybrid else 1


def mtp_attention_runs(cfg: ModelConfig) -> int:
    """How many attention cores a multi-token-prediction head runs per sample (as
    :func:`mtp_moe_runs`, for the attention layers)."""
    if not cfg.mtp_layers:
        return 0
    return cfg.mtp_layers * cfg.mtp_pattern.count("*") if cfg.hybrid else 1


def _mla_fields(cfg: ModelConfig, body: str) -> dict[str, int]:
    """A latent-attention block's :class:`LayerCost` ranks and head widths (the ``mla_*``
    fields, for Megatron-Core's ``mla_up_proj`` recompute: :mod:`simulator.remat`); empty for
    other bodies and models."""
    if not cfg.mla or body not in ATTENTION_BODIES:
        return {}
    return {"mla_q_rank": cfg.q_lora_rank, "mla_kv_rank": cfg.kv_lora_rank,
            "mla_nope_dim": cfg.head_dim, "mla_rope_dim": cfg.qk_rope_head_dim,
            "mla_v_dim": cfg.v_head_dim}


def mean_cost(costs: list[tuple[LayerCost, int]], name: str) -> LayerCost:
    """One :class:`LayerCost` named ``name`` whose every figure is the ``count``-weighted mean
    of ``costs`` (``(cost, count)`` pairs of bodies with the same parameters and experts, e.g.
    a sliding-window and a full-attention block): ``n`` layers of it cost what the ``n`` layers
    cost together when they hold the mix in these proportions. Operation counts round.

    Raises:
        ZooError: bodies whose parameters or experts differ (a mean would misplace weights).
    """
    first = costs[0][0]
    if any((c.param_count, c.experts, c.expert_param_count) !=
           (first.param_count, first.experts, first.expert_param_count) for c, _ in costs):
        raise ZooError(f"bodies {[c.name for c, _ in costs]} hold different parameters; only "
                       f"layers that differ in their attention span are costed as one mean body")
    total = sum(n for _, n in costs)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(LayerCost):
        v = getattr(first, f.name)
        if f.name == "name":
            out[f.name] = name
        elif f.name == "attention_kernel":     # the kernel any of them runs its core with
            out[f.name] = max((getattr(c, f.name) for c, _ in costs), key=len)
        elif isinstance(v, bool) or f.name in ("param_count", "experts", "expert_param_count"):
            out[f.name] = v
        else:
            m = sum(getattr(c, f.name) * n for c, n in costs) / total
            out[f.name] = round(m) if isinstance(v, int) else m
    return LayerCost(**out)


def _uniform_blocks(bodies: tuple[str, ...], costs: dict[str, LayerCost]
                    ) -> tuple[tuple[str, ...], dict[str, LayerCost]]:
    """A run of blocks that differ only in their attention span (gpt-oss's sliding and full
    layers) as one body, ``"decoder_block"``, costed as their mean (:func:`mean_cost`); other
    sequences unchanged. Why: the planner partitions one contiguous run of identical blocks
    (``planner.options._split_layers``). Exact for the model's step and for every stage holding
    whole periods of the pattern; a stage with one extra sliding (full) layer is charged half a
    layer's difference in attention core more (less) than it computes."""
    run = [b for b in bodies if b in ("decoder_block", "sliding_block")]
    kinds = sorted(set(run))
    if len(kinds) < 2:
        return bodies, costs
    mean = mean_cost([(costs[k], run.count(k)) for k in kinds], "decoder_block")
    out = {k: v for k, v in costs.items() if k not in kinds}
    out["decoder_block"] = mean
    return tuple("decoder_block" if b in kinds else b for b in bodies), out


HYBRID_BODY = "hybrid_block"
"""The body a hybrid model's mixed blocks are planned as (:func:`_hybrid_blocks`)."""


def _hybrid_blocks(bodies: tuple[str, ...], costs: dict[str, LayerCost]
                   ) -> tuple[tuple[str, ...], dict[str, LayerCost]]:
    """A hybrid model's blocks between its embedding and its head (Nemotron-H's Mamba-2,
    attention and mixture-of-experts layers in the order of its ``hybrid_override_pattern``) as
    one body, :data:`HYBRID_BODY`, every figure the count-weighted mean over the layers, so
    ``n`` of them cost ``n / L`` of the ``L`` blocks together; its ``experts`` and
    ``experts_per_token`` are the mixture-of-experts layers' (the expert shares, all-to-all bytes
    and expert FLOP are means, so expert parallelism splits exactly the model's experts over its
    layers). Why: the planner partitions one contiguous run of identical blocks
    (``planner.options._split_layers``). Exact for the whole step, its parameters and memory; a
    pipeline stage is charged the mean of the pattern, not the layers it holds (at most one
    period of the pattern off: Nemotron 3 Nano repeats ``MEMEM*E``). A sequence whose most
    common block forms one contiguous run (dense first blocks, then the rest) is unchanged."""
    inner = bodies[1:-1] if len(bodies) > 2 else bodies
    kinds = list(dict.fromkeys(inner))
    if len(kinds) < 2 or any(k in ("embed", "head") for k in kinds):
        return bodies, costs
    common = max(kinds, key=inner.count)
    at = [i for i, b in enumerate(inner) if b == common]
    if at[-1] - at[0] + 1 == len(at):
        return bodies, costs     # one contiguous run (DeepSeek-V3's dense first blocks before it)
    pairs = [(costs[k], inner.count(k)) for k in kinds]
    total = sum(n for _, n in pairs)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(LayerCost):
        vals = [getattr(c, f.name) for c, _ in pairs]
        if f.name == "name":
            out[f.name] = HYBRID_BODY
        elif f.name in ("experts", "experts_per_token"):
            out[f.name] = max(vals)
        elif f.name == "attention_kernel":     # the layers with a core name it; the rest ""
            out[f.name] = max(vals, key=len)
        elif isinstance(vals[0], bool):
            out[f.name] = any(vals)
        else:
            m = sum(v * n for v, (_, n) in zip(vals, pairs)) / total
            out[f.name] = round(m) if isinstance(vals[0], int) else m
    merged = {k: v for k, v in costs.items() if k not in kinds}
    merged[HYBRID_BODY] = LayerCost(**out)
    head = bodies[:1] if len(bodies) > 2 else ()
    tail = bodies[-1:] if len(bodies) > 2 else ()
    return head + (HYBRID_BODY,) * len(inner) + tail, merged


def workload(name_or_cfg: str | ModelConfig, global_batch: int, seq_len: int | None = None,
             *, per_layer: bool = False, **overrides) -> Workload:
    """The :class:`~ir.Workload` of one step of ``global_batch`` samples.

    Args:
        name_or_cfg: a zoo name (``zoo.list_models()``) or a :class:`ModelConfig`.
        global_batch: samples per step (Mochi: one sample = one DiT forward of one video at one
            denoising step; a video costs ``cfg.sampling_steps * cfg.cfg_passes`` samples).
        seq_len: tokens per sample; default the model's ``seq_len``. Mochi's token count follows
            its latent video size (override ``latent_frames`` etc.), so ``seq_len`` must match it.
        per_layer: each layer's own body (gpt-oss: ``"sliding_block"`` and ``"decoder_block"``
            alternating; Nemotron-H: its pattern's layers); by default blocks that differ only in
            their attention span are costed as one mean body the planner can partition
            (:func:`_uniform_blocks`), and a hybrid's mixed blocks as another
            (:func:`_hybrid_blocks`).
        overrides: :class:`ModelConfig` fields.
    Raises:
        ZooError: unknown model or field, ``global_batch < 1``, or a Mochi ``seq_len`` mismatch.
    """
    cfg = get_config(name_or_cfg, **overrides)
    if global_batch < 1:
        raise ZooError(f"global_batch={global_batch} must be >= 1")
    if seq_len is not None and seq_len != cfg.seq_len:
        if cfg.family in ("mochi", "mochi_vae"):
            raise ZooError(f"{cfg.family} seq_len is fixed by the latent size ({cfg.seq_len} "
                           f"tokens); override latent_frames/latent_height/latent_width instead "
                           f"of {seq_len}")
        cfg = get_config(cfg, seq_len=seq_len)
    if cfg.family == "mochi" and cfg.seq_len != cfg.visual_tokens + cfg.text_tokens:
        cfg = get_config(cfg, seq_len=cfg.visual_tokens + cfg.text_tokens)
    if cfg.family == "mochi_vae" and cfg.seq_len != cfg.latent_positions:
        cfg = get_config(cfg, seq_len=cfg.latent_positions)
    names = models.layer_names(cfg)
    bodies = tuple(models.body_of(cfg, n) for n in names)
    costs = {b: body_cost(cfg, b) for b in dict.fromkeys(bodies)}
    if not per_layer:
        bodies, costs = _uniform_blocks(bodies, costs)
        bodies, costs = _hybrid_blocks(bodies, costs)
    return Workload(model=cfg.name, layers=bodies, costs=costs, seq_len=cfg.seq_len,
                    global_batch=global_batch, training=cfg.training,
                    dtype_bytes=cfg.dtype_bytes, source=cfg.source, shards=shard_dims(cfg),
                    dtype=MODEL_DTYPES.get(cfg.dtype, ""))


def analytic_training_flops(cfg: ModelConfig | str, tokens: float) -> float:
    """Model FLOPs of training on ``tokens`` tokens: ``6 N tokens + 12 L h s tokens``.

    ``N`` is the matmul parameter count (every weight matrix, the output head included, the input
    and position embeddings excluded: a lookup costs no FLOPs); ``6 N`` per token is the forward (2)
    plus backward (4) of the dense layers (Kaplan et al. 2020, section 2.1). The attention term
    ``12 L h s`` per token (``h = heads * head_dim``, full ``s x s`` scores, no causal saving) is
    PaLM's (Chowdhery et al. 2022, appendix B: ``6N + 12 L H Q T``) and Narayanan et al. 2021's
    ``72 B s l h^2 (1 + s/(6h) + V/(12 h l))``, of which it is the ``s/(6h)`` part.
    """
    cfg = cfg if isinstance(cfg, ModelConfig) else get_config(cfg)
    n = 0
    for layer in models.layer_names(cfg):
        for name, s in models.layer_param_shapes(cfg, layer).items():
            if len(s.shape) == 2 and name not in ("tok", "pos"):
                n += math.prod(s.shape)
    return 6.0 * n * tokens + 12.0 * cfg.layers * cfg.heads * cfg.head_dim * cfg.seq_len * tokens
