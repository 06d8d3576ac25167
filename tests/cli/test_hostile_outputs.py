"""Output paths are checked before any work: for every command and every flag that names an
output, a path below a regular file, in a folder that cannot be written, or already taken (a
directory where a file goes, a file where a folder goes) fails in one line, exit status 2, naming
the path, with nothing written; the command's work function (monkeypatched to raise) is never
called, so the check provably comes first (:func:`ir.files.check_output`).
"""

from __future__ import annotations

import importlib
import os
import stat
from pathlib import Path

import pytest

from ir.files import InputError, check_output
from tests.cli.test_hostile import CPU, ROOT, one_line, run

PLAN = ROOT / "tests" / "launchers" / "data" / "llama3-70b-h100x128.json"
DP_PLAN = ROOT / "tests" / "launchers" / "data" / "llama3-70b-h100-tpu-data-parallel.json"
LAYERS = ROOT / "reports" / "validation" / "device" / "h100_layers.csv"
STEPS = ROOT / "reports" / "validation" / "device" / "h100_serving.csv"
SERVE = ["serve-plan", "--model", "llama3-8b", "--cluster",
         ROOT / "hardware_profiles" / "clusters" / "h100x64_nodes.yaml", "--prompt", "128",
         "--output", "16"]
CALIBRATE = ("mpmd.cli.calibrate", "cpu_devices")     # JAX starts there, before measuring
WHATIF = ["whatif", "--model", "llama-tiny", "--options", "cpu4x2", "--time-limit", "0.2",
          "--no-screenshot"]

# name -> (the command up to the output flag, the output flag, whether it names a folder,
#          the work (module, function) that must not run)
OUTPUTS: dict[str, tuple[list, str, bool, tuple[str, str]]] = {
    "plan --out": (["plan", "--model", "llama-tiny", "--cluster", CPU, "--global-batch", "8",
                    "--time-limit", "1"], "--out", False, ("planner", "plan")),
    "simulate --trace": (["simulate", PLAN], "--trace", False, ("simulator.plan_sim", "simulate_any")),
    "run --trace": (["run", PLAN, "--steps", "1"], "--trace", False, ("mpmd.cli.run", "cpu_devices")),
    "export --out": (["export", PLAN, "--to", "megatron"], "--out", False, ("launchers", "export_plan")),
    "validate --out": (["validate"], "--out", False, ("simulator.validate", "load_rows_lenient")),
    "validate --fit --profiles-out": (["validate", "--fit"], "--profiles-out", True,
                                      ("simulator.validate", "load_rows_lenient")),
    "validate --layers --out": (["validate", "--layers", LAYERS], "--out", False,
                                ("runtime.calibration.device_layers", "compare")),
    "validate --layers STEPS --out": (["validate", "--layers", STEPS], "--out", False,
                                      ("runtime.calibration.device_serving", "compare")),
    "validate --serving --out": (["validate", "--serving"], "--out", False,
                                 ("runtime.calibration.serving_rows", "score")),
    "validate --serving --fit --profiles-out": (["validate", "--serving", "--fit"], "--profiles-out",
                                                True, ("runtime.calibration.serving_rows", "score")),
    "whatif --out": (WHATIF, "--out", False, ("reports", "whatif")),
    "whatif --out (with the screenshot)": (WHATIF[:-1], "--out", False, ("reports", "whatif")),
    "whatif --example (serving) --out": (["whatif", "--example", "llama70b-serve", "--no-screenshot"],
                                         "--out", False, ("reports.serving", "serving_whatif")),
    "serve-plan --out": (SERVE, "--out", False, ("planner.serving", "plan_serving")),
    "serve-plan --trace": (SERVE, "--trace", False, ("planner.serving", "plan_serving")),
    "calibrate --out": (["calibrate"], "--out", True, CALIBRATE),
    "calibrate --device-out": (["calibrate"], "--device-out", False, CALIBRATE),
    "calibrate --cluster-out": (["calibrate"], "--cluster-out", False, CALIBRATE),
}


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a folder)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


@pytest.fixture
def no_work(monkeypatch):
    """``no_work(module, name)``: that function raises if called (the command did its work
    before checking its outputs)."""
    def patch(module: str, name: str) -> None:
        def never(*args, **kwargs):
            raise AssertionError(f"{module}.{name} ran before the output check")

        monkeypatch.setattr(importlib.import_module(module), name, never)

    return patch


def taken(tmp_path: Path, folder: bool) -> Path:
    """A path already taken: a directory where a file goes, a file where a folder goes."""
    p = tmp_path / ("taken" if folder else "taken.out")
    if folder:
        p.write_text("keep")
    else:
        p.mkdir()
    return p


