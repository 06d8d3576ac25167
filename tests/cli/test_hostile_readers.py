"""Every reader on the guarded path, every number checked: the measurement CSVs of
``mpmd validate --layers`` (layer timings, serving-step timings) and ``--serving`` (published
serving rows), what-if sweep specs and options, every float flag of every command (``nan`` and
``inf`` refused), and ``serve-plan --precision``. Each bad input is one line on stderr starting
with "error: ", naming the file, line, column and value (or the flag and value) and the fix,
exit status 2, no traceback, no output file.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

import click
import pytest

from mpmd.cli.main import COMMANDS
from mpmd.cli.params import FiniteFloat
from mpmd.cli.serve import parse_precisions
from tests.cli.test_hostile import CPU, EXAMPLE, ROOT, one_line, run

DEVICE = ROOT / "reports" / "validation" / "device"
LAYERS = DEVICE / "h100_layers.csv"
STEPS = DEVICE / "h100_serving.csv"
PUBLISHED = ROOT / "reports" / "validation" / "published_serving.csv"
PLAN = ROOT / "tests" / "launchers" / "data" / "llama3-70b-h100x128.json"
H100X64 = ROOT / "hardware_profiles" / "clusters" / "h100x64_nodes.yaml"


def rows_of(src: Path) -> list[list[str]]:
    return list(csv.reader(io.StringIO(src.read_text(), newline="")))


def line_of(src: Path, **where: str) -> int:
    """The line of the first row of ``src`` whose columns hold the values ``where`` gives."""
    rows = rows_of(src)
    head = rows[0]
    return next(i + 1 for i, r in enumerate(rows)
                if i and all(r[head.index(c)] == v for c, v in where.items()))


def edited(src: Path, line: int, column: str, value: str) -> str:
    """``src`` with ``column`` of line ``line`` set to ``value``."""
    rows = rows_of(src)
    rows[line - 1][rows[0].index(column)] = value
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def refused_csv(tmp_path: Path, data: str | bytes, args: list, needles: tuple[str, ...]) -> str:
    f = tmp_path / "bad.csv"
    f.write_bytes(data if isinstance(data, bytes) else data.encode())
    out = tmp_path / "report.md"
    line = one_line(run([*args, f, "--out", out]), out, needles=needles)
    assert str(f) in line
    return line


# ----------------------------------------------------------------------------- layer timings
GEMM = line_of(LAYERS, item="gemm")
F, FB = line_of(LAYERS, item="block", **{"pass": "F"}), line_of(LAYERS, item="block", **{"pass": "FB"})

LAYER_CSVS = {
    "binary": (lambda: b"device_kind,item\n\x00\x01", ("NUL byte at offset 17", "binary file")),
    "non-numeric seconds": (lambda: edited(LAYERS, GEMM, "seconds", "fast"),
                            (f"line {GEMM}: column 'seconds' = 'fast' is not a positive finite number",
                             "fix: give the measured seconds")),
    "zero seconds": (lambda: edited(LAYERS, GEMM, "seconds", "0"),
                     (f"line {GEMM}: column 'seconds' = '0' is not a positive finite number",)),
    "negative seconds": (lambda: edited(LAYERS, GEMM, "seconds", "-0.5"),
                         (f"line {GEMM}: column 'seconds' = '-0.5'",)),
    "nan seconds": (lambda: edited(LAYERS, GEMM, "seconds", "nan"), ("column 'seconds' = 'nan'",)),
    "inf seconds": (lambda: edited(LAYERS, GEMM, "seconds", "inf"), ("column 'seconds' = 'inf'",)),
    "non-integer m": (lambda: edited(LAYERS, GEMM, "m", "4096.5"),
                      (f"line {GEMM}: column 'm' = '4096.5' is not an integer from 1 to",
                       "bench_device_layers.py")),
    "zero m": (lambda: edited(LAYERS, GEMM, "m", "0"), ("column 'm' = '0' is not an integer",)),
    "gemm without m": (lambda: edited(LAYERS, GEMM, "m", ""), ("column 'm' = '' is not an integer",)),
    "2**31 tokens": (lambda: edited(LAYERS, F, "seq_len", str(2**31)),
                     (f"line {F}: column 'seq_len' = '2147483648' is not an integer from 1 to "
                      f"1048576",)),
    "unknown pass": (lambda: edited(LAYERS, F, "pass", "BF"),
                     (f"line {F}: column 'pass' = 'BF' is not one of F, FB",)),
    "unknown item": (lambda: edited(LAYERS, GEMM, "item", "conv"),
                     ("column 'item' = 'conv' is not one of block, gemm, copy",)),
    "unknown attention kernel": (lambda: edited(LAYERS, F, "attention", "flash3"),
                                 ("column 'attention' = 'flash3' is not one of cudnn, xla",)),
    "no rows": (lambda: LAYERS.read_text().splitlines()[0] + "\n", ("layer-timing CSV has no rows",)),
    "missing column": (lambda: LAYERS.read_text().replace(",seconds,", ",secs,", 1),
                       ("layer-timing CSV lacks column(s) seconds",)),
    "extra field": (lambda: edited(LAYERS, GEMM, "attention", "x,y"),
                    (f"line {GEMM}: ", "more than the 19 columns")),
}


@pytest.mark.parametrize("case", list(LAYER_CSVS))
def test_hostile_layer_timings(tmp_path, case):
    make, needles = LAYER_CSVS[case]
    data = make()
    if case == "extra field":      # an unquoted comma: one field more than the header
        data = data.replace('"x,y"', "x,y")
    refused_csv(tmp_path, data, ["validate", "--layers"], needles)


# ----------------------------------------------------------------------------- serving steps
DECODE, PREFILL = line_of(STEPS, item="decode"), line_of(STEPS, item="prefill")

STEP_CSVS = {
    "binary": (lambda: b"device_kind,context\n\x00", ("NUL byte", "binary file")),
    "non-numeric seconds": (lambda: edited(STEPS, DECODE, "seconds", "slow"),
                            (f"line {DECODE}: column 'seconds' = 'slow' is not a positive finite",)),
    "zero seconds": (lambda: edited(STEPS, DECODE, "seconds", "0"), ("column 'seconds' = '0'",)),
    "negative seconds": (lambda: edited(STEPS, DECODE, "seconds", "-1"), ("column 'seconds' = '-1'",)),
    "non-integer batch": (lambda: edited(STEPS, DECODE, "batch", "2.5"),
                          ("column 'batch' = '2.5' is not an integer from 1 to 65536",
                           "bench_device_serving.py")),
    "zero tensor": (lambda: edited(STEPS, DECODE, "tensor", "0"), ("column 'tensor' = '0'",)),
    "unknown item": (lambda: edited(STEPS, DECODE, "item", "verify"),
                     ("column 'item' = 'verify' is not one of decode, prefill",)),
    "decode without context": (lambda: edited(STEPS, DECODE, "context", ""),
                               (f"line {DECODE}: column 'context' = '' is not an integer",)),
    "prefill without prompt": (lambda: edited(STEPS, PREFILL, "prompt", ""),
                               (f"line {PREFILL}: column 'prompt' = ''",)),
    "prompt of 10**12 tokens": (lambda: edited(STEPS, PREFILL, "prompt", "1000000000000"),
                                ("column 'prompt' = '1000000000000' is not an integer from 1 to",)),
}


@pytest.mark.parametrize("case", list(STEP_CSVS))
def test_hostile_serving_step_timings(tmp_path, case):
    make, needles = STEP_CSVS[case]
    refused_csv(tmp_path, make(), ["validate", "--layers"], needles)


# ----------------------------------------------------------------------------- published serving
PUBLISHED_CSVS = {
    "binary": (lambda: PUBLISHED.read_bytes()[:300] + b"\x00", ("NUL byte", "binary file")),
    "non-numeric value": (lambda: edited(PUBLISHED, 2, "value", "fast"),
                          ("line 2: column 'value' = 'fast' is not a positive finite number",)),
    "zero value": (lambda: edited(PUBLISHED, 2, "value", "0"), ("column 'value' = '0'",)),
    "negative value": (lambda: edited(PUBLISHED, 2, "value", "-3"), ("column 'value' = '-3'",)),
    "infinite value": (lambda: edited(PUBLISHED, 2, "value", "inf"), ("column 'value' = 'inf'",)),
    "infinite tp": (lambda: edited(PUBLISHED, 2, "tp", "inf"),
                    ("line 2: column 'tp' = 'inf' is not an integer from 1 to 1048576",)),
    "zero tp": (lambda: edited(PUBLISHED, 2, "tp", "0"), ("column 'tp' = '0'",)),
    "non-integer devices": (lambda: edited(PUBLISHED, 2, "devices", "1.5"),
                            ("column 'devices' = '1.5'",)),
    "output of 10**8 tokens": (lambda: edited(PUBLISHED, 2, "output_tokens", "100000000"),
                               ("column 'output_tokens' = '100000000' is not an integer",)),
    "unknown metric": (lambda: edited(PUBLISHED, 3, "metric", "tok_per_s"),
                       ("line 3: column 'metric' = 'tok_per_s' is not one of tokens_per_s_per_user",)),
    "missing column": (lambda: PUBLISHED.read_text().replace(",engine,", ",engin,", 1),
                       ("serving CSV lacks column(s) engine",)),
}


@pytest.mark.parametrize("case", list(PUBLISHED_CSVS))
def test_hostile_published_serving_rows(tmp_path, case):
    make, needles = PUBLISHED_CSVS[case]
    refused_csv(tmp_path, make(), ["validate", "--serving", "--csv"], needles)


# ----------------------------------------------------------------------------- float flags
def plan_args(tmp):
    return ["plan", "--model", "llama-tiny", "--cluster", CPU, "--global-batch", "8",
            "--out", tmp / "plan.json"], [tmp / "plan.json"]


def simulate_args(tmp):
    return ["simulate", PLAN, "--trace", tmp / "trace.json"], [tmp / "trace.json"]


def run_args(tmp):
    return ["run", PLAN, "--steps", "1", "--trace", tmp / "trace.json"], [tmp / "trace.json"]


def whatif_args(tmp):
    stem = tmp / "w" / "report"
    return (["whatif", "--model", "llama-tiny", "--options", "cpu4x2", "--no-screenshot",
             "--out", stem], [stem.with_suffix(s) for s in (".html", ".csv", ".md")])


def serve_args(tmp):
    return (["serve-plan", "--model", "llama3-8b", "--cluster", H100X64, "--prompt", "128",
             "--output", "16", "--out", tmp / "plans.json", "--trace", tmp / "trace.json"],
            [tmp / "plans.json", tmp / "trace.json"])


def video_args(tmp):
    return (["video", "--pipeline", "mochi", "--cluster", "hardware_profiles/clusters/h100x1.yaml",
             "--out", tmp / "video.json"], [tmp / "video.json"])


FLOAT_FLAGS = {("plan", "--time-limit"): plan_args, ("plan", "--min-throughput"): plan_args,
               ("plan", "--max-usd-per-hour"): plan_args, ("simulate", "--jitter"): simulate_args,
               ("run", "--lr"): run_args, ("whatif", "--tokens"): whatif_args,
               ("whatif", "--videos-per-hour"): whatif_args,
               ("whatif", "--deadline-days"): whatif_args, ("whatif", "--time-limit"): whatif_args,
               ("serve-plan", "--ttft"): serve_args, ("serve-plan", "--tpot"): serve_args,
               ("serve-plan", "--percentile"): serve_args, ("serve-plan", "--spread"): serve_args,
               ("video", "--memory-gb"): video_args, ("video", "--headroom"): video_args}
"""Every float flag of every command, with the command's arguments (and its output files)."""


