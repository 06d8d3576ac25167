"""RoPE scaling written the way each launcher spells it (the read-back against each launcher's
own configuration code is the ``launchers`` suite's): Llama 3.1's bands, YaRN with and without
multi-latent attention, and one note per figure a target cannot set."""

from __future__ import annotations

import dataclasses

from launchers.maxtext import rope_scaling_keys
from launchers.megatron import rope_scaling_args
from launchers.megatron_bridge import rope_scaling_overrides
from launchers.torchtitan import FLAVOR_ROPE, rope_of, rope_text
from zoo.model_files import resolve_model

LLAMA31 = resolve_model("zoo/configs/Llama-3.1-8B.json")
LLAMA32 = resolve_model("zoo/configs/Llama-3.2-1B-Instruct.json")
DSV3 = resolve_model("deepseek-v3")
KIMI = resolve_model("zoo/configs/Kimi-K2-Instruct.json")
GPT_OSS = resolve_model("zoo/configs/gpt-oss-20b.json")
QWEN3 = resolve_model("zoo/configs/Qwen3-8B.json")


def test_megatron_arguments():
    assert rope_scaling_args(LLAMA31) == ([("--use-rope-scaling", None),
                                           ("--rope-scaling-factor", 8.0)], [])
    assert rope_scaling_args(DSV3) == ([("--rope-type", "yarn"), ("--rotary-scaling-factor", 40.0),
                                        ("--mscale", 1.0), ("--mscale-all-dim", 1.0)], [])
    assert rope_scaling_args(GPT_OSS) == ([
        ("--rotary-scaling-factor", 32.0), ("--yarn-original-max-position-embeddings", 4096),
        ("--yarn-beta-fast", 32.0), ("--yarn-beta-slow", 1.0),
        ("--no-yarn-correction-range-round-to-int", None)], [])
    # Kimi K2's beta_fast 1: Megatron-LM's MLA config fixes 32 (a note, not a silent change)
    assert rope_scaling_args(KIMI)[1] == ["YaRN beta_fast 1: Megatron-LM's multi-latent "
                                          "attention fixes 32"]
    assert rope_scaling_args(QWEN3) == ([], [])
    odd = dataclasses.replace(LLAMA31, rope_high_freq_factor=2.0)
    assert rope_scaling_args(odd)[1] == ["llama3 rope scaling with low/high frequency factors 1/2 "
                                         "over 8192 positions: Megatron-LM fixes 1/4 over 8192"]


def test_megatron_bridge_overrides():
    notes: list[str] = []
    assert rope_scaling_overrides(LLAMA32, notes) == [("model.rope_scaling", True),
                                                      ("model.rope_scaling_factor", 32.0)]
    assert rope_scaling_overrides(KIMI, notes) == [
        ("model.rope_type", "yarn"), ("model.rotary_scaling_factor", 32.0),
        ("model.original_max_position_embeddings", 4096), ("model.beta_fast", 1.0),
        ("model.beta_slow", 1.0), ("model.mscale", 1.0), ("model.mscale_all_dim", 1.0)]
    assert ("model.yarn_correction_range_round_to_int", False) in rope_scaling_overrides(GPT_OSS,
                                                                                        notes)
    assert notes == []


def test_maxtext_keys():
    notes: list[str] = []
    assert rope_scaling_keys(LLAMA31, notes) == {"rope_type": "llama3.1", "rope_use_scale": True}
    assert notes == []
    rope_scaling_keys(LLAMA32, notes)       # factor 32: MaxText's llama3.1 RoPE fixes 8
    assert notes == ["llama3 rope scaling factor 32, low/high frequency factors 1/4 over 8192 "
                     "positions: MaxText's llama3.1 RoPE fixes 8, 1/4 over 8192"]
    assert rope_scaling_keys(GPT_OSS, notes) == {
        "rope_type": "yarn", "rope_factor": 32.0, "original_max_position_embeddings": 4096,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "rope_truncate": False}


def test_torchtitan_flavours_against_the_plan():
    # torchtitan's llama3 flavours all run Llama 3.1's bands; the zoo's Llama 3 70B has none
    assert FLAVOR_ROPE["llama3"] == rope_of(LLAMA31) != rope_of(resolve_model("llama3-70b")) == ()
    assert FLAVOR_ROPE["deepseek_v3"] == rope_of(DSV3)
    assert FLAVOR_ROPE["gpt_oss"] == rope_of(GPT_OSS)
    assert rope_text(rope_of(GPT_OSS)) == "yarn x32 over 4096 (beta 32/1, untruncated)"
