"""The validation CSV's model and parallelism columns (``model_config``, ``cp``, ``vp``, ``ep``,
``etp``): a row naming a zoo model with blank shape columns is filled from it and costed as the
zoo traces it; context parallelism is the layout's context degree (dp excluding it); a published
``vp`` pins the interleaved chunk count; expert parallelism is refused on a dense model and where
the layout cannot say it; an unknown model or disagreeing shapes skip the row with the reason."""

from __future__ import annotations

import csv
import dataclasses
import io
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from ir import Layout
from mpmd.cli import validate as CLI
from mpmd.cli.main import main
from simulator import validate as V
from simulator.validation_rows import ValidationError

ROOT = Path(__file__).resolve().parents[2]

HEAD = ["source", "model", "layers", "hidden", "heads", "seq_len", "device", "gpus", "tp", "pp",
        "dp", "global_batch", "micro_batch", "microbatches", "schedule", "metric", "value",
        "model_config", "cp", "vp", "ep", "etp", "fsdp", "recompute", "note"]

BASE = dict(source="t", seq_len="2048", device="h100-sxm", gpus="8", tp="1", pp="1", dp="8",
            global_batch="64", micro_batch="1", microbatches="8", metric="iteration_s",
            value="2.0", model_config="llama3-8b")


def row(**kw) -> dict:
    d = dict(BASE)
    d.update(kw)
    return d


def write(path: Path, rows: list[dict]) -> Path:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=HEAD, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    path.write_text(out.getvalue())
    return path


ROWS = [row(model="8b"),                                                    # line 2
        row(model="8b-cp", gpus="16", cp="2"),                               # line 3
        row(model="8b-vp", gpus="32", pp="4", vp="4"),                       # line 4
        row(model="8b-ep", ep="2"),                                          # line 5
        row(model="unknown", model_config="llama3-9b"),                      # line 6
        row(model="8b-80", layers="80"),                                     # line 7
        row(model="8b-32", layers="32", hidden="4096", heads="32")]          # line 8


def load(path: Path):
    return V.load_rows_lenient(path, fill=CLI.model_fill(path))


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("cols") / "cols.csv", ROWS)