def test_every_float_flag_is_finite_and_listed():
    found = {(cmd.name, opt) for cmd in COMMANDS for p in cmd.params
             if isinstance(p.type, click.types.FloatParamType)
             for opt in p.opts if opt.startswith("--")}
    assert found == set(FLOAT_FLAGS)
    for cmd in COMMANDS:
        for p in cmd.params:
            if isinstance(p.type, click.types.FloatParamType):
                assert isinstance(p.type, FiniteFloat), (cmd.name, p.name)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("command,flag", list(FLOAT_FLAGS))
def test_float_flags_refuse_nan_and_inf(tmp_path, command, flag, value):
    args, outs = FLOAT_FLAGS[command, flag](tmp_path)
    one_line(run([*args, flag, value]), *outs,
             needles=(f"'{flag}'", f"'{value}' is not a finite number", "give a number such as"))


# numbers inside flag values, parsed by hand
KNOBS = [(simulate_args, "--straggler", "m0={}", "{} is not a number in (0, 1e+06]"),
         (simulate_args, "--degrade-link", "m0<->m1={}", "{} is not a number in (0, 1]"),
         (simulate_args, "--fail-link", "m0<->m1@{}", "{} is not a number in [0, 1e+09]"),
         (simulate_args, "--fail-mesh", "m0@{}", "{} is not a number in [0, 1e+09]"),
         (whatif_args, "--price", "h100-sxm={}", "--price 'h100-sxm={}'")]


