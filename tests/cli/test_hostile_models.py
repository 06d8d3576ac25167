"""Hostile model descriptions at every command that reads one: a YAML spec or Hugging Face
config given to ``plan``, ``serve-plan`` and ``whatif``, and a plan file carrying an invalid
model to ``simulate``, ``export`` and ``run``: one line, exit status 2, nothing written. The
worst cases (a billion layers, a 10**12 vocabulary) also run as real processes under a 3 GiB
address-space cap, so a check that came after the work would show as a crash, not a pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpmd.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "hardware_profiles" / "clusters" / "cpu4x2.yaml"
SERVE = ROOT / "hardware_profiles" / "clusters" / "serve_h100x16_nodes.yaml"
QWEN3 = json.loads((ROOT / "zoo" / "configs" / "Qwen3-8B.json").read_text())
DEEPSEEK = json.loads((ROOT / "zoo" / "configs" / "DeepSeek-V3.json").read_text())
SPEC = "family: llama\nlayers: 4\nhidden: 512\nheads: 8\nffn: 1536\nvocab: 256\nseq_len: 128\n"
CAP = 3 * 2**30


def run(args: list) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line(res, *outs: Path, needle: str = "") -> str:
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert needle in lines[0], lines[0]
    for out in outs:
        assert not out.exists(), out
    return lines[0]


MODELS = {
    "a billion layers": ("m.yaml", SPEC.replace("layers: 4", "layers: 1000000000"),
                         "layers = 1000000000 is over the limit 16,384"),
    "kv heads not dividing the heads": ("m.yaml", SPEC + "kv_heads: 3\n",
                                        "kv_heads = 3 does not divide heads = 8"),
    "zero tokens": ("m.yaml", SPEC.replace("seq_len: 128", "seq_len: 0"), "seq_len = 0 is below 1"),
    "a model name the plan file would refuse": ("m.yaml", SPEC + "name: 'my model'\n",
                                                "name = 'my model' is not a model name"),
    "a 10**12 vocabulary": ("m.json", json.dumps({**QWEN3, "vocab_size": 10**12}),
                            "vocab_size = 1000000000000 is over the limit 16,777,216"),
    "rope_theta of the wrong type": ("m.json", json.dumps({**QWEN3, "rope_theta": "big"}),
                                     "field 'rope_theta' = 'big' is not a finite number"),
    "more dense layers than layers": ("m.json", json.dumps({**DEEPSEEK, "first_k_dense_replace": 1000}),
                                      "first_k_dense_replace = 1000 leaves no mixture-of-experts layer"),
    "top-k above the experts": ("m.json", json.dumps({**DEEPSEEK, "num_experts_per_tok": 300}),
                                "num_experts_per_tok = 300 is not between 1 and the 256 experts"),
}


def _model(tmp_path: Path, case: str) -> Path:
    name, text, _ = MODELS[case]
    f = tmp_path / name
    f.write_text(text)
    return f


@pytest.mark.parametrize("case", list(MODELS))
def test_plan_refuses_a_bad_model_file(tmp_path, case):
    out = tmp_path / "plan.json"
    one_line(run(["plan", "--model", _model(tmp_path, case), "--cluster", CPU, "--global-batch", "8",
                  "--time-limit", "1", "--out", out]), out, needle=MODELS[case][2])


@pytest.mark.parametrize("case", ["kv heads not dividing the heads", "a billion layers",
                                  "more dense layers than layers"])
def test_serve_plan_and_whatif_refuse_a_bad_model_file(tmp_path, case):
    m, out = _model(tmp_path, case), tmp_path / "serve.json"
    one_line(run(["serve-plan", "--model", m, "--cluster", SERVE, "--prompt", "100", "--output",
                  "100", "--out", out]), out, needle=MODELS[case][2])
    one_line(run(["whatif", "--model", m, "--options", CPU, "--time-limit", "0.2",
                  "--no-screenshot", "--out", tmp_path / "w" / "x"]), tmp_path / "w",
             needle=MODELS[case][2])


@pytest.fixture(scope="module")
def plan_json(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("plan")
    (d / "m.yaml").write_text(SPEC)
    out = d / "plan.json"
    res = run(["plan", "--model", d / "m.yaml", "--cluster", CPU, "--global-batch", "8",
               "--time-limit", "2", "--out", out])
    assert res.exit_code == 0, res.output
    return out


CARRIED = {"kv_heads": (3, "the plan's model_config: kv_heads = 3 does not divide heads = 8"),
           "layers": (10**9, "the plan's model_config: layers = 1000000000 is over the limit"),
           "rope_theta": ("x", "the plan's model_config: rope_theta = 'x' is not a finite number"),
           "experts_per_token": (2, "the plan's model_config: experts_per_token = 2 is set but "
                                    "experts = 0")}


def _carrying(plan_json: Path, tmp_path: Path, field: str) -> Path:
    doc = json.loads(plan_json.read_text())
    doc["model_config"][field] = CARRIED[field][0]
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(doc))
    return f


@pytest.mark.parametrize("field", list(CARRIED))
def test_a_plan_carrying_an_invalid_model_is_refused_by_every_reader(plan_json, tmp_path, field):
    bad = _carrying(plan_json, tmp_path, field)
    needle = CARRIED[field][1]
    one_line(run(["simulate", bad, "--trace", tmp_path / "s.json"]), tmp_path / "s.json", needle=needle)
    one_line(run(["export", bad, "--to", "megatron", "--out", tmp_path / "e.sh"]), tmp_path / "e.sh",
             needle=needle)
    one_line(run(["run", bad, "--steps", "1", "--trace", tmp_path / "t.json"]), tmp_path / "t.json",
             needle=needle)


def test_run_refuses_a_model_this_machine_cannot_hold(plan_json, tmp_path, monkeypatch):
    import runtime.train.host_memory as hm
    monkeypatch.setattr(hm, "available_bytes", lambda *a: 1e8)
    line = one_line(run(["run", plan_json, "--steps", "1", "--trace", tmp_path / "t.json"]),
                    tmp_path / "t.json")
    assert line.startswith("error: running model 'm' at a global batch of 8 needs about ")
    assert line.endswith("and 0.1 GB is available; fix: run a smaller model or batch (mpmd run "
                         "executes every mesh on this machine)")


def test_host_memory_estimate_counts_state_and_activations_twice():
    import zoo
    from runtime.train.host_memory import host_memory
    cfg = zoo.get_config("llama-tiny")
    m = host_memory(cfg, 8, 1000)
    assert m.state == 8 * 1000 * 4
    s, h = 128, 512
    assert m.activations == 2 * 8 * 8 * (34 * s * h + 5 * 8 * s * s) * 4 / 2
    flash = host_memory(zoo.get_config("llama-tiny", attention="flash"), 8, 1000)
    assert flash.activations == 2 * 8 * 8 * 34 * s * h * 4 / 2


# ----------------------------------------------------------------------------- real processes
def capped(*args: str) -> subprocess.CompletedProcess:
    """``python -m mpmd ARGS`` in a process whose address space is capped at :data:`CAP` (set
    by the child itself before it becomes mpmd: no Python runs between fork and exec here, which
    JAX's threads in this process would make unsafe)."""
    boot = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_AS, (%d, %d)); "
            "os.execv(sys.executable, [sys.executable, '-m', 'mpmd', *sys.argv[1:]])" % (CAP, CAP))
    return subprocess.run([sys.executable, "-c", boot, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("case", ["a billion layers", "a 10**12 vocabulary"])
def test_the_worst_models_are_refused_within_3_gib(tmp_path, case):
    m, out = _model(tmp_path, case), tmp_path / "plan.json"
    p = capped("plan", "--model", str(m), "--cluster", str(CPU), "--global-batch", "8", "--out",
               str(out))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert MODELS[case][2] in p.stderr and not out.exists()


def test_a_plan_carrying_a_billion_layers_is_refused_within_3_gib(plan_json, tmp_path):
    bad = _carrying(plan_json, tmp_path, "layers")
    for args in (["simulate", str(bad)], ["run", str(bad), "--steps", "1"]):
        p = capped(*args)
        assert p.returncode == 2, p.stderr
        assert p.stderr.strip().splitlines() == [f"error: {CARRIED['layers'][1]} 16,384 (far above "
                                                 "any published model; the cost model's tables and "
                                                 "the traced program grow with it); fix: give at "
                                                 "most 16,384"]


def test_a_layout_that_cannot_run_the_model_is_refused_by_export_and_run(tmp_path):
    spec = tmp_path / "m3.yaml"
    spec.write_text(SPEC.replace("heads: 8", "heads: 3").replace("hidden: 512", "hidden: 384"))
    out = tmp_path / "plan.json"
    res = run(["plan", "--model", spec, "--cluster", CPU, "--global-batch", "8", "--time-limit",
               "2", "--out", out])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert all(m["layout"]["tensor"] == 1 for m in doc["meshes"].values())   # 2 cannot split 3 heads
    mesh = next(iter(doc["meshes"]))
    doc["meshes"][mesh]["layout"].update(data=1, tensor=2)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    why = (f"mesh {mesh}'s layout cannot run: tensor parallel 2 does not divide m3's 3 attention "
           "heads; fix: re-plan (mpmd plan only picks layouts that run) or edit its tensor degree")
    assert one_line(run(["export", bad, "--to", "megatron", "--out", tmp_path / "e.sh"]),
                    tmp_path / "e.sh") == f"error: {why}"
    assert one_line(run(["run", bad, "--steps", "1"])) == f"error: {why}"
