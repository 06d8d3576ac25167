"""Models from published config files (``zoo.model_files``): the shipped Hugging Face configs
against their published parameter totals, the refusals, and a plan that carries its model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import zoo
from ir import any_plan_to_json, with_model_config
from ir.plan_file import load_plan
from mpmd.cli.main import main
from zoo import ZooError
from zoo.model_files import (config_fields, from_hf, from_spec, is_model_file, load_model_file,
                             plan_model, resolve_model)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "zoo" / "configs"

PUBLISHED = {  # file -> published total (zoo/configs/README.md cites each)
    "Llama-3.1-8B.json": 8.03e9,
    "Llama-3.2-1B-Instruct.json": 1.23e9,
    "Llama-3.2-3B-Instruct.json": 3.21e9,
    "Mistral-7B-v0.1.json": 7.24e9,
    "Qwen2.5-7B.json": 7.61e9,
    "Qwen3-8B.json": 8.2e9,
    "gemma-2-9b.json": 9_241_705_984,
    "gemma-3-1b-pt.json": 1.0e9,
    "gpt2.json": 124e6,
    "gpt-neox-20b.json": 20_554_567_680,
    "opt-1.3b.json": 1.32e9,
    "Qwen3-30B-A3B.json": 30.5e9,
    "gpt-oss-120b.json": 116.83e9,     # test_gpt_oss.py checks its parts and active count
    "Nemotron-3-Nano-30B-A3B.json": 31.6e9,   # test_hybrid.py checks the active count
    "Nemotron-3-Super-120B.json": 120e9,  # the release's name; test_hybrid.py: 12B active
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_count_within_1pct_of_published(name):
    n = zoo.param_count(load_model_file(CONFIGS / name))
    assert abs(n - PUBLISHED[name]) / PUBLISHED[name] < 0.01, n


def test_every_shipped_config_is_covered():
    shipped = {p.name for p in CONFIGS.glob("*.json")}
    moe = {"Mixtral-8x22B-v0.1.json", "Qwen3-235B-A22B.json", "DeepSeek-V3.json",  # test_moe.py
           "DeepSeek-V3-MTP.json"}                                                 # test_mtp.py
    recipes = {"gpt-oss-20b.json", "Kimi-K2-Instruct.json",        # test_recipe_models.py
               "Nemotron-H-56B-Base-8K.json", "Llama-3.1-70B-Instruct.json",
               "Llama-4-Scout-17B-16E.json",
               "Nemotron-3-Super-MTP.json",                     # test_hybrid.py
               "Nemotron-3.5-Lightning.json",                   # test_hybrid.py
               "Qwen3-Next-80B-A3B.json", "Qwen3.5-35B-A3B.json",  # test_gated_deltanet.py
               "Qwen3.5-122B-A10B.json", "Qwen3.5-397B-A17B.json"}
    assert shipped == set(PUBLISHED) | moe | recipes


def test_qwen3_30b_a3b_total_and_active_parameters():
    """Qwen/Qwen3-30B-A3B model card: 30.5B in total, 3.3B activated (48 layers, 128 experts,
    8 per token); the count is 30,532,110,336 and 3,353,020,416 active (the card's 3.3B
    truncates it; q/k norms left out, 12,288 parameters)."""
    cfg = resolve_model("qwen3-30b-a3b")
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_dim) == (48, 2048, 32, 4, 128)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn, cfg.vocab) == (128, 8, 768, 151936)
    assert zoo.param_count(cfg) == 30_532_110_336
    assert zoo.active_param_count(cfg) == 3_353_020_416


def test_exact_counts_where_the_architecture_is_modelled_exactly():
    # no simplification applies to these four: their safetensors totals, to the parameter
    assert zoo.param_count(load_model_file(CONFIGS / "Llama-3.1-8B.json")) == 8_030_261_248
    assert zoo.param_count(load_model_file(CONFIGS / "Mistral-7B-v0.1.json")) == 7_241_732_096
    assert zoo.param_count(load_model_file(CONFIGS / "gpt2.json")) == 124_439_808
    assert zoo.param_count(load_model_file(CONFIGS / "gpt-neox-20b.json")) == 20_554_567_680


def test_fields_are_read_as_published():
    g = load_model_file(CONFIGS / "gemma-2-9b.json")
    assert (g.family, g.layers, g.hidden, g.heads, g.kv_heads, g.head_dim, g.ffn, g.vocab) == (
        "llama", 42, 3584, 16, 8, 256, 14336, 256000)
    assert g.tie_embeddings and g.seq_len == 8192 and "GeGLU costed as SwiGLU" in g.source
    q = load_model_file(CONFIGS / "Qwen3-8B.json")
    assert (q.head_dim, q.kv_heads, q.rope_theta, q.tie_embeddings) == (128, 8, 1e6, False)
    n = load_model_file(CONFIGS / "gpt-neox-20b.json")
    assert (n.family, n.pos_emb, n.mlp, n.bias, n.tie_embeddings) == ("gpt", "rope", "gelu", True, False)
    o = load_model_file(CONFIGS / "opt-1.3b.json")
    assert (o.mlp, o.pos_emb, o.tie_embeddings, o.ffn) == ("relu", "learned", True, 8192)
    # Llama 3.1's 131,072-token window is capped for the default training sequence
    assert load_model_file(CONFIGS / "Llama-3.1-8B.json").seq_len == 8192


def test_gemma3_reads_its_text_config():
    doc = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
           "text_config": {"hidden_size": 2560, "num_attention_heads": 8, "num_key_value_heads": 4,
                           "head_dim": 256, "intermediate_size": 10240, "num_hidden_layers": 34,
                           "vocab_size": 262208, "max_position_embeddings": 131072}}
    c = from_hf(doc, "gemma-3-4b", "test")
    assert (c.layers, c.hidden, c.head_dim, c.tie_embeddings) == (34, 2560, 256, True)


@pytest.mark.parametrize("doc,needle", [
    ({"model_type": "qwen2_moe"}, "model_type 'qwen2_moe' is a mixture of experts with a gated shared expert"),
    ({"architectures": ["DeepseekV3ForCausalLM"], "moe_layer_freq": 2}, "moe_layer_freq 2"),
    ({"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
      "intermediate_size": 64, "vocab_size": 10, "num_local_experts": 2, "num_experts_per_tok": 3},
     "num_experts_per_tok = 3 is not between 1 and the 2 experts"),
    ({"model_type": "mamba"}, "model_type 'mamba' is not supported; supported: llama, mistral"),
    ({"model_type": "llama", "num_attention_heads": 8}, "field 'hidden_size' is missing"),
    ({"model_type": "llama", "hidden_size": "4096"}, "'hidden_size' = '4096' is not a positive integer"),
])
def test_refusals_are_one_line(doc, needle):
    with pytest.raises(ZooError) as e:
        from_hf(doc, "m", "m.json")
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_model_spec_checks_fields():
    ok = {"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "ffn": 256, "vocab": 100}
    c = from_spec(ok, "s", "s.yaml")
    assert (c.kv_heads, c.mlp, c.norm) == (4, "swiglu", "rms")      # ModelConfig's defaults
    with pytest.raises(ZooError, match="unknown field 'layerz'; did you mean 'layers'[?] valid fields: name, family"):
        from_spec({**ok, "layerz": 3}, "s", "s.yaml")
    with pytest.raises(ZooError, match="field 'vocab' is missing"):
        from_spec({k: v for k, v in ok.items() if k != "vocab"}, "s", "s.yaml")
    with pytest.raises(ZooError, match="family = 'mamba' is not one of llama, gpt"):
        from_spec({**ok, "family": "mamba"}, "s", "s.yaml")
    with pytest.raises(ZooError, match="layers = 2.5 is not an integer"):
        from_spec({**ok, "layers": 2.5}, "s", "s.yaml")


def test_a_bundled_config_is_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model("zoo/configs/gpt2.json").hidden == 768


def test_shipped_configs_answer_to_their_names():
    assert resolve_model("deepseek-v3") == load_model_file(CONFIGS / "DeepSeek-V3.json")
    assert resolve_model("Qwen3-235B-A22B").experts == 128
    with pytest.raises(ZooError, match="unknown model 'deepseek-v5'; did you mean 'deepseek-v3'"):
        resolve_model("deepseek-v5")
    # a model recipes train whose architecture the zoo lacks is named, not guessed at
    with pytest.raises(ZooError, match="model 'deepseek-v4-flash' is not modelled yet: the zoo "
                                       "lacks DeepSeek-V4's hyper-connections"):
        resolve_model("DeepSeek_V4_Flash")
    with pytest.raises(ZooError, match="model 'glm5' is not modelled yet: .*sparse attention"):
        resolve_model("GLM5")


def test_resolve_model_takes_a_name_or_a_file():
    assert not is_model_file("llama3-8b") and is_model_file("a/b/config.JSON")
    assert resolve_model("llama3-8b") == zoo.get_config("llama3-8b")
    assert resolve_model(str(CONFIGS / "tiny-llama.yaml")).name == "tiny-llama"


def test_a_plan_carries_its_models_fields():
    plan = load_plan(ROOT / "tests" / "launchers" / "data" / "llama3-70b-h100x128.json")
    cfg = load_model_file(CONFIGS / "Qwen3-8B.json")
    doc = any_plan_to_json(with_model_config(plan, config_fields(cfg)))
    back = load_plan_doc(doc)
    assert plan_model(back.model, back.model_config) == cfg
    assert plan_model(plan.model, plan.model_config) == zoo.get_config("llama3-70b")


def load_plan_doc(doc):
    from ir.plan_file import plan_from_doc
    return plan_from_doc(json.loads(json.dumps(doc)))


def test_cli_plans_a_config_file_and_the_plan_exports(tmp_path):
    out = tmp_path / "gpt2.json"
    res = CliRunner().invoke(main, ["plan", "--model", str(CONFIGS / "gpt2.json"), "--cluster",
                                    str(ROOT / "hardware_profiles" / "clusters" / "h100x64_nodes.yaml"),
                                    "--global-batch", "64", "--time-limit", "2", "--out", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["model"] == "gpt2" and doc["model_config"]["hidden"] == 768
    res = CliRunner().invoke(main, ["export", str(out), "--to", "megatron",
                                    "--out", str(tmp_path / "gpt2.args")])
    assert res.exit_code == 0, res.output
    assert "--hidden-size 768" in (tmp_path / "gpt2.args").read_text()


@pytest.mark.parametrize("content,needle", [
    ('{"model_type": "qwen2_moe"}', "is a mixture of experts with a gated shared expert"),
    ("[1, 2]", "a model file holds a mapping of fields"),
])
def test_cli_refuses_a_bad_model_file_in_one_line(tmp_path, content, needle):
    f = tmp_path / "config.json"
    f.write_text(content)
    res = CliRunner().invoke(main, ["plan", "--model", str(f), "--cluster",
                                    str(ROOT / "hardware_profiles" / "clusters" / "h100x64_nodes.yaml"),
                                    "--out", str(tmp_path / "p.json")])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and needle in res.output
    assert not (tmp_path / "p.json").exists()


def test_whatif_takes_a_shipped_config_by_name(tmp_path):
    """`mpmd whatif --model` goes through the same resolver as `mpmd plan`."""
    from reports import whatif

    df = whatif("gpt2", [str(ROOT / "hardware_profiles" / "clusters" / "h100x64_nodes.yaml")],
                global_batch=64, time_limit_s=1.0)
    assert len(df) == 1 and bool(df.iloc[0]["feasible"])
    assert df.iloc[0]["plan"].model == "gpt2"


def test_rope_scaling_is_read_as_published_and_carried_by_a_plan():
    """Llama 3.1's bands, DeepSeek-V3's and gpt-oss's YaRN (gpt-oss unrounded), none for Qwen3;
    the fields survive a plan's model_config; an unsupported type is refused in one line."""
    c = resolve_model("zoo/configs/Llama-3.1-8B.json")
    assert (c.rope_scaling, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
            c.rope_original_max_position) == ("llama3", 8.0, 1.0, 4.0, 8192)
    d = resolve_model("deepseek-v3")
    assert (d.rope_scaling, d.rope_factor, d.rope_original_max_position, d.rope_beta_fast,
            d.rope_beta_slow, d.rope_mscale, d.rope_mscale_all_dim, d.rope_truncate) == (
        "yarn", 40.0, 4096, 32.0, 1.0, 1.0, 1.0, True)
    g = resolve_model("zoo/configs/gpt-oss-20b.json")
    assert (g.rope_scaling, g.rope_factor, g.rope_truncate) == ("yarn", 32.0, False)
    assert resolve_model("zoo/configs/Qwen3-8B.json").rope_scaling == ""
    assert plan_model(d.name, config_fields(d)) == d
    doc = json.loads((CONFIGS / "Llama-3.1-8B.json").read_text())
    with pytest.raises(ZooError) as e:
        from_hf({**doc, "rope_scaling": {"rope_type": "longrope", "factor": 4}}, "m", "m.json")
    assert "rope_scaling type 'longrope' is not supported; supported: linear, llama3, yarn" in str(e.value)
    assert "\n" not in str(e.value)