def below_a_file(tmp_path: Path, folder: bool) -> Path:
    (tmp_path / "afile").write_text("keep")
    return tmp_path / "afile" / "sub" / "x.out"


def in_a_read_only_folder(tmp_path: Path, folder: bool) -> Path:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    return ro / "x.out"


KINDS = {"below a file": below_a_file, "taken": taken, "read-only folder": in_a_read_only_folder}


def refused(tmp_path, no_work, case, make) -> str:
    """Run ``case`` with the bad output ``make`` gives; check the one line and that nothing was
    written; return the line."""
    args, flag, folder, work = OUTPUTS[case]
    out = make(tmp_path, folder)
    no_work(*work)
    before = tree(tmp_path)
    line = one_line(run([*args, flag, out]), needles=(str(out), "fix: "))
    assert tree(tmp_path) == before
    return line


@pytest.mark.parametrize("kind", ["below a file", "taken"])
@pytest.mark.parametrize("case", list(OUTPUTS))
def test_bad_output_fails_before_the_work(tmp_path, no_work, monkeypatch, case, kind):
    monkeypatch.chdir(tmp_path)                 # a default output would land here
    line = refused(tmp_path, no_work, case, KINDS[kind])
    why = {"below a file": f"{tmp_path / 'afile'} is a file, not a folder",
           "taken": "it is a file, not a folder" if OUTPUTS[case][2] else "directory"}[kind]
    assert why in line


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.parametrize("case", list(OUTPUTS))
def test_output_in_a_read_only_folder_fails_before_the_work(tmp_path, no_work, case):
    try:
        line = refused(tmp_path, no_work, case, in_a_read_only_folder)
    finally:
        (tmp_path / "ro").chmod(0o700)
    assert "is not writable" in line


@pytest.mark.parametrize("case", ["plan --out", "validate --fit --profiles-out", "whatif --out",
                                  "calibrate --out"])
def test_read_only_folder_as_access_reports_it(tmp_path, no_work, monkeypatch, case):
    """The same check where the tests run as root (which ignores permissions): ``os.access``
    answers as for another user."""
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if Path(p) == tmp_path / "ro" and mode & os.W_OK else real(p, mode, **kw)))
    try:
        line = refused(tmp_path, no_work, case, in_a_read_only_folder)
    finally:
        (tmp_path / "ro").chmod(0o700)
    assert f"folder {tmp_path / 'ro'} is not writable" in line


def test_export_writes_no_part_when_one_part_is_taken(tmp_path):
    # MaxText writes both parts (H100 and TPU v5e; Megatron refuses the TPU part in one line)
    (tmp_path / "x-part1.yml").mkdir()
    before = tree(tmp_path)
    line = one_line(run(["export", DP_PLAN, "--to", "maxtext", "--out", tmp_path / "x.yml"]),
                    tmp_path / "x-part0.yml", needles=(f"{tmp_path / 'x-part1.yml'}: cannot "
                                                      f"write the maxtext file there",))
    assert "(it is a directory)" in line
    assert tree(tmp_path) == before


def test_the_message_names_the_path_the_reason_and_the_fix(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(InputError) as e:
        check_output(tmp_path / "f" / "plan.json", "plan JSON")
    assert str(e.value) == (f"{tmp_path / 'f' / 'plan.json'}: cannot write the plan JSON there "
                            f"({tmp_path / 'f'} is a file, not a folder); fix: give a path in a "
                            f"folder you can write")


@pytest.mark.parametrize("path,folder,reason", [
    ("/dev/null", False, "it is not a regular file"),
    ("new/deeper/plan.json", False, None),
    ("new/deeper", True, None),
    ("f", False, None),
    ("d", True, None),
])
def test_check_output_creates_nothing(tmp_path, monkeypatch, path, folder, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "f").write_text("")
    (tmp_path / "d").mkdir()
    if reason is None:
        assert check_output(path, "x", folder=folder) == Path(path)
    else:
        with pytest.raises(InputError, match=reason):
            check_output(path, "x", folder=folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"]


def test_an_unwritable_existing_file_is_refused(tmp_path, monkeypatch):
    f = tmp_path / "plan.json"
    f.write_text("{}")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: (
        False if Path(p) == f else real(p, mode, **kw)))
    with pytest.raises(InputError, match="the file is not writable"):
        check_output(f, "plan JSON")
    assert stat.S_ISREG(f.stat().st_mode) and f.read_text() == "{}"
