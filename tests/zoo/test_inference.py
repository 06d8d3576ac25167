"""zoo.inference: a decoder's per-token serving costs (weights, KV cache, FLOP) from its config,
against figures worked out by hand from the architecture, and the precision strings' errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import zoo
from ir import InferenceModel
from zoo import ZooError
from zoo.inference import inference_model, parse_precision
from zoo.model_files import resolve_model

CONFIGS = Path(__file__).resolve().parents[2] / "zoo" / "configs"

BFP8 = 1088 / 1024      # bytes per value: 16 x 8-bit mantissas + one shared 8-bit exponent per row
BFP4 = 576 / 1024

# Llama 3 8B (Meta's config.json): 32 layers, hidden 4096, 32 heads of 128, 8 KV heads,
# SwiGLU width 14336, vocabulary 128256, untied head.
L8, H8, HEADS8, KV8, D8, FFN8, V8 = 32, 4096, 32, 8, 128, 14336, 128256
ATTN8 = L8 * (H8 * D8 * (HEADS8 + 2 * KV8) + HEADS8 * D8 * H8)     # q, k, v, o
GATE_UP8 = L8 * 2 * H8 * FFN8
DOWN8 = L8 * FFN8 * H8
HEAD8 = H8 * V8
NORMS8 = L8 * 2 * H8 + H8                                            # two RMSNorms per block + final
EMBED8 = V8 * H8


def test_llama3_8b_params_by_hand_match_the_zoo():
    # the hand split above is the whole model: the zoo's own count (traced shapes) agrees
    assert ATTN8 + GATE_UP8 + DOWN8 + HEAD8 + NORMS8 + EMBED8 == zoo.param_count("llama3-8b")
    assert zoo.param_count("llama3-8b") == 8_030_261_248


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b"])
def test_bf16_weights_are_two_bytes_per_parameter(name):
    m = inference_model(name, "bf16")
    assert m.weight_bytes == 2 * zoo.param_count(name)
    # untied: the input embedding is held (looked up, not streamed), the head is streamed
    cfg = zoo.get_config(name)
    assert m.embedding_bytes == 2 * cfg.vocab * cfg.hidden
    assert m.dense_weight_bytes == m.weight_bytes - m.embedding_bytes
    assert m.expert_weight_bytes == 0 and m.experts == 0 and m.moe_layers == 0


def test_llama3_8b_per_token_costs():
    m = inference_model("llama3-8b")
    assert (m.layers, m.hidden, m.vocab, m.kv_heads) == (L8, H8, V8, KV8)
    # one K and one V vector per KV head per layer, 2 bytes each
    assert m.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    # an fp8 cache halves it
    assert inference_model("llama3-8b", kv_format="fp8").kv_bytes_per_token == 65536
    # 2 FLOP per matmul weight, all at the bf16 rate; norms and the input embedding do no matmul
    assert m.flops_per_token == (("bf16", 2.0 * (ATTN8 + GATE_UP8 + DOWN8 + HEAD8)),)
    # QK^T and PV: 2 x heads x (128 + 128) per layer per (query, key) pair
    assert m.attention_flops_per_pair == 2 * 32 * 32 * (128 + 128)
    # two all-reduces of hidden bf16 activations per block
    assert m.tp_allreduce_bytes_per_token == 2 * 32 * 4096 * 2


def test_mla_caches_the_latent_and_the_rotary_key():
    cfg = resolve_model(str(CONFIGS / "DeepSeek-V3.json"))
    assert cfg.mla and (cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.layers) == (512, 64, 61)
    m = inference_model(cfg)
    # DeepSeek-V2 Sec. 2.1.2: (d_c + d_h^R) x layers elements, bf16
    assert m.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70272
    assert inference_model(cfg, kv_format="fp8").kv_bytes_per_token == (512 + 64) * 61
    # every head shares the latent: one "KV head" (a TP group keeps a copy on each device)
    assert m.kv_heads == 1
    assert (m.experts, m.experts_per_token, m.moe_layers) == (256, 8, 61 - 3)


def test_moe_flops_are_twice_the_active_matmul_weights():
    cfg = resolve_model(str(CONFIGS / "Mixtral-8x22B-v0.1.json"))
    m = inference_model(cfg)
    active = zoo.active_param_count(cfg, embedding=False)
    # Within 0.5%: active_param_count counts every parameter a token touches; the FLOP count is
    # 2 x the *matmul* weights only. The difference is the RMSNorm weights (no matmul) and the
    # router (kept at bf16 and left out of flops_per_token): exactly those, as checked next.
    assert m.matmul_flops_per_token == pytest.approx(2 * active, rel=5e-3)
    h, L, E = cfg.hidden, cfg.layers, cfg.experts
    assert (h, L, E, cfg.experts_per_token) == (6144, 56, 8, 2)
    norms = L * 2 * h + h
    router = L * E * h
    assert m.matmul_flops_per_token == 2 * (active - norms - router)
    # all 8 experts of every block are held; a token reads 2 of them
    assert m.moe_layers == 56 and m.experts == 8
    assert m.expert_weight_bytes == 2 * 56 * 8 * 3 * h * cfg.expert_ffn
    assert m.weight_bytes == 2 * zoo.param_count(cfg)


def test_parse_precision_parts():
    assert parse_precision("bfp8,gate_up=bfp4") == {
        "attention": "bfp8", "gate_up": "bfp4", "down": "bfp8", "head": "bfp8"}
    assert parse_precision("bf16") == dict.fromkeys(("attention", "gate_up", "down", "head"), "bf16")
    assert parse_precision(" fp8 , head=bf16 ") == {
        "attention": "fp8", "gate_up": "fp8", "down": "fp8", "head": "bf16"}


def test_gate_up_at_bfp4_costs_576_bytes_per_1024_values():
    bf16 = inference_model("llama3-8b", "bf16")
    mixed = inference_model("llama3-8b", "bf16,gate_up=bfp4")
    assert mixed.weight_bytes == bf16.weight_bytes - GATE_UP8 * (2 - 576 / 1024)
    # bfp4 matmuls run at LoFi: the profiles' "bfp8" peak entry; the rest stays at bf16
    assert dict(mixed.flops_per_token) == {"bf16": 2.0 * (ATTN8 + DOWN8 + HEAD8),
                                           "bfp8": 2.0 * GATE_UP8}
    assert mixed.weight_format == "bf16,gate_up=bfp4"


def test_tt_transformers_performance_precision_bytes():
    m = inference_model("llama3-8b", "bfp8,gate_up=bfp4")
    dense = (ATTN8 + DOWN8 + HEAD8) * BFP8 + GATE_UP8 * BFP4 + NORMS8 * 2
    assert m.dense_weight_bytes == pytest.approx(dense, rel=1e-12)
    assert m.embedding_bytes == EMBED8 * 2           # looked up, kept at bf16
    # bfp8 weights run at HiFi2 (the "bf16" entry), bfp4 at LoFi ("bfp8")
    assert dict(m.flops_per_token) == {"bf16": 2.0 * (ATTN8 + DOWN8 + HEAD8), "bfp8": 2.0 * GATE_UP8}


@pytest.mark.parametrize("precision, words", [
    ("bf16,mlp=fp8", ("unknown weight part 'mlp'", "fix", "gate_up")),
    ("bf17", ("unknown weight format 'bf17'", "fix", "bf16")),
    ("bf16,gate_up=fp7", ("unknown weight format 'fp7'", "fix", "bfp4")),
    ("gate_up=bfp4", ("must start with a default format", "'bf16'", "'bfp8,gate_up=bfp4'")),
    ("", ("must start with a default format", "'bf16'")),
])
def test_bad_precision_is_refused_with_the_fix(precision, words):
    for call in (lambda: parse_precision(precision), lambda: inference_model("llama3-8b", precision)):
        with pytest.raises(ZooError) as e:
            call()
        msg = str(e.value)
        assert "\n" not in msg
        for w in words:
            assert w in msg


def test_bad_kv_format_is_refused():
    with pytest.raises(ZooError, match=r"unknown weight format 'fp7'; fix: use one of .*bf16"):
        inference_model("llama3-8b", kv_format="fp7")


@pytest.mark.parametrize("name", ["mochi-dit-tiny", "mochi-dit-10b"])
def test_a_diffusion_model_is_not_served(name):
    with pytest.raises(ZooError, match=r"is not a decoder language model; fix: serve a decoder"):
        inference_model(name)


def test_unknown_model_name_is_a_zoo_error():
    with pytest.raises(ZooError):
        inference_model("llama3-9b")


def _tiny(experts: int, k: int, expert_bytes: float) -> InferenceModel:
    return InferenceModel(
        name="tiny", layers=2, hidden=4, vocab=8, kv_heads=1, weight_format="bf16",
        kv_format="bf16", dense_weight_bytes=100.0, expert_weight_bytes=expert_bytes,
        experts=experts, experts_per_token=k, moe_layers=2 if experts else 0,
        flops_per_token=(("bf16", 10.0),), attention_flops_per_pair=1.0,
        kv_bytes_per_token=1.0, tp_allreduce_bytes_per_token=1.0, embedding_bytes=10.0)


def test_expert_bytes_read_under_uniform_routing():
    m = _tiny(8, 2, 800.0)     # 8 experts of 100 bytes (over all blocks), top-2
    # E (1 - (1 - k/E)^t) experts touched, each expert_weight_bytes / E
    assert m.expert_bytes_read(0) == 0.0
    assert m.expert_bytes_read(-3) == 0.0
    assert m.expert_bytes_read(1) == pytest.approx(800 * (1 - 0.75))                 # 2 experts
    assert m.expert_bytes_read(2) == pytest.approx(800 * (1 - 0.5625))               # 3.5
    assert m.expert_bytes_read(3) == pytest.approx(800 * (1 - 0.421875))             # 4.625
    assert m.expert_bytes_read(10_000) == pytest.approx(800.0)                       # all of them
    assert m.weight_bytes == 100 + 800 + 10
    assert m.matmul_flops_per_token == 10.0
    # top-E reads every expert whatever the tokens; a dense model reads none
    assert _tiny(4, 4, 400.0).expert_bytes_read(1) == 400.0
    assert _tiny(0, 0, 0.0).expert_bytes_read(64) == 0.0


# --------------------------------------------------- every parameter, biases and latent norms too
def test_gpt2_bf16_weights_are_two_bytes_per_parameter():
    cfg = resolve_model("gpt2")
    assert zoo.param_count(cfg) == 124_439_808           # the model card's safetensors total
    assert inference_model(cfg).weight_bytes == 2 * 124_439_808


def test_deepseek_v3_bf16_weights_are_two_bytes_per_parameter():
    cfg = resolve_model(str(CONFIGS / "DeepSeek-V3.json"))
    assert inference_model(cfg).weight_bytes == 2 * zoo.param_count(cfg)
