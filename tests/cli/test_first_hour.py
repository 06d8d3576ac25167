"""What a new user sees first (issue 50): ``mpmd`` alone, ``mpmd models``, the inputs ``mpmd plan``
prints before the plan, ``mpmd whatif``'s terminal table, and sources cited by document name."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from click.testing import CliRunner
from rich.console import Console

from mpmd.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]


def mpmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mpmd", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


def rendered(thing, width: int = 120) -> list[str]:
    """``thing`` as rich prints it on a ``width``-column console, lines right-stripped."""
    con = Console(width=width, color_system=None)
    with con.capture() as cap:
        con.print(thing)
    return [ln.rstrip() for ln in cap.get().splitlines()]


def lines_of(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


# ------------------------------------------------------------------------------ mpmd alone
def test_mpmd_alone_prints_the_short_usage():
    r = mpmd()
    assert (r.returncode, r.stdout) == (2, "")
    lines = lines_of(r.stderr)
    assert lines[:3] == ["Usage: mpmd [OPTIONS] COMMAND [ARGS]...", "", "Commands:"]
    assert [ln.split()[0] for ln in lines[3:-2]] == sorted(c.name for c in COMMANDS)
    assert all(ln.startswith("  ") and len(ln) <= 80 for ln in lines[3:-2])
    assert "  models      List the models --model takes, with their sizes." in lines
    assert lines[-2:] == ["", "Run 'mpmd COMMAND --help' for a command's options."]


@pytest.mark.parametrize("args,line", [
    (["nosuch"], "error: No such command 'nosuch'; see 'mpmd --help'"),
    (["plan", "--bogus"],
     "error: No such option '--bogus'. Did you mean '--out'?; see 'mpmd plan --help'"),
    (["--bogus"], "error: No such option '--bogus'; see 'mpmd --help'"),
])
def test_other_usage_errors_stay_one_line(args, line):
    r = mpmd(*args)
    assert (r.returncode, r.stdout, lines_of(r.stderr)) == (2, "", [line])


# ------------------------------------------------------------------------------ mpmd models
ZOO_TABLE = """\
zoo models (--model NAME)
model              family     use    layers  hidden  heads  experts  params  active
gpt3-175b          gpt        train      96   12288  96/96  -        174.6B  174.6B
grok-1-314b        llama      train      64    6144  48/8   2 of 8   315.7B   83.8B
llama-tiny         llama      train       8     512  8/8    -         27.5M   27.5M
llama3-405b        llama      train     126   16384  128/8  -        405.9B  405.9B
llama3-70b         llama      train      80    8192  64/8   -         70.6B   70.6B
llama3-8b          llama      train      32    4096  32/8   -          8.0B    8.0B
mochi-dit-10b      mochi      infer      48    3072  24/24  -         10.0B   10.0B
mochi-dit-tiny     mochi      infer       4      64  4/4    -          0.3M    0.3M
mochi-vae-decoder  mochi_vae  infer      22     768  1/1    -        362.5M  362.5M
mochi-vae-tiny     mochi_vae  infer       9      32  1/1    -          0.2M    0.2M
opt-350m           gpt        train      24    1024  16/16  -        355.9M  355.9M
t5-tiny-encoder    t5         infer       2      32  4/4    -          0.0M    0.0M
t5-xxl-encoder     t5         infer      24    4096  64/64  -          4.8B    4.8B""".splitlines()

SHIPPED_HEADER = [
    "shipped configs, zoo/configs/ (--model NAME, or the file's path)",
    "model                    family       use    layers  hidden  heads    experts        params  active"]

SHIPPED_ROWS = [   # the mixtures of experts, and one config of each other kind
    "deepseek-v3              deepseek_v3  train      61    7168  128/128  8 of 256 +1    671.0B   37.6B",
    "mixtral-8x22b-v0.1       mixtral      train      56    6144  48/8     2 of 8         140.6B   39.2B",
    "qwen3-235b-a22b          qwen3_moe    train      94    4096  64/4     8 of 128       235.1B   22.2B",
    "gpt2                     gpt2         train      12     768  12/12    -              124.4M  124.4M",
    "llama-tiny-decode        llama spec   infer       8     512  8/8      -               27.5M   27.5M",
    "tiny-moe                 llama spec   train       4     128  4/2      2 of 4           1.1M    0.7M",
    "kimi-k2-instruct         kimi_k2      train      61    7168  64/64    8 of 384 +1   1026.4B   32.9B",
]

MODELS_FOOTER = """\
heads: query/key-value; experts: the routed experts a token goes to, of all (+ shared experts);
active: the parameters one token uses.
--model also takes a model file: a Hugging Face config.json of model_type llama, mistral, qwen2,
qwen3, gemma, gemma2, gemma3, gemma3_text, gpt2, gpt_neox, opt, or of the mixtures of experts
mixtral, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, nemotron_h, llama4, llama4_text,
qwen3_next, qwen3_5_moe, qwen3_5_moe_text; or a YAML model spec (family llama or gpt).""".splitlines()


def test_models_lists_the_zoo_and_the_shipped_configs():
    from zoo.config import list_models
    from zoo.model_files import shipped_models

    r = CliRunner().invoke(main, ["models"])
    assert r.exit_code == 0, r.output
    lines = lines_of(r.output)
    assert max(len(ln) for ln in lines) <= 100
    n = len(list_models())
    assert lines[:2] == ZOO_TABLE[:2] and set(lines[2]) == {"─"}
    assert lines[3:3 + n] == ZOO_TABLE[2:]
    shipped = lines[3 + n:]
    assert shipped[:2] == SHIPPED_HEADER and set(shipped[2]) == {"─"}
    rows = shipped[3:-len(MODELS_FOOTER)]
    assert [ln.split()[0] for ln in rows] == sorted(shipped_models())
    assert set(SHIPPED_ROWS) <= set(rows)
    assert shipped[-len(MODELS_FOOTER):] == MODELS_FOOTER


def test_plan_help_names_the_zoo_models_and_mpmd_models():
    from mpmd.cli.plan import plan_command

    (opt,) = [p for p in plan_command.params if p.name == "model"]
    assert opt.help == (
        "A zoo model (gpt3-175b, grok-1-314b, llama-tiny, llama3-405b, llama3-70b, llama3-8b, "
        "mochi-dit-10b, mochi-dit-tiny, mochi-vae-decoder, mochi-vae-tiny, opt-350m, t5-tiny-encoder, "
        "t5-xxl-encoder), a shipped config's name (e.g. deepseek-v3) or "
        "a model file: a Hugging Face config.json of model_type llama, mistral, qwen2, qwen3, "
        "gemma, gemma2, gemma3, gemma3_text, gpt2, gpt_neox, opt, or of the mixtures of experts "
        "mixtral, qwen3_moe, deepseek_v2, deepseek_v3, kimi_k2, gpt_oss, nemotron_h, llama4, "
        "llama4_text, qwen3_next, qwen3_5_moe, qwen3_5_moe_text; or a YAML model spec "
        "(family llama or gpt). "
        "'mpmd models' lists them all, with their families, sizes and experts.")
    r = CliRunner().invoke(main, ["plan", "--help"])
    assert r.exit_code == 0
    assert "'mpmd models' lists them all" in " ".join(r.output.split())


# ------------------------------------------------------------------------------ plan inputs
def _inputs(model: str, cluster: str, batch: int, seq: int, batch_given: bool = False,
            seq_given: bool = False, precision: str = "bf16") -> list[str]:
    from hardware_profiles import load_cluster
    from mpmd.cli.output import plan_inputs
    from zoo.model_files import resolve_model
    from zoo.models import layer_names

    w = SimpleNamespace(global_batch=batch, seq_len=seq, precision=precision,
                        cross_entropy="fused", layers=layer_names(resolve_model(model)))
    return rendered(plan_inputs(model, resolve_model(model), w, load_cluster(cluster),
                                batch_given=batch_given, seq_given=seq_given))


def test_plan_inputs_of_a_zoo_model_with_default_batch_and_length():
    assert _inputs("llama3-70b", "h100x16_p150bx32", 256, 8192) == [
        "inputs",
        "model            llama3-70b from the zoo: 70.6B parameters in bfloat16",
        "layers           82 in the stage table: 0 embedding, 1-80 decoder blocks, 81 head",
        "global batch     256 samples (mpmd plan's default; --global-batch sets it)",
        "sequence length  8,192 tokens per sample (default: the zoo model's)",
        "tokens per step  2,097,152",
        "precision        bf16: every GEMM in the model's dtype (the default; --precision sets "
        "it)",
        "cluster          h100x16_p150bx32, 48 devices: 16 h100-sxm (2 meshes of 8), 32 "
        "blackhole-p150b (4 meshes of 8)",
        "read             both as listed and as node groups h100-sxm (2 x 8), blackhole-p150b (4 x "
        "8) with the listing's links as",
        "                 the topology between them (they join the nodes unequally); the faster "
        "plan is kept"]


def test_plan_inputs_of_a_shipped_mixture_of_experts_on_node_groups():
    assert _inputs("deepseek-v3", "h100x2048_nodes", 15360, 4096, batch_given=True,
                   seq_given=True, precision="mxfp8") == [
        "inputs",
        "model            DeepSeek-V3 from zoo/configs/DeepSeek-V3.json: 671.0B parameters (37.6B "
        "active per token) in bfloat16",
        "layers           63 in the stage table: 0 embedding, 1-61 decoder blocks, 62 head",
        "global batch     15,360 samples (--global-batch)",
        "sequence length  4,096 tokens per sample (--seq-len)",
        "tokens per step  62,914,560",
        "precision        mxfp8: MXFP8: 32 E4M3 elements share a power-of-two scale (Blackwell "
        "tensor cores); attention, norms,",
        "                 embedding and LM head in bf16 (--precision)",
        "cluster          h100x2048_nodes, 2,048 devices: 2,048 h100-sxm (256 nodes of 8)"]


def test_plan_inputs_of_a_config_file_and_of_mochi():
    assert _inputs("zoo/configs/Qwen3-8B.json", "mixed512_nodes", 256, 8192)[1:] == [
        "model            Qwen3-8B from zoo/configs/Qwen3-8B.json: 8.2B parameters in bfloat16",
        "layers           38 in the stage table: 0 embedding, 1-36 decoder blocks, 37 head",
        "global batch     256 samples (mpmd plan's default; --global-batch sets it)",
        "sequence length  8,192 tokens per sample (default: the config's context length, at most "
        "8,192)",
        "tokens per step  2,097,152",
        "precision        bf16: every GEMM in the model's dtype (the default; --precision sets "
        "it)",
        "cluster          mixed512_nodes, 512 devices: 128 h100-sxm (16 nodes of 8), 256 tpu-v5e (4 "
        "nodes of 64), 128",
        "                 blackhole-p150b (16 nodes of 8)"]
    assert _inputs("mochi-dit-10b", "h100x1", 128, 44776)[1:] == [
        "model            mochi-dit-10b from the zoo: 10.0B parameters in bfloat16",
        "layers           50 in the stage table: 0 embedding, 1-48 decoder blocks, 49 head",
        "global batch     128 samples: one video, 64 sampling steps x 2 guidance passes (the "
        "default; --global-batch sets it)",
        "sequence length  44,776 tokens per sample (the model's: latent video and text tokens)",
        "tokens per step  5,731,328",
        "cluster          h100x1, 1 device: 1 h100-sxm (1 mesh of 1)"]


def test_mpmd_plan_prints_its_inputs_first():
    """The whole command: the inputs block, then the plan table; an inference decoder's default
    batch is one request (it was 0 samples, refused)."""
    r = CliRunner().invoke(main, ["plan", "--model", "zoo/configs/llama-tiny-decode.yaml",
                                  "--cluster", "cpu4x2", "--time-limit", "1"])
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stdout)
    assert lines[:9] == [
        "inputs",
        "model            llama-tiny-decode from zoo/configs/llama-tiny-decode.yaml: 27.5M "
        "parameters in float32",
        "layers           10 in the stage table: 0 embedding, 1-8 decoder blocks, 9 head",
        "global batch     1 sample: one request (the default; --global-batch sets it)",
        "sequence length  128 tokens per sample (default: the model spec's)",
        "tokens per step  128",
        "cluster          cpu4x2, 8 devices: 8 cpu-host (4 meshes of 2)",
        "read             its 4 meshes as listed, not as node groups: mesh 'm0' shares host "
        "'local' with other meshes",
        "llama-tiny-decode on cpu4x2: stages"]


# ------------------------------------------------------------------------------ whatif table
def _option(option, devices, step, tps, mfu, usd_h, usd_mtok, **extra):
    lo, hi = usd_h
    return {"option": option, "devices": devices, "feasible": step is not None, "reason": "",
            "step_time_s": step, "tokens_per_s": tps, "mfu": mfu, "usd_per_hour_low": lo,
            "usd_per_hour_high": hi, "usd_per_mtok_low": usd_mtok[0],
            "usd_per_mtok_high": usd_mtok[1], **extra}


def _whatif_df():
    df = pd.DataFrame([
        _option("64 H100", "64 h100-sxm", 31.935, 65670.2, 0.473, (172.8, 313.6), (0.7309, 1.327)),
        _option("256 TPU v5e", "256 tpu-v5e", 33.178, 63210.0, 0.571, (307.2, 307.2), (1.35, 1.35)),
        _option("32 H100 + 128 p150b (2 DGX + 16 LoudBoxes)", "32 h100-sxm + 128 blackhole-p150b",
                31.817, 65912.0, 0.405, (92.72, 171.4), (0.3908, 0.7224)),
        {**_option("16 H100", "16 h100-sxm", None, math.nan, math.nan, (43.2, 78.4),
                   (math.nan, math.nan)), "reason": "does not fit"},
        _option("cpu", "8 cpu-host", 8.842, 3706.0, 0.542, (math.nan, math.nan),
                (math.nan, math.nan)),
    ])
    df.attrs.update(kind="training", title="What-if: train Llama 3 70B on 1T tokens")
    return df


def test_whatif_table_has_the_buyers_columns_and_fits_120_columns():
    from mpmd.cli.whatif import buyer_table

    assert rendered(buyer_table(_whatif_df())) == """\
