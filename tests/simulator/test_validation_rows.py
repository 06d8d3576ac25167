"""Tests of simulator.validation_rows: lenient loading (skipped rows), per-device batches, MFU."""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path

import pytest

from ir import Layout
from simulator import validation_rows as VR

CSV = Path(__file__).resolve().parents[2] / "reports" / "validation" / "published_training.csv"
LINES = CSV.read_text().splitlines()
HEAD = next(csv.reader([LINES[0]]))


def _csv(tmp_path, *rows: dict, extra=("per_device_batch",)) -> Path:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=HEAD + list(extra), lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    p = tmp_path / "rows.csv"
    p.write_text(out.getvalue())
    return p


def bundled(line: int, **kw) -> dict:
    """The bundled CSV's row at ``line`` (2 = the first row), as a dict, with ``kw`` changed."""
    d = dict(zip(HEAD, next(csv.reader([LINES[line - 1]]))))
    d.update(kw)
    return d


V5E = 43                       # maxtext-v5e 16B, 256 chips, per_device_batch_size 6: 1536
V5P = 52                       # maxtext-v5p 32B, 64 chips, tp 4 / dp 16, per_device_batch_size 6


def test_bad_rows_are_skipped_with_their_line_and_reason(tmp_path):
    p = _csv(tmp_path, bundled(2), bundled(V5E, recompute="bogus_policy"), bundled(3),
             bundled(4, device="h900", model="x|y"), bundled(5, tp="2"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.line for r in rows] == [2, 4]
    assert [(b.line, b.source, b.model) for b in bad] == [(3, "maxtext-v5e", "16B"), (5, "zb", "x|y"),
                                                         (6, "zb", "1.5B")]
    assert bad[0].reason.startswith("recompute 'bogus_policy' unknown; fix: use one of none, "
                                    "selective, full, minimal, ")
    assert bad[1].reason.startswith("device 'h900' is not a known profile; fix: use one of ")
    assert bad[2].reason == "tp*pp*dp = 16 != gpus=8; fix the layout"
    assert bad[2].message == "row 6: tp*pp*dp = 16 != gpus=8; fix the layout"
    # the strict form raises the first as today's error
    with pytest.raises(VR.ValidationError, match=r"^row 3: recompute 'bogus_policy' unknown"):
        VR.load_rows(p)


def test_file_level_problems_stay_fatal(tmp_path):
    with pytest.raises(VR.ValidationError, match="no such file|does not exist|not found"):
        VR.load_rows_lenient(tmp_path / "missing.csv")
    head_only = tmp_path / "h.csv"
    head_only.write_text(LINES[0] + "\n")
    with pytest.raises(VR.ValidationError, match="validation CSV has no rows"):
        VR.load_rows_lenient(head_only)
    no_metric = tmp_path / "m.csv"
    no_metric.write_text(LINES[0].replace(",metric,", ",") + "\n" + LINES[1] + "\n")
    with pytest.raises(VR.ValidationError, match=r"header lacks column\(s\) metric; fix the header"):
        VR.load_rows_lenient(no_metric)
    # a renamed column: the one it lacks and the unknown one, both named (the typo is found)
    renamed = tmp_path / "r.csv"
    renamed.write_text(LINES[0].replace(",metric,", ",metrik,") + "\n" + LINES[1] + "\n")
    with pytest.raises(VR.ValidationError, match=r"header lacks column\(s\) metric and has "
                                                 r"unknown column\(s\) 'metrik'; fix the header"):
        VR.load_rows_lenient(renamed)


def test_maxtext_policy_names_are_read_case_insensitively(tmp_path):
    p = _csv(tmp_path, bundled(V5E, recompute="Save_QKV_Proj"),
             bundled(V5E, recompute="MINIMAL_OFFLOADED"))
    rows, bad = VR.load_rows_lenient(p)
    assert not bad and [r.recompute for r in rows] == ["save_qkv_proj", "minimal_offloaded"]


def test_per_device_batch_gives_the_global_batch(tmp_path):
    given = bundled(V5E)
    derived = bundled(V5E, global_batch="", micro_batch="", microbatches="", per_device_batch="6")
    both = bundled(V5E, per_device_batch="6")
    # MaxText allows a fraction per chip: 0.5 x 64 v5p chips (4-way tensor parallel) = 32
    half = bundled(V5P, global_batch="", micro_batch="", microbatches="", per_device_batch="0.5")
    rows, bad = VR.load_rows_lenient(_csv(tmp_path, given, derived, both, half))
    assert not bad
    g, d, b, h = rows
    assert (g.global_batch, g.per_device_batch, g.global_batch_derived) == (1536, None, False)
    assert (d.global_batch, d.per_device_batch, d.global_batch_derived) == (1536, 6.0, True)
    assert (b.global_batch, b.global_batch_derived) == (1536, False)
    assert (h.global_batch, h.global_batch_derived, h.dp) == (32, True, 16)


def test_per_device_batch_problems_skip_the_row(tmp_path):
    rows, bad = VR.load_rows_lenient(_csv(
        tmp_path,
        bundled(V5E, global_batch="", per_device_batch=""),
        bundled(V5E, per_device_batch="4"),
        bundled(V5E, global_batch="", micro_batch="", microbatches="", per_device_batch="0.001"),
        bundled(V5E, global_batch="", micro_batch="", microbatches="", per_device_batch="six"),
        bundled(V5E, global_batch="", micro_batch="", microbatches="", per_device_batch="0.5")))
    assert not rows
    assert [b.reason for b in bad] == [
        "global_batch and per_device_batch are both blank; fill in one",
        "global_batch 1536 != per_device_batch 4 x gpus 256 = 1024; fix the row (or leave one of "
        "them blank)",
        "per_device_batch 0.001 x gpus 256 = 0.256 is not a whole batch; fix the row",
        "per_device_batch='six' is not a number; fix the CSV",
        # 128 samples over 256-way data parallelism: the simulator splits a batch over dp whole
        "global_batch 128 is not micro_batch x microbatches x dp (- x - x 256); fix the row"]


def test_mfu_is_a_fraction(tmp_path):
    ok = bundled(V5E, metric="mfu", value="0.61")
    pct = bundled(V5E, metric="mfu", value="61")
    rows, bad = VR.load_rows_lenient(_csv(tmp_path, ok, pct))
    assert [r.value for r in rows] == [0.61]
    assert [b.reason for b in bad] == ["mfu 61.0 is above 1; fix: write MFU as a fraction (45% -> 0.45)"]
    # MaxText's FLOP count is PaLM's: its MFU is its TFLOP/s per device over the peak
    r = rows[0]
    assert VR.palm_flops(r) == VR.maxtext_flops(r)
    assert VR.metric_from_step(r, 2.0, 1.97e14) == VR.maxtext_flops(r) / 2.0 / (256 * 1.97e14)


PARALLEL = ("per_device_batch", "model_config", "cp", "vp", "ep", "etp")


def test_context_virtual_and_expert_columns_are_parsed_and_checked(tmp_path):
    zb = 2                     # zb 1.5B: 22 layers, 8 GPUs, tp 1 / pp 8 / dp 1, 1F1B
    p = _csv(tmp_path,
             bundled(zb, gpus="16", cp="2"),
             bundled(zb, cp="2"),
             bundled(zb, schedule="1f1b-interleaved", vp="2"),
             bundled(zb, schedule="1f1b-interleaved", vp="4"),
             bundled(zb, schedule="zb-1p", vp="2"),
             bundled(zb, schedule="1f1b-interleaved", vp="1"),
             bundled(zb, ep="2"),
             bundled(zb, etp="0"),
             bundled(zb, pp="1", dp="8", vp="2"),
             bundled(zb, schedule="", vp="2", ep="", etp="1"),
             extra=PARALLEL)
    rows, bad = VR.load_rows_lenient(p)
    assert [(r.line, r.cp, r.replicas, r.vp, r.ep, r.etp) for r in rows] == [
        (2, 2, 2, None, 1, None), (4, 1, 1, 2, 1, None), (11, 1, 1, 2, 1, 1)]
    assert rows[2].schedule is None          # a blank schedule stays blank: vp decides it later
    assert {b.line: b.reason for b in bad} == {
        3: "tp*pp*dp*cp = 16 != gpus=8; fix the layout (dp excludes cp: gpus = tp x pp x dp x cp)",
        5: "vp=4 chunks per rank cannot be held: 22 layers over pp=8 ranks leave 2 on the "
           "smallest; fix vp (at most 2) or leave it blank",
        6: "vp=2 but schedule zb-1p runs 1 stage per rank; fix vp or the schedule (vp > 1: "
           "1f1b-interleaved)",
        7: "vp=1 but schedule 1f1b-interleaved runs at least 2 stages per rank; fix vp or the "
           "schedule (vp > 1: 1f1b-interleaved)",
        8: "ep=2 but the row's model is not a mixture of experts (its shape columns describe a "
           "dense model); fix: ep 1 (or blank), or name a mixture of experts in model_config",
        9: "etp=0 is out of range; fix the CSV (an integer from 1 to 1024)",
        10: "vp=2 needs a pipeline (pp > 1); fix: vp 1 (or blank)"}


def test_a_model_config_header_may_leave_the_shapes_to_the_fill_hook(tmp_path):
    head = [k for k in HEAD if k not in ("layers", "hidden", "heads")] + ["model_config"]
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=head, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerow(bundled(2, model_config="zb-1.5b"))
    w.writerow(bundled(3, model_config="nope"))
    p = tmp_path / "m.csv"
    p.write_text(out.getvalue())
    rows, bad = VR.load_rows_lenient(p)       # no hook: the shapes stay blank
    assert not rows and bad[0].reason == ("field 'layers' is blank; fill it in (or have the "
                                          "model_config filled in: mpmd validate does)")

    def fill(d: dict) -> dict:
        if d["model_config"] != "zb-1.5b":
            raise VR.ValidationError(f"model_config: unknown model {d['model_config']!r}")
        return {**d, "layers": "22", "hidden": "2304", "heads": "24"}

    rows, bad = VR.load_rows_lenient(p, fill)
    assert [(r.line, r.layers, r.hidden, r.heads, r.model_config) for r in rows] == [
        (2, 22, 2304, 24, "zb-1.5b")]
    assert [(b.line, b.reason) for b in bad] == [(3, "model_config: unknown model 'nope'")]
    with pytest.raises(VR.ValidationError, match=r"^row 3: model_config: unknown model 'nope'$"):
        VR.load_rows(p, fill)


def test_precision_names_a_recipe_or_a_compute_dtype(tmp_path):
    from simulator.validation_setup import row_precision
    from hardware_profiles.loader import load_device

    p = _csv(tmp_path, bundled(2, precision=""), bundled(2, precision="FP16"),
             bundled(2, precision="fp8"), bundled(2, precision="int8"))
    rows, bad = VR.load_rows_lenient(p)
    blank, fp16, fp8 = rows
    assert (blank.precision, blank.precision_given, blank.dtype, blank.recipe) == (
        "bf16", False, "bf16", "bf16")
    assert (fp16.precision, fp16.precision_given, fp16.dtype, fp16.recipe, fp16.low_precision) == (
        "fp16", True, "fp16", "bf16", False)
    assert (fp8.dtype, fp8.recipe, fp8.low_precision) == ("bf16", "fp8", True)
    assert [b.reason for b in bad] == [
        "precision 'int8' unknown; fix: use one of bf16, fp8, fp8-blockwise, mxfp8, nvfp4, fp16, "
        "fp32 or leave it blank (bf16, or fp16 on a device without a bf16 rate)"]
    v100, a100, v5e = (load_device(d) for d in ("v100-sxm2-16gb", "a100-40gb-sxm", "tpu-v5e"))
    # blank: bf16 where the device has it, else fp16, said; given: kept where the device has it
    assert row_precision(blank, a100) == ("bf16", None)
    assert row_precision(blank, v100) == ("fp16", "precision fp16 (not published; v100-sxm2-16gb "
                                          "has no bf16 rate: 16-bit mixed precision on it is fp16 "
                                          "with loss scaling)")
    assert row_precision(fp16, a100) == row_precision(fp16, v100) == ("fp16", None)
    with pytest.raises(VR.ValidationError) as e:
        row_precision(fp16, v5e)
    assert str(e.value) == ("row 3: precision fp16 but device 'tpu-v5e' has no fp16 rate (its "
                            "rates: bf16, int8); fix: precision bf16 or fp32")
    given_bf16 = VR.parse_row(bundled(2, precision="bf16"), 9, ["v100-sxm2-16gb"] + [blank.device])
    with pytest.raises(VR.ValidationError, match=r"^row 9: precision bf16 but device "
                       r"'v100-sxm2-16gb' has no bf16 rate"):
        row_precision(given_bf16, v100)


def test_optimizer_state_reaches_the_rows_layout_and_memory(tmp_path):
    """The ``optimizer_state`` column: blank is fp32; bf16-moments and bf16 reach the row's
    layout (and so its memory: 12, 8 and 4 bytes a parameter of Adam state over data parallel);
    an unknown one is a skipped row naming it."""
    from simulator.validation_setup import row_layout

    p = _csv(tmp_path, bundled(2), bundled(2, optimizer_state="bf16-moments"),
             bundled(2, optimizer_state="BF16"), bundled(2, optimizer_state="fp8"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.optimizer_state for r in rows] == ["fp32", "bf16-moments", "bf16"]
    assert [row_layout(r).optimizer_state for r in rows] == ["fp32", "bf16-moments", "bf16"]
    assert [b.reason for b in bad] == [
        "optimizer_state 'fp8' unknown; fix: use one of fp32, bf16-moments, bf16 or leave it "
        "blank (fp32)"]


def test_a_2020_container_run_is_charged_that_eras_elementwise_traffic(tmp_path):
    from hardware_profiles.loader import load_device
    from simulator.validation_setup import (SOFTWARE_2020_ELEMENTWISE_TRAFFIC, row_device,
                                            software_2020)

    note = "DeepLearningExamples BERT, pytorch:20.06-py3, mixed precision"
    p = _csv(tmp_path, bundled(2, note=note), bundled(2, note=note + ", eager"),
             bundled(2, note="pytorch:21.11-py3"), bundled(2, note="TensorFlow 20.06-py3"))
    era, eager_run, later, tf = VR.load_rows_lenient(p)[0]
    a100 = load_device("a100-40gb-sxm")
    assert SOFTWARE_2020_ELEMENTWISE_TRAFFIC == 0.45 and a100.elementwise_traffic == 0.2
    assert software_2020(era) == (True, "2020 NGC container (from the note): elementwise "
                                        "traffic 0.45")
    assert row_device(era, a100).elementwise_traffic == row_device(tf, a100).elementwise_traffic == 0.45
    assert software_2020(eager_run) == (False, None)             # eager's traffic is all of it
    assert row_device(eager_run, a100).elementwise_traffic == 1.0
    assert software_2020(later) == (False, None)
    assert row_device(later, a100).elementwise_traffic == 0.2


def test_offload_layers_keep_the_other_blocks_activations_on_the_device(tmp_path):
    """``offload_layers`` (Megatron-Core's --cpu-offloading-num-layers; all the layers: a MaxText
    remat policy offloading ``decoder_layer_input``) is read, refused with a pipeline or more
    layers than the model has, and keeps ``1 - N / blocks`` of each decoder block's saved
    activations on the device (``LayerCost.host_offload``, memory only); the row says so."""
    from mpmd.cli.validate import workload_for
    from simulator.cost_model import stage_memory
    from simulator.validation_setup import offload_activations, row_setup

    pp1 = next(i for i, line in enumerate(LINES[1:], start=2)
               if dict(zip(HEAD, next(csv.reader([line]))))["pp"] == "1"
               and dict(zip(HEAD, next(csv.reader([line]))))["layers"])
    layers = int(bundled(pp1)["layers"])
    p = _csv(tmp_path, bundled(pp1, offload_layers="4"), bundled(2, offload_layers="4"),
             bundled(pp1, offload_layers=str(layers + 1)),
             bundled(pp1, offload_layers=str(layers)))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.offload_layers for r in rows] == [4, layers]
    assert [b.line for b in bad] == [3, 4]
    assert all("decoder_layer_input: all); fix offload_layers or pp" in b.reason for b in bad)
    row = rows[0]
    w = workload_for(row)
    blocks = sum(1 for n in w.layers if n == "decoder_block")
    kept, why = offload_activations(w, row)
    assert kept.costs["decoder_block"] == dataclasses.replace(w.costs["decoder_block"],
                                                              host_offload=4 / blocks)
    assert all(kept.costs[n] == c for n, c in w.costs.items() if n != "decoder_block")
    lay = Layout(1, 1)
    for recompute in (False, True):       # the residuals, or under full recompute each input
        on, off = (stage_memory(x, 0, len(x.layers), lay, 1.0, recompute) for x in (w, kept))
        assert off.residual_bytes_per_microbatch < on.residual_bytes_per_microbatch
        assert off.static_bytes == on.static_bytes
    every, _ = offload_activations(w, rows[1])
    assert every.costs["decoder_block"].host_offload == 1.0
    assert why == f"activations of 4 of {blocks} blocks offloaded to host (memory only: the copies overlap compute)"
    assert why in row_setup(row, workload_for).assumptions


def test_bf16_layers_keep_the_first_and_last_blocks_out_of_the_recipe(tmp_path):
    """``bf16_first_layers`` / ``bf16_last_layers`` (Megatron-Bridge's ``first_last_layers_bf16``
    with ``num_layers_at_start/end_in_bf16``) are read, refused without a low-precision recipe or
    when they cover every layer, and run those blocks' GEMMs in BF16: the row is slower than the
    same row wholly in NVFP4 and faster than it in BF16, and says so."""
    from dataclasses import replace

    from hardware_profiles.loader import load_device
    from mpmd.cli.validate import model_fill, predict_step, workload_for
    from simulator.validate import evaluate
    from simulator.validation_setup import row_setup

    station = next(i for i, line in enumerate(LINES[1:], start=2)
                   if line.startswith("dgx-station-nvfp4,") and ",nvfp4," in line)
    row = dict(bundled(station))
    assert row["bf16_last_layers"] == "4" and row["precision"] == "nvfp4"
    p = _csv(tmp_path, row, dict(row, bf16_last_layers=""), dict(row, precision="bf16"),
             dict(row, bf16_first_layers="1"), dict(row, bf16_last_layers="32"))
    rows, bad = VR.load_rows_lenient(p, fill=model_fill(p))
    assert [(r.bf16_first_layers, r.bf16_last_layers, r.recipe) for r in rows] == [
        (0, 4, "nvfp4"), (0, 0, "nvfp4"), (1, 4, "nvfp4")]
    assert [b.line for b in bad] == [4, 6]
    assert bad[0].reason.endswith("precision is 'bf16'; fix: blank them or give the row's "
                                  "fp8/mxfp8/nvfp4 precision")
    assert "leave none of the 32 layers to the nvfp4 recipe" in bad[1].reason
    kept, whole, both = (row_setup(r, workload_for) for r in rows)
    assert kept.workload.layers[-6:] == ("decoder_block",) + ("decoder_block_bf16",) * 4 + ("head",)
    assert both.workload.layers[1:3] == ("decoder_block_bf16", "decoder_block")
    assert kept.workload.costs["decoder_block_bf16"] == replace(
        whole.workload.costs["decoder_block"], name="decoder_block_bf16", low_precision=False)
    assert "blocks in BF16: first 0, last 4 (the rest nvfp4)" in kept.assumptions
    bf16 = row_setup(replace(rows[0], precision="bf16", bf16_last_layers=0), workload_for)
    t_kept, t_whole, t_bf16 = (r.step_s for r in evaluate(
        (kept, whole, bf16), load_device("gb300"), predict_step))
    assert t_whole < t_kept < t_bf16


def test_precision_as_published_tables_print_it(tmp_path):
    """NVIDIA's performance summary writes FP8-CS, FP8-DS, FP8-MX and NVFP4; its recipe names
    fp8cs, fp8mx and fp8sc (sub-channel, i.e. blockwise): each reads as the recipe it is."""
    printed = ("FP8-CS", "FP8-DS", "fp8_cs", "FP8-MX", "fp8mx", "FP8-SC", "NVFP4", "FP4", "BF16")
    p = _csv(tmp_path, *(bundled(2, precision=x) for x in printed))
    rows, bad = VR.load_rows_lenient(p)
    assert not bad
    assert [r.precision for r in rows] == ["fp8", "fp8", "fp8", "mxfp8", "mxfp8", "fp8-blockwise",
                                           "nvfp4", "nvfp4", "bf16"]


def test_dispatcher_spellings(tmp_path):
    p = _csv(tmp_path, *(bundled(2, dispatcher=x) for x in ("Token-Drop", "all_to_all", "a2a",
                                                            "HybridEP", "deep_ep")))
    rows, bad = VR.load_rows_lenient(p)
    assert not bad
    assert [r.dispatcher for r in rows] == ["tokendrop", "alltoall", "alltoall", "deepep", "deepep"]


def test_a_table_printed_device_name_reads_as_its_profile(tmp_path):
    p = _csv(tmp_path, bundled(2, device="DGX-H100"), bundled(2, device="H100"),
             bundled(2, device="V100"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.device for r in rows] == ["h100-sxm", "h100-sxm"]
    assert len(bad) == 1 and bad[0].reason.startswith("device 'V100' is not a known profile")


def test_a_blank_dp_is_the_gpus_the_other_degrees_leave(tmp_path):
    p = _csv(tmp_path, bundled(2, dp=""), bundled(2, dp="", tp="3"))
    rows, bad = VR.load_rows_lenient(p)
    (tmp_path / "x").mkdir()
    full = VR.load_rows_lenient(_csv(tmp_path / "x", bundled(2)))[0][0]
    assert [r.dp for r in rows] == [full.dp]
    assert [b.reason for b in bad] == [f"dp is blank and gpus={full.gpus} is not a multiple of "
                                       f"tp*pp*cp = {3 * full.pp}; fix: give dp or the layout"]


def test_not_stated_optional_degrees_read_as_blank(tmp_path):
    p = _csv(tmp_path, bundled(2, vp="NA", ep="-", cp="None"), bundled(2, tp="NA"))
    rows, bad = VR.load_rows_lenient(p)
    assert [(r.vp, r.ep, r.cp) for r in rows] == [(None, 1, 1)]
    assert [b.reason for b in bad] == ["tp='NA' is not an integer; fix the CSV"]


def test_a_published_ga_that_disagrees_with_the_batch_is_dropped_and_said(tmp_path):
    """NVIDIA's 25.11 GB300 Qwen3-235B row prints GBS 8192, MBS 2 and GA 32 on 64-way data
    parallel (2 x 32 x 64 = 4096): the global batch is kept, the GA dropped, the row says so."""
    from simulator.validation_setup import _choices

    p = _csv(tmp_path, bundled(2, microbatches="7"))
    rows, bad = VR.load_rows_lenient(p)
    assert not bad and rows[0].microbatches is None and rows[0].microbatches_published == 7
    notes = _choices(rows[0])[4]
    assert "microbatches 7 as published disagree with global_batch / (micro_batch x dp) = 24: " \
           "the published global batch kept" in notes


def test_chunks_filled_by_the_embedding_and_the_loss_are_held(tmp_path):
    """NVIDIA's Llama 3.1 405B recipes run 126 blocks on pp 16 x vp 8: with the embedding and
    the loss counted as layers (Megatron-Core's account_for_*_in_pipeline_split) each of the 128
    chunks holds one; 22 blocks on pp 8 x vp 3 (24 = 22 + 2) is held the same way, 22 on pp 8
    x vp 4 is not."""
    p = _csv(tmp_path, *(bundled(2, schedule="1f1b-interleaved", **kw) for kw in (
        dict(layers="126", vp="16"), dict(vp="3"), dict(vp="4"))))
    rows, bad = VR.load_rows_lenient(p)
    assert [(r.layers, r.vp) for r in rows] == [(126, 16), (22, 3)]
    assert [b.reason for b in bad] == [
        "vp=4 chunks per rank cannot be held: 22 layers over pp=8 ranks leave 2 on the smallest; "
        "fix vp (at most 2) or leave it blank"]


def test_a_maxtext_policy_keeps_the_block_input_and_the_tensors_it_names(tmp_path):
    """MaxText's ``minimal`` (``checkpoint_dots_with_no_batch_dims``) keeps, per token of a
    decoder block, its input and the weight matmuls' outputs and nothing else: for the bundled
    32B v5p row (hidden 8192, 64 heads of 128, GLU MLP of 28672) ``8192 + 3 x 8192 + 8192 +
    2 x 28672 + 8192`` bf16 elements, below the traced residuals that ``none`` keeps; the other
    layers keep theirs."""
    from mpmd.cli.validate import model_fill, workload_for
    from simulator.validation_setup import row_setup

    p = _csv(tmp_path, bundled(V5P), bundled(V5P, recompute="none"))
    minimal, none = VR.load_rows(p, fill=model_fill(p))
    kept, traced = (row_setup(r, workload_for).workload for r in (minimal, none))
    assert kept.costs["decoder_block"].residual_bytes_per_sample == (
        (8192 + 3 * 8192 + 8192 + 2 * 28672 + 8192) * 2048 * 2)
    assert traced.costs["decoder_block"].residual_bytes_per_sample > (
        kept.costs["decoder_block"].residual_bytes_per_sample)
    assert {n: c.residual_bytes_per_sample for n, c in kept.costs.items() if n != "decoder_block"} \
        == {n: c.residual_bytes_per_sample for n, c in traced.costs.items() if n != "decoder_block"}


def test_a_published_peak_memory_is_read_in_bytes(tmp_path):
    """``peak_memory_gb`` (x 1e9) or ``peak_memory_gib`` (x 2**30, as PyTorch prints it) is the
    row's published peak per device in bytes; blank is None; both given, or a bad number, is a
    skipped row naming the column and the fix."""
    p = _csv(tmp_path, bundled(2), bundled(2, peak_memory_gb="80"),
             bundled(2, peak_memory_gib="82.4"),
             bundled(2, peak_memory_gb="80", peak_memory_gib="74.5"),
             bundled(2, peak_memory_gib="lots"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.peak_memory_bytes for r in rows] == [None, 80e9, 82.4 * 2 ** 30]
    assert [b.reason for b in bad] == [
        "peak_memory_gb 80 and peak_memory_gib 74.5 both given; fix: keep the one the source "
        "prints",
        "peak_memory_gib='lots' is not a number; fix the CSV"]


def test_the_bundled_rows_that_publish_their_peak_memory():
    """torchtitan's H100 table prints each run's peak (``max_memory_reserved``, GiB) and the DGX
    Station playbook ``nvidia-smi``'s (GB): eight rows of the bundled CSV carry one."""
    from mpmd.cli.validate import model_fill

    rows, bad = VR.load_rows_lenient(CSV, fill=model_fill(CSV))
    peaks = {(r.source, r.precision, r.gpus, r.value): r.peak_memory_bytes
             for r in rows if r.peak_memory_bytes is not None}
    assert peaks == {("torchtitan-h100", "bf16", 8, 5762.0): 82.4 * 2 ** 30,
                     ("torchtitan-h100", "bf16", 128, 5605.0): 67.0 * 2 ** 30,
                     ("torchtitan-h100", "bf16", 8, 6667.0): 77.0 * 2 ** 30,
                     ("torchtitan-h100", "bf16", 128, 6514.0): 62.0 * 2 ** 30,
                     ("torchtitan-h100", "fp8", 8, 8532.0): 76.8 * 2 ** 30,
                     ("torchtitan-h100", "fp8", 128, 8380.0): 61.8 * 2 ** 30,
                     ("dgx-station-nvfp4", "bf16", 1, 28966.0): 221.6e9,
                     ("dgx-station-nvfp4", "nvfp4", 1, 48635.0): 207.8e9}


def test_cross_entropy_names_how_the_loss_ran(tmp_path):
    """``cross_entropy``: blank is fused (Transformer Engine's, XLA's); fp32 and eager are read
    case-insensitively and reach the row's workload; an unknown one is a skipped row naming it.
    The bundled rows state eager for torchtitan's runs and fp32 for Megatron-Core's own loss."""
    from mpmd.cli.validate import model_fill, workload_for

    p = _csv(tmp_path, bundled(2, cross_entropy=""), bundled(2, cross_entropy="FP32"),
             bundled(2, cross_entropy="eager"), bundled(2, cross_entropy="triton"))
    rows, bad = VR.load_rows_lenient(p)
    assert [r.cross_entropy for r in rows] == ["fused", "fp32", "eager"]
    assert [workload_for(r).cross_entropy for r in rows] == ["fused", "fp32", "eager"]
    assert [b.reason for b in bad] == [
        "cross_entropy 'triton' unknown; fix: use one of fused, fp32, eager or leave it blank "
        "(fused)"]
    every, _ = VR.load_rows_lenient(CSV, fill=model_fill(CSV))
    eager = {r.source for r in every if r.cross_entropy == "eager"}
    fp32 = {r.source for r in every if r.cross_entropy == "fp32"}
    assert eager == {"torchtitan", "torchtitan-h100"}
    # DGX Cloud's releases from 25.05 ran NeMo commits whose performance scripts set TE's loss
    assert fp32 == {"zb", "korthikanti", "narayanan", "bloom", "dgxc-h100", "dgxc-24.11",
                    "dgxc-25.02"}
    # Megatron-Bridge's performance scripts set TE's loss for every model of both tables
    assert not {r.source for r in every if r.source.startswith("nemo-2")
                and r.cross_entropy != "fused"}


def test_the_bundled_rows_name_the_runs_that_ran_flashattention_2():
    """``attention`` ``flash2`` on the rows whose stack ran FlashAttention-2: the DGX Cloud
    releases whose scripts export ``NVTE_FUSED_ATTN=0`` (Grok-1 in 24.11 and 25.02, GPT-3 175B and
    Nemotron-4 340B in 24.11) and, held out, torchtitan's runs under context parallelism (it
    pins SDPA's flash and efficient backends there); its runs without CP keep the default."""
    from mpmd.cli.validate import model_fill

    every, _ = VR.load_rows_lenient(CSV, fill=model_fill(CSV))
    assert {(r.source, r.model) for r in every if r.attention == "flash2"} == {
        ("dgxc-24.11", "grok1-314b"), ("dgxc-25.02", "grok1-314b"),
        ("dgxc-h100", "gpt3-175B"), ("dgxc-h100", "nemotron4-340B")}
    held = CSV.with_name("heldout_training.csv")
    rows, _ = VR.load_rows_lenient(held, fill=model_fill(held))
    titan = [r for r in rows if r.source == "torchtitan-h100"]
    assert {r.attention == "flash2" for r in titan if r.cp > 1} == {True}
    assert {r.attention for r in titan if r.cp == 1} == {None}


def test_cp_comm_names_the_context_exchange(tmp_path):
    """``cp_comm``: blank is the ring; Megatron-Core's ``--cp-comm-type`` names (``p2p``,
    ``all_gather``, ``a2a``) and PyTorch's (``allgather``) reach the row's layout; an unknown one
    is a skipped row naming it."""
    from simulator.validation_setup import row_layout

    base = dict(dp="32", cp="2", global_batch="64")     # torchtitan's 64 A100, fsdp 32 x cp 2
    p = _csv(tmp_path, bundled(36, **base), bundled(36, cp_comm="P2P", **base),
             bundled(36, cp_comm="all_gather", **base), bundled(36, cp_comm="a2a", **base),
             bundled(36, cp_comm="ring-ish", **base), extra=("per_device_batch", "cp_comm"))
    rows, bad = VR.load_rows_lenient(p)
    assert [row_layout(r).context_method for r in rows] == ["ring", "ring", "allgather", "alltoall"]
    assert [b.reason for b in bad] == [
        "cp_comm 'ring-ish' unknown; fix: use one of ring, p2p, allgather, alltoall, a2a or leave "
        "it blank (ring)"]


def test_saved_inputs_says_what_the_low_precision_gemms_keep(tmp_path):
    """``saved_inputs``: blank is the format's copy (Transformer Engine); ``compute`` (torchao's
    Float8Linear keeping its bf16 inputs) reaches the row's workload; an unknown one is a skipped
    row naming it. The bundled torchtitan Float8 rows state ``compute``."""
    from mpmd.cli.validate import workload_for

    p = _csv(tmp_path, bundled(2, saved_inputs=""), bundled(2, saved_inputs="Compute"),
             bundled(2, saved_inputs="fp8"))
    rows, bad = VR.load_rows_lenient(p)
    assert [workload_for(r).saved_inputs for r in rows] == ["format", "compute"]
    assert [b.reason for b in bad] == [
        "saved_inputs 'fp8' unknown; fix: use one of format, compute or leave it blank (format)"]
    every, _ = VR.load_rows_lenient(CSV)
    assert {(r.source, r.precision) for r in every if r.saved_inputs == "compute"} == {
        ("torchtitan-h100", "fp8")}
