"""Tests of Megatron-Core's named-module recompute: simulator.remat.module_cost / parse_modules,
the ``modules:`` form of the validation CSV's ``recompute`` column, and
simulator.validation_setup.module_recompute."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pytest

from ir import LayerCost, Workload
from simulator import remat as R
from simulator import validation_rows as VR
from simulator import validation_setup as VS

CSV = Path(__file__).resolve().parents[2] / "reports" / "validation" / "published_training.csv"
LINES = CSV.read_text().splitlines()
HEAD = next(csv.reader([LINES[0]]))

# a small block: h 64, 4 heads, dense ffn 256 (SwiGLU); 8 experts, top-2, expert ffn 32, one
# shared expert of 32; latent attention q rank 16, kv rank 8, nope 16 + rope 8, values 16
MOE = R.ModuleShape(hidden=64, heads=4, ffn=256, glu=True, moe=True, experts=8, top_k=2.0,
                    expert_ffn=32, shared_ffn=32, q_rank=16, kv_rank=8, nope=16, rope=8, v_dim=16,
                    attention_flops=1000.0, dtype_bytes=2)
DENSE = R.ModuleShape(hidden=64, heads=4, ffn=256, glu=True, attention_flops=1000.0)
LATENT = dataclasses.replace(MOE, latent=16)


@pytest.mark.parametrize("module, shape, dropped, flops, traffic", [
    ("layernorm", MOE, 2 * 64 * 2, 0.0, 4 * 64 * 2),              # both norms' outputs
    ("moe_act", MOE, 2 * 32 * 2, 0.0, 2 * 3 * 32 * 2),             # fc2's input per routed copy
    ("moe_act", DENSE, 0, 0.0, 0),
    ("mla_up_proj", MOE, 4 * (2 * 24 + 16) * 2, 2.0 * 4 * (16 * 24 + 8 * (16 + 16)), 0),
    ("mla_up_proj", DENSE, 0, 0.0, 0),                             # no latent attention
    ("mlp", DENSE, 3 * 256 * 2, 2.0 * 64 * 256 * 3, 3 * 256 * 2),
    ("mlp", MOE, 0, 0.0, 0),                                       # Megatron: dense layers only
    ("shared_experts", MOE, 3 * 32 * 2, 2.0 * 64 * 32 * 3, 3 * 32 * 2),
    ("moe", MOE, 2 * (64 + 3 * 32) * 2 + 4 * 8 + 3 * 32 * 2,
     2.0 * 64 * 8 + 2.0 * 2 * 64 * 32 * 3 + 2.0 * 64 * 32 * 3, 2 * 3 * 32 * 2 + 3 * 32 * 2),
    ("core_attn", MOE, 0, 1000.0, 0),
    # LatentMoE at latent 16: the permuted rows and expert matmuls at 16 wide, plus the
    # down-projected tokens kept and both 64 x 16 projections rerun
    ("moe", LATENT, 2 * (16 + 3 * 32) * 2 + 16 * 2 + 4 * 8 + 3 * 32 * 2,
     2.0 * 64 * 8 + 2.0 * 2 * 16 * 32 * 3 + 4.0 * 64 * 16 + 2.0 * 64 * 32 * 3,
     2 * 3 * 32 * 2 + 3 * 32 * 2),
])
def test_each_module_drops_its_saved_bytes_and_reruns_its_forward(module, shape, dropped, flops,
                                                                  traffic):
    c = R.module_cost(module, shape)
    assert (c.dropped_bytes, c.rerun_flops, c.rerun_traffic_bytes) == (dropped, flops, traffic)


def test_moe_subsumes_its_parts_and_modules_add():
    assert R.modules_cost(("moe", "moe_act", "shared_experts"), MOE) == R.module_cost("moe", MOE)
    both = R.modules_cost(("layernorm", "moe_act"), MOE)
    assert both.dropped_bytes == 256 + 128 and both.rerun_traffic_bytes == 512 + 384


def test_module_names_parse_and_a_bad_one_is_named_in_one_line():
    assert R.parse_modules("modules:LayerNorm, moe_act") == ("moe_act", "layernorm")
    with pytest.raises(R.RematError) as e:
        R.parse_modules("modules:moe_act,attn")
    msg = str(e.value)
    assert "\n" not in msg and "'attn'" in msg
    assert "core_attn, mlp, moe, moe_act, layernorm, shared_experts, mla_up_proj" in msg
    with pytest.raises(R.RematError, match="names no module"):
        R.parse_modules("modules:")
    p = R.policy("modules:mla_up_proj,mlp", R.LayerShape(64, 4, 4, 16, 256, True, 128))
    assert (p.name, p.cost_model) == ("modules:mlp,mla_up_proj", "modules")


def _csv(tmp_path, *rows: dict) -> Path:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=HEAD, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    p = tmp_path / "rows.csv"
    p.write_text(out.getvalue())
    return p


def _row(line: int, **kw) -> dict:
    d = dict(zip(HEAD, next(csv.reader([LINES[line - 1]]))))
    d.update(kw)
    return d


def test_the_recompute_column_takes_named_modules(tmp_path):
    p = _csv(tmp_path, _row(2, recompute="modules:moe_act,LAYERNORM"),
             _row(3, recompute="modules:moe_act,bogus"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.recompute for r in rows] == ["modules:moe_act,layernorm"]
    assert len(bad) == 1 and bad[0].line == 3
    assert bad[0].reason.startswith("recompute module 'bogus' unknown; fix: use modules from "
                                    "core_attn, mlp, moe, moe_act, layernorm")
    assert "\n" not in bad[0].reason


def test_bundled_nemo_rows_name_their_recipes_modules():
    rows = [dict(zip(HEAD, f)) for f in csv.reader(LINES[1:])]
    named = [r for r in rows if r["recompute"].startswith("modules:")]
    # NVIDIA's Megatron-Bridge recipes (recompute_modules=[...]) and DGX Cloud's DeepSeek-V3
    # launch, which passes NeMo's --recompute_modules
    assert named and all(r["source"].startswith(("nemo-25.", "dgxc-25.05")) for r in named)
    assert all("recompute_modules=[" in r["note"] or "--recompute_modules" in r["note"]
               for r in named)
    assert {r["source"] for r in named if r["source"].startswith("dgxc")} == {
        "dgxc-25.05", "dgxc-25.05.04"}
    for r in named:
        R.parse_modules(r["recompute"])


def _block(**kw) -> LayerCost:
    base = dict(name="decoder_block", fwd_flops_per_sample=1e9, bwd_flops_per_sample=2e9,
                bwd_input_flops_per_sample=1e9, fwd_bytes_fixed=0.0, fwd_bytes_per_sample=0.0,
                bwd_bytes_fixed=0.0, bwd_bytes_per_sample=0.0, param_count=1,
                param_bytes=2.0, activation_bytes_per_sample=64 * 128 * 2,
                residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=0.0,
                experts=8, experts_per_token=2.0, expert_width=32, shared_expert_width=32,
                mla_q_rank=16, mla_kv_rank=8, mla_nope_dim=16, mla_rope_dim=8, mla_v_dim=16,
                attention_fwd_flops_per_sample=1000.0 * 128)
    base.update(kw)
    return LayerCost(**base)  # type: ignore[arg-type]


def test_module_recompute_reduces_residuals_and_adds_the_rerun():
    embed = _block(name="embed", experts=0)
    w = Workload("t", ("embed", "decoder_block"), {"embed": embed, "decoder_block": _block()},
                 seq_len=128, global_batch=8)
    row = VR.Row(source="s", model="t", layers=1, hidden=64, heads=4, seq_len=128, vocab=None,
                 device="h100-sxm", gpus=1, tp=1, pp=1, dp=1, global_batch=8, micro_batch=1,
                 microbatches=None, schedule=None, metric="iteration_s", value=1.0, ffn=256,
                 head_dim=16, glu=True, recompute="modules:mla_up_proj,moe_act,layernorm")
    out = VS.module_recompute(w, row)
    mc = R.modules_cost(("moe_act", "layernorm", "mla_up_proj"), VS.block_shape(row, _block()))
    assert mc.dropped_bytes == 512 + 128 + 256
    b = out.costs["decoder_block"]
    assert b.residual_bytes_per_sample == 1e7 - 128 * (512 + 128 + 256)
    assert b.bwd_flops_per_sample == 2e9 + 128 * 5120
    assert b.bwd_input_flops_per_sample == 1e9 + 128 * 5120
    assert b.bwd_other_bytes_per_sample == 128 * (384 + 512)
    assert out.costs["embed"] == embed
    # never below the block's input, which every checkpoint keeps
    small = Workload("t", ("decoder_block",), {"decoder_block": _block(residual_bytes_per_sample=
                                                                      20000.0)}, 128, 8)
    kept = VS.module_recompute(small, row).costs["decoder_block"].residual_bytes_per_sample
    assert kept == 64 * 128 * 2
