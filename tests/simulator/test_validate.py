"""Tests of simulator.validate (fast: synthetic workloads; the full run is marked slow)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from ir import LayerCost, Layout, Workload
from hardware_profiles import load_device
from simulator import validate as V

CSV = Path(__file__).resolve().parents[2] / "reports" / "validation" / "published_training.csv"


def _lc(name: str, f: float, params: int = 1000) -> LayerCost:
    return LayerCost(name=name, fwd_flops_per_sample=f, bwd_flops_per_sample=2 * f,
                     bwd_input_flops_per_sample=f, fwd_bytes_fixed=1e6, fwd_bytes_per_sample=1e6,
                     bwd_bytes_fixed=2e6, bwd_bytes_per_sample=2e6, param_count=params,
                     param_bytes=2.0 * params, activation_bytes_per_sample=1e6,
                     residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=2e6)


def fake_workload(row: V.Row) -> Workload:
    costs = {"embed": _lc("embed", 1e6), "decoder_block": _lc("decoder_block", 1e11),
             "head": _lc("head", 5e10)}
    return Workload(model=f"fake-{row.model}", layers=("embed",) + ("decoder_block",) * row.layers
                    + ("head",), costs=costs, seq_len=row.seq_len, global_batch=row.global_batch)


def _row(**kw) -> V.Row:
    base = dict(source="zb", model="1.5B", layers=22, hidden=2304, heads=24, seq_len=1024,
                vocab=None, device="a100-80gb-sxm", gpus=8, tp=1, pp=8, dp=1, global_batch=144,
                micro_batch=6, microbatches=24, schedule="1f1b", metric="samples_per_gpu_s",
                value=11.8)
    base.update(kw)
    return V.Row(**base)


def test_csv_rows_load():
    from mpmd.cli.validate import model_fill

    rows = [r for r in V.load_rows(CSV, fill=model_fill(CSV))      # the FP8 twins, Blackwell
            if r.precision == "bf16" and r.device not in ("b200", "gb200", "gb300")  # and the
            and r.ep == 1]                                            # mixtures of experts aside
    assert len(rows) == 100
    station = [r for r in V.load_rows(CSV, fill=model_fill(CSV)) if r.source == "dgx-station-nvfp4"]
    assert [(r.device, r.gpus, r.recipe, r.bf16_first_layers, r.bf16_last_layers)
            for r in station] == [("gb300", 1, "bf16", 0, 0), ("gb300", 1, "nvfp4", 0, 4)]
    moe = [r for r in V.load_rows(CSV, fill=model_fill(CSV)) if r.ep > 1]
    assert len(moe) == 54 and {r.model_config for r in moe} == {
        "deepseek-v3", "deepseek-v3-mtp", "qwen3-235b-a22b", "qwen3-30b-a3b", "gpt-oss-120b",
        "grok-1-314b"}
    # NVIDIA's published DeepSeek-V3 layouts (NeMo's first/last split, Megatron-Bridge's strings)
    laid = {(r.source, r.pp, r.vp, r.pipeline_layout) for r in moe if r.pipeline_layout}
    assert laid == {("dgxc-25.05", 16, 1, "Et*3|(t*4|)*14t*2mL"),
                    ("dgxc-25.05.04", 16, 1, "Et*3|(t*4|)*14t*2mL"),
                    ("dgxc-25.05.04", 8, 1, "Et*7|(t*8|)*6t*6mL"),
                    ("nemo-25.09", 8, 4, "Et|(tt|)*30mL"),
                    # the 32-stage string 25.09's run_script passes everywhere: Megatron-Core
                    # takes VP = stages / PP from it (B200 PP 16 -> 2, GB200 PP 4 -> 8)
                    ("nemo-25.09", 16, 2, "Et|(tt|)*30mL"),
                    ("nemo-25.09", 4, 8, "Et|(tt|)*30mL"),
                    ("nemo-25.11", 16, 1, "Et*4|(t*4|)*14tmL"),
                    ("nemo-25.11", 4, 4, "Et*4|(t*4|)*14tL")}
    assert all(r.model_config == "deepseek-v3-mtp" for r in moe if "m" in (r.pipeline_layout or ""))
    # Megatron-Core's expert tensor degree defaults to tp: the 24.11 / 25.02 Grok-1 yamls set none
    assert {(r.source, r.etp) for r in moe if r.model_config == "grok-1-314b"} == {
        ("dgxc-24.11", 4), ("dgxc-25.02", 4), ("dgxc-25.05", 4), ("dgxc-25.05.01", 1),
        ("dgxc-25.05.02", 1)}
    # NVIDIA's dispatchers as the recipes set them: 25.09's token-dropping runs, DeepEP on H100,
    # HybridEP on the 25.11 racks, the all-to-all gpt-oss's provider keeps, and the capacity
    # factor every DGX Cloud Grok-1 and DeepSeek-V3 config or NeMo script sets (no MoE row left
    # blank); Megatron-Core's all-to-all overlap where the recipe sets it
    assert sorted((r.source, r.dispatcher) for r in moe if r.dispatcher) == sorted(
        [("nemo-25.09", "tokendrop")] * 12 + [("nemo-25.09", "deepep")]
        + [("nemo-25.11", "deepep")] * 8 + [("dgxc-24.11", "tokendrop")] * 6
        + [("nemo-25.11", "alltoall")] * 8 + [("dgxc-25.02", "tokendrop")] * 6
        + [("dgxc-25.05", "tokendrop")] * 7 + [("dgxc-25.05.01", "tokendrop")] * 2
        + [("dgxc-25.05.02", "tokendrop")] * 2 + [("dgxc-25.05.04", "tokendrop")] * 2)
    assert all(r.dispatcher for r in moe if r.ep > 1)
    assert sorted((r.source, r.model, r.device) for r in moe
                  if r.schedule == "1f1b-interleaved-a2a") == [
        ("nemo-25.09", "deepseek-v3", "h100-sxm"), ("nemo-25.11", "qwen3-235b-a22b", "b200"),
        ("nemo-25.11", "qwen3-30b-a3b", "h100-sxm")]
    assert {r.device for r in rows} == {"a100-80gb-sxm", "h100-sxm", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"}
    assert rows[0].vocab is None and rows[0].devices_per_node == 8 and rows[0].glu is None
    tt = [r for r in rows if r.metric == "tokens_per_gpu_s" and r.device == "h100-sxm"]
    assert len(tt) == 16 and {r.source for r in tt} == {"torchtitan-h100", "llm-foundry",
                                                         "nemo-automodel"}
    # NeMo's performance recipes overlap tensor-parallel traffic; nothing else states it
    over = [r for r in rows if r.tp_overlap]
    assert len(over) == 15 and {r.source for r in over} == {"dgxc-h100"} and min(r.tp for r in over) == 4
    assert V.row_layout(over[0]).tp_overlap and not V.row_layout(rows[0]).tp_overlap
    assert tt[0].kv_heads == 8 and tt[0].glu and tt[0].fsdp
    assert tt[0].scale_out_gbit_per_device == 400.0 and tt[0].recompute == "op"
    assert tt[0].memory_bandwidth_gb_per_s == 2400.0
    assert {r.source for r in rows if r.attention == "unfused"} == {
        "narayanan", "korthikanti", "bloom", "palm"}
    v5p = [r for r in rows if r.device == "tpu-v5p"]
    # MaxText counts its per-device batch over every chip: 6 per chip x 4-way tensor parallel
    assert v5p[0].micro_batch == 24 and v5p[0].micro_batch * v5p[0].dp == v5p[0].global_batch
    assert {r.head_dim for r in v5p} == {128} and v5p[1].slices == 2


def test_row_builds_expected_1f1b_plan():
    s = V.row_setup(_row(), fake_workload)
    p = s.plan
    assert p.microbatches == 24 and p.schedule.name == "1f1b" and s.schedule == "1f1b"
    assert p.rank_mesh == tuple(f"stage{k}" for k in range(8))
    # 22 blocks over 8 stages: [2,3,3,3,3,3,3,2]; embed on the first, head on the last
    blocks = [st.last - st.first - (st.index == 0) - (st.index == 7) for st in p.stages]
    assert blocks == [2, 3, 3, 3, 3, 3, 3, 2]
    assert p.stages[0].first == 0 and p.stages[-1].last == 24
    assert all(l.data == 1 and l.tensor == 1 for l in p.layouts.values())
    assert not any(p.recompute.values()) and s.recompute == "none"
    # each blank field is filled by its one rule, and the rule is printed
    assert "vocab: " + V.RULES["vocab"] in s.assumptions and "recompute: none" in s.assumptions


def test_row_builds_interleaved_and_zb_plans():
    s = V.row_setup(_row(schedule="1f1b-interleaved"), fake_workload)
    assert s.schedule == "interleaved-1f1b" and s.virtual_stages == 3
    assert len(s.plan.stages) == 24 and s.plan.stages[5].mesh == "stage5"
    assert s.plan.stages[13].mesh == "stage5"
    # every rank holds the same blocks as under 1F1B
    per_rank = {}
    for st in s.plan.stages:
        n = st.last - st.first - (st.index == 0) - (st.index == 23)
        per_rank[st.mesh] = per_rank.get(st.mesh, 0) + n
    assert [per_rank[f"stage{k}"] for k in range(8)] == [2, 3, 3, 3, 3, 3, 3, 2]
    # the paper's automatic schedules, generated from the row's own stage times
    assert V.row_setup(_row(schedule="zb-1p"), fake_workload).plan.schedule.name == "zb-1p"
    z2 = V.row_setup(_row(schedule="zb-2p"), fake_workload).plan.schedule
    assert z2.name == "zb-2p" and z2.split_backward


def test_narayanan_row_choices_and_layouts():
    r = _row(source="narayanan", model="145.6B", layers=80, hidden=12288, heads=96, seq_len=2048,
             gpus=1536, tp=8, pp=8, dp=24, global_batch=2304, micro_batch=None, microbatches=None,
             schedule=None, metric="tflops_per_gpu", value=148, recompute="full",
             tp_overlap=False)     # as the CSV states for 2021 Megatron-LM
    s = V.row_setup(r, fake_workload)
    assert s.micro_batch == 1 and s.microbatches == 96 and s.schedule == "interleaved-1f1b"
    assert s.virtual_stages == 2 and s.recompute == "full" and all(s.plan.recompute.values())
    assert set(s.plan.layouts.values()) == {Layout(24, 8)}
    c = V.build_cluster(r, load_device("a100-80gb-sxm"))
    m = c.meshes["stage0"]
    assert m.num_devices == 192 and dict(m.axes) == {"data": 24, "tensor": 8}
    assert m.devices_per_node == 8
    # tp 8 leaves one data-parallel member per node: one ring over one network card
    assert m.collective_link(24, 8).bandwidth == m.scale_out_link.bandwidth
    assert m.collective_link(8) is m.intra_link
    assert c.link_between("stage0", "stage1").link.bandwidth == pytest.approx(25e9 * 192)


def test_cluster_links_follow_nodes_and_the_rows_network():
    dev = load_device("a100-80gb-sxm")
    c = V.build_cluster(_row(model="14.6B", gpus=16, pp=16), dev)
    nv = c.link_between("stage0", "stage1").link.bandwidth
    ib = c.link_between("stage7", "stage8").link.bandwidth
    assert nv == pytest.approx(300e9) and ib == pytest.approx(25e9)     # blank: the profile's NIC
    assert c.meshes["stage3"].scale_out_link is None
    c = V.build_cluster(_row(model="14.6B", gpus=16, pp=16, scale_out_gbit_per_device=100.0), dev)
    assert c.link_between("stage7", "stage8").link.bandwidth == pytest.approx(12.5e9)
    c = V.build_cluster(_row(model="14.6B", gpus=16, pp=16, devices_per_node=4), dev)
    assert c.link_between("stage3", "stage4").link.bandwidth == pytest.approx(25e9)
    assert c.link_between("stage4", "stage5").link.bandwidth == pytest.approx(300e9)


def test_power_cap_from_the_column_or_the_note_scales_the_peak():
    from simulator.validation_setup import power_capped, power_limit

    dev = load_device("h100-sxm")
    assert power_limit(_row()) == (None, None)                                   # no cap stated
    noted = _row(note="H100 96GB HBM2e at a 500 W power limit (below the 700 W SXM TDP)")
    assert power_limit(noted) == (500.0, "power_limit_w: 500 W (from the note)")
    assert power_limit(dataclasses.replace(noted, power_limit_w=600.0)) == (600.0, None)
    capped = power_capped(dev, 500.0)
    f = 500 / 700                               # power ~ clock at the voltage floor
    assert capped.peak_flops["bf16"] == pytest.approx(989e12 * f, rel=1e-12)
    assert capped.memory_bandwidth == dev.memory_bandwidth and capped.tdp_watts == 500.0
    assert power_capped(dev, 700.0) is dev and power_capped(dev, None) is dev
    row = dataclasses.replace(noted, device="h100-sxm", gpus=8, pp=1, dp=8, global_batch=16,
                              micro_batch=2, microbatches=1, schedule=None)
    mesh = V.build_cluster(row, dev).meshes["stage0"]
    assert mesh.device.peak_flops["bf16"] == pytest.approx(989e12 * f, rel=1e-12)
    assert "power_limit_w: 500 W (from the note)" in V.row_setup(row, fake_workload).assumptions


def test_eager_run_from_the_column_or_the_note_charges_every_unfused_op():
    from simulator.validation_setup import eager, row_device

    dev = load_device("h100-sxm")
    assert eager(_row()) == (False, None)
    noted = _row(note="FSDP2 eager (no torch.compile, no Float8)")
    assert eager(noted) == (True, "eager: 1 (from the note: elementwise traffic 1)")
    assert eager(dataclasses.replace(noted, eager=False)) == (False, None)   # the column wins
    assert row_device(noted, dev).elementwise_traffic == 1.0
    assert row_device(_row(), dev) is dev                                    # no cap, not eager


def test_interleaving_rule_reads_layers_per_rank_not_the_source():
    few = V.row_setup(_row(source="anything", schedule="1f1b-interleaved"), fake_workload)
    assert few.virtual_stages == 3                      # 22 layers / 8 ranks: one layer per chunk
    many = V.row_setup(_row(source="zb", layers=80, schedule="1f1b-interleaved", pp=8),
                       fake_workload)
    assert many.virtual_stages == 2                     # 10 per rank: Megatron's 2 chunks


def test_virtual_stage_candidates_divide_a_ranks_layers():
    assert V.virtual_stage_candidates(_row(layers=80, pp=8)) == [2, 5, 10]
    assert V.virtual_stage_candidates(_row(layers=22, pp=8)) == [3]      # ceil(22 / 8) = 3
    assert V.virtual_stage_candidates(_row(layers=8, pp=8)) == [2]       # one layer each: 2
    assert V.virtual_stage_candidates(_row(layers=126, pp=16)) == [2, 4, 8]


def test_tuned_interleaving_takes_the_fastest_chunk_count():
    row = _row(layers=80, pp=8, schedule="1f1b-interleaved", microbatches=None)
    seen = []

    def step(plan, workload, cluster):           # 5 chunks fastest; 2 and 10 slower
        v = plan.schedule.num_stages // 8
        seen.append(v)
        return {2: 3.0, 5: 1.0, 10: 2.0}[v]

    dev = load_device("a100-80gb-sxm")
    assert V.tune_virtual_stages(row, fake_workload(row), 6, "none", step, dev) == (5, 1.0,
                                                                                    [2, 5, 10])
    assert seen == [2, 5, 10]
    s = V.row_setup(row, fake_workload, step_fn=step, device=dev)
    assert s.virtual_stages == 5 and s.plan.schedule.num_stages == 40
    assert "5 virtual stages (the fastest of v in {2, 5, 10})" in s.assumptions
    tie = V.row_setup(row, fake_workload, step_fn=lambda p, w, c: 1.0, device=dev)
    assert tie.virtual_stages == 2                                       # ties keep the smaller v
    plain = V.row_setup(_row(schedule="1f1b"), fake_workload, step_fn=step, device=dev)
    assert plain.virtual_stages == 1 and seen == [2, 5, 10] * 2          # only interleaved tunes


def test_other_published_schedules_build_with_each_rank_holding_its_layers():
    """GPipe, ZB-H1/H2, ZB-V and DualPipe-V rows (any case) build plans in which every rank holds
    the layers split_layers gives it, whatever the schedule's stage-to-rank map (V-shaped for ZB-V:
    rank 0 holds the first and the last stage)."""
    for sched, name, S in (("GPipe", "gpipe", 8), ("zb-h1", "zb-h1", 8), ("ZB-H2", "zb-h2", 8),
                           ("zbv", "zb-v", 16), ("zb-v", "zb-v", 16),
                           ("dualpipe-v", "dualpipe-v", 16)):
        row = dataclasses.replace(_row(), schedule=sched.lower())
        p = V.row_setup(row, fake_workload).plan
        assert p.schedule.name == name and p.schedule.num_stages == S
        per_mesh = {}
        for st in p.stages:
            blocks = st.last - st.first - (st.index == 0) - (st.index == S - 1)
            per_mesh[st.mesh] = per_mesh.get(st.mesh, 0) + blocks
        assert [per_mesh[f"stage{r}"] for r in range(8)] == V.split_layers(22, 8)
    v = V.row_setup(dataclasses.replace(_row(), schedule="zb-v"), fake_workload).plan
    assert v.stages[0].mesh == v.stages[15].mesh == "stage0"


def test_schedule_names_are_read_case_insensitively(tmp_path):
    text = CSV.read_text().splitlines()
    head, first = text[0], text[1].replace(",1f1b,", ",1F1B,")
    f = tmp_path / "rows.csv"
    f.write_text(head + "\n" + first + "\n")
    assert V.load_rows(f)[0].schedule == "1f1b"


def test_fsdp_rows_get_fsdp_and_hybrid_sharding_across_slices():
    r = _row(source="x", layers=4, tp=1, pp=1, dp=1024, gpus=1024, global_batch=2048,
             micro_batch=2, microbatches=1, schedule=None, fsdp=True, slices=4,
             device="tpu-v5e", metric="tflops_per_device", value=100.0)
    assert V.row_layout(r) == Layout(1024, 1, fsdp=True, hsdp=4) and r.node_size == 256
    s = V.row_setup(r, fake_workload)
    assert set(s.plan.layouts.values()) == {Layout(1024, 1, fsdp=True, hsdp=4)}
    assert "hybrid sharding: fsdp within each of 4 slices" in s.assumptions
    c = V.build_cluster(r, load_device("tpu-v5e"))
    m = c.meshes["stage0"]
    assert m.devices_per_node == 256 and m.scale_out_link.bandwidth == pytest.approx(25e9 / 8)


def test_selective_recompute_adds_attention_core():
    w = fake_workload(_row())
    ws = V.selective_recompute(w, 2304)
    extra = 4.0 * 1024 ** 2 * 2304
    assert ws.costs["decoder_block"].bwd_flops_per_sample == 2e11 + extra
    assert ws.costs["decoder_block"].bwd_input_flops_per_sample == 1e11 + extra
    assert ws.costs["head"] == w.costs["head"]
    half = V.selective_recompute(w, 2304, 0.5)
    assert half.costs["decoder_block"].bwd_flops_per_sample == 2e11 + extra / 2


def test_attention_kernel_column_note_and_rule():
    assert V.attention_kernel(_row()) == ("flash", None)                       # the rule
    assert V.attention_kernel(_row(attention="unfused")) == ("unfused", None)  # the column
    noted = _row(note="Megatron-LM with its fused scale-mask-softmax kernel")
    assert V.attention_kernel(noted) == ("unfused", "attention: unfused (from the note)")
    assert "attention: unfused (from the note)" in V.row_setup(noted, fake_workload).assumptions


def test_op_recompute_reruns_every_second_matmul_and_the_non_matmul_ops():
    import dataclasses

    w = fake_workload(_row())
    blk = dataclasses.replace(w.costs["decoder_block"], fwd_other_bytes_per_sample=3e8,
                              bwd_other_bytes_per_sample=5e8, bwd_input_other_bytes_per_sample=2e8)
    w = dataclasses.replace(w, costs={**w.costs, "decoder_block": blk})
    # Llama 3 8B's block: wq, wk, wv, wo, w1, w3, w2 -> wk (4096 x 1024), wo, w3 (4096 x 14336)
    llama = _row(hidden=4096, heads=32, kv_heads=8, ffn=14336, glu=True, seq_len=8192,
                 recompute="op")
    op = V.op_recompute(w, llama).costs["decoder_block"]
    extra = 2.0 * 8192 * (4096 * 1024 + 4096 * 4096 + 4096 * 14336)
    assert op.bwd_flops_per_sample == 2e11 + extra
    assert op.bwd_input_flops_per_sample == 1e11 + extra
    assert (op.bwd_other_bytes_per_sample, op.bwd_input_other_bytes_per_sample) == (8e8, 5e8)
    assert V.op_recompute(w, llama).costs["head"] == w.costs["head"]
    # it keeps the block input, wq, wv, w1, w2 and the kernel's output and log-sum-exp
    kept = (4096 + 4096 + 1024 + 4096 + 14336 + 4096 + 2 * 32) * 8192 * w.dtype_bytes
    assert op.residual_bytes_per_sample == min(blk.residual_bytes_per_sample, kept)
    big = dataclasses.replace(blk, residual_bytes_per_sample=10 * kept)
    wb = dataclasses.replace(w, costs={**w.costs, "decoder_block": big})
    assert V.op_recompute(wb, llama).costs["decoder_block"].residual_bytes_per_sample == kept
    # GPT's block: wq, wk, wv, wo, w1, w2 -> wk, wo, w2
    gpt = V.op_recompute(w, _row(recompute="op")).costs["decoder_block"]
    assert gpt.bwd_flops_per_sample == 2e11 + 2.0 * 1024 * (2304 ** 2 + 2304 ** 2 + 4 * 2304 ** 2)
    setup = V.row_setup(llama, fake_workload)
    assert setup.recompute == "op" and not any(setup.plan.recompute.values())
    assert any(a.startswith("op-level selective recompute (torchtitan)") for a in setup.assumptions)


def test_layer_recompute_reruns_one_block_in_two_on_average():
    import dataclasses

    w = fake_workload(_row())
    blk = dataclasses.replace(w.costs["decoder_block"], fwd_other_bytes_per_sample=3e8,
                              fwd_bytes_per_sample=4e8, fwd_bytes_fixed=1e8)
    w = dataclasses.replace(w, costs={**w.costs, "decoder_block": blk})
    got = V.layer_recompute(w, 2304).costs["decoder_block"]
    assert (got.bwd_flops_per_sample, got.bwd_input_flops_per_sample) == (2e11 + 5e10, 1e11 + 5e10)
    assert got.bwd_other_bytes_per_sample == blk.bwd_other_bytes_per_sample + 1.5e8
    assert got.bwd_bytes_per_sample == blk.bwd_bytes_per_sample + 2e8
    assert got.bwd_bytes_fixed == blk.bwd_bytes_fixed + 5e7
    assert V.layer_recompute(w, 2304, every=4).costs["decoder_block"].bwd_flops_per_sample == 2e11 + 2.5e10
    # the checkpointed block keeps its input only: half the blocks, on average
    block_input = 2304 * w.seq_len * w.dtype_bytes
    assert got.residual_bytes_per_sample == (0.5 * blk.residual_bytes_per_sample
                                             + 0.5 * min(block_input, blk.residual_bytes_per_sample))
    setup = V.row_setup(_row(recompute="layer"), fake_workload)
    assert setup.recompute == "layer" and not any(setup.plan.recompute.values())
    assert setup.workload.costs["decoder_block"].bwd_flops_per_sample == 2e11 + 5e10


def test_memory_bandwidth_column_sets_the_rows_part():
    from hardware_profiles.loader import load_device

    h100 = load_device("h100-sxm")
    row = _row(device="h100-sxm", memory_bandwidth_gb_per_s=2410.0)
    assert V.row_device(row, h100).memory_bandwidth == 2410e9
    assert V.row_device(_row(device="h100-sxm"), h100).memory_bandwidth == h100.memory_bandwidth


def test_maxtext_and_palm_flop_counts_exact():
    r = _row(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, ffn=256, glu=True, vocab=100,
             seq_len=16, global_batch=3, gpus=2, tp=1, pp=1, dp=2, micro_batch=None,
             microbatches=None, metric="tflops_per_device")
    weights = 64 * 256 * 3 + 64 * (4 + 2 * 2) * 32 + 4 * 32 * 64
    want = 3.0 * 3 * 16 * (2 * (weights * 2 + 64 * 100) + 4 * 16 * 4 * 32 * 2)
    assert V.maxtext_flops(r) == want
    assert V.metric_from_step(r, 2.0) == pytest.approx(want / 2.0 / 2 / 1e12, rel=1e-15)
    palm = (6.0 * (weights * 2 + 64 * 100) + 12.0 * 2 * 4 * 32 * 16) * 3 * 16
    assert V.palm_flops(r) == palm
    m = _row(**{**{k: getattr(r, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                             "ffn", "glu", "vocab", "seq_len", "global_batch",
                                             "gpus", "tp", "pp", "dp")}, "metric": "mfu"})
    assert V.metric_from_step(m, 2.0, 1e12) == pytest.approx(palm / 2.0 / (2 * 1e12), rel=1e-15)
    t = _row(metric="tokens_per_gpu_s")
    assert V.metric_from_step(t, 2.0) == 144 * 1024 / 2.0 / 8
    with pytest.raises(V.ValidationError, match="peak"):
        V.metric_from_step(m, 2.0)


def test_metric_conversions_exact():
    r = _row()
    assert V.metric_from_step(r, 2.0) == 144 / 2.0 / 8
    k = _row(metric="iteration_s")
    assert V.metric_from_step(k, 1.25) == 1.25
    n = _row(source="narayanan", layers=24, hidden=2304, seq_len=2048, gpus=32, global_batch=512,
             metric="tflops_per_gpu")
    f = 96 * 512 * 2048 * 24 * 2304 ** 2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert V.narayanan_flops(512, 2048, 24, 2304, 51200) == pytest.approx(f, rel=1e-15)
    assert V.metric_from_step(n, 3.0) == pytest.approx(f / 3.0 / 32 / 1e12, rel=1e-15)


def test_ranking_agrees_on_synthetic_inputs():
    m = {"1f1b": 11.8, "1f1b-interleaved": 13.1, "zb-1p": 12.9, "zb-2p": 14.5}
    assert V.ranking_agrees(m, {"1f1b": 1, "1f1b-interleaved": 3, "zb-1p": 2, "zb-2p": 4})
    assert not V.ranking_agrees(m, {"1f1b": 1, "1f1b-interleaved": 2, "zb-1p": 3, "zb-2p": 4})
    assert not V.ranking_agrees(m, {"1f1b": 1, "1f1b-interleaved": 3, "zb-1p": 3, "zb-2p": 4})
    tie = {"a": 1.0, "b": 1.0, "c": 2.0}
    assert V.ranking_agrees(tie, {"a": 1.0, "b": 0.5, "c": 3.0})
    assert V.ranking_agrees(tie, {"a": 0.5, "b": 1.0, "c": 3.0})
    with pytest.raises(V.ValidationError):
        V.ranking_agrees(tie, {"a": 1.0})


def test_small_rows_simulate_and_predict_agree():
    from planner.predict import predict

    dev = load_device("a100-80gb-sxm")
    for sched in ("1f1b", "1f1b-interleaved", "zb-1p", "zb-2p"):
        s = V.row_setup(_row(schedule=sched), fake_workload)
        c = V.build_cluster(s.row, dev)
        a, b = V.sim_step(s.plan, s.workload, c), predict(s.plan, s.workload, c).step_time_s
        assert a > 0 and math.isclose(a, b, rel_tol=0.01)


GOOD = "zb,1.5B,22,2304,24,1024,,a100-80gb-sxm,8,1,8,1,144,6,24,1f1b,samples_per_gpu_s,11,,,,,,,,8,,"


@pytest.mark.parametrize("row, match", [
    (GOOD.replace(",8,1,8,1,144", ",8,1,4,1,144"), r"row 2: tp\*pp\*dp = 4 != gpus=8"),
    (GOOD.replace("a100-80gb-sxm", "a100-40gx"), r"row 2: device 'a100-40gx' is not a known profile"),
    (GOOD.replace("samples_per_gpu_s", "hfu"), r"row 2: metric 'hfu' unknown"),
    (GOOD.replace(",144,6,24,", ",145,6,24,"), r"row 2: global_batch 145 is not micro_batch x"),
    (GOOD.replace(",,,,,,,,8,,", ",,,,,,maybe,,8,,"), r"row 2: recompute 'maybe' unknown"),
    (GOOD.replace(",,,,,,,,8,,", ",,,,2,,,,8,,"), r"row 2: glu='2' is not 0 or 1"),
])
def test_bad_rows_raise_one_line(tmp_path, row, match):
    p = tmp_path / "x.csv"
    p.write_text(CSV.read_text().splitlines()[0] + "\n" + row + "\n")
    with pytest.raises(V.ValidationError, match=match) as e:
        V.load_rows(p)
    assert "\n" not in str(e.value) and "fix" in str(e.value)


def test_bad_rows_raise(tmp_path):
    p = tmp_path / "x.csv"
    p.write_text(CSV.read_text().splitlines()[0] + "\n" + GOOD + "\n")
    assert len(V.load_rows(p)) == 1
    with pytest.raises(V.ValidationError, match="microbatches"):
        V.row_setup(_row(microbatches=25), fake_workload)


def _per_kind():
    """The bundled profiles (each fitted by ``mpmd validate --fit`` on its own kind's rows)
    reproduce validation.md's per-kind mean and max error, and predict = simulate within 1%."""
    import re

    from mpmd.cli.validate import model_fill, predict_step, workload_for

    md = (CSV.parent / "validation.md").read_text()
    want = dict((d, (float(m), float(x))) for d, m, x in re.findall(
        r"- \*\*([\w.-]+)\*\*: mean ([\d.]+)%, max ([\d.]+)%", md))
    assert set(want) == {"a100-80gb-sxm", "h100-sxm", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e",
                         "gb200", "b200", "gb300", "a100-40gb-sxm", "v100-sxm2-16gb",
                         "v100-sxm2-32gb"}, \
        "validation.md has no per-kind summary; run mpmd validate --fit --out"
    setups = [V.row_setup(r, workload_for, step_fn=predict_step, device=load_device(r.device))
              for r in V.load_rows(CSV, fill=model_fill(CSV))]   # as `mpmd validate` builds them
    res = []
    for dev in want:
        mine = [s for s in setups if s.row.device == dev]
        sim = V.evaluate(mine, load_device(dev))
        pred = V.evaluate(mine, load_device(dev), predict_step)
        assert all(math.isclose(a.step_s, b.step_s, rel_tol=0.01) for a, b in zip(sim, pred))
        err, worst = V.mape(sim), max(r.ape for r in sim)
        assert (round(err, 1), round(worst, 1)) == want[dev]
        res += sim
    ranks = V.zb_rankings(res)
    assert len(ranks) == 6
    by_kind = {d: [r for r in res if r.row.device == d] for d in want}
    return by_kind, ranks


@pytest.mark.slow
def test_profile_calibration_reproduces_report_per_device_kind():
    by_kind, ranks = _per_kind()
    assert all(ok for *_, ok in ranks) and all(by_kind.values())


@pytest.mark.slow
def test_issue_11_targets_per_device_kind():
    """Issue 11's targets hold on every kind's dense rows (the mixtures of experts' rows, with
    their one fitted token-path figure, are issue 43's and do not meet them yet: see
    validation.md). The V100 kinds' rows (DeepLearningExamples' BERT-Large, 2020 containers) miss
    both (mean 11.9% and 10.0%, max 26.7% and 21.9% for 16 and 32 GB): TensorFlow's 16 GB runs on 4 and 8 GPUs scale unevenly (112 and 125
    sequences/s per GPU against 134 on one) and its 32 GB runs are faster per GPU at micro batch
    64 than at 16, which no one-efficiency model reproduces; they are held at mean 12% and max
    30% so neither can silently grow."""
    from mpmd.cli.validate import held_out

    by_kind, ranks = _per_kind()
    for dev, sub in by_kind.items():
        dense = [r for r in sub if not held_out(r.setup)]
        mean, worst = (12.0, 30.0) if dev.startswith("v100") else (8.0, 20.0)
        assert V.mape(dense) <= mean and max(r.ape for r in dense) <= worst, dev
    assert all(ok for *_, ok in ranks)


def test_blocking_p2p_holds_the_receivers_compute_stream():
    """The receive side of blocking P2P: each F/B with an input from another mesh spends that
    transfer on its own stream first (``recv_time``); none on an overlapped cluster; the engine
    and the replay agree, and every op starts no earlier than its predecessor's end + recv."""
    import dataclasses

    from ir import FragmentRef
    from planner.predict import predict
    from simulator.plan_costs import PlanCosts
    from simulator.plan_sim import plan_program, simulate_plan

    dev = load_device("a100-80gb-sxm")
    s = V.row_setup(_row(schedule="1f1b"), fake_workload)
    blocking = V.build_cluster(s.row, dev)
    overlapped = dataclasses.replace(blocking, p2p="overlapped")
    cb, co = PlanCosts(s.plan, s.workload, blocking), PlanCosts(s.plan, s.workload, overlapped)
    assert cb.recv_time(FragmentRef("F", 3, 0)) == co.boundary(2, 3)[2] > 0
    assert cb.recv_time(FragmentRef("B", 3, 0)) == co.boundary(4, 3)[2]
    assert cb.recv_time(FragmentRef("F", 0, 0)) == 0.0           # the first stage receives nothing
    assert cb.recv_time(FragmentRef("B", 7, 0)) == 0.0           # nor the last stage's B
    assert co.recv_time(FragmentRef("F", 3, 0)) == 0.0
    prog = plan_program(s.plan, s.workload, blocking)
    res = simulate_plan(s.plan, s.workload, blocking)
    assert res.step_time_s == pytest.approx(predict(s.plan, s.workload, blocking).step_time_s,
                                            rel=1e-9)
    ops = [e for e in res.timeline.events if e.track.endswith("/compute") and e.stage >= 0]
    start = {e.name: e.start_s for e in ops}
    end = {e.name: e.end_s for e in ops}
    held = 0
    for mesh, ids in prog.order.items():
        prev = 0.0
        for i in ids:
            op = prog.ops[i]
            if op.stage < 0:
                continue
            assert start[op.name] >= prev + op.recv_s - 1e-12
            held += op.recv_s > 0 and start[op.name] == pytest.approx(prev + op.recv_s)
            prev = end[op.name]
    assert held > 0                       # some ops were held by their receive, not their input


def test_blocking_p2p_holds_the_senders_compute_stream():
    """Megatron-style blocking P2P: each F/B is longer by its send, the boundary carries 0 s, and
    every sending mesh's busy time grows by exactly its sends."""
    import dataclasses

    from ir import FragmentRef
    from simulator.plan_costs import PlanCosts
    from simulator.plan_sim import simulate_plan

    dev = load_device("a100-80gb-sxm")
    s = V.row_setup(_row(schedule="1f1b"), fake_workload)
    blocking = V.build_cluster(s.row, dev)
    assert blocking.p2p == "blocking"
    overlapped = dataclasses.replace(blocking, p2p="overlapped")
    cb, co = PlanCosts(s.plan, s.workload, blocking), PlanCosts(s.plan, s.workload, overlapped)
    c = co.boundary(0, 1)[2]
    assert c > 0 and cb.boundary(0, 1)[2] == 0.0 and cb.boundary(0, 1)[1] == co.boundary(0, 1)[1]
    f0, b0, b7 = FragmentRef("F", 0, 0), FragmentRef("B", 0, 0), FragmentRef("F", 7, 0)
    assert cb.fragment_time(f0) == co.fragment_time(f0) + c
    assert cb.fragment_time(b0) == co.fragment_time(b0)          # stage 0's B sends nothing
    assert cb.fragment_time(b7) == co.fragment_time(b7)          # the last stage's F neither
    assert cb.send_time(FragmentRef("B", 3, 0)) == co.boundary(3, 2)[2]
    rb, ro = simulate_plan(s.plan, s.workload, blocking), simulate_plan(s.plan, s.workload, overlapped)
    M = s.plan.microbatches
    for k in range(8):
        sends = (M * co.boundary(k, k + 1)[2] if k < 7 else 0.0) + \
                (M * co.boundary(k, k - 1)[2] if k > 0 else 0.0)
        assert rb.busy_s[f"stage{k}"] == pytest.approx(ro.busy_s[f"stage{k}"] + sends, rel=1e-12)
    assert rb.step_time_s > ro.step_time_s


# --------------------------------------------------------------------------- remat, skipped rows
V5P_ROW = dict(source="maxtext-v5p", model="32B", layers=4, hidden=8192, heads=64, seq_len=2048,
               vocab=32000, device="tpu-v5p", gpus=64, tp=4, pp=1, dp=16, global_batch=384,
               micro_batch=24, microbatches=1, schedule=None, metric="tflops_per_device",
               value=328.0, ffn=28672, kv_heads=64, head_dim=128, glu=True, fsdp=True, slices=1)


def test_maxtext_policies_cost_as_the_nearest_option_and_say_so():
    from simulator import remat

    full = V.row_setup(_row(**V5P_ROW, recompute="save_qkv_proj"), fake_workload)
    assert full.recompute == "full" and all(full.plan.recompute.values())
    assert ("remat save_qkv_proj: reruns 80% of the layer's forward (context, out_proj, mlpwi, "
            "mlpwo), costed as full recompute") in full.assumptions
    sel = V.row_setup(_row(**V5P_ROW, recompute="minimal"), fake_workload)
    assert sel.recompute == "selective" and not any(sel.plan.recompute.values())
    # the attention core, rerun (selective_recompute), on the causal blocks a fused kernel runs
    extra = 4.0 * 2048 ** 2 * 64 * 128 * (17 / 32)
    assert sel.workload.costs["decoder_block"].bwd_flops_per_sample == 2e11 + extra
    unfused = V.row_setup(_row(**V5P_ROW, recompute="minimal", attention="unfused"),
                          fake_workload)
    assert unfused.workload.costs["decoder_block"].bwd_flops_per_sample == (
        2e11 + 4.0 * 2048 ** 2 * 64 * 128)
    none = V.row_setup(_row(**V5P_ROW, recompute="minimal_with_context"), fake_workload)
    assert none.recompute == "none" and none.workload.costs == fake_workload(none.row).costs
    assert sel.offload_s == full.offload_s == none.offload_s == 0.0
    # offloading: the same plan as minimal, plus the host transfers, charged exposed
    off = V.row_setup(_row(**V5P_ROW, recompute="minimal_offloaded"), fake_workload)
    assert off.recompute == "selective" and off.plan == sel.plan
    per_token = (3 * 8192 + 2 * 28672 + 8192 + 8192) * 2        # qkv, mlpwi (gated), out, wo; bf16
    want = 2.0 * per_token * (384 * 2048 / (16 * 4)) * 4 / remat.TPU_V5_PCIE_BYTES_PER_S
    assert off.offload_s == want
    note = f"host offload {want * 1e3:.3g} ms per step over 15 GB/s each way (exposed)"
    assert note in off.assumptions
    dev = load_device("tpu-v5p")
    a, b = V.evaluate([sel], dev)[0], V.evaluate([off], dev)[0]
    assert b.step_s == a.step_s + want


def test_per_device_batch_rows_run_the_whole_batch_at_once():
    r = _row(**{**V5P_ROW, "micro_batch": None, "microbatches": None}, per_device_batch=6.0,
             global_batch_derived=True)
    s = V.row_setup(r, fake_workload)
    assert s.micro_batch == 24 and s.microbatches == 1
    assert "global batch 384 = per_device_batch 6 x 64 devices" in s.assumptions
    assert "micro batch 24 = per_device_batch x tp (one microbatch)" in s.assumptions


def test_rows_whose_setup_or_simulation_fails_are_skipped():
    good = _row(line=2)
    few_layers = _row(layers=4, line=3)                    # 4 layers cannot fill 8 stages
    no_host_link = _row(**{**V5P_ROW, "device": "b200"}, recompute="qkv_proj_offloaded", line=4)
    setups, bad = V.row_setups([good, few_layers, no_host_link], fake_workload)
    assert [s.row.line for s in setups] == [2]
    assert [(b.line, b.source, b.model) for b in bad] == [(3, "zb", "1.5B"),
                                                         (4, "maxtext-v5p", "32B")]
    assert bad[0].reason == ("4 decoder blocks cannot fill 8 pipeline stages (each stage but the "
                             "first and last needs one); fix: fewer stages (vp), or give a "
                             "pipeline_layout")
    assert bad[1].reason.startswith("no host-link bandwidth for device 'b200'")
    dev = {"a100-80gb-sxm": load_device("a100-80gb-sxm")}
    res, bad = V.evaluate_rows(setups, dev)
    assert not bad and res == V.evaluate(setups, dev["a100-80gb-sxm"])

    def boom(plan, workload, cluster):
        raise V.ValidationError("zb/1.5B/b144/1f1b: does not fit; fix it")

    res, bad = V.evaluate_rows(setups, dev, boom)
    assert not res
    assert bad == (V.SkippedRow(2, "zb", "1.5B", "zb/1.5B/b144/1f1b: does not fit; fix it"),)


def test_the_held_out_figures_quoted_in_the_validation_readme_are_what_validate_scores():
    """``reports/validation/README.md`` quotes the held-out H100 rows' errors; they are what
    ``mpmd validate --csv reports/validation/heldout_training.csv`` prints with the bundled
    profiles, so a profile change cannot leave the quoted figures stale."""
    import re
    import subprocess

    root = CSV.parents[2]
    r = subprocess.run(["mpmd", "validate", "--csv", "reports/validation/heldout_training.csv"],
                       capture_output=True, text=True, cwd=root, env={**__import__("os").environ,
                                                                      "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    m = re.search(r"(\d+) of (\d+) rows scored\s+mean abs % error ([\d.]+)%\s+max ([\d.]+)%",
                  r.stdout)
    assert m, r.stdout[-500:]
    scored, total, mean, worst = m.groups()
    readme = " ".join((root / "reports" / "validation" / "README.md").read_text().split())
    assert (f"{scored} of {total} rows, mean absolute error {mean}%, max {worst}%" in readme)


def moe_workload(row: V.Row) -> Workload:
    """:func:`fake_workload` whose blocks are a mixture of 8 experts (half the parameters)."""
    w = fake_workload(row)
    block = dataclasses.replace(w.costs["decoder_block"], experts=8, expert_param_count=500)
    return dataclasses.replace(w, costs={**w.costs, "decoder_block": block})


def test_context_parallel_is_the_layouts_context_degree():
    r = _row(gpus=16, cp=2)                  # 24 published microbatches of 6 per dp replica
    s = V.row_setup(r, fake_workload)
    assert r.replicas == 2 and s.microbatches == 24 and s.plan.global_batch == 144
    assert set(s.plan.layouts.values()) == {Layout(1, 1, context=2, context_method="ring")}
    assert not any("context" in a for a in s.assumptions)
    m = V.build_cluster(r, load_device("a100-80gb-sxm")).meshes["stage0"]
    assert m.num_devices == 2 and dict(m.axes) == {"data": 2, "tensor": 1}
    with pytest.raises(V.ValidationError, match=r"microbatches=24 but global_batch/\(micro_batch"
                                                r"\*dp\) = 12; fix the row"):
        V.row_setup(_row(gpus=16, cp=2, dp=1, global_batch=72), fake_workload)


def test_a_published_vp_is_used_as_is():
    calls = []

    def step(plan, workload, cluster):
        calls.append(plan)
        return 1.0

    s = V.row_setup(_row(schedule="1f1b-interleaved", vp=2), fake_workload, step_fn=step,
                    device=load_device("a100-80gb-sxm"))
    assert s.virtual_stages == 2 and len(s.plan.stages) == 16 and not calls
    assert not any("virtual stages" in a for a in s.assumptions)
    # the rule (or the tuner) would have taken 3
    assert V.row_setup(_row(schedule="1f1b-interleaved"), fake_workload).virtual_stages == 3
    blank = V.row_setup(_row(schedule=None, vp=4, layers=32), fake_workload)
    assert blank.schedule == "interleaved-1f1b" and blank.virtual_stages == 4
    assert "1f1b-interleaved (vp 4; schedule not published)" in blank.assumptions
    one = V.row_setup(_row(schedule=None, vp=1), fake_workload)
    assert one.schedule == "1f1b" and "1f1b (vp 1; schedule not published)" in one.assumptions


def test_expert_parallel_folds_over_the_stage_devices_or_is_refused():
    r = _row(gpus=16, dp=2, microbatches=12, ep=2)
    s = V.row_setup(r, moe_workload)
    assert set(s.plan.layouts.values()) == {Layout(2, 1, expert=2)}
    with pytest.raises(V.ValidationError, match=r"^row 0: ep x etp = 4 x 1 does not divide dp x cp "
                                                r"x tp = 2; fix ep or etp \(their product divides "
                                                r"a stage's devices\)$"):
        V.row_setup(dataclasses.replace(r, ep=4), moe_workload)
    # MoE parallel folding: ep over dp x tp, etp blank = 1 (Megatron-Bridge's MoE recipes)
    tp = V.row_setup(dataclasses.replace(r, gpus=32, tp=2, ep=4), moe_workload)
    assert set(tp.plan.layouts.values()) == {Layout(2, 2, expert=4, expert_tensor=1)}
    etp = V.row_setup(dataclasses.replace(r, gpus=32, tp=2, ep=2, etp=2), moe_workload)
    assert set(etp.plan.layouts.values()) == {Layout(2, 2, expert=2)}
    # the experts split the data x context devices
    cp = V.row_setup(dataclasses.replace(r, gpus=32, cp=2, ep=4), moe_workload)
    assert set(cp.plan.layouts.values()) == {Layout(2, 1, expert=4, context=2)}
    with pytest.raises(V.ValidationError, match=r"ep=16 does not divide model fake-1.5B's 8 "
                                                r"experts; fix ep"):
        V.row_setup(dataclasses.replace(r, gpus=128, dp=16, microbatches=None, ep=16),
                    moe_workload)
    with pytest.raises(V.ValidationError, match=r"ep x etp = 2 x 2 does not divide dp x cp x tp "
                                                r"= 2"):
        V.row_setup(dataclasses.replace(r, etp=2), moe_workload)
    with pytest.raises(V.ValidationError, match=r"^row 0: ep=2 but model fake-1.5B is not a "
                                                r"mixture of experts; fix: leave ep blank$"):
        V.row_setup(r, fake_workload)
    assert V.expert_problem(_row()) is None and V.row_layout(_row()).expert == 1