def test_the_cli_scores_model_config_rows_and_lists_the_refused(small, tmp_path):
    out = tmp_path / "report.md"
    res = CliRunner().invoke(main, ["validate", "--csv", str(small), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    md = out.read_text()
    assert "**4 of 7 rows scored** (3 not simulated: see below)." in md
    table = {ln.split(" | ")[1]: ln.split(" | ") for ln in md.splitlines() if ln.startswith("| t |")}
    assert sorted(table) == ["8b", "8b-32", "8b-cp", "8b-vp"]
    # the given shape columns that agree change nothing
    assert table["8b"][6:] == table["8b-32"][6:]
    assert table["8b"][5:8] == ["1/1/8", "1 x 8", "- (1f1b)"]
    assert "context parallel" not in table["8b-cp"][8]
    assert table["8b-cp"][5:7] == ["1/1/8 cp2", "1 x 8"]
    assert table["8b-vp"][7] == "- (interleaved-1f1b)"
    assert "1f1b-interleaved (vp 4; schedule not published)" in table["8b-vp"][8]
    assert "virtual stages" not in table["8b-vp"][8]          # published: not tuned
    reasons = {int(ln.split(" | ")[0][2:]): ln.split(" | ")[3][:-2] for ln in md.splitlines()
               if ln.startswith("| ") and ln.split(" | ")[0][2:].isdigit()}
    assert reasons[5] == "ep=2 but model llama3-8b is not a mixture of experts; fix: leave ep blank"
    assert reasons[6].startswith("model_config: unknown model 'llama3-9b'; did you mean "
                                 "'llama3-8b'? known models: ")
    assert reasons[7] == ("layers=80 but model_config llama3-8b has layers 32; fix: leave layers "
                          "blank or make it agree")


def test_fill_takes_the_shapes_from_the_model(small):
    rows, bad = load(small)
    assert [r.line for r in rows] == [2, 3, 4, 5, 8]
    r = rows[0]
    assert (r.layers, r.hidden, r.heads, r.vocab, r.ffn, r.kv_heads, r.head_dim, r.glu) == (
        32, 4096, 32, 128256, 14336, 8, 128, True)
    assert r.model_config == "llama3-8b" and (r.cp, r.vp, r.ep, r.etp) == (1, None, 1, None)
    assert [(b.line, b.model) for b in bad] == [(6, "unknown"), (7, "8b-80")]
    # without the hook the simulator alone cannot fill them, and says what would
    rows, bad = V.load_rows_lenient(small)
    assert [r.line for r in rows] == [8] and bad[0].reason == ("field 'layers' is blank; fill it in (or have the "
                                          "model_config filled in: mpmd validate does)")


def test_cp_is_the_context_degree_and_vp_pins_the_chunks(small):
    rows, _ = load(small)
    by = {r.model: r for r in rows}
    cp = V.row_setup(by["8b-cp"], CLI.workload_for)
    assert {(l.data, l.context, l.tensor, l.context_method)
            for l in cp.plan.layouts.values()} == {(8, 2, 1, "ring")}
    assert cp.microbatches == 8 and cp.plan.global_batch == 64
    assert not any("context parallel" in a for a in cp.assumptions)
    assert cp.workload.model == "llama3-8b" and cp.workload.seq_len == 2048
    vp = V.row_setup(by["8b-vp"], CLI.workload_for)
    assert vp.schedule == "interleaved-1f1b" and vp.virtual_stages == 4
    assert len(vp.plan.stages) == 16


def test_the_tuner_leaves_a_published_vp_alone(small):
    from hardware_profiles import load_device

    rows, _ = load(small)
    r = next(x for x in rows if x.model == "8b-vp")
    calls = []

    def step(plan, workload, cluster):
        calls.append(plan)
        return 1.0

    s = V.row_setup(r, CLI.workload_for, step_fn=step, device=load_device("h100-sxm"))
    assert s.virtual_stages == 4 and not calls


def test_a_relative_model_file_is_read_beside_the_csv(tmp_path):
    (tmp_path / "models").mkdir()
    shutil.copy(ROOT / "zoo" / "configs" / "Qwen3-8B.json", tmp_path / "models" / "q.json")
    p = write(tmp_path / "rel.csv", [row(model="q", model_config="models/q.json"),
                                     row(model="q-bad", model_config="models/none.json")])
    rows, bad = load(p)
    assert [r.model for r in rows] == ["q"]
    assert rows[0].model_config == str(tmp_path / "models" / "q.json")
    assert (rows[0].layers, rows[0].hidden, rows[0].kv_heads, rows[0].head_dim) == (36, 4096, 8, 128)
    assert bad[0].line == 3 and bad[0].reason.startswith("model_config: ")
    assert "none.json" in bad[0].reason and "\n" not in bad[0].reason


def test_expert_parallel_on_a_mixture_of_experts(tmp_path):
    moe = "zoo/configs/tiny-moe.yaml"            # 4 experts, top 2, 4 layers
    base = dict(seq_len="64", global_batch="16", micro_batch="1", microbatches="2",
                model_config=moe)
    p = write(tmp_path / "moe.csv", [
        row(model="ep2", ep="2", **base),
        row(model="ep8", ep="8", **base),                                   # 8 does not divide 4
        row(model="ep16", gpus="16", dp="16", ep="16", **{**base, "microbatches": "1"}),
        row(model="etp", gpus="16", tp="2", ep="4", etp="1", **base),      # folded over dp x tp
        row(model="fsdp", ep="2", fsdp="1", **base),
        row(model="mfu", ep="2", **{**base, "metric": "mfu", "value": "0.4"})])
    rows, bad = load(p)
    assert not bad
    setups, skipped = V.row_setups(rows, CLI.workload_for, errors=CLI.row_errors())
    assert [s.row.model for s in setups] == ["ep2", "etp", "fsdp"]
    assert set(setups[2].plan.layouts.values()) == {Layout(8, 1, fsdp=True, expert=2)}
    assert {l.expert for l in setups[0].plan.layouts.values()} == {2}
    # MoE parallel folding: EP 4 over the dp 8 x tp 2 devices, the experts not tensor-split
    assert set(setups[1].plan.layouts.values()) == {Layout(8, 2, expert=4, expert_tensor=1)}
    from hardware_profiles import load_device

    scored, none = V.evaluate_rows(setups, {"h100-sxm": load_device("h100-sxm")})
    assert not none and scored[0].step_s > 0
    assert scored[0].predicted == pytest.approx(scored[0].step_s)      # iteration_s
    reasons = {k.model: k.reason for k in skipped}
    assert reasons["ep8"] == "ep=8 does not divide model tiny-moe's 4 experts; fix ep"
    assert reasons["ep16"] == "ep=16 does not divide model tiny-moe's 4 experts; fix ep"
    assert reasons["mfu"].startswith("metric mfu is counted from a dense model's shape columns")
    # ep x etp beyond a stage's devices
    assert V.expert_problem(dataclasses.replace(rows[0], ep=16)) == (
        "ep x etp = 16 x 1 does not divide dp x cp x tp = 8; fix ep or etp (their product divides "
        "a stage's devices)")


def test_workload_for_traces_the_zoo_model_not_the_shape_columns(small):
    rows, _ = load(small)
    r = rows[0]
    w = CLI.workload_for(r)
    assert w.model == "llama3-8b" and w.seq_len == 2048 and w.global_batch == 64
    with pytest.raises(ValidationError, match="^model_config: unknown model 'nope'"):
        CLI.resolved_model("nope")
    with pytest.raises(ValidationError, match="is a mochi model; fix: name a decoder"):
        CLI.resolved_model("mochi-dit-tiny")


def test_a_table_printed_model_name_stands_for_the_model_config(tmp_path):
    """No model_config and no shape: the model column, as NVIDIA's tables print it, names the
    zoo model (its qualifier dropped); a name that resolves to nothing leaves the row as it was
    (skipped for its blank shape)."""
    path = write(tmp_path / "names.csv", [row(model="LLAMA3_8B (tokendrop)", model_config=""),
                                          row(model="NotAModel_7B", model_config=""),
                                          row(model="LLAMA3_8B", model_config="", layers="32",
                                              hidden="4096", heads="32")])
    rows, bad = load(path)
    assert [(r.line, r.model_config) for r in rows] == [(2, "LLAMA3_8B (tokendrop)"), (4, None)]
    assert (rows[0].layers, rows[0].vocab) == (32, 128256)
    assert [(b.line, b.reason) for b in bad] == [(3, "field 'layers' is blank; fill it in")]


def test_a_tokendrop_qualifier_fills_a_blank_dispatcher(tmp_path):
    fill = CLI.model_fill(tmp_path / "x.csv")
    assert fill({"model": "Qwen3_30B_a3B (tokendrop)"})["dispatcher"] == "tokendrop"
    assert fill({"model": "Qwen3_30B_a3B (tokendrop)", "dispatcher": "deepep"})["dispatcher"] == "deepep"
    assert "dispatcher" not in fill({"model": "Qwen3_30B_a3B"})
