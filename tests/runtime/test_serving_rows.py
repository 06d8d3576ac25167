"""runtime.calibration.serving_rows: reading the serving CSV (and refusing bad files in one line),
what each metric is predicted as (against step times worked out by hand on a synthetic device),
a fit that recovers parameters it generated the rows with, and the bundled published rows."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hardware_profiles.loader import load_device
from ir.files import InputError
from runtime.calibration.fit import CalibrationError
from runtime.calibration.serving_rows import (COLUMNS, METRICS, OFFLINE_CHUNK_TOKENS,
                                              OFFLINE_MAX_BATCH, ServingRow, chip_kinds, fit_chip,
                                              leave_one_out, predict, read_rows, replica_for,
                                              score, with_values)
from simulator.serving_cost import saturation_throughput
from zoo.inference import inference_model

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "reports" / "validation" / "published_serving.csv"

HEADER = ",".join(COLUMNS)
GOOD = [
    # source, model, device, devices, tp, dp, batch, prompt, output, wfmt, kvfmt, metric, value, ...
    'src-a,llama3-8b,h100-sxm,1,1,,,128,128,,,tokens_per_s,1234.5,trt,trtllm,"a, quoted note"',
    "src-b,llama3-8b,h100-sxm,2,1,2,4,2048,,fp8,fp8,tokens_per_s_per_user,95,vllm,vllm,",
    "src-c,llama3-70b,wormhole-n300,4,4,1,32,128,,\"bfp8,gate_up=bfp4\",bfp8,ttft_s,0.159,tt,tt-transformers,x",
]


def write(tmp_path: Path, lines: list[str], header: str = HEADER) -> Path:
    p = tmp_path / "rows.csv"
    p.write_text("\n".join([header, *lines]) + "\n")
    return p


# ------------------------------------------------------------------------------------ reading
def test_read_rows_parses_every_column(tmp_path):
    rows = read_rows(write(tmp_path, GOOD))
    assert [r.line for r in rows] == [2, 3, 4]
    a, b, c = rows
    assert a == ServingRow(line=2, source="src-a", model="llama3-8b", device="h100-sxm", devices=1,
                           tp=1, dp=1, batch=None, prompt_tokens=128, output_tokens=128,
                           weight_format="bf16", kv_format="bf16", metric="tokens_per_s",
                           value=1234.5, engine="trtllm")
    assert (b.dp, b.batch, b.output_tokens, b.weight_format, b.kv_format) == (2, 4, None, "fp8", "fp8")
    assert (b.metric, b.value, b.engine) == ("tokens_per_s_per_user", 95.0, "vllm")
    assert (c.weight_format, c.tp, c.devices, c.value) == ("bfp8,gate_up=bfp4", 4, 4, 0.159)


def _one_line_error(path) -> str:
    with pytest.raises(CalibrationError) as e:
        read_rows(path)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_file(tmp_path):
    msg = _one_line_error(tmp_path / "nope.csv")
    assert "not found" in msg and "fix" in msg


def test_missing_column(tmp_path):
    header = HEADER.replace(",engine", "")
    msg = _one_line_error(write(tmp_path, [], header=header))
    assert "serving CSV lacks column(s) engine" in msg and "fix" in msg


def test_bad_metric(tmp_path):
    msg = _one_line_error(write(tmp_path, [GOOD[0], GOOD[1].replace("tokens_per_s_per_user",
                                                                    "tok_per_s")]))
    assert "rows.csv: line 3: column 'metric' = 'tok_per_s' is not one of" in msg and "fix" in msg
    for m in METRICS:
        assert m in msg


def test_non_numeric_value(tmp_path):
    msg = _one_line_error(write(tmp_path, [GOOD[0].replace("1234.5", "fast")]))
    assert "rows.csv: line 2: column 'value' = 'fast' is not a positive finite number" in msg


@pytest.mark.parametrize("col, old, new", [("tp", "h100-sxm,1,1,", "h100-sxm,1,four,"),
                                           ("prompt_tokens", ",128,128,", ",,128,")])
def test_bad_integer_column(tmp_path, col, old, new):
    msg = _one_line_error(write(tmp_path, [GOOD[0].replace(old, new)]))
    assert f"rows.csv: line 2: column {col!r} = " in msg and "fix" in msg


def test_truncated_row(tmp_path):
    _one_line_error(write(tmp_path, ["src,llama3-8b,h100-sxm,1,1,1,1,128,128,bf16,bf16,ttft_s"]))


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-1"])
def test_value_must_be_finite_and_positive(tmp_path, value):
    _one_line_error(write(tmp_path, [GOOD[0].replace("1234.5", value)]))


def test_binary_file_is_refused_in_one_line(tmp_path):
    p = tmp_path / "rows.csv"
    p.write_bytes(HEADER.encode() + b"\n\xff\xfe\x00garbage\n")
    with pytest.raises((CalibrationError, InputError)):
        read_rows(p)


# ------------------------------------------------------------------------------------ predict
# a synthetic card: 1e15 bf16 FLOP/s at 0.5, 1e12 B/s at 0.5, 10 us / 20 us per layer, 1 ns per
# sampled logit, 80 GB
RATE, BWE, DEC, PRE, LOGIT = 5e14, 5e11, 1e-5, 2e-5, 1e-9


def synthetic():
    return dataclasses.replace(
        with_values(load_device("h100-sxm"), {"matmul_efficiency": 0.5, "memory_efficiency": 0.5,
                                              "decode_layer_overhead": DEC,
                                              "prefill_layer_overhead": PRE,
                                              "logit_overhead": LOGIT}),
        peak_flops={"bf16": 1e15}, memory_bandwidth=1e12, memory_bytes=80e9, roofline="max")


M = inference_model("llama3-8b")
F = M.matmul_flops_per_token          # 2 x the matmul weights
A = M.attention_flops_per_pair
K = M.kv_bytes_per_token              # 131072
D = M.dense_weight_bytes              # the weights a step streams (the embedding is looked up)
L, V = 32, 128256


def hand_step(tokens, pairs, kv_read, prefill, sampled):
    """roofline max(compute, memory) + layers x overhead + sampled x vocab x logit (tp 1)."""
    compute = tokens * F / RATE + pairs * A / RATE
    memory = (D + K * (kv_read + tokens)) / BWE
    return max(compute, memory) + L * (PRE if prefill else DEC) + sampled * V * LOGIT


def row(metric, *, batch=None, prompt=128, output=None, dp=1, value=1.0) -> ServingRow:
    return ServingRow(line=2, source="hand", model="llama3-8b", device="h100-sxm", devices=dp,
                      tp=1, dp=dp, batch=batch, prompt_tokens=prompt, output_tokens=output,
                      weight_format="bf16", kv_format="bf16", metric=metric, value=value,
                      engine="e")


def test_ttft_is_one_prefill_of_the_prompt():
    # 128 tokens, 128 x 129 / 2 = 8256 pairs, 128 read + 128 written, one logit vector
    got = predict(row("ttft_s", batch=32, prompt=128), synthetic())
    assert got == pytest.approx(hand_step(128, 8256, 128, True, 1), rel=1e-12)
    # the batch does not enter: the per-user figure
    assert got == predict(row("ttft_s", batch=1, prompt=128), synthetic())


def test_tokens_per_s_per_user_is_one_over_a_decode_step_at_mid_output():
    # batch 4, prompt 128, output 100: context 128 + 50 = 178 for each of the 4
    got = predict(row("tokens_per_s_per_user", batch=4, output=100), synthetic())
    assert got == pytest.approx(1 / hand_step(4, 4 * 178, 4 * 178, False, 4), rel=1e-12)
    # odd output: output // 2
    got = predict(row("tokens_per_s_per_user", batch=4, output=101), synthetic())
    assert got == pytest.approx(1 / hand_step(4, 4 * 178, 4 * 178, False, 4), rel=1e-12)
    # no output length: the prompt's context; no batch: one user
    got = predict(row("tokens_per_s_per_user", prompt=2048), synthetic())
    assert got == pytest.approx(1 / hand_step(1, 2048, 2048, False, 1), rel=1e-12)
    # dp replicas sampled by one host: the others' logits too
    got = predict(row("tokens_per_s_per_user", batch=4, output=100, dp=3), synthetic())
    host = 2 * 4 * V * LOGIT
    assert got == pytest.approx(1 / (hand_step(4, 4 * 178, 4 * 178, False, 4) + host), rel=1e-12)


def test_static_batch_throughput():
    # batch 2, prompt 128, output 3: one prefill of both prompts, then decodes at 129 and 130
    t = (hand_step(256, 2 * 8256, 256, True, 2)
         + hand_step(2, 2 * 129, 2 * 129, False, 2) + hand_step(2, 2 * 130, 2 * 130, False, 2))
    got = predict(row("tokens_per_s", batch=2, output=3), synthetic())
    assert got == pytest.approx(2 * 3 / t, rel=1e-12)


def test_unbounded_load_throughput():
    dev = synthetic()
    rep = replica_for(row("tokens_per_s", output=128), dev)
    per = saturation_throughput(rep, 128, 128, max_batch=OFFLINE_MAX_BATCH,
                                chunk_tokens=OFFLINE_CHUNK_TOKENS)
    assert predict(row("tokens_per_s", output=128), dev) == pytest.approx(per, rel=1e-12)
    assert predict(row("tokens_per_s_total", output=128, dp=4), dev) == pytest.approx(4 * per,
                                                                                      rel=1e-12)
    with pytest.raises(CalibrationError, match="needs an output length"):
        predict(row("tokens_per_s"), dev)


def test_replica_of_a_row_spans_its_tp_devices_on_the_scale_up_link():
    dev = load_device("h100-sxm")
    r = dataclasses.replace(row("ttft_s"), tp=4, devices=4)
    rep = replica_for(r, dev)
    assert (rep.tp, rep.span.ranks, rep.span.nodes) == (4, 4, 1)
    assert (rep.span.intra.bandwidth, rep.span.intra.latency) == (dev.scale_up_bandwidth,
                                                                   dev.scale_up_latency)


def test_score_skips_a_row_it_cannot_predict():
    bad = dataclasses.replace(row("ttft_s"), model="llama3-9b", line=7)
    scored, skipped = score([row("ttft_s", value=0.05), bad], {"h100-sxm": synthetic()})
    assert [s.row.line for s in scored] == [2] and len(skipped) == 1
    assert skipped[0].line == 7 and "llama3-9b" in skipped[0].reason
    assert scored[0].error == pytest.approx(scored[0].predicted / 0.05 - 1)


# ---------------------------------------------------------------------------------------- fit
TRUTH = {"memory_efficiency": 0.72, "decode_layer_overhead": 2.5e-5}
PARAMS = ("memory_efficiency", "decode_layer_overhead")


def _generated_rows() -> list[ServingRow]:
    truth = with_values(load_device("h100-sxm"), TRUTH)
    out = []
    for i, (model, batch, prompt) in enumerate([
            ("llama3-8b", 1, 128), ("llama3-8b", 8, 2048), ("llama3-8b", 32, 1024),
            ("llama-3.2-1b-instruct", 1, 128), ("llama-3.2-1b-instruct", 16, 4096),
            ("llama-3.2-1b-instruct", 64, 512), ("llama3-70b", 1, 128), ("llama3-70b", 8, 1024)]):
        tp = 4 if model == "llama3-70b" else 1
        r = ServingRow(line=i + 2, source="gen", model=model, device="h100-sxm", devices=tp,
                       tp=tp, dp=1, batch=batch, prompt_tokens=prompt, output_tokens=256,
                       weight_format="bf16", kv_format="bf16", metric="tokens_per_s_per_user",
                       value=1.0, engine="gen-engine")
        out.append(dataclasses.replace(r, value=predict(r, truth)))
    return out


def test_fit_recovers_the_parameters_it_generated_the_rows_with():
    rows = _generated_rows()
    start = with_values(load_device("h100-sxm"),
                        {"memory_efficiency": 0.4, "decode_layer_overhead": 2e-4})
    fit = fit_chip(rows, {"h100-sxm": start}, PARAMS)
    assert set(fit.values) == set(PARAMS)
    for p, v in TRUTH.items():
        assert fit.values[p] == pytest.approx(v, rel=0.02), p
    assert fit.mape < 0.5
    assert (fit.chip, fit.engine, fit.rows) == ("gh100", "gen-engine", 8)
    # each row refitted without it is still predicted within 1%
    loo = leave_one_out(rows, {"h100-sxm": start}, fit)
    assert len(loo) == 8 and max(abs(s.error) for s in loo) < 0.01


def test_fit_with_no_predictable_row_is_refused():
    with pytest.raises(CalibrationError, match="can be predicted; fix"):
        fit_chip([dataclasses.replace(row("ttft_s"), model="llama3-9b")],
                 {"h100-sxm": synthetic()}, PARAMS)


def test_chip_kinds():
    kinds = chip_kinds("wormhole")
    assert sorted(kinds) == ["wormhole-n150", "wormhole-n300"]
    assert all(d.chip == "wormhole" for d in kinds.values())
    assert sorted(chip_kinds("gh100")) == ["h100-sxm", "h200-sxm", "h800-sxm"]
    assert chip_kinds("no-such-chip") == {}


def test_with_values_sets_fields_as_floats():
    dev = with_values(load_device("h100-sxm"), {"memory_efficiency": 1, "logit_overhead": 0})
    assert dev.memory_efficiency == 1.0 and isinstance(dev.memory_efficiency, float)
    assert dev.name == "h100-sxm"


# -------------------------------------------------------------------------------- bundled rows
def test_every_bundled_row_is_read_and_scored():
    rows = read_rows(BUNDLED)
    assert len(rows) > 100
    assert {r.metric for r in rows} <= set(METRICS)
    scored, skipped = score(rows)
    assert skipped == []
    assert len(scored) == len(rows)
    for s in scored:
        assert s.predicted > 0 and s.row.value > 0
