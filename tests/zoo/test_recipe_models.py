"""Models NVIDIA's Megatron-Bridge performance recipes train, shipped in ``zoo/configs/``
(``zoo/configs/README.md`` cites each file): their layers, widths, heads, experts and parameter
counts against the published figures, the names recipes use for them, and the recipe models the
zoo refuses in one line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import zoo
from zoo import ZooError
from zoo.model_files import ALIASES, canonical_name, from_hf, resolve_model

CONFIGS = Path(__file__).resolve().parents[2] / "zoo" / "configs"


def test_gpt_oss_20b_matches_the_model_card():
    """OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv:2508.10925), Table 1, gpt-oss-20b:
    24 layers, 32 experts (top 4), MLP 19.12B, attention 0.64B, embed + unembed 1.16B, 20.91B in
    total, 3.61B active (unembedding counted, embedding not)."""
    cfg = resolve_model("gpt-oss-20b")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.vocab) == (
        24, 2880, 64, 8, 64, 201088)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn) == (32, 4, 2880)
    assert (cfg.sliding_window, cfg.full_attention_every, cfg.attention_sinks) == (128, 2, True)
    assert zoo.param_count(cfg) == 20_914_757_184
    assert round(zoo.param_count(cfg) / 1e7) == 2091
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e7) == 361
    block = zoo.layer_param_shapes(cfg, "block0")
    attn = sum(math.prod(s.shape) for k, s in block.items()
               if k in ("wq", "wk", "wv", "wo", "wq_b", "wk_b", "wv_b", "wo_b", "sinks"))
    mlp = sum(math.prod(s.shape) for k, s in block.items()
              if k.startswith(("w_router", "w_gate", "w_up", "w_down")))
    assert round(24 * mlp / 1e7) == 1912 and round(24 * attn / 1e7) == 64


def test_kimi_k2_is_read_as_deepseek_v3():
    """moonshotai/Kimi-K2-Instruct (model_type kimi_k2, DeepseekV3ForCausalLM): 61 layers (1
    dense), hidden 7168, 64 heads of MLA, 384 experts of 2048, 8 per token + 1 shared
    (MoonshotAI/Kimi-K2 README, Model Summary: 1T total, 32B activated). The count is the
    checkpoint's: its safetensors hold 1,026,470,731,056 values, this count plus 62,521,648 FP8
    block scales, router correction biases and rotary buffers."""
    cfg = resolve_model("kimi-k2-instruct")
    assert (cfg.layers, cfg.dense_layers, cfg.hidden, cfg.heads, cfg.ffn, cfg.vocab) == (
        61, 1, 7168, 64, 18432, 163840)
    assert (cfg.experts, cfg.experts_per_token, cfg.shared_experts, cfg.expert_ffn) == (
        384, 8, 1, 2048)
    assert (cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.v_head_dim,
            cfg.head_size, cfg.mtp_layers) == (1536, 512, 64, 128, 128, 0)
    total = zoo.param_count(cfg)
    assert total == 1_026_408_209_408
    scales = (60 * 385 * 3 * 56 * 16 + 61 * (5 * 56 + 128 * 4 + 56 * 64 + 12 * 56 + 96 * 12)
              + 3 * 144 * 56)                     # FP8 128x128 block scales of each weight
    assert total + scales + 60 * 384 + 61 * 56 == 1_026_470_731_056
    assert round(total / 1e12) == 1
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e9) == 32
    assert "kimi_k2 (DeepSeek-V3 architecture" in cfg.source


def test_kimi_k2_needs_deepseek_v3s_architecture():
    doc = json.loads((CONFIGS / "Kimi-K2-Instruct.json").read_text())
    with pytest.raises(ZooError, match="is not DeepseekV3ForCausalLM") as e:
        from_hf({**doc, "architectures": ["KimiK25ForConditionalGeneration"]}, "k", "k.json")
    assert "\n" not in str(e.value)


def test_nemotron_h_56b_reads_its_hybrid_pattern():
    """Nemotron-H (NVIDIA 2025, arXiv:2504.03624): the 56B base has 54 Mamba-2, 54 MLP and 10
    self-attention layers; Megatron-Bridge ``NemotronHModelProvider56B``: hidden 8192, FFN
    32768, 64 heads in 8 query groups, 256 Mamba heads of 64, state 256, 8 groups."""
    cfg = resolve_model("nemotron-h-56b-base-8k")
    pattern = cfg.hybrid_pattern
    assert (len(pattern), pattern.count("M"), pattern.count("-"), pattern.count("*")) == (
        118, 54, 54, 10)
    assert [zoo.body_of(cfg, f"block{i}") for i in range(8)] == [
        "mamba_block", "mlp_block"] * 3 + ["mamba_block", "attention_block"]
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.ffn) == (
        118, 8192, 64, 8, 128, 32768)
    assert (cfg.mamba_heads, cfg.mamba_head_dim, cfg.ssm_state, cfg.mamba_groups) == (
        256, 64, 256, 8)
    assert (cfg.experts, cfg.mlp, cfg.pos_emb, cfg.seq_len) == (0, "relu2", "none", 8192)
    assert zoo.param_count(cfg) == 56_324_350_464
    assert round(zoo.param_count(cfg) / 1e9) == 56


def test_llama_31_names_resolve():
    """Llama 3.1 70B: 80 layers, 8192 wide, 64 / 8 heads, 70.6B on its Hugging Face page
    (70,553,706,496 in its safetensors); Llama 3.1 405B is the zoo's ``llama3-405b``."""
    c70 = resolve_model("llama-3.1-70b")
    assert (c70.layers, c70.hidden, c70.heads, c70.kv_heads, c70.ffn, c70.vocab) == (
        80, 8192, 64, 8, 28672, 128256)
    assert zoo.param_count(c70) == 70_553_706_496
    assert c70.seq_len == 8192 and c70.rope_theta == 500000.0
    assert "'llama3' rope scaling costed as plain RoPE" in c70.source
    assert resolve_model("Llama-3.1-405B") == zoo.get_config("llama3-405b")
    assert round(zoo.param_count(resolve_model("llama-3.1-405b")) / 1e9) == 406
    assert ALIASES["llama-3.1-405b"] == "llama3-405b"