@pytest.mark.parametrize("value", ["nan", "inf"])
@pytest.mark.parametrize("make,flag,form,needle", KNOBS, ids=[k[1] for k in KNOBS])
def test_numbers_inside_flag_values_refuse_nan_and_inf(tmp_path, make, flag, form, needle, value):
    args, outs = make(tmp_path)
    one_line(run([*args, flag, form.format(value)]), *outs,
             needles=(flag, needle.format(value)))


# ----------------------------------------------------------------------------- serve-plan formats
@pytest.mark.parametrize("precision,needles", [
    ("bfp8,gate_up=", ("'bfp8,gate_up=': item 'gate_up=' is not PART=FORMAT",
                       "PART one of attention, gate_up, down, head", "FORMAT one of fp32, bf16",
                       "write [KIND:]FORMAT[,PART=FORMAT...], e.g. 'bfp8,gate_up=bfp4'")),
    ("bfp8,mlp=bfp4", ("item 'mlp=bfp4' is not PART=FORMAT",)),
    ("bfp8,,gate_up=bfp4", ("item '' is not PART=FORMAT",)),
    ("gate_up=bfp4", ("'gate_up=bfp4': starts with 'gate_up=bfp4', not a format",)),
    ("bfp9", ("'bfp9': starts with 'bfp9', not a format (one of fp32, bf16",)),
    ("blackhole-p150b:bfp8,down=fp5", ("'blackhole-p150b:bfp8,down=fp5': item 'down=fp5'",)),
    ("blackhole-p150b:", ("'blackhole-p150b:': starts with '', not a format",)),
    (":bf16", ("':bf16' has no device kind before ':'",)),
])
def test_precision_names_the_malformed_item(tmp_path, precision, needles):
    args, outs = serve_args(tmp_path)
    one_line(run([*args, "--precision", precision]), *outs,
             needles=("Invalid value for --precision: ", *needles))