What-if: train Llama 3 70B on 1T tokens
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━┓
┃ option                      ┃ devices                    ┃   step (s) ┃ tokens/s ┃   MFU ┃      $/hour ┃  $/M tokens ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━┩
│ 64 H100                     │ 64 h100-sxm                │     31.935 │   65,670 │ 47.3% │ 172.8-313.6 │  0.731-1.33 │
│ 256 TPU v5e                 │ 256 tpu-v5e                │     33.178 │   63,210 │ 57.1% │       307.2 │        1.35 │
│ 32 H100 + 128 p150b (2 DGX  │ 32 h100-sxm + 128          │     31.817 │   65,912 │ 40.5% │ 92.72-171.4 │ 0.391-0.722 │
│ + 16 LoudBoxes)             │ blackhole-p150b            │            │          │       │             │             │
│ 16 H100                     │ 16 h100-sxm                │ infeasible │        - │     - │           - │           - │
│ cpu                         │ 8 cpu-host                 │      8.842 │    3,706 │ 54.2% │           - │           - │
└─────────────────────────────┴────────────────────────────┴────────────┴──────────┴───────┴─────────────┴─────────────┘""".splitlines()


def test_whatif_table_of_an_inference_model_and_of_a_sweep():
    from mpmd.cli.whatif import buyer_table

    df = pd.DataFrame([{"option": "1 H100", "devices": "1 h100-sxm", "feasible": True,
                        "step_time_s": 414.744, "videos_per_hour": 8.68, "mfu": 0.525,
                        "usd_per_hour_low": 2.7, "usd_per_hour_high": 4.9,
                        "usd_per_video_low": 0.3111, "usd_per_video_high": 0.5645}])
    df.attrs.update(kind="inference", title="Mochi")
    assert rendered(buyer_table(df))[2] == (
        "┃ option ┃ devices    ┃ step (s) ┃ videos/h ┃   MFU ┃  $/hour ┃     $/video ┃")
    assert rendered(buyer_table(df))[4] == (
        "│ 1 H100 │ 1 h100-sxm │  414.744 │     8.68 │ 52.5% │ 2.7-4.9 │ 0.311-0.565 │")
    sweep = _whatif_df().assign(option=lambda d: d["devices"])    # named by their devices
    assert rendered(buyer_table(sweep)) == """\
