"""launchers: each bundled plan exported to every target, parsed back (``shlex`` / ``tomllib`` /
``yaml``), its degrees multiplied out against the plan's devices, and held to golden files.

The plans in ``data/`` are ``mpmd plan`` outputs (the data-parallel one joins two of them by hand,
as :class:`ir.DataParallelPlan`); they are inputs, not planner expectations, so a planner change
does not touch them. After a deliberate change to an exporter, rewrite the golden files with
``python tests/launchers/test_export.py`` and review the diff."""

from __future__ import annotations

import math
import shlex
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ir.plan_file import load_plan
from launchers import TARGETS, LauncherError, export_plan, part_views
from mpmd.cli.main import main

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
GOLDEN = HERE / "golden"
PLANS = sorted(DATA.glob("*.json"))


def exported(plan_path: Path, target: str):
    """The export's files; () where the target refuses the plan: torchtitan for a model it does
    not ship, MaxText for a pipeline whose blocks do not divide into its uniform stages."""
    out = GOLDEN / f"{plan_path.stem}{TARGETS[target][1]}"
    try:
        return export_plan(load_plan(plan_path), target, out, source=f"data/{plan_path.name}")
    except LauncherError as e:
        assert ((target.startswith("torchtitan") and "torchtitan ships no model for" in str(e))
                or (target == "maxtext" and "MaxText's pipeline runs as many blocks" in str(e))
                or (target == "megatron-bridge" and "has no recipe for" in str(e)))
        return ()


def megatron_args(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            words = shlex.split(line)
            out[words[0]] = words[1] if len(words) > 1 else None
    return out


def all_modules(layers: int) -> list[str]:
    return ["tok_embeddings", *(f"layers.{i}" for i in range(layers)), "norm", "output"]


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_degrees_multiply_to_each_parts_devices(plan_path, target):
    plan = load_plan(plan_path)
    views = part_views(plan)
    files = exported(plan_path, target)
    if not files:
        return
    views = [v for v in views if any(f.path.stem.endswith(v.name) for f in files)]
    assert len(files) == len(views)
    for f, v in zip(files, views):
        if target == "megatron":
            a = megatron_args(f.text)
            t, p = int(a["--tensor-model-parallel-size"]), int(a["--pipeline-model-parallel-size"])
            assert v.devices % (t * p) == 0
            data = v.devices // (t * p)
            assert data == v.data
            assert int(a["--global-batch-size"]) % (int(a["--micro-batch-size"]) * data) == 0
            assert int(a["--num-layers"]) == v.model.layers
            layout = a.get("--pipeline-model-parallel-layout")
            if layout is not None:
                stages = layout.split("|")
                assert len(stages) == p * v.virtual
                assert layout.count("t") == v.model.layers
                assert stages[0].startswith("E") and stages[-1].endswith("L")
        elif target == "megatron-bridge":
            a = dict(w.split("=", 1) for w in shlex.split(
                " ".join(x for x in f.text.splitlines() if not x.startswith("#"))))
            t, p = int(a["model.tensor_model_parallel_size"]), int(a["model.pipeline_model_parallel_size"])
            c = int(a["model.context_parallel_size"])
            assert v.devices % (t * p * c) == 0 and v.devices // (t * p * c) == v.data
            assert int(a["train.global_batch_size"]) % (int(a["train.micro_batch_size"]) * v.data) == 0
            assert int(a["model.num_layers"]) == v.model.layers
        elif target == "torchtitan":
            assert f"TORCHTITAN_VERSION = '0.3.0'" in f.text and "def mpmd_plan():" in f.text
        elif target == "torchtitan@0.2":
            doc = tomllib.loads(f.text)
            par = doc["parallelism"]
            dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
            assert dp % par.get("expert_parallel_degree", 1) == 0
            assert dp * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] == v.devices
            assert doc["training"]["global_batch_size"] % (doc["training"]["local_batch_size"] * dp) == 0
            if par["pipeline_parallel_degree"] > 1:
                parts = par["module_fqns_per_model_part"]
                assert len(parts) == par["pipeline_parallel_degree"] * v.virtual
                assert [m for part in parts for m in part] == all_modules(v.model.layers)
        else:
            doc = yaml.safe_load(f.text)
            axes = [doc[f"{level}_{axis}_parallelism"] for level in ("ici", "dcn")
                    for axis in ("data", "fsdp", "tensor", "pipeline", "expert") if
                    f"{level}_{axis}_parallelism" in doc]
            assert math.prod(axes) == v.devices
            accumulation = doc.get("gradient_accumulation_steps", 1)
            assert doc["per_device_batch_size"] * v.devices * accumulation == v.global_batch
        assert all("\n" not in n for n in f.notes)


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("plan_path", PLANS, ids=[p.stem for p in PLANS])
def test_golden(plan_path, target):
    for f in exported(plan_path, target):
        assert f.text == f.path.read_text(), f"{f.path.name} differs; see the module docstring"