def test_kv_format_is_checked_first(tmp_path):
    args, outs = serve_args(tmp_path)
    one_line(run([*args, "--kv-format", "bf17"]), *outs,
             needles=("--kv-format: 'bf17' is not a format; use one of fp32, bf16",))


def test_good_precisions_still_parse():
    assert parse_precisions(("fp8", "blackhole-p150b:bfp8,gate_up=bfp4", "h100-sxm:bf16")) == (
        "fp8", {"blackhole-p150b": "bfp8,gate_up=bfp4", "h100-sxm": "bf16"})
    assert parse_precisions(()) == ("bf16", {})


# ----------------------------------------------------------------------------- what-if specs
def whatif_with(tmp_path, *args):
    stem = tmp_path / "w" / "report"
    return (["whatif", *args, "--out", stem, "--no-screenshot", "--time-limit", "1"],
            [stem.with_suffix(s) for s in (".html", ".csv", ".md")])


SWEEP = "budget_usd_per_hour: 100\ndevices: {{h100-sxm: {{{}}}}}\n{}"
SWEEPS = {
    "fractional unit": (SWEEP.format("unit: 8.5, units: [1]", ""), ("unit = 8.5, units = [1]",)),
    "fractional unit count": (SWEEP.format("unit: 8, units: [1.5]", ""), ("units = [1.5]",)),
    "boolean unit": (SWEEP.format("unit: true, units: [1]", ""), ("unit = True",)),
    "units as a string": (SWEEP.format("unit: 8, units: '12'", ""), ("units = '12'",)),
    "no unit counts": (SWEEP.format("unit: 8, units: []", ""), ("units a non-empty list",)),
    "fractional axis": (SWEEP.format("unit: 8, units: [1], axes: {data: 4, tensor: 2.5}", ""),
                        ("axes {'data': 4, 'tensor': 2.5} are not integers",)),
    "fractional max_options": (SWEEP.format("unit: 8, units: [1]", "max_options: 2.5\n"),
                               ("max_options = 2.5",)),
    "boolean budget": (SWEEP.format("unit: 8, units: [1]", "").replace("100", "true"),
                       ("numeric 'budget_usd_per_hour'",)),
}


@pytest.mark.parametrize("case", list(SWEEPS))
def test_hostile_sweep_values(tmp_path, case):
    text, needles = SWEEPS[case]
    f = tmp_path / "sweep.yaml"
    f.write_text(text)
    args, outs = whatif_with(tmp_path, "--model", "llama3-8b", "--sweep", f)
    one_line(run(args), *outs, needles=("sweep device 'h100-sxm'" if "max" not in case
                                        and "budget" not in case else "sweep", *needles))


@pytest.mark.parametrize("setting,needles", [
    ("schedules: [nope]", ("option 'h100x64_nodes': schedules holds 'nope', not a schedule",
                           "fix: use 1f1b, interleaved-1f1b")),
    ("schedules: 1f1b", ("schedules = '1f1b' is not a list", "'schedules: [1f1b]'")),
    ("microbatches: 8", ("microbatches = 8 is not a list",)),
    ("microbatches: [true]", ("microbatches = True is not a number",)),
])
def test_hostile_option_settings(tmp_path, setting, needles):
    text = EXAMPLE.read_text()
    data = text.replace("options:\n  - cluster: h100x64_nodes\n",
                        f"options:\n  - cluster: h100x64_nodes\n    {setting}\n")
    assert data != text
    f = tmp_path / "ex.yaml"
    f.write_text(data)
    args, outs = whatif_with(tmp_path, "--example", f)
    one_line(run(args), *outs, needles=needles)
