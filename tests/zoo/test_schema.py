"""One validity check for every model source (zoo.schema.check_model): a case per field family
(types, ranges and limits, vocabularies, names, heads, experts, latent attention, Mochi), each
through the source a user would use (a YAML spec, a Hugging Face config, overrides, a plan's
carried fields), with the exact message; and a property: no field value makes it raise anything
but ZooError."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

import zoo
from zoo import ZooError
from zoo.config import ModelConfig
from zoo.model_files import from_hf, from_spec, load_model_file, plan_model, shipped_models
from zoo.schema import LIMITS, check_model

ROOT = Path(__file__).resolve().parents[2]
SPEC = {"family": "llama", "layers": 4, "hidden": 512, "heads": 8, "ffn": 1536, "vocab": 256}
MOE = {**SPEC, "experts": 8, "experts_per_token": 2, "expert_ffn": 512}
MLA = {**SPEC, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "v_head_dim": 64, "head_size": 32}
DEEPSEEK = json.loads((ROOT / "zoo" / "configs" / "DeepSeek-V3.json").read_text())
QWEN3 = json.loads((ROOT / "zoo" / "configs" / "Qwen3-8B.json").read_text())


def spec_error(**fields) -> str:
    with pytest.raises(ZooError) as e:
        from_spec({k: v for k, v in {**SPEC, **fields}.items() if v is not None}, "m", "m.yaml")
    return str(e.value)


def hf_error(base: dict, **fields) -> str:
    with pytest.raises(ZooError) as e:
        from_hf({**base, **fields}, "m", "m.json (Hugging Face config)")
    return str(e.value)


def test_every_zoo_model_and_shipped_config_is_valid():
    for name in zoo.list_models():
        assert check_model(zoo.get_config(name)) == zoo.get_config(name)
    for path in shipped_models().values():
        assert check_model(load_model_file(path)).name


# ----------------------------------------------------------------------------- types
@pytest.mark.parametrize("field,value,expect", [
    ("layers", 2.5, "m.yaml: layers = 2.5 is not an integer; fix: give a whole number"),
    ("layers", True, "m.yaml: layers = True is not an integer; fix: give a whole number"),
    ("hidden", "512", "m.yaml: hidden = '512' is not an integer; fix: give a whole number"),
    ("rope_theta", "abc", "m.yaml: rope_theta = 'abc' is not a finite number; fix: give a number "
                          "such as 1.5"),
    ("norm_eps", float("nan"), "m.yaml: norm_eps = nan is not a finite number"),
    ("capacity_factor", float("inf"), "m.yaml: capacity_factor = inf is not a finite number"),
    ("bias", "yes", "m.yaml: bias = 'yes' is not true or false; fix: give true or false"),
    ("dtype", 16, "m.yaml: dtype = 16 is not a string; fix: give a string"),
])
def test_a_field_of_the_wrong_type_is_named(field, value, expect):
    assert spec_error(**{field: value}).startswith(expect)


def test_a_float_field_takes_the_string_yaml_makes_of_1e6():
    assert from_spec({**SPEC, "rope_theta": "1e6"}, "m", "m.yaml").rope_theta == 1e6


@pytest.mark.parametrize("field,value,needle", [
    ("rope_theta", "abc", "field 'rope_theta' = 'abc' is not a finite number; fix the config"),
    ("rms_norm_eps", [1], "field 'rms_norm_eps' = [1] is not a finite number"),
    ("tie_word_embeddings", "no", "field 'tie_word_embeddings' = 'no' is not true or false"),
    ("num_key_value_heads", "8", "field 'num_key_value_heads' = '8' is not a positive integer"),
])
def test_a_hugging_face_field_of_the_wrong_type_is_named(field, value, needle):
    assert needle in hf_error(QWEN3, **{field: value})


@pytest.mark.parametrize("field,value,needle", [
    ("moe_layer_freq", "x", "'moe_layer_freq' = 'x' is not a positive integer"),
    ("q_lora_rank", 1.5, "'q_lora_rank' = 1.5 is not a whole number >= 0"),
    ("n_shared_experts", -1, "'n_shared_experts' = -1 is not a whole number >= 0"),
    ("first_k_dense_replace", 1000, "first_k_dense_replace = 1000 leaves no mixture-of-experts "
                                    "layer of the 61; fix: give fewer than 61 dense first layers"),
])
def test_deepseek_fields_are_checked(field, value, needle):
    assert needle in hf_error(DEEPSEEK, **{field: value})


def test_qwen3_moe_decoder_sparse_step_of_the_wrong_type():
    doc = {**QWEN3, "model_type": "qwen3_moe", "num_experts": 8, "moe_intermediate_size": 512,
           "num_experts_per_tok": 2, "decoder_sparse_step": "one"}
    assert "'decoder_sparse_step' = 'one' is not a positive integer" in hf_error(doc)


# ----------------------------------------------------------------------------- ranges and limits
@pytest.mark.parametrize("field,value,expect", [
    ("layers", 10**9, "m.yaml: layers = 1000000000 is over the limit 16,384 (far above any "
                      "published model; the cost model's tables and the traced program grow with "
                      "it); fix: give at most 16,384"),
    ("vocab", 10**12, "m.yaml: vocab = 1000000000000 is over the limit 16,777,216"),
    ("seq_len", 0, "m.yaml: seq_len = 0 is below 1; fix: give at least 1"),
    ("seq_len", 2**23, "m.yaml: seq_len = 8388608 is over the limit 4,194,304"),
    ("hidden", 2**30, "m.yaml: hidden = 1073741824 is over the limit 262,144"),
    ("layers", 0, "m.yaml: layers = 0 is below 1"),
    ("vocab", 0, "m.yaml: vocab = 0 is below 1"),
    ("head_size", -4, "m.yaml: head_size = -4 is below 0"),
    ("norm_eps", -1e-5, "m.yaml: norm_eps = -1e-05 is outside [1e-30, 0.1]; fix: give a value in "
                        "[1e-30, 0.1]"),
    ("capacity_factor", 0, "m.yaml: capacity_factor = 0 is outside [0.001, 64]"),
    ("rope_theta", 1e13, "m.yaml: rope_theta = 10000000000000.0 is outside [1, 1e+12]"),
])
def test_a_value_out_of_range_is_refused_with_its_limit(field, value, expect):
    assert spec_error(**{field: value}).startswith(expect)


def test_a_hugging_face_layer_count_of_a_billion_is_refused():
    assert hf_error(QWEN3, num_hidden_layers=10**9).startswith(
        "m.json (Hugging Face config): num_hidden_layers = 1000000000 is over the limit 16,384")


def test_the_seq_len_limit_is_the_plan_files():
    from ir.plan_file import LIMITS as PLAN_LIMITS
    assert LIMITS["seq_len"] == PLAN_LIMITS["seq_len"]


@pytest.mark.parametrize("field,value,expect", [
    ("family", "mamba", "m.yaml: family = 'mamba' is not one of llama, gpt"),
    ("mlp", "geglu", "m.yaml: mlp = 'geglu' is not one of swiglu, gelu, relu, relu2; fix: use "
                     "one of swiglu, gelu, relu, relu2"),
    ("dtype", "int8", "m.yaml: dtype = 'int8' is not one of bfloat16, float16, float32"),
    ("name", "my model", "m.yaml: name = 'my model' is not a model name (letters, digits and "
                         "_ . + - only, at most 200 characters); fix: rename the model or its file"),
    ("name", "a" * 201, "m.yaml: name = '" + "a" * 201 + "' is not a model name"),
])
def test_vocabularies_and_names(field, value, expect):
    assert spec_error(**{field: value}).startswith(expect)


# ----------------------------------------------------------------------------- relations
@pytest.mark.parametrize("fields,expect", [
    ({"hidden": 500}, "m.yaml: hidden = 500 is not divisible by heads = 8; fix: pick heads "
                      "dividing the width, or set head_size"),
    ({"kv_heads": 3}, "m.yaml: kv_heads = 3 does not divide heads = 8 (each key/value head serves "
                      "a whole group of query heads); fix: give a divisor of 8"),
    ({"kv_heads": 16}, "m.yaml: kv_heads = 16 does not divide heads = 8"),
    ({"kv_heads": 0}, "m.yaml: kv_heads = 0 is below 1"),
    ({"head_size": 63}, "m.yaml: head_size = 63 gives odd-width heads (63), which rotary "
                        "embeddings cannot rotate in pairs; fix: use an even head width"),
])
def test_heads_must_fit_together(fields, expect):
    assert spec_error(**fields).startswith(expect)


def test_heads_named_by_their_hugging_face_keys():
    assert hf_error(QWEN3, num_key_value_heads=3) == (
        "m.json (Hugging Face config): num_key_value_heads = 3 does not divide "
        "num_attention_heads = 32 (each key/value head serves a whole group of query heads); "
        "fix: give a divisor of 32")
    assert hf_error({**QWEN3, "head_dim": None}, hidden_size=4100).startswith(
        "m.json (Hugging Face config): hidden_size = 4100 is not divisible by num_attention_heads = 32")


@pytest.mark.parametrize("fields,expect", [
    ({"experts_per_token": 0}, "m.yaml: experts_per_token = 0 is not between 1 and the 8 experts"),
    ({"experts_per_token": 9}, "m.yaml: experts_per_token = 9 is not between 1 and the 8 experts; "
                               "fix: route each token to 1 to 8 experts"),
    ({"expert_ffn": 0}, "m.yaml: expert_ffn = 0 is not set for a mixture of experts"),
    ({"dense_layers": 4}, "m.yaml: dense_layers = 4 leaves no mixture-of-experts layer of the 4; "
                          "fix: give fewer than 4 dense first layers"),
    ({"shared_experts": -1}, "m.yaml: shared_experts = -1 is below 0"),
    ({"experts": 0}, "m.yaml: experts_per_token = 2 is set but experts = 0 (a dense model); "
                     "fix: set experts or drop experts_per_token"),
])
def test_experts_must_fit_together(fields, expect):
    with pytest.raises(ZooError) as e:
        from_spec({**MOE, **fields}, "m", "m.yaml")
    assert str(e.value).startswith(expect)


def test_a_dense_model_sets_no_expert_field():
    assert spec_error(dense_layers=2) == ("m.yaml: dense_layers = 2 is set but experts = 0 (a "
                                          "dense model); fix: set experts or drop dense_layers")


@pytest.mark.parametrize("fields,expect", [
    ({"v_head_dim": 0}, "m.yaml: v_head_dim = 0 is not set but kv_lora_rank = 64 (latent "
                        "attention needs its head widths); fix: give v_head_dim"),
    ({"qk_rope_head_dim": 0}, "m.yaml: qk_rope_head_dim = 0 is not set but kv_lora_rank = 64"),
    ({"qk_rope_head_dim": 15}, "m.yaml: qk_rope_head_dim = 15 is odd"),
    ({"kv_lora_rank": 0}, "m.yaml: qk_rope_head_dim = 16 is set but kv_lora_rank = 0 (no latent "
                          "attention); fix: set kv_lora_rank with it, or drop qk_rope_head_dim"),
])
def test_latent_attention_fields_all_or_none(fields, expect):
    with pytest.raises(ZooError) as e:
        from_spec({**MLA, **fields}, "m", "m.yaml")
    assert str(e.value).startswith(expect)
    assert from_spec(MLA, "m", "m.yaml").mla


def test_mochi_fields_belong_to_mochi():
    assert spec_error(patch_size=2) == ("m.yaml: patch_size = 2 applies to family mochi only, not "
                                        "llama; fix: drop patch_size")
    with pytest.raises(ZooError, match="latent_height = 7 is not a multiple of patch_size = 2"):
        zoo.get_config("mochi-dit-tiny", latent_height=7)
    with pytest.raises(ZooError, match="training = True is true; the Mochi DiT is modelled for "
                                       "inference only"):
        zoo.get_config("mochi-dit-tiny", training=True)


# ----------------------------------------------------------------------------- every source
def test_overrides_are_checked_and_named():
    with pytest.raises(ZooError) as e:
        zoo.get_config("llama-tiny", seq_len=0)
    assert str(e.value) == ("model 'llama-tiny' with seq_len=0: seq_len = 0 is below 1; fix: give "
                            "at least 1")


def test_a_plans_carried_model_is_checked():
    fields = dataclasses.asdict(from_spec(SPEC, "m", "m.yaml"))
    assert plan_model("m", fields).hidden == 512
    with pytest.raises(ZooError) as e:
        plan_model("m", {**fields, "kv_heads": 3})
    assert str(e.value).startswith("the plan's model_config: kv_heads = 3 does not divide heads = 8")
    with pytest.raises(ZooError, match="the plan's model_config: layers = 1000000000 is over"):
        plan_model("m", {**fields, "layers": 10**9})


def test_a_spec_file_with_a_bad_name_is_refused_before_any_plan(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("name: 'my model!'\nfamily: llama\nlayers: 2\nhidden: 64\nheads: 4\nffn: 128\n"
                 "vocab: 100\n")
    with pytest.raises(ZooError, match="m.yaml [(]model spec[)]: name = 'my model!' is not a model name"):
        load_model_file(f)


# ----------------------------------------------------------------------------- property
_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
                    st.lists(st.integers(), max_size=2))
_FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(_FIELDS), _VALUES, max_size=4))
def test_any_field_values_give_a_valid_model_or_one_zoo_error(fields):
    try:
        cfg = from_spec({**MOE, **fields}, "m", "m.yaml")
    except ZooError as e:
        assert "\n" not in str(e) and str(e).startswith("m.yaml: ")
        return
    assert check_model(cfg) is cfg
    assert 1 <= cfg.layers <= LIMITS["layers"] and cfg.heads % cfg.kv_heads == 0
    assert math.isfinite(cfg.rope_theta) and cfg.experts_per_token <= cfg.experts