def test_llama3_70b_on_128_h100_as_megatron_arguments():
    """The 4-stage plan: TP4 x PP4 x DP8 (its first mesh's TP8 is a note), uneven stages as
    Megatron-core's layout string, the distributed optimizer the plan's memory assumed."""
    (f,) = exported(DATA / "llama3-70b-h100x128.json", "megatron")
    a = megatron_args(f.text)
    assert (a["--tensor-model-parallel-size"], a["--pipeline-model-parallel-size"]) == ("4", "4")
    assert a["--pipeline-model-parallel-layout"] == ("E" + "t" * 18 + "|" + "t" * 21 + "|"
                                                     + "t" * 21 + "|" + "t" * 20 + "L")
    assert (a["--micro-batch-size"], a["--global-batch-size"]) == ("1", "256")
    assert "--use-distributed-optimizer" in a and "--sequence-parallel" in a
    assert "--recompute-granularity" not in a
    assert f.notes == ("mesh h100.0 runs dp4xtp8, the others dp8xtp4: one layout per pipeline "
                       "is written (dp8xtp4)",)


def test_interleaved_plan_as_torchtitan_toml():
    (f,) = exported(DATA / "llama3-70b-interleaved.json", "torchtitan@0.2")
    par = tomllib.loads(f.text)["parallelism"]
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert len(par["module_fqns_per_model_part"]) == 2 * par["pipeline_parallel_degree"]


def test_data_parallel_plan_gives_one_file_per_part():
    files = exported(DATA / "llama3-70b-h100-tpu-data-parallel.json", "maxtext")
    assert [f.path.name for f in files] == ["llama3-70b-h100-tpu-data-parallel-part0.yml",
                                           "llama3-70b-h100-tpu-data-parallel-part1.yml"]
    tpu = yaml.safe_load(files[1].text)
    assert (tpu["ici_fsdp_parallelism"], tpu["ici_tensor_parallelism"]) == (128, 2)
    assert tpu["remat_policy"] == "full"
    assert all(any("gradient all-reduce over h100.0<->tpu_0" in n for n in f.notes) for f in files)


def test_unknown_target_and_non_language_model_are_refused():
    plan = load_plan(DATA / "llama3-70b-h100x128.json")
    with pytest.raises(LauncherError, match="unknown export target 'nemo'"):
        export_plan(plan, "nemo", "x")
    from dataclasses import replace
    with pytest.raises(LauncherError, match="not a decoder language model"):
        export_plan(replace(plan, model="mochi-dit-tiny"), "megatron", "x")


def test_cli_writes_files_and_prints_each_note_once(tmp_path):
    """The TPU part is not written for torchtitan (it runs NVIDIA GPUs): one line says so."""
    out = tmp_path / "dp.py"
    res = CliRunner().invoke(main, ["export", str(DATA / "llama3-70b-h100-tpu-data-parallel.json"),
                                    "--to", "torchtitan", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "dp-part0.py").exists() and not (tmp_path / "dp-part1.py").exists()
    assert res.output.count("gradient all-reduce") == 1
    assert "torchtitan cannot express: mesh h100.0 runs dp4xtp8" in res.output
    assert res.output.count("part1 not written: part1 runs on tpu-v5e, which torchtitan cannot "
                            "run") == 1


def test_cli_bad_target_is_one_line(tmp_path):
    res = CliRunner().invoke(main, ["export", str(PLANS[0]), "--to", "nemo",
                                    "--out", str(tmp_path / "x")])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1 and "'nemo' is not one of" in res.output
    assert not (tmp_path / "x").exists()


def _regenerate() -> None:
    for p in PLANS:
        for t in TARGETS:
            for f in exported(p, t):
                f.path.write_text(f.text)
                print("wrote", f.path)


if __name__ == "__main__":
    sys.exit(_regenerate())


@pytest.mark.parametrize("precision,megatron,torchtitan,maxtext", [
    ("bf16", {}, None, None),
    ("fp8", {"--fp8-format": "hybrid", "--fp8-recipe": "tensorwise", "--fp8-param-gather": None},
     ("float8", "tensorwise"), "fp8"),
    ("fp8-blockwise", {"--fp8-format": "e4m3", "--fp8-recipe": "blockwise"},
     ("float8", "rowwise"), "fp8"),
    ("mxfp8", {"--fp8-format": "e4m3", "--fp8-recipe": "mxfp8"}, ("mx", "mxfp8"), "fp8"),
    ("nvfp4", {"--fp4-format": "e2m1", "--fp4-recipe": "nvfp4"}, ("mx", "mxfp8"), "fp8"),
])
def test_precision_reaches_every_target(precision, megatron, torchtitan, maxtext):
    """The plan's training precision recipe is written as each launcher's own setting; a recipe
    the launcher lacks is written as the nearest with a note naming both."""
    from dataclasses import replace

    from launchers import maxtext as mx, megatron as mg, torchtitan as tt

    (v,) = part_views(replace(load_plan(DATA / "llama3-70b-h100x128.json"), precision=precision))
    args, _ = mg.megatron_args(v)
    flags = dict(args)
    for k, want in megatron.items():
        assert flags[k] == want
    assert ("--fp8-format" in flags or "--fp4-format" in flags) == (precision != "bf16")
    doc, notes = tt.job(v, "x")
    if torchtitan is None:
        assert "converters" not in doc["model"]
    else:
        conv, recipe = torchtitan
        assert doc["model"]["converters"] == [conv] and doc[conv]["recipe_name"] == recipe
    assert any(precision in n for n in notes) == (precision in ("fp8-blockwise", "nvfp4"))
    cfg, notes = mx.config(v, "x")
    assert cfg.get("quantization") == maxtext
    assert any(f"no {precision} training recipe" in n for n in notes) == (
        precision in ("fp8-blockwise", "mxfp8", "nvfp4"))
