"""Megatron-LM model arguments for the zoo's newer architectures: a hybrid Mamba model's pattern
and mixer, DeepSeek-V3's multi-token prediction, gpt-oss's alternating sliding window."""

from __future__ import annotations

from types import SimpleNamespace

from launchers.megatron import _model_args
from zoo.model_files import resolve_model


def _args(name: str) -> dict:
    return dict(_model_args(SimpleNamespace(model=resolve_model(name), seq_len=4096)))


def test_hybrid_mtp_and_sliding_window_arguments():
    nano = _args("nemotron-3-nano-30b-a3b")
    assert nano["--hybrid-override-pattern"].startswith("MEMEM*E") and nano["--num-layers"] == 52
    assert (nano["--mamba-num-heads"], nano["--mamba-head-dim"], nano["--mamba-state-dim"],
            nano["--mamba-num-groups"]) == (64, 64, 128, 8)
    assert _args("deepseek-v3-mtp")["--mtp-num-layers"] == 1
    assert "--mtp-num-layers" not in _args("deepseek-v3")
    oss = _args("gpt-oss-120b")
    assert (oss["--window-size"], oss["--window-attn-skip-freq"]) == ("127,0", 2)
    assert "--hybrid-override-pattern" not in oss and "--window-size" not in _args("qwen3-30b-a3b")


def test_qwen3_next_goes_to_the_bridge_recipe_and_is_refused_by_megatron_lm():
    import pytest

    from launchers.megatron import megatron_args
    from launchers.megatron_bridge import recipe
    from launchers.view import LauncherError

    v = SimpleNamespace(model=resolve_model("qwen3-next-80b-a3b"), seq_len=4096,
                        kinds=("h100-sxm",), name="")
    assert recipe(v) == "qwen3_next_80b_a3b_pretrain_32gpu_h100_bf16_config"
    with pytest.raises(LauncherError, match="Gated DeltaNet layers .* export this plan to "
                                            "megatron-bridge") as e:
        megatron_args(v)
    assert "\n" not in str(e.value)
    from launchers.torchtitan import model_flavor

    with pytest.raises(LauncherError, match="export this plan to megatron-bridge$"):
        model_flavor(v)
