"""Model configurations of the zoo: one frozen :class:`ModelConfig` per published model.

Every number below comes from the model's published configuration (the ``source`` field of each
entry cites it). Units: counts (layers, widths, heads, tokens); ``dtype`` is a JAX dtype name.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any
from dataclasses import dataclass

from ir.shards import ShardDims
from zoo.errors import ZooError
from zoo.schema import check_model


DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}
"""Bytes per element of each dtype a :class:`ModelConfig` may name."""


@dataclass(frozen=True)
class ModelConfig:
    """A model's architecture, as published.

    Attributes (common):
        name: zoo name, e.g. ``"llama3-8b"``.
        family: ``"llama"`` (pre-RMSNorm, SwiGLU, RoPE, GQA), ``"gpt"`` (pre-LayerNorm, 4h GeLU MLP,
            learned positions, biases), ``"mochi"`` (asymmetric joint-attention DiT), ``"t5"``
            (the T5 v1.1 text encoder, :mod:`zoo.t5`) or ``"mochi_vae"`` (the Mochi VAE
            decoder, :mod:`zoo.mochi_vae`).
        layers: transformer blocks L.
        hidden: model width h (the visual stream's width for Mochi).
        heads / kv_heads: query heads and key/value heads (GQA when fewer).
        ffn: MLP hidden width (the SwiGLU inner width for Llama / Mochi, 4h for GPT).
        head_size: width of one attention head; 0 (the default) means ``hidden / heads``. Set it
            when the head width is independent of the model width (MaxText's synthetic models:
            ``head_dim`` 128 at any ``emb_dim``).
        vocab: vocabulary size (0 for Mochi, which has no token embedding).
        seq_len: tokens per sample (Mochi: visual + text tokens of the joint attention).
        training: True for a training model (``forward_loss``), False for inference (``forward``).
        dtype: compute and parameter dtype name (``"bfloat16"``, ``"float16"`` or
            ``"float32"``); a device runs its matmuls at its own rate for that precision
            (``hardware_profiles.types.DeviceProfile.matmul_precision``: no bfloat16 on a V100).
        source: citation of the published configuration.
    Family fields:
        norm ("rms" | "layer"), mlp ("swiglu" | "gelu" | "relu"), pos_emb ("rope" | "learned" | "none"),
        bias (linear biases), tie_embeddings (output head shares the input embedding; the head still
        holds its own copy, as a pipeline's last stage does, see :func:`param_count`),
        rope_theta, the RoPE scaling of the published config (``rope_scaling``: ``""`` none,
        ``"llama3"`` Llama 3.1's frequency-band rescaling with ``rope_factor``,
        ``rope_low_freq_factor``, ``rope_high_freq_factor`` and ``rope_original_max_position``
        (Meta, "The Llama 3 Herd of Models", 2024; Hugging Face ``_compute_llama3_parameters``),
        ``"yarn"`` YaRN with ``rope_factor``, ``rope_original_max_position``,
        ``rope_beta_fast``/``rope_beta_slow`` and ``rope_mscale``/``rope_mscale_all_dim``
        (Peng et al. 2023, "YaRN"; DeepSeek-V3, Kimi K2, gpt-oss; ``rope_truncate`` False: the
        correction range's ends are not rounded to integers, gpt-oss's ``truncate``), ``"linear"`` position
        interpolation by ``rope_factor``; 0 for a figure the config does not give; no parameters
        and the same FLOP as plain RoPE, so costed as it and carried for the launchers' exports),
        norm_eps, attention ("plain": materialized softmax, or "flash": a custom-VJP
        attention that keeps only q, k, v, o and the log-sum-exp for the backward: how the JAX
        model computes), attention_kernel (what the costed production stack runs, see
        :data:`ir.workload.ATTENTION_KERNELS`: ``"flash"``, the default, ``"flash2"`` or ``"unfused"``).
        Mixture of experts (``experts`` > 0; llama family): every block's MLP is ``experts``
        SwiGLU experts of inner width ``expert_ffn`` behind a linear router; each token goes to its
        ``experts_per_token`` highest-scoring experts, their gates renormalized over those (Mixtral,
        Jiang et al. 2024, Sec. 2.1; Qwen3-MoE's ``norm_topk_prob``), and each expert takes at most
        ``ceil(tokens x experts_per_token x capacity_factor / experts)`` tokens of a microbatch
        (GShard / Switch Transformer capacity, Fedus et al. 2022, Sec. 2.2); a token over capacity
        passes by that expert on the residual. ``shared_experts``: SwiGLU experts of width
        ``expert_ffn`` every token goes through besides its routed ones; ``dense_layers``: the
        first blocks keep a dense SwiGLU MLP of width ``ffn`` (DeepSeek-V3's
        ``first_k_dense_replace``; DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", Sec. 2.1).
        ``moe_latent`` > 0 (LatentMoE, NVIDIA Nemotron 3 Super and Ultra; Megatron-Core's
        ``--moe-latent-size``): the router scores the ``hidden``-wide token, which is then
        projected down to ``moe_latent`` before the dispatch, so the all-to-all, the permutation
        and the routed experts (``moe_latent`` -> ``expert_ffn`` -> ``moe_latent``) run at that
        width, and the combined result is projected back up; shared experts stay ``hidden``
        wide (hybrid ``nemotron_h`` models only).
        Multi-head latent attention (``kv_lora_rank`` > 0; DeepSeek-V2, Sec. 2.1): queries through
        a rank-``q_lora_rank`` bottleneck (0: a full projection), keys and values through a
        rank-``kv_lora_rank`` latent; each head's query and key are ``head_size`` wide plus a
        shared ``qk_rope_head_dim`` rotary part, its value ``v_head_dim`` wide.
        Sliding-window attention (``sliding_window`` > 0; Mistral 7B, Jiang et al. 2023; gpt-oss):
        a sliding layer's query ``i`` attends the ``sliding_window`` keys ``i - window < j <= i``;
        ``full_attention_every`` = n makes every n-th block (``i % n == n - 1``) full causal
        attention and the others sliding (gpt-oss: 2, its ``layer_types`` alternating sliding and
        full, from the first block sliding), 0 makes every block sliding (:meth:`layer_window`).
        ``qk_norm``: queries and keys are RMS-normalised per head before RoPE (Qwen3's
        ``q_norm`` / ``k_norm``; Megatron's ``qk_layernorm``); not costed (under 0.01% of the
        parameters and FLOPs), carried for the launchers' exports.
        ``attention_sinks``: one learned logit per head joins each query's softmax denominator
        (gpt-oss; Xiao et al. 2024, "Efficient Streaming Language Models with Attention Sinks").
        ``swiglu_limit`` > 0: gpt-oss's clamped SwiGLU, ``(clip(u, -l, l) + 1) * g' *
        sigmoid(1.702 g')`` with ``g' = min(g, l)`` (openai/gpt-oss ``torch/model.py``,
        ``swiglu``); the same three matrices. ``bias`` on a mixture of experts also gives the
        router and every expert's three projections their biases (gpt-oss).
        ``mtp_layers`` (0 or 1): DeepSeek-V3's multi-token-prediction module (Technical Report
        Sec. 2.2, ``num_nextn_predict_layers``) in the head: the last block's output and the
        embedding of the next token, each RMS-normed, concatenated and projected ``2h -> h``, one
        more mixture-of-experts block, an RMSNorm and a second pass of the shared output head on
        the token after next; the loss is the main loss plus the MTP loss (the report weighs it by
        lambda; 1 here). The head holds its own copy of the embedding table, counted once.
        On a hybrid model, ``mtp_layers`` (1 to 4) is the passes of one such module whose block
        is the layers ``mtp_pattern`` names (``hybrid_pattern`` characters; Nemotron 3 Super:
        ``*E``, an attention and a mixture-of-experts layer, run twice with the same weights,
        Megatron-Core's ``--mtp-num-layers 2 --mtp-use-repeated-layer``): pass ``d`` combines the
        previous pass's output with the embedding of token ``i + d`` and predicts token
        ``i + d + 1``.
        Gated DeltaNet (``linear_key_heads`` > 0; Qwen3-Next, :mod:`zoo.gated_deltanet`): every
        block but each ``full_attention_interval``-th (``i % n == n - 1``) replaces attention by
        Gated DeltaNet linear attention with ``linear_key_heads`` query/key heads of
        ``linear_key_head_dim``, ``linear_value_heads`` value heads of ``linear_value_head_dim``,
        a causal convolution of ``linear_conv_kernel`` taps and the chunked delta rule in chunks
        of ``linear_chunk`` tokens. ``attention_output_gate``: the attention output is gated by
        ``sigmoid`` of a second query-width projection (Qwen3-Next's gated attention: ``wq`` is
        twice as wide); ``shared_expert_gate``: the shared expert's output is scaled by
        ``sigmoid`` of a learned ``h -> 1`` projection (Qwen3-Next, Qwen2-MoE).
        Hybrid (``hybrid_pattern`` set; NVIDIA Nemotron-H / Nemotron 3, :mod:`zoo.hybrid`): one
        character per layer, ``M`` a Mamba-2 layer (``mamba_heads`` heads of ``mamba_head_dim``,
        ``mamba_groups`` groups of B and C of width ``ssm_state``, a causal convolution of
        ``conv_kernel`` taps, the SSD scan in chunks of ``ssm_chunk`` tokens), ``*`` attention,
        ``-`` a dense MLP, ``E`` a mixture of experts; ``mlp`` ``relu2`` is the squared-ReLU MLP
        without a gate (two matrices; its experts and shared experts too).
        Mochi: hidden_y / ffn_y (text stream width and SwiGLU inner width), text_tokens, text_dim
        (T5-XXL feature width), latent_channels / latent_frames / latent_height / latent_width (VAE
        latent video), patch_size (spatial patch), sampling_steps and cfg_passes (DiT forwards per
        denoising step with classifier-free guidance): one video costs
        ``sampling_steps * cfg_passes`` samples of the workload.
        T5 encoder (family ``t5``, inference only): ``mlp`` ``"gelu"`` is T5 v1.1's gated GELU
        (``feed_forward_proj`` ``gated-gelu``: ``wi_0``, ``wi_1``, ``wo``), ``pos_emb``
        ``"relative"`` its bucketed relative position bias (``relative_buckets`` buckets,
        ``relative_max_distance`` the distance from which positions share the last one);
        ``seq_len`` is the text tokens.
        Mochi VAE decoder (family ``mochi_vae``, inference only): ``vae_channels`` (channel width
        of each level, narrowest first: diffusers' ``decoder_block_out_channels``),
        ``vae_blocks`` (residual blocks per stage, ``len(vae_channels) + 1`` of them:
        ``layers_per_block``), ``temporal_expansions`` / ``spatial_expansions`` (the up blocks'
        factors), ``out_channels`` (3: RGB), ``norm_groups`` (GroupNorm groups), the latent
        fields of the DiT (its input); ``layers`` counts the residual blocks and the up blocks'
        projections, ``hidden`` is ``vae_channels[-1]``, ``heads`` = ``kv_heads`` = 1 and
        ``ffn`` = ``hidden`` (no attention, no MLP: nothing for tensor parallelism to split, as
        the Tenstorrent guide, shared/reference/004 Sec. 6, says), ``seq_len`` the latent
        positions ``frames x height x width`` (:attr:`latent_positions`).
    """

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    seq_len: int = 2048
    training: bool = True
    dtype: str = "bfloat16"
    source: str = ""
    norm: str = "rms"
    mlp: str = "swiglu"
    pos_emb: str = "rope"
    bias: bool = False
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    rope_scaling: str = ""
    rope_factor: float = 1.0
    rope_original_max_position: int = 0
    rope_low_freq_factor: float = 0.0
    rope_high_freq_factor: float = 0.0
    rope_beta_fast: float = 0.0
    rope_beta_slow: float = 0.0
    rope_mscale: float = 0.0
    rope_mscale_all_dim: float = 0.0
    rope_truncate: bool = True
    norm_eps: float = 1e-5
    attention: str = "plain"
    attention_kernel: str = "flash"
    hidden_y: int = 0
    ffn_y: int = 0
    text_tokens: int = 0
    text_dim: int = 0
    latent_channels: int = 0
    latent_frames: int = 0
    latent_height: int = 0
    latent_width: int = 0
    patch_size: int = 0
    sampling_steps: int = 0
    cfg_passes: int = 0
    head_size: int = 0
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    capacity_factor: float = 1.0
    shared_experts: int = 0
    moe_latent: int = 0
    dense_layers: int = 0
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    sliding_window: int = 0
    full_attention_every: int = 0
    attention_sinks: bool = False
    qk_norm: bool = False
    swiglu_limit: float = 0.0
    mtp_layers: int = 0
    mtp_pattern: str = ""
    full_attention_interval: int = 0
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    linear_chunk: int = 0
    attention_output_gate: bool = False
    shared_expert_gate: bool = False
    hybrid_pattern: str = ""
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state: int = 0
    mamba_groups: int = 0
    conv_kernel: int = 0
    ssm_chunk: int = 0
    relative_buckets: int = 0
    relative_max_distance: int = 0
    vae_channels: tuple[int, ...] = ()
    vae_blocks: tuple[int, ...] = ()
    temporal_expansions: tuple[int, ...] = ()
    spatial_expansions: tuple[int, ...] = ()
    out_channels: int = 0
    norm_groups: int = 0

    def __post_init__(self) -> None:
        # a tuple field read back from JSON or YAML arrives as a list: hold it as the tuple it
        # was (so a plan's model_config gives back an equal, hashable model)
        for f in ("vae_channels", "vae_blocks", "temporal_expansions", "spatial_expansions"):
            if isinstance(getattr(self, f), list):
                object.__setattr__(self, f, tuple(getattr(self, f)))

    @property
    def hybrid(self) -> bool:
        """Whether the layers follow ``hybrid_pattern`` (Mamba-2 / attention / MLP / MoE)."""
        return bool(self.hybrid_pattern)

    def layer_window(self, i: int) -> int:
        """Keys block ``i``'s queries attend under its sliding window, 0 for full causal
        attention (see the class docs)."""
        if not self.sliding_window:
            return 0
        n = self.full_attention_every
        return 0 if n and i % n == n - 1 else self.sliding_window

    @property
    def linear_attention(self) -> bool:
        """Whether some blocks are Gated DeltaNet linear attention (``linear_key_heads > 0``)."""
        return self.linear_key_heads > 0

    def linear_layer(self, i: int) -> bool:
        """Whether block ``i`` is a Gated DeltaNet block (every block but each
        ``full_attention_interval``-th, ``i % n == n - 1``; see the class docs)."""
        n = self.full_attention_interval
        return self.linear_attention and not (n and i % n == n - 1)

    @property
    def expert_input(self) -> int:
        """The width tokens enter the routed experts at: ``moe_latent`` under LatentMoE, else
        ``hidden``."""
        return self.moe_latent or self.hidden

    @property
    def mla(self) -> bool:
        """Whether attention is multi-head latent attention (``kv_lora_rank > 0``)."""
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        """Whether every block's MLP is a mixture of experts (``experts > 0``)."""
        return self.experts > 0

    @property
    def head_dim(self) -> int:
        """Width of one attention head: ``head_size`` when set, else ``hidden // heads``."""
        return self.head_size or self.hidden // self.heads

    @property
    def jnp_dtype(self):
        """``dtype`` as a ``jax.numpy`` dtype (imports JAX)."""
        import jax.numpy as jnp   # optional heavy dependency: the configs themselves need no JAX
        return jnp.dtype(self.dtype)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per element of ``dtype``.

        Raises:
            ZooError: a dtype outside :data:`DTYPE_BYTES`.
        """
        try:
            return DTYPE_BYTES[self.dtype]
        except KeyError:
            raise ZooError(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_BYTES)}") from None

    @property
    def visual_tokens(self) -> int:
        """Mochi: latent patches per video, ``frames * (H/p) * (W/p)``; 0 for other families."""
        if self.family != "mochi":
            return 0
        p = self.patch_size
        return self.latent_frames * (self.latent_height // p) * (self.latent_width // p)

    @property
    def latent_positions(self) -> int:
        """Mochi VAE decoder: latent positions per video, ``frames * height * width``; 0 for
        other families."""
        if self.family != "mochi_vae":
            return 0
        return self.latent_frames * self.latent_height * self.latent_width


_LLAMA3 = ("Llama 3: Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv:2407.21783) Table 3; "
           "meta-llama/Meta-Llama-3-{size} config.json (hidden_size {h}, intermediate_size {f}, "
           "num_hidden_layers {l}, num_attention_heads {a}, num_key_value_heads 8, vocab_size "
           "128256, rope_theta 500000, rms_norm_eps 1e-5); pretraining context 8192")

_MOCHI_SRC = (
    "Mochi 1 (Genmo 2024, github.com/genmoai/mochi, dit config: depth 48, num_heads 24, "
    "hidden_size_x 3072, hidden_size_y 1536, mlp_ratio_x/y 4.0 SwiGLU (inner 8192 / 4096), "
    "patch_size 2, in_channels 12, t5_feat_dim 4096, t5_token_length 256, qk_norm; last block "
    "context_pre_only); AsymmVAE 8x8 spatial / 6x temporal compression to 12 channels; 480p "
    "(480x848) 163 frames = 5.4 s at 30 fps -> latent 28x60x106 -> 28*30*53 = 44520 visual "
    "tokens; 64 sampling steps, CFG 4.5 (two DiT passes per step). Tenstorrent tt-xla 'Sharding "
    "for Mochi' guide (shared/reference/004): 48 AsymmDiT blocks, 24 heads, weight shapes, latent "
    "60x106, 10B params, 2 all-reduces per block")

_T5_SRC = (
    "T5 v1.1 XXL encoder: google/t5-v1_1-xxl config.json (huggingface.co/google/t5-v1_1-xxl: "
    "d_model 4096, num_layers 24, num_heads 64, d_kv 64, d_ff 10240, feed_forward_proj "
    "gated-gelu, vocab_size 32128, relative_attention_num_buckets 32, layer_norm_epsilon 1e-6, "
    "tie_word_embeddings false; relative_attention_max_distance 128, transformers' T5Config "
    "default, written out in the later T5EncoderModel exports of the same weights); the encoder "
    "as transformers' T5EncoderModel runs it (RMSNorm, unscaled attention with a relative "
    "position bias from block 0 shared by all, gated-GELU with gelu_new, final RMSNorm); "
    "4,762,310,656 parameters by this config = the 4.76B Hugging Face reports for the "
    "encoder-only safetensors (huggingface.co/lnyan/t5-v1_1-xxl-encoder); 256 tokens as Mochi "
    "encodes prompts (Genmo t5_token_length 256); Tenstorrent 'Sharding for Mochi' guide "
    "(shared/reference/004) Sec. 6: T5-XXL 4.7B, run apart from the DiT. Attention costed "
    "unfused: transformers' T5Attention materializes the scores plus the position bias")

_MOCHI_VAE_SRC = (
    "Mochi 1 AsymmVAE decoder: genmo/mochi-1-preview vae/config.json (AutoencoderKLMochi: "
    "latent_channels 12, out_channels 3, decoder_block_out_channels [128, 256, 512, 768], "
    "layers_per_block [3, 3, 4, 6, 3], temporal_expansions [1, 2, 3], spatial_expansions [2, 2, "
    "2], act_fn silu) as diffusers' MochiDecoder3D runs it (src/diffusers/models/autoencoders/"
    "autoencoder_kl_mochi.py: 1x1x1 conv_in; residual blocks of per-frame GroupNorm(32 groups, "
    "eps 1e-5), SiLU and causal 3x3x3 Conv3d with replicate padding (CogVideoXCausalConv3d); up "
    "blocks of residual blocks and a linear depth-to-space; SiLU and proj_out; the first 5 "
    "frames dropped); latent 12 x 28 x 60 x 106 (the DiT's, 480x848 at 163 frames) -> video "
    "3 x 163 x 480 x 848; 362,526,595 parameters by this config = Genmo's 362M (github.com/"
    "genmoai/models README, 'AsymmVAE Model Specs': 362M, decoder base channels 128, 8x8 spatial "
    "and 6x temporal compression) and the Tenstorrent guide's (shared/reference/004 Sec. 6: VAE "
    "decoder 362M, ~724 MB bf16, Conv3D and GroupNorm, no tensor parallelism)")

_REGISTRY: dict[str, ModelConfig] = {
    "llama3-8b": ModelConfig(
        name="llama3-8b", family="llama", layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336,
        vocab=128256, seq_len=8192, rope_theta=500000.0,
        source=_LLAMA3.format(size="8B", h=4096, f=14336, l=32, a=32)),
    "llama3-70b": ModelConfig(
        name="llama3-70b", family="llama", layers=80, hidden=8192, heads=64, kv_heads=8, ffn=28672,
        vocab=128256, seq_len=8192, rope_theta=500000.0,
        source=_LLAMA3.format(size="70B", h=8192, f=28672, l=80, a=64)),
    "llama3-405b": ModelConfig(
        name="llama3-405b", family="llama", layers=126, hidden=16384, heads=128, kv_heads=8, ffn=53248,
        vocab=128256, seq_len=8192, rope_theta=500000.0, rope_scaling="llama3", rope_factor=8.0,
        rope_original_max_position=8192, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
        source=("Llama 3: Dubey et al. 2024, 'The Llama 3 Herd of Models' (arXiv:2407.21783) Table 3 "
                "(405B: 126 layers, model dimension 16,384, FFN dimension 53,248, 128 attention heads, "
                "8 key/value heads, vocabulary 128,000, RoPE theta 500,000); meta-llama/Llama-3.1-405B "
                "config.json (vocab_size 128256, rms_norm_eps 1e-5; rope_scaling llama3: factor 8, "
                "low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192); "
                "pretraining context 8192")),
    "gpt3-175b": ModelConfig(
        name="gpt3-175b", family="gpt", layers=96, hidden=12288, heads=96, kv_heads=96,
        ffn=4 * 12288, vocab=50257, seq_len=2048, norm="layer", mlp="gelu", pos_emb="learned",
        bias=True, tie_embeddings=True,
        source=("GPT-3: Brown et al. 2020, 'Language Models are Few-Shot Learners', Table 2.1 "
                "(n_layers 96, d_model 12288, n_heads 96, d_head 128, n_ctx 2048, 175.0B params); "
                "GPT-2 BPE vocabulary 50257 and tied embeddings (Radford et al. 2019)")),
    "opt-350m": ModelConfig(
        name="opt-350m", family="gpt", layers=24, hidden=1024, heads=16, kv_heads=16, ffn=4096,
        vocab=50272, seq_len=2048, norm="layer", mlp="relu", pos_emb="learned", bias=True,
        tie_embeddings=True, dtype="float16",
        source=("OPT: Zhang et al. 2022, 'OPT: Open Pre-trained Transformer Language Models' "
                "(arXiv:2205.01068) Table 1 (350M: 24 layers, 16 heads, d_model 1024) and "
                "sec. 2.4 (trained with FP16 weights, dynamic loss scaling, Adam state in FP32); "
                "facebook/opt-350m config.json (hidden_size 1024, ffn_dim 4096, "
                "num_hidden_layers 24, num_attention_heads 16, vocab_size 50272, "
                "max_position_embeddings 2048, activation relu, tied embeddings, "
                "torch_dtype float16). Costed as a "
                "pre-LayerNorm block with the embedding at width 1024: the published model "
                "normalises after each block and projects a 512-wide embedding in and out "
                "(word_embed_proj_dim 512), which changes its 331M parameters by under 8%")),
    "grok-1-314b": ModelConfig(
        name="grok-1-314b", family="llama", layers=64, hidden=6144, heads=48, kv_heads=8,
        ffn=32768, vocab=131072, seq_len=8192, tie_embeddings=True, experts=8,
        experts_per_token=2, expert_ffn=32768,
        source=("Grok-1: xai-org/grok-1 README (314B parameters, a mixture of 8 experts with 2 "
                "used per token, 64 layers, 48 query heads and 8 key/value heads, embedding "
                "size 6,144, SentencePiece vocabulary of 131,072 tokens, rotary embeddings, "
                "context 8,192) and run.py (widening_factor 8: each expert's width "
                "int(8 x 6144) x 2 / 3 = 32,768; model.py's InOutEmbed ties the output head to "
                "the embedding); NVIDIA dgxc-benchmarking's Grok-1 314B training recipe. Its "
                "GeGLU experts are costed as SwiGLU (the same three matrices); its extra "
                "post-attention/post-MLP RMSNorms and logit soft-capping are left out "
                "(negligible parameters and FLOP); 315,684,034,560 parameters by this config")),
    "llama-tiny": ModelConfig(
        name="llama-tiny", family="llama", layers=8, hidden=512, heads=8, kv_heads=8, ffn=1536,
        vocab=256, seq_len=128, dtype="float32",
        source=("project test model: Llama-3-style decoder (Dubey et al. 2024) scaled down to 8 "
                "layers, width 512, 8 heads, byte vocabulary 256, SwiGLU inner 1536 "
                "(~8/3 h rounded to 256)")),
    "mochi-dit-10b": ModelConfig(
        name="mochi-dit-10b", family="mochi", layers=48, hidden=3072, heads=24, kv_heads=24,
        ffn=8192, vocab=0, seq_len=44520 + 256, training=False, hidden_y=1536, ffn_y=4096,
        text_tokens=256, text_dim=4096, latent_channels=12, latent_frames=28, latent_height=60,
        latent_width=106, patch_size=2, sampling_steps=64, cfg_passes=2, pos_emb="rope",
        norm_eps=1e-6, source=_MOCHI_SRC),
    "mochi-dit-tiny": ModelConfig(
        name="mochi-dit-tiny", family="mochi", layers=4, hidden=64, heads=4, kv_heads=4, ffn=128,
        vocab=0, seq_len=32 + 8, training=False, hidden_y=32, ffn_y=64, text_tokens=8,
        text_dim=32, latent_channels=4, latent_frames=2, latent_height=8, latent_width=8,
        patch_size=2, sampling_steps=4, cfg_passes=2, pos_emb="rope", norm_eps=1e-6,
        dtype="float32",
        source=("project test model: the Mochi 1 DiT block structure (Genmo 2024, see "
                "mochi-dit-10b: asymmetric joint-attention blocks, last block context_pre_only, "
                "patch embed with timestep + AttentionPool conditioning, adaLN head) scaled down "
                "to 4 blocks, widths 64 / 32 (4 heads x 16), SwiGLU inner 128 / 64, 8 text tokens "
                "of width 32, latent 4 x 2 x 8 x 8 with patch 2 (32 visual tokens); 4 Euler "
                "sampling steps with classifier-free guidance (2 passes per step)")),
    "t5-xxl-encoder": ModelConfig(
        name="t5-xxl-encoder", family="t5", layers=24, hidden=4096, heads=64, kv_heads=64,
        ffn=10240, vocab=32128, seq_len=256, training=False, mlp="gelu", pos_emb="relative",
        norm_eps=1e-6, attention_kernel="unfused", relative_buckets=32,
        relative_max_distance=128, source=_T5_SRC),
    "t5-tiny-encoder": ModelConfig(
        name="t5-tiny-encoder", family="t5", layers=2, hidden=32, heads=4, kv_heads=4, ffn=64,
        vocab=256, seq_len=8, training=False, mlp="gelu", pos_emb="relative", norm_eps=1e-6,
        attention_kernel="unfused", relative_buckets=8, relative_max_distance=16,
        dtype="float32",
        source=("project test model: the T5 v1.1 encoder (see t5-xxl-encoder) scaled down to 2 "
                "blocks, width 32 (4 heads x 8), gated-GELU inner 64, byte vocabulary 256, 8 "
                "relative position buckets (max distance 16), 8 tokens: the text mochi-dit-tiny "
                "reads (8 tokens of width 32)")),
    "mochi-vae-decoder": ModelConfig(
        name="mochi-vae-decoder", family="mochi_vae", layers=22, hidden=768, heads=1,
        kv_heads=1, ffn=768, vocab=0, seq_len=28 * 60 * 106, training=False, pos_emb="none",
        latent_channels=12, latent_frames=28, latent_height=60, latent_width=106,
        vae_channels=(128, 256, 512, 768), vae_blocks=(3, 3, 4, 6, 3),
        temporal_expansions=(1, 2, 3), spatial_expansions=(2, 2, 2), out_channels=3,
        norm_groups=32, source=_MOCHI_VAE_SRC),
    "mochi-vae-tiny": ModelConfig(
        name="mochi-vae-tiny", family="mochi_vae", layers=9, hidden=32, heads=1, kv_heads=1,
        ffn=32, vocab=0, seq_len=2 * 8 * 8, training=False, pos_emb="none", latent_channels=4,
        latent_frames=2, latent_height=8, latent_width=8, vae_channels=(8, 16, 24, 32),
        vae_blocks=(1, 1, 1, 2, 1), temporal_expansions=(1, 2, 3), spatial_expansions=(2, 2, 2),
        out_channels=3, norm_groups=4, dtype="float32",
        source=("project test model: the Mochi VAE decoder's structure (see mochi-vae-decoder: "
                "residual blocks of per-frame GroupNorm, SiLU and causal 3x3x3 convolutions, "
                "three linear depth-to-space up blocks x1/x2/x3 in time and x2 in space, the "
                "first 5 frames dropped) scaled down to widths 8/16/24/32, residual blocks "
                "(1, 1, 1, 2, 1), 4 GroupNorm groups; mochi-dit-tiny's latent 4 x 2 x 8 x 8 -> "
                "video 3 x 7 x 64 x 64")),
}


def gpt_config(layers: int, hidden: int, heads: int, vocab: int = 51200, *, seq_len: int = 2048,
               ffn: int | None = None, learned_pos: bool = True, tie_embeddings: bool = True,
               dtype: str = "bfloat16", name: str | None = None, training: bool = True,
               source: str = "") -> ModelConfig:
    """A GPT-style decoder (pre-LayerNorm, 4h GeLU MLP, biases, learned positions or none).

    Used to cost published Megatron-LM runs (Narayanan et al. 2021, 'Efficient Large-Scale
    Language Model Training on GPU Clusters Using Megatron-LM', Table 1: vocab 51200).

    Raises:
        ZooError: not a valid model (:func:`zoo.schema.check_model`), e.g. a non-positive size or
            ``hidden`` not divisible by ``heads``.
    """
    return check_model(ModelConfig(
        name=name or f"gpt-{layers}l-{hidden}h", family="gpt", layers=layers, hidden=hidden,
        heads=heads, kv_heads=heads, ffn=ffn or 4 * hidden, vocab=vocab, seq_len=seq_len,
        training=training, dtype=dtype, norm="layer", mlp="gelu",
        pos_emb="learned" if learned_pos else "none", bias=True, tie_embeddings=tie_embeddings,
        source=source or "GPT-style decoder as in Megatron-LM (Narayanan et al. 2021, Table 1)"))


def list_models() -> list[str]:
    """Names of the zoo's models, sorted."""
    return sorted(_REGISTRY)


def get_config(name: str | ModelConfig, **overrides: Any) -> ModelConfig:
    """The published configuration of ``name``, with ``overrides`` (ModelConfig fields) applied.

    Raises:
        ZooError: unknown model name (the message lists the known ones), unknown field, or
            overrides that make an invalid model (:func:`zoo.schema.check_model`).
    """
    if isinstance(name, ModelConfig):
        cfg = name
    elif name in _REGISTRY:
        cfg = _REGISTRY[name]
    else:
        close = difflib.get_close_matches(str(name), list_models(), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ZooError(f"unknown model {name!r}; {hint}known models: {', '.join(list_models())}")
    if not overrides:
        return cfg
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    bad = sorted(set(overrides) - fields)
    if bad:
        raise ZooError(f"unknown ModelConfig field(s) {bad} for {cfg.name!r}; "
                       f"valid fields: {', '.join(sorted(fields))}")
    return check_model(dataclasses.replace(cfg, **overrides),
                       f"model {cfg.name!r} with {', '.join(f'{k}={v!r}' for k, v in overrides.items())}")


def tensor_shard(cfg: ModelConfig, tensor: int) -> ModelConfig:
    """What one device of a ``tensor``-way tensor-parallel layout computes of each block, as a
    model of its own: heads, key/value heads (at least one: replicated below the degree, as
    Megatron-LM does) and the MLP width divided by ``tensor``, the head width kept (Shoeybi et al.
    2019, Sec. 3). Used to time and cost one shard on one device.

    Raises:
        ZooError: ``tensor`` < 1, or it does not divide the heads or the MLP width.
    """
    if tensor < 1 or cfg.heads % tensor or cfg.ffn % tensor:
        raise ZooError(f"tensor={tensor} must be >= 1 and divide {cfg.name}'s {cfg.heads} heads "
                       f"and MLP width {cfg.ffn}; pick a divisor of both")
    return dataclasses.replace(cfg, heads=cfg.heads // tensor,
                               kv_heads=max(cfg.kv_heads // tensor, 1), ffn=cfg.ffn // tensor,
                               head_size=cfg.head_dim)


def shard_dims(cfg: ModelConfig) -> ShardDims:
    """What tensor and expert parallelism split in ``cfg`` (:class:`ir.shards.ShardDims`): its
    query and key/value heads (latent attention: every head has its own key and value), the
    dense MLP's inner width (when some block has one), each expert's and the Mochi text
    stream's."""
    dense = not cfg.moe or cfg.dense_layers > 0
    widths = tuple(w for w, used in ((cfg.ffn, dense), (cfg.expert_ffn, cfg.moe),
                                     (cfg.ffn_y, cfg.family == "mochi")) if used)
    return ShardDims(heads=cfg.heads, kv_heads=cfg.heads if cfg.mla else cfg.kv_heads,
                     widths=widths, experts=cfg.experts, model=cfg.name,
                     expert_width=cfg.expert_ffn if cfg.moe else 0)