def test_table_spellings_resolve_to_zoo_models():
    """The model names NVIDIA's Megatron-Bridge performance summary and dgxc-benchmarking tables
    print resolve to the zoo's models (case, underscores and spaces normalised; then ALIASES)."""
    names = {"LLAMA3_70B": "llama3-70b", "LLAMA3.1_405B": "llama3-405b", "LLAMA3_8B": "llama3-8b",
             "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
             "GPT OSS 120B": "gpt-oss-120b", "DeepSeekV3": "deepseek-v3-mtp",
             "Kimi_K2": "kimi-k2-instruct",
             "Nemotron_H_56B": "nemotron-h-56b-base-8k", "Grok1 314b": "grok-1-314b"}
    for printed, zoo_name in names.items():
        assert canonical_name(printed) in (zoo_name, printed.lower().replace("_", "-").replace(" ", "-"))
        assert resolve_model(printed).name.lower() == zoo_name
    assert canonical_name("  Mixtral__8x22B ") == "mixtral-8x22b-v0.1"
    # a printed qualifier: the routing goes to the dispatcher column, "w/ MTP" names the module
    assert canonical_name("Qwen3_30B_a3B (tokendrop)") == "qwen3-30b-a3b"
    # DeepSeek-V3 unlabelled is the recipes' default, one multi-token-prediction module
    assert canonical_name("DeepSeekV3 (w/o MTP)") == "deepseek-v3"
    assert canonical_name("DeepSeekV3 (w/ MTP)") == canonical_name("DeepSeekV3 (dropless)") == (
        "deepseek-v3-mtp")
    assert canonical_name("Nemotron3_Super (w/o MTP)") == "nemotron-3-super-120b"
    assert canonical_name("deepseek-v3") == "deepseek-v3"        # the zoo's own name: as published
    assert resolve_model("DeepSeekV3 (w/ MTP)").mtp_layers == 1
    # Megatron-Bridge's recipe names
    assert resolve_model("llama31_405b") == zoo.get_config("llama3-405b")
    assert resolve_model("nemotron_3_nano").name.lower() == "nemotron-3-nano-30b-a3b"
    # a vision-language model's language model (its vision encoder is not modelled)
    assert resolve_model("Qwen3_VL_235B_A22B") == resolve_model("qwen3-235b-a22b")


def test_llama4_scout_every_layer_moe_with_a_shared_expert():
    """meta-llama/Llama-4-Scout-17B-16E (Meta's model card: 17B active, 109B total, 16 experts,
    the vision encoder included): 48 layers of GQA attention (40 / 8 heads of 128) and 16 routed
    experts of 8192 (top 1) + a shared expert of 8192 in every layer; the text model is
    107,769,861,120 parameters, 17.17B active per token (embedding counted)."""
    cfg = resolve_model("llama-4-scout-17b-16e")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.vocab) == (
        48, 5120, 40, 8, 128, 202048)
    assert (cfg.experts, cfg.experts_per_token, cfg.shared_experts, cfg.expert_ffn,
            cfg.dense_layers) == (16, 1, 1, 8192, 0)
    assert (cfg.seq_len, cfg.rope_theta, cfg.tie_embeddings, cfg.bias) == (
        8192, 500000.0, False, False)
    total = zoo.param_count(cfg)
    attn = 48 * (2 * 5120 * 40 * 128 + 2 * 5120 * 8 * 128)
    mlp = 48 * (17 * 3 * 5120 * 8192 + 5120 * 16)
    assert total == attn + mlp + 2 * 202048 * 5120 + 97 * 5120 == 107_769_861_120
    assert round(total / 1e9) == 108                      # 109B with the vision encoder
    assert round(zoo.active_param_count(cfg) / 1e9) == 17
    assert "chunked attention (8192-token chunks) costed as full causal" in cfg.source
    assert "vision encoder not modelled" in cfg.source


def test_llama4_maverick_interleaved_dense_layers_are_refused():
    doc = json.loads((CONFIGS / "Llama-4-Scout-17B-16E.json").read_text())
    maverick = {**doc, "text_config": {**doc["text_config"], "interleave_moe_layer_step": 2,
                                       "moe_layers": list(range(1, 48, 2))}}
    with pytest.raises(ZooError, match="interleave_moe_layer_step 2 .dense layers between") as e:
        from_hf(maverick, "m", "m.json")
    assert "\n" not in str(e.value)
