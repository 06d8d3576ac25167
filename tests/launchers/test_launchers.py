"""The ``launchers`` suite (not in the default run: ``./scripts/test.sh -m launchers``): every
export of the bundled example plans and of the six plans of issue 46 (made here with
``mpmd plan --time-limit 5``) loaded through each launcher's own configuration code, installed by
``scripts/launchers_env.sh`` (``MPMD_LAUNCHERS``, default /tmp/mpmd-launchers): Megatron-LM's
``parse_args`` + ``validate_args`` (megatron-core's wheel), Megatron-Bridge's recipe with the
file's overrides and ``runtime_config_update`` (``checks/megatron_bridge_check.py``), torchtitan 0.3.0's and 0.2.2's config
manager with ``ParallelDims`` on a fake process group, MaxText's ``pyconfig`` for the part's
target topology (``checks/*_check.py``, run in those environments). The Megatron arguments are
taken from the file's own launch line, run as written with ``torchrun`` replaced by a recorder.

Three outcomes per part and target, kept apart: **accepted** (the launcher's validation passed),
**refused** (no file written: the exporter's one-line reason; allowed only where the target
truly cannot run the part, :func:`refusal_is_fair`), **rejected** (written, and the launcher's
validation failed: always a failure). Each accepted file is then read back through the
launcher's parsed config and compared with the plan JSON (:mod:`readback`): micro batch and
accumulation, degrees, schedule and stage placement, recomputation, precision and the model.

``python tests/launchers/test_launchers.py`` prints the plan x target x launcher-version table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:     # run as a script
    sys.path.insert(0, str(ROOT))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from ir.plan_file import load_plan                       # noqa: E402
from launchers import LauncherError, export_plan, part_views   # noqa: E402
from launchers.export import TARGETS, VERSIONS           # noqa: E402
from readback import expected_parts, mismatches          # noqa: E402

pytestmark = pytest.mark.launchers

ENV = Path(os.environ.get("MPMD_LAUNCHERS", "/tmp/mpmd-launchers"))
CHECKS = HERE / "checks"
C = "hardware_profiles/clusters/"
BUNDLED = {p.stem: p for p in sorted((HERE / "data").glob("*.json"))}
PLANNED = {   # issue 46's six plans
    "issue46-llama3-70b-h100x128": ["--model", "llama3-70b", "--cluster", C + "h100x128_nodes.yaml",
                                    "--global-batch", "256", "--seq-len", "8192"],
    "issue46-qwen3-8b-h100x64": ["--model", "zoo/configs/Qwen3-8B.json", "--cluster",
                                 C + "h100x64_nodes.yaml", "--global-batch", "256",
                                 "--seq-len", "4096"],
    "issue46-mixtral-8x22b-h100x256": ["--model", "zoo/configs/Mixtral-8x22B-v0.1.json",
                                       "--cluster", C + "h100x256_nodes.yaml",
                                       "--global-batch", "512", "--seq-len", "4096"],
    "issue46-deepseek-v3-h100x2048": ["--model", "deepseek-v3", "--cluster",
                                      C + "h100x2048_nodes.yaml", "--global-batch", "2048",
                                      "--seq-len", "4096"],
    "issue46-llama3-8b-tpuv5e256": ["--model", "llama3-8b", "--cluster", C + "tpuv5e256.yaml",
                                    "--global-batch", "256", "--seq-len", "8192"],
    "issue46-llama3-70b-mixed512": ["--model", "llama3-70b", "--cluster",
                                    C + "mixed512_nodes.yaml", "--global-batch", "512",
                                    "--seq-len", "8192"],
    # sliding-window attention on alternate blocks (torchtitan's and MaxText's gpt-oss models)
    "gpt-oss-120b-h100x64": ["--model", "gpt-oss-120b", "--cluster", C + "h100x64_nodes.yaml",
                             "--global-batch", "256", "--seq-len", "4096"],
}
PLANS = [*BUNDLED, *PLANNED]

# target -> (interpreter, extra sys.path, checker)
LAUNCHERS = {
    "megatron": (ENV / "py312/bin/python", [], "megatron_check.py"),
    "torchtitan": (ENV / "py311/bin/python", [ENV / "tt-0.3.0"], "torchtitan_check.py"),
    "torchtitan@0.2": (ENV / "py311/bin/python", [ENV / "tt-0.2.2"], "torchtitan_check.py"),
    "maxtext": (ENV / "py312/bin/python", [], "maxtext_check.py"),
    # Megatron-Bridge 0.6.2's own recipes and ConfigContainer; Transformer Engine (a CUDA build,
    # imported at module level, called by none of the config code) is checks/stubs' stand-in
    "megatron-bridge": (ENV / "py312/bin/python", [CHECKS / "stubs"], "megatron_bridge_check.py"),
}
BRIDGE_HF = {   # the Hugging Face config.json each Bridge recipe builds its model from (offline)
    "meta-llama/Meta-Llama-3-70B": HERE / "pinned/hf/Meta-Llama-3-70B.json",
    "Qwen/Qwen3-8B": ROOT / "zoo/configs/Qwen3-8B.json",
    "Qwen/Qwen3-30B-A3B": ROOT / "zoo/configs/Qwen3-30B-A3B.json",
    "Qwen/Qwen3-235B-A22B": ROOT / "zoo/configs/Qwen3-235B-A22B.json",
    "deepseek-ai/DeepSeek-V3": ROOT / "zoo/configs/DeepSeek-V3-MTP.json",   # as published
    "openai/gpt-oss-120b": ROOT / "zoo/configs/gpt-oss-120b.json",
}
ARCH = {"v100": 7, "a100": 8, "l40s": 8, "h100": 9, "h200": 9, "h800": 9, "b200": 10,
        "gb200": 10, "gb300": 10}


def _arch(kind: str) -> int:
    return next(a for k, a in sorted(ARCH.items(), key=lambda x: -len(x[0]))
                if kind.lower().startswith(k))


@dataclass
class Row:
    """One part of one plan exported to one target."""

    plan: str
    target: str
    part: str
    view: object                  # launchers.view.PartView
    path: Path | None             # the file written, None when refused
    refusal: str | None           # the exporter's one-line reason, when refused
    notes: tuple[str, ...] = ()
    status: str = ""              # accepted | refused | rejected | unchecked
    detail: str = ""              # refusal reason or launcher error
    values: dict | None = None    # the launcher's parsed config (accepted files)


def make_plans(out: Path) -> dict[str, Path]:
    from mpmd.cli.main import main

    files = dict(BUNDLED)
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for name, args in PLANNED.items():
            res = CliRunner().invoke(main, ["plan", *args, "--time-limit", "5",
                                            "--out", str(out / f"{name}.json")])
            assert res.exit_code == 0, res.output[-2000:]
            files[name] = out / f"{name}.json"
    finally:
        os.chdir(cwd)
    return files


def make_exports(plan_files: dict[str, Path], out: Path) -> list[Row]:
    rows: list[Row] = []
    for name, path in plan_files.items():
        plan = load_plan(path)
        views = {v.name: v for v in part_views(plan)}
        for target, (_, suffix) in TARGETS.items():
            stem = f"{name}_{target.replace('@', '_').replace('.', '')}".replace("-", "_")
            try:
                files = export_plan(plan, target, out / f"{stem}{suffix}")
            except LauncherError as e:
                for v in views.values():     # each part's own reason
                    try:
                        TARGETS[target][0](v, "plan", out / f"{stem}{suffix}")
                        why = str(e)
                    except LauncherError as ev:
                        why = str(ev)
                    rows.append(Row(name, target, v.name, v, None, why))
                continue
            written = {f.path.stem.rsplit("-", 1)[-1] if len(views) > 1 else "": f for f in files}
            for vname, v in views.items():
                f = written.get(vname)
                if f is None:
                    why = next(n for n in files[0].notes if n.startswith(f"{vname} not written"))
                    rows.append(Row(name, target, vname, v, None, why))
                    continue
                f.path.write_text(f.text)
                rows.append(Row(name, target, vname, v, f.path, None, f.notes))
    return rows


def _megatron_entry(path: Path, text: str) -> dict:
    """The arguments and world size the file's own launch line hands torchrun, recorded by
    running that line with ``torchrun ... pretrain_gpt.py`` replaced by a recorder."""
    line = next(x for x in text.splitlines() if x.startswith("# launch"))
    cmd = line.split(": ", 1)[1]
    run = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+) "
                    r"(pretrain_\w+\.py|scripts/training/run_recipe\.py)", cmd)
    rec = path.with_suffix(".argv.json")
    recorder = (f"{sys.executable} -c 'import json,os,sys; json.dump({{\"argv\": sys.argv[1:], "
                f"\"env\": os.environ.get(\"CUDA_DEVICE_MAX_CONNECTIONS\")}}, open(\"{rec}\", \"w\"))'")
    subprocess.run(["bash", "-c", cmd.replace(run.group(0), recorder)], cwd=path.parent,
                   check=True)
    got = json.loads(rec.read_text())
    return {"argv": got["argv"], "env": got["env"],
            "world_size": int(run.group(1)) * int(run.group(2))}


def node_size(plan_path: Path, part: int, kind: str) -> int:
    """Devices of one scale-up domain (a GPU node, a TPU slice) of ``kind`` in the plan's
    cluster file (``node_groups[].devices_per_node``; a listed cluster's largest mesh of the
    kind, e.g. a whole TPU pod). Read from the cluster, not from the exported file."""
    raw = json.loads(plan_path.read_text())
    cp = (raw["parts"][part] if "parts" in raw else raw)["cluster_path"]
    cl = yaml.safe_load((ROOT / cp).read_text())
    if "node_groups" in cl:
        return next(g["devices_per_node"] for g in cl["node_groups"] if g["device"] == kind)
    return max(m["num_devices"] for m in cl["meshes"] if m["device"] == kind)


def _run_checker(target: str, entries: list[dict]) -> dict:
    python, paths, script = LAUNCHERS[target]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)), CUDA_VISIBLE_DEVICES="",
               JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    manifest = Path(entries[0]["path"]).with_name(f"manifest-{target.replace('@', '_')}.json")
    manifest.write_text(json.dumps(entries if target != "megatron-bridge" else {
        "hf_configs": {k: str(x) for k, x in BRIDGE_HF.items()}, "entries": entries}))
    res = subprocess.run([str(python), str(CHECKS / script), str(manifest)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def check_all(rows: list[Row], plan_files: dict[str, Path]) -> dict[str, str]:
    """Runs each installed launcher's checker on the written files; fills each row's status.
    Returns target -> the launcher and version that checked it."""
    launchers = {}
    for target in TARGETS:
        mine = [r for r in rows if r.target == target]
        for r in mine:
            if r.path is None:
                r.status, r.detail = "refused", r.refusal or ""
        if not LAUNCHERS[target][0].exists():
            for r in mine:
                if r.path is not None:
                    r.status = "unchecked"
            continue
        entries = []
        for r in mine:
            if r.path is None:
                continue
            v = r.view
            e = {"path": str(r.path), "world_size": v.devices}
            if target == "megatron":
                e |= _megatron_entry(r.path, r.path.read_text()) | {"arch": _arch(v.device)}
            if target == "megatron-bridge":
                e |= _megatron_entry(r.path, r.path.read_text()) | {"gpu": v.device}
            if target == "maxtext":
                idx = int(r.part[4:]) if r.part else 0
                e["slices"] = max(1, v.devices // node_size(plan_files[r.plan], idx, v.device))
                launch = next(x for x in r.path.read_text().splitlines() if "pre_train.train" in x)
                words = launch.split("pre_train.train ", 1)[1].split()[1:]   # after the file
                e["overrides"] = [w for w in words if "=" in w and not w.startswith(
                    ("base_output_directory=", "dataset_path="))]
            entries.append(e)
        got = _run_checker(target, entries) if entries else {"launcher": target, "results": []}
        if "unavailable" in got:     # its configuration code does not import here
            for r in mine:
                if r.path is not None:
                    r.status, r.detail = "unchecked", got["unavailable"]
            continue
        launchers[target] = got["launcher"]
        res = {x["path"]: x for x in got["results"]}
        for r in mine:
            if r.path is None:
                continue
            x = res[str(r.path)]
            r.status = "accepted" if x["ok"] else "rejected"
            r.detail = "" if x["ok"] else x["error"]
            r.values = x.get("values")
    return launchers


_KIND_RE = re.compile(r"runs on (.+), which (\S+) cannot run")


def refusal_is_fair(r: Row) -> str | None:
    """None when the refusal names a part the target truly cannot run, checked against the plan
    and the installed launchers: a TPU part to Megatron-LM or torchtitan, a Blackhole part
    anywhere; a model torchtitan ships no model directory for; a pipeline whose blocks do not
    divide into MaxText's uniform stages. Else why the refusal is not fair."""
    why = r.refusal or ""
    if "\n" in why or not why:
        return f"not one line: {why!r}"
    m = _KIND_RE.search(why)
    if m:
        kinds = [k.strip() for k in m.group(1).split(",")]
        gpu_only = r.target in ("megatron", "megatron-bridge", "torchtitan", "torchtitan@0.2")
        unfair = [k for k in kinds if not (k.startswith("blackhole") or
                                           (gpu_only and k.startswith("tpu")))]
        actual = set(r.view.kinds)
        if unfair or not set(kinds) <= actual:
            return f"refuses kinds {kinds} (part runs {sorted(actual)})"
        return None
    if "torchtitan ships no model" in why and r.target.startswith("torchtitan"):
        tt = ENV / ("tt-0.2.2" if r.target.endswith("0.2") else "tt-0.3.0") / "torchtitan/models"
        family = re.split(r"[-_.]", r.view.model.name.lower())[0]
        shipped = [d.name for d in tt.iterdir()] if tt.exists() else []
        if any(d.startswith(family) for d in shipped):
            return f"torchtitan ships {family} ({sorted(d for d in shipped if d.startswith(family))})"
        return None
    if r.target == "megatron-bridge" and "has no recipe for" in why:
        # Bridge 0.6.2's pretraining recipes, pinned from its wheel (test_megatron_bridge.py)
        pinned = json.loads((HERE / "pinned" / "megatron_bridge_0.6.2.json").read_text())
        family = re.split(r"[-_.]", r.view.model.name.lower())[0]
        have = [n for n in pinned["recipes"] if n.startswith(family)]
        return f"Bridge has {family} recipes {have[:3]}" if have else None
    if r.target == "maxtext" and "MaxText's pipeline runs as many blocks" in why:
        v = r.view
        stages = len(v.stage_layers)
        piped = v.model.layers - (v.model.dense_layers if v.model.name.lower().startswith(
            "deepseek") else 0)
        return None if piped % stages else f"{piped} blocks do divide over {stages} stages"
    return "not a reason the target cannot run the part"


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    plan_files = make_plans(tmp_path_factory.mktemp("plans"))
    rows = make_exports(plan_files, tmp_path_factory.mktemp("exports"))
    launchers = check_all(rows, plan_files)
    return plan_files, rows, launchers


