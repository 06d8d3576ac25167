"""``mpmd validate`` on a small CSV: a row it cannot simulate is skipped and listed, a row with a
per-device batch is scored, ``--strict`` makes the skipped row one error line (exit 2)."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from mpmd.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
CSV = ROOT / "reports" / "validation" / "published_training.csv"
LINES = CSV.read_text().splitlines()
HEAD = next(csv.reader([LINES[0]]))


def bundled(line: int, **kw) -> dict:
    d = dict(zip(HEAD, next(csv.reader([LINES[line - 1]]))))
    d.update(kw)
    return d


def write(path: Path, rows: list[dict]) -> Path:
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=HEAD + ["per_device_batch"], lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    path.write_text(out.getvalue())
    return path


# two maxtext-v5e rows (16B and 32B on one v5e-256 slice), one torchtitan row (llama2-13B, 64 A100;
# its peak memory a made-up 70 GiB, as a row of a source that prints one gives it)
SMALL = [bundled(43), bundled(46), bundled(36, peak_memory_gib="70"),
         bundled(43, recompute="bogus_policy"),
         bundled(43, global_batch="", micro_batch="", microbatches="", per_device_batch="6")]


def run(args: list) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("v") / "small.csv", SMALL)


def test_unsimulable_row_is_skipped_and_the_per_device_row_scored(small, tmp_path):
    out = tmp_path / "report.md"
    res = run(["validate", "--csv", small, "--out", out])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    assert "4 of 5 rows scored" in res.output
    assert ("line 5 maxtext-v5e/16B: recompute 'bogus_policy' unknown; fix: use one of none, "
            "selective, full, minimal, ") in res.output
    md = out.read_text()
    assert "**4 of 5 rows scored** (1 not simulated: see below)." in md
    assert "## Not simulated\n\n| line | source | model | reason |\n|---|---|---|---|\n" in md
    assert "| 5 | maxtext-v5e | 16B | recompute 'bogus_policy' unknown; fix: use one of none," in md
    table = [ln.split(" | ") for ln in md.splitlines() if ln.startswith("| maxtext-v5e | 16B |")]
    assert len(table) == 2
    given, derived = table
    # the per-device row is the same run: the same prediction, and the assumption says why
    assert derived[10:] == given[10:]
    assert "global batch 1536 = per_device_batch 6 x 256 devices" in derived[8]
    # the published layout's memory in the model, and whether it fits (v5e: 16 GB)
    assert given[-1].endswith(" / 16 GB, yes |")
    # a published peak: the model's against it, signed, in the cell and summed up below
    titan = next(ln for ln in md.splitlines() if ln.startswith("| torchtitan | llama2-13B |"))
    peak = float(re.search(r"\| (\d+) / 86 GB, yes; measured 75 \(([+-]\d+)%\) \|$", titan)[1])
    err = float(re.search(r"measured 75 \(([+-]\d+)%\)", titan)[1])
    assert abs(err - (peak / (70 * 2 ** 30 / 1e9) - 1) * 100) <= 1.5
    assert "Published layouts that fit in the model's memory: 4 of 4 rows." in md
    m = re.search(r"Predicted peak memory against the 1 published peaks: mean abs (\d+\.\d)%, "
                  r"max (\d+\.\d)% \(signed, per row, in the table's last column\)\.", md)
    assert m and m[1] == m[2] and abs(float(m[1]) - abs(err)) <= 0.5


def test_memory_fit_reads_as_the_report_prints_it():
    """:class:`MemoryFit`: fits when the peak is at most the capacity; the error is signed
    against the published peak; the summary counts the fits and averages the absolute errors."""
    from mpmd.cli.validate import MemoryFit, memory_lines

    a = MemoryFit(62e9, 86e9, 88.5e9)
    b = MemoryFit(92e9, 80e9)
    c = MemoryFit(231e9, 298e9, 221.6e9)
    assert a.fits and not b.fits and b.error_pct is None
    assert str(a) == "62 / 86 GB, yes; measured 88 (-30%)"       # 88.5 prints as 88 (even)
    assert str(b) == "92 / 80 GB, no"
    assert str(c) == "231 / 298 GB, yes; measured 222 (+4%)"
    assert memory_lines({1: a, 2: b, 3: c, 4: None}) == [
        "Published layouts that fit in the model's memory: 2 of 3 rows.",
        "Predicted peak memory against the 2 published peaks: mean abs 17.1%, max 29.9% "
        "(signed, per row, in the table's last column)."]


def test_strict_turns_the_skipped_row_into_one_error_line(small, tmp_path):
    out = tmp_path / "report.md"
    res = run(["validate", "--csv", small, "--out", out, "--strict"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith("error: row 5: recompute 'bogus_policy' unknown; fix: use one of ")
    assert lines[0].endswith("(--strict: every row must be simulated; fix the row or drop --strict)")
    assert not out.exists()


def test_no_row_to_score_is_one_error_line(tmp_path):
    f = write(tmp_path / "bad.csv", [bundled(43, recompute="bogus_policy"), bundled(2, device="h900")])
    res = run(["validate", "--csv", f])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1, res.output
    assert lines[0].startswith(f"error: {f}: none of its 2 rows can be simulated; the first: row 2: "
                               "recompute 'bogus_policy' unknown")


# BERT-Large pre-training on one DGX-1 V100 16GB (NVIDIA DeepLearningExamples, PyTorch 20.06)
BERT_V100 = dict(source="dle-bert-pyt", model="bert-large", layers="24", hidden="1024", heads="16",
                 seq_len="128", vocab="30522", device="v100-sxm2-16gb", gpus="1", tp="1", pp="1",
                 dp="1", global_batch="65536", micro_batch="16", microbatches="4096",
                 metric="samples_per_gpu_s", value="164.0", recompute="none",
                 devices_per_node="8", attention="unfused")


def test_a_device_without_bf16_runs_the_row_in_fp16_or_refuses_bf16(tmp_path):
    f = write(tmp_path / "v100.csv", [
        BERT_V100,                                           # blank precision: fp16, stated
        dict(BERT_V100, precision="fp16"),                   # published fp16: no assumption
        dict(BERT_V100, precision="bf16"),                   # bf16 on a V100: refused
        dict(BERT_V100, precision="fp8")])                   # a recipe it has no rate for
    out = tmp_path / "report.md"
    res = run(["validate", "--csv", f, "--out", out])
    assert res.exit_code == 0, res.output
    assert "2 of 4 rows scored" in res.output
    md = out.read_text()
    rows = [ln.split(" | ") for ln in md.splitlines() if ln.startswith("| dle-bert-pyt |")]
    assert len(rows) == 2
    blank, given = rows
    assert blank[3] == given[3] == "fp16"                   # the precision column of the table
    assert ("precision fp16 (not published; v100-sxm2-16gb has no bf16 rate: 16-bit mixed "
            "precision on it is fp16 with loss scaling)") in blank[8]
    assert "precision fp16" not in given[8]
    assert blank[10:] == given[10:]                          # the same run, the same prediction
    assert ("| 4 | dle-bert-pyt | bert-large | precision bf16 but device 'v100-sxm2-16gb' has no "
            "bf16 rate (its rates: fp16, fp32); fix: precision fp16 or fp32 |") in md
    assert ("| 5 | dle-bert-pyt | bert-large | precision fp8 (it computes in bf16) but device "
            "'v100-sxm2-16gb' has no bf16 rate (its rates: fp16, fp32); fix: precision fp16 or "
            "fp32 |") in md


def test_kinds_of_one_part_but_for_memory_are_fitted_as_one():
    from hardware_profiles.loader import load_device
    from mpmd.cli.validate import memory_twins

    devices = {d: load_device(d) for d in ("v100-sxm2-16gb", "v100-sxm2-32gb", "a100-40gb-sxm",
                                           "a100-80gb-sxm")}
    assert memory_twins("v100-sxm2-16gb", devices) == ["v100-sxm2-32gb"]
    assert memory_twins("v100-sxm2-32gb", devices) == ["v100-sxm2-16gb"]
    # one GA100 die, but 1,555 against 2,039 GB/s of HBM: they time a row differently
    assert devices["a100-40gb-sxm"].chip == devices["a100-80gb-sxm"].chip == "ga100"
    assert memory_twins("a100-40gb-sxm", devices) == []
