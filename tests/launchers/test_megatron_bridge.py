"""launchers: Megatron-Bridge (NeMo) recipe overrides (``mpmd export --to megatron-bridge``).

Read back: each bundled plan's overrides file is taken through its own launch line's shell
reading (``grep -v '^#' FILE | xargs``, with ``torchrun`` replaced by ``printf``), each
``KEY=VALUE`` parsed in Hydra's grammar, and compared with what the plan JSON says the job is
(:func:`readback.expected_parts`, read from the plan's IR, not from the exporter): degrees,
micro and global batch, accumulation, sequence length, stage layout, recomputation, precision and
the model's architecture.

Field names, in the default suite: every key is checked against the field names of a pinned copy
of Megatron-Bridge 0.6.2's dataclasses, with its recipe and mixed-precision names
(``pinned/megatron_bridge_0.6.2.json``; its ``source`` names the files of the megatron-bridge
0.6.2 and megatron-core 0.19.2 wheels it was read from): OmegaConf in struct mode, which Bridge
applies overrides with, refuses a key its ConfigContainer lacks. The real recipes, overrides and
validation run in the ``launchers`` suite (``test_launchers.py``, ``checks/megatron_bridge_check.py``),
where ``scripts/launchers_env.sh`` installed megatron-bridge."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ir.plan_file import load_plan                          # noqa: E402
from launchers import LauncherError, export_plan, part_views  # noqa: E402
from launchers import megatron_bridge as mb                  # noqa: E402
from readback import expected_parts                          # noqa: E402

DATA = HERE / "data"
PINNED = json.loads((HERE / "pinned" / "megatron_bridge_0.6.2.json").read_text())
PLANS = sorted(DATA.glob("*.json"))


def hydra_value(text: str):
    """A value of Hydra's override grammar as the files use it: null, true/false, ints, floats,
    bare words and nested lists."""
    if text.startswith("["):
        out, depth, cur = [], 0, ""
        for ch in text[1:-1]:
            if ch == "," and depth == 0:
                out.append(hydra_value(cur))
                cur = ""
                continue
            depth += ch == "["
            depth -= ch == "]"
            cur += ch
        return out + ([hydra_value(cur)] if cur else [])
    if text in ("null", "true", "false"):
        return {"null": None, "true": True, "false": False}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def launched(path: Path) -> tuple[str, dict]:
    """(the recipe, the overrides) as the file's own launch line hands them to the runner."""
    text = path.read_text()
    line = next(x for x in text.splitlines() if "launch from" in x).split(": ", 1)[1]
    line = re.sub(r"xargs torchrun .*? scripts/training/run_recipe.py", r"xargs printf '%s\\n'",
                  line)
    words = subprocess.run(["bash", "-c", line], cwd=path.parent, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    # xargs appends the file's words after the runner's own arguments: trailing overrides
    assert words[0] == "--recipe" and words[2:4] == ["--mode", "pretrain"]
    recipe = words[1]
    pairs = [w.split("=", 1) for w in words[4:]]
    return recipe, {k: hydra_value(x) for k, x in pairs}


def export_parts(plan_path: Path, out: Path):
    try:
        return export_plan(load_plan(plan_path), "megatron-bridge", out)
    except LauncherError as e:
        assert "has no recipe for" in str(e)
        return ()


@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_overrides_read_back_equal_the_plan(plan_path, tmp_path):
    files = export_parts(plan_path, tmp_path / f"{plan_path.stem}.overrides")
    want = expected_parts(load_plan(plan_path))
    for f in files:
        f.path.write_text(f.text)
        recipe, o = launched(f.path)
        e = want[f.path.stem.rsplit("-", 1)[-1] if f.path.stem.endswith(tuple(
            f"part{i}" for i in range(9))) else ""]
        m = e.model
        assert recipe == mb.RECIPES[m.name.lower()]
        tp, pp = o["model.tensor_model_parallel_size"], o["model.pipeline_model_parallel_size"]
        cp = o["model.context_parallel_size"]
        assert (tp, pp, cp) == (e.tensor, e.pipeline, e.context)
        assert (o["model.virtual_pipeline_model_parallel_size"] or 1) == e.virtual
        data = e.data          # Megatron-Core's data-parallel size: world / (tp x pp x cp)
        assert (o["train.micro_batch_size"], o["train.global_batch_size"]) == (e.micro_batch,
                                                                              e.global_batch)
        assert e.global_batch // (e.micro_batch * data) == e.microbatches
        assert o["dataset.seq_length"] == o["model.seq_length"] == e.seq_len
        assert o["model.sequence_parallel"] == (e.tensor > 1)
        if m.moe:
            assert o["model.expert_model_parallel_size"] == e.expert
        assert o["ddp.use_megatron_fsdp"] == e.fsdp
        layout = o["model.pipeline_model_parallel_layout"]
        if layout is None:
            per = m.layers // (e.pipeline * e.virtual)
            assert e.blocks == (per,) * (e.pipeline * e.virtual)
        else:
            assert tuple(s.count("decoder") for s in layout) == e.blocks
            assert layout[0][0] == "embedding" and layout[-1][-1] == "loss"
        assert (o["model.recompute_granularity"] == "full") == e.recompute
        assert o["mixed_precision"] == mb.PRECISIONS[e.precision]
        assert (o["model.num_layers"], o["model.hidden_size"], o["model.num_attention_heads"],
                o["model.vocab_size"]) == (m.layers, m.hidden, m.heads, m.vocab)
        assert o["model.num_query_groups"] == m.kv_heads and o["model.kv_channels"] == m.head_dim
        assert o["model.qk_layernorm"] == m.qk_norm
        assert o["model.share_embeddings_and_output_weights"] == m.tie_embeddings
        assert o["model.rotary_base"] == int(m.rope_theta)
        if m.moe:
            assert (o["model.num_moe_experts"], o["model.moe_router_topk"],
                    o["model.moe_ffn_hidden_size"]) == (m.experts, m.experts_per_token,
                                                        m.expert_ffn)
        else:
            assert o["model.ffn_hidden_size"] == m.ffn


def test_qwen3_plan_carries_qk_norm_to_bridge(tmp_path):
    (f,) = export_parts(DATA / "qwen3-235b-a22b-expert-parallel.json", tmp_path / "q.overrides")
    f.path.write_text(f.text)
    recipe, o = launched(f.path)
    assert recipe == "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config"
    assert o["model.qk_layernorm"] is True
    assert o["model.expert_tensor_parallel_size"] == 4
    assert "# Megatron-Bridge recipe overrides (megatron-bridge 0.6.2)" in f.text


@pytest.mark.parametrize("precision", sorted(mb.PRECISIONS))
def test_every_key_and_name_exists_in_megatron_bridge(precision):
    """Every override key is a field of Bridge 0.6.2's ConfigContainer section it names; the
    recipe and the mixed-precision recipe are ones it registers (pinned copy, module doc)."""
    fields = PINNED["fields"]
    for plan_path in PLANS:
        for v in part_views(replace(load_plan(plan_path), precision=precision)):
            try:
                name, out, _ = mb.overrides(v)
            except LauncherError:
                continue
            assert name in PINNED["recipes"]
            for key, x in out:
                section, _, field = key.rpartition(".")
                assert field in fields[section], f"{key} is not a Megatron-Bridge 0.6.2 field"
                if key == "mixed_precision":
                    assert x in PINNED["mixed_precision"]
    assert set(mb.RECIPES.values()) <= set(PINNED["recipes"])


def test_fsdp_context_and_recompute_written(tmp_path):
    plan = load_plan(DATA / "llama3-70b-interleaved.json")
    (v,) = part_views(plan)
    name, out, notes = mb.overrides(replace(v, recompute=True))
    o = dict(out)
    assert (o["model.recompute_granularity"], o["model.recompute_method"],
            o["model.recompute_num_layers"]) == ("full", "uniform", 1)
    assert o["ddp.use_megatron_fsdp"] is True and o["checkpoint.ckpt_format"] == "fsdp_dtensor"
    assert o["model.virtual_pipeline_model_parallel_size"] == 2
    ctx = replace(v, layout=replace(v.layout, context=2, context_method="allgather"))
    assert dict(mb.overrides(ctx)[1])["model.cp_comm_type"] == "all_gather"


def test_refusals_are_one_line():
    """A TPU part and a model without a Bridge recipe are refused in one line."""
    (h100, tpu) = part_views(load_plan(DATA / "llama3-70b-h100-tpu-data-parallel.json"))
    with pytest.raises(LauncherError, match=r"tpu-v5e, which Megatron-Bridge cannot run") as e:
        mb.overrides(tpu)
    assert "\n" not in str(e.value)
    with pytest.raises(LauncherError, match="no recipe for Mixtral-8x22B") as e:
        mb.overrides(replace(h100, model=replace(h100.model, name="Mixtral-8x22B-v0.1")))
    assert "\n" not in str(e.value)