def _rows(suite, plan, target) -> list[Row]:
    _, rows, launchers = suite
    if target not in launchers:
        pytest.skip(f"{target}: launcher not installed at {LAUNCHERS[target][0]}; run "
                    f"scripts/launchers_env.sh")
    assert VERSIONS[target].split()[-1] in launchers[target]
    return [r for r in rows if r.plan == plan and r.target == target]


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("plan", PLANS)
def test_every_written_file_is_accepted(plan, target, suite):
    rows = _rows(suite, plan, target)
    bad = [f"{r.path.name}: {r.detail[:600]}" for r in rows if r.status == "rejected"]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("plan", PLANS)
def test_every_refusal_is_a_part_the_target_cannot_run(plan, target, suite):
    rows = _rows(suite, plan, target)
    bad = [f"{r.part or 'plan'}: {refusal_is_fair(r)}: {r.refusal}" for r in rows
           if r.status == "refused" and refusal_is_fair(r) is not None]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("plan", PLANS)
def test_read_back_is_the_plan(plan, target, suite):
    plan_files = suite[0]
    rows = [r for r in _rows(suite, plan, target) if r.status == "accepted"]
    if not rows:
        pytest.skip(f"no accepted file of {plan} for {target}")
    expect = expected_parts(load_plan(plan_files[plan]))
    bad = []
    for r in rows:
        bad += [f"{r.path.name}: {m}" for m in mismatches(target, expect[r.part], r.values,
                                                            r.notes)]
    assert not bad, "\n".join(bad)