What-if: train Llama 3 70B on 1T tokens
┏━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━┳━━━━━━━━━━━━━┓
┃ option                            ┃   step (s) ┃ tokens/s ┃   MFU ┃      $/hour ┃  $/M tokens ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━╇━━━━━━━━━━━━━┩
│ 64 h100-sxm                       │     31.935 │   65,670 │ 47.3% │ 172.8-313.6 │  0.731-1.33 │
│ 256 tpu-v5e                       │     33.178 │   63,210 │ 57.1% │       307.2 │        1.35 │
│ 32 h100-sxm + 128 blackhole-p150b │     31.817 │   65,912 │ 40.5% │ 92.72-171.4 │ 0.391-0.722 │
│ 16 h100-sxm                       │ infeasible │        - │     - │           - │           - │
│ 8 cpu-host                        │      8.842 │    3,706 │ 54.2% │           - │           - │
└───────────────────────────────────┴────────────┴──────────┴───────┴─────────────┴─────────────┘""".splitlines()


def test_mpmd_whatif_prints_the_short_table_and_says_where_the_rest_is(tmp_path):
    r = CliRunner().invoke(main, ["whatif", "--model", "llama-tiny", "--options", "cpu4x2",
                                  "h100x1", "--time-limit", "0.2", "--no-screenshot", "--out",
                                  str(tmp_path / "r")])
    assert r.exit_code == 0, r.output
    lines = lines_of(r.stdout)
    assert max(len(ln) for ln in lines) <= 120
    i = lines.index("What-if: llama-tiny")
    assert [c.strip() for c in lines[i + 2].split("┃")[1:-1]] == [
        "option", "devices", "step (s)", "tokens/s", "MFU", "$/hour", "$/M tokens"]
    assert [ln.split("│")[1].strip() for ln in lines[i + 4:i + 6]] == ["cpu4x2", "h100x1"]
    wrote = " ".join(lines[lines.index(next(ln for ln in lines if ln.startswith("wrote"))):])
    paths = ", ".join(str(tmp_path / f"r.{e}") for e in ("html", "csv", "md"))
    assert wrote.startswith(f"wrote {paths} in ")
    assert wrote.endswith(" s; they also hold Plan, Bubble mean/max, Mem headroom, Solver, "
                          "the best-worst ranges and the source of every figure")


# ------------------------------------------------------------------------------ citations
OUTSIDE = ("/work/", "shared/reference", "../shared")


@pytest.mark.parametrize("text,cited", [
    ("collected in /work/shared/hardware_reference.md (H100 row)",
     "collected in 'Accelerator reference figures' (H100 row)"),
    ("guide (/work/shared/reference/004_fb84b110b421d1e0.txt, 'QuietBox')",
     "guide ('Sharding and Multi-Device Parallelism for Mochi on Tenstorrent Hardware', "
     "'QuietBox')"),
    ("the RFC (shared/reference/000_*.txt)", "the RFC ('MPMD RFC (Shardy)')"),
    ("see ../shared/DESIGN.md", "see 'Design: an MPMD auto-planner, simulator and compiler for "
                                "heterogeneous clusters'"),
    ("(0.90, /work/.library/device/KINDS.md)", "(0.90, 'Accelerator kinds of the device pool')"),
    ("/work/elsewhere/notes.txt", "notes.txt"),
    ("reports/validation/device/h200_layers.csv", "reports/validation/device/h200_layers.csv"),
    ("zoo/shared/x.md", "zoo/shared/x.md"),
])
def test_cite_names_documents_outside_the_repository_by_title(text, cited):
    from reports.citations import cite

    assert cite(text) == cited


def test_report_figures_cite_documents_by_name():
    """Every figure source and alternative of the bundled devices, as a report prints them."""
    from hardware_profiles import load_cluster
    from reports.pricing import figure_rows

    clusters = [load_cluster(c) for c in ("h100x32_p150bx128_nodes", "tpuv5e256",
                                          "quietbox_n300x4", "h200x1")]
    sources = [r["source"] for r in figure_rows(clusters, {})]
    assert not [s for s in sources if any(o in s for o in OUTSIDE)]
    assert any("'Accelerator reference figures'" in s for s in sources)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "reports" / "whatif").iterdir()
                                         if p.suffix in (".md", ".csv", ".html")))
def test_committed_reports_cite_documents_by_name(name):
    text = (ROOT / "reports" / "whatif" / name).read_text()
    assert not [o for o in OUTSIDE if o in text]