def table(rows: list[Row], launchers: dict[str, str]) -> str:
    """The plan x target table: one line per plan, target and part."""
    out = ["| plan | target | launcher | part | outcome | detail |", "|---|---|---|---|---|---|"]
    for r in rows:
        detail = r.detail.replace("|", "/").replace("\n", " ")[:160]
        out.append(f"| {r.plan} | {r.target} | {launchers.get(r.target, 'not installed')} | "
                   f"{r.part or '-'} | {r.status} | {detail} |")
    counts = Counter((r.target, r.status) for r in rows)
    out.append("")
    out += [f"{t}: " + ", ".join(f"{counts[t, s]} {s}" for s in
                                 ("accepted", "refused", "rejected", "unchecked") if counts[t, s])
            for t in TARGETS]
    return "\n".join(out)


def main() -> None:
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="mpmd-launchers-"))
    (out / "plans").mkdir()
    (out / "exports").mkdir()
    plan_files = make_plans(out / "plans")
    rows = make_exports(plan_files, out / "exports")
    launchers = check_all(rows, plan_files)
    for r in rows:
        if r.status == "accepted":
            bad = mismatches(r.target, expected_parts(load_plan(plan_files[r.plan]))[r.part],
                             r.values, r.notes)
            if bad:
                r.detail = "read back differs: " + "; ".join(bad)
        elif r.status == "refused" and refusal_is_fair(r):
            r.detail = f"UNFAIR ({refusal_is_fair(r)}): {r.detail}"
    print(table(rows, launchers))


if __name__ == "__main__":
    main()
