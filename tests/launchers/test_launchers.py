"""The ``launchers`` suite (not in the default run: ``./scripts/test.sh -m launchers``): every
export of the bundled example plans and of the six plans of issue 46 (made here with
``mpmd plan --time-limit 5``) loaded through each launcher's own configuration code, installed by
``scripts/launchers_env.sh`` (``MPMD_LAUNCHERS``, default /tmp/mpmd-launchers): Megatron-LM's
``parse_args`` + ``validate_args`` (megatron-core's wheel), torchtitan 0.3.0's and 0.2.2's config
manager with ``ParallelDims`` on a fake process group, MaxText's ``pyconfig``
(``checks/*_check.py``, run in those environments). Each accepted file is read back through the
launcher's parsed config and compared with the plan: micro batch and accumulation, degrees,
schedule, recomputation, precision and the model. The Megatron arguments are taken from the
file's own launch line, run as written with ``torchrun`` replaced by a recorder.

``python tests/launchers/test_launchers.py`` prints the plan x target table."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ir.plan_file import load_plan
from launchers import LauncherError, export_plan, part_views
from launchers.export import TARGETS, VERSIONS

pytestmark = pytest.mark.launchers

HERE = Path(__file__).resolve().parent
ENV = Path(os.environ.get("MPMD_LAUNCHERS", "/tmp/mpmd-launchers"))
CHECKS = HERE / "checks"
C = "hardware_profiles/clusters/"
ROOT = HERE.parents[1]
BUNDLED = {p.stem: p for p in sorted((HERE / "data").glob("*.json"))}
PLANNED = {   # issue 46's six plans
    "issue46-llama3-70b-h100x128": ["--model", "llama3-70b", "--cluster", C + "h100x128_nodes.yaml",
                            "--global-batch", "256", "--seq-len", "8192"],
    "issue46-qwen3-8b-h100x64": ["--model", "zoo/configs/Qwen3-8B.json", "--cluster",
                         C + "h100x64_nodes.yaml", "--global-batch", "256", "--seq-len", "4096"],
    "issue46-mixtral-8x22b-h100x256": ["--model", "zoo/configs/Mixtral-8x22B-v0.1.json", "--cluster",
                               C + "h100x256_nodes.yaml", "--global-batch", "512",
                               "--seq-len", "4096"],
    "issue46-deepseek-v3-h100x2048": ["--model", "deepseek-v3", "--cluster", C + "h100x2048_nodes.yaml",
                              "--global-batch", "2048", "--seq-len", "4096"],
    "issue46-llama3-8b-tpuv5e256": ["--model", "llama3-8b", "--cluster", C + "tpuv5e256.yaml",
                            "--global-batch", "256", "--seq-len", "8192"],
    "issue46-llama3-70b-mixed512": ["--model", "llama3-70b", "--cluster", C + "mixed512_nodes.yaml",
                            "--global-batch", "512", "--seq-len", "8192"],
}
PLANS = [*BUNDLED, *PLANNED]

# target -> (interpreter, extra sys.path, checker)
LAUNCHERS = {
    "megatron": (ENV / "py312/bin/python", [], "megatron_check.py"),
    "torchtitan": (ENV / "py311/bin/python", [ENV / "tt-0.3.0"], "torchtitan_check.py"),
    "torchtitan@0.2": (ENV / "py311/bin/python", [ENV / "tt-0.2.2"], "torchtitan_check.py"),
    "maxtext": (ENV / "py312/bin/python", [], "maxtext_check.py"),
}
ARCH = {"v100": 7, "a100": 8, "l40s": 8, "h100": 9, "h200": 9, "h800": 9, "b200": 10,
        "gb200": 10, "gb300": 10}


def _arch(kind: str) -> int:
    return next(a for k, a in sorted(ARCH.items(), key=lambda x: -len(x[0]))
                if kind.lower().startswith(k))


@pytest.fixture(scope="session")
def plan_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans")
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


def _megatron_entry(path: Path, text: str) -> dict:
    """The arguments and world size the file's own launch line hands torchrun, recorded by
    running that line with ``torchrun ... pretrain_gpt.py`` replaced by a recorder."""
    line = next(x for x in text.splitlines() if x.startswith("# launch"))
    cmd = line.split(": ", 1)[1]
    run = re.search(r"torchrun --nnodes (\d+) --nproc-per-node (\d+) pretrain_\w+\.py", cmd)
    rec = path.with_suffix(".argv.json")
    recorder = (f"{sys.executable} -c 'import json,os,sys; json.dump({{\"argv\": sys.argv[1:], "
                f"\"env\": os.environ.get(\"CUDA_DEVICE_MAX_CONNECTIONS\")}}, open(\"{rec}\", \"w\"))'")
    subprocess.run(["bash", "-c", cmd.replace(run.group(0), recorder)], cwd=path.parent,
                   check=True)
    got = json.loads(rec.read_text())
    return {"argv": got["argv"], "env": got["env"],
            "world_size": int(run.group(1)) * int(run.group(2))}


@pytest.fixture(scope="session")
def exports(plan_files, tmp_path_factory):
    """(plan, target) -> list of (part view, file path or None, refusal or None)."""
    out = tmp_path_factory.mktemp("exports")
    table: dict = {}
    for name, path in plan_files.items():
        plan = load_plan(path)
        views = {v.name: v for v in part_views(plan)}
        for target, (_, suffix) in TARGETS.items():
            stem = f"{name}_{target.replace('@', '_').replace('.', '')}".replace("-", "_")
            try:
                files = export_plan(plan, target, out / f"{stem}{suffix}")
            except LauncherError as e:
                table[name, target] = [(v, None, str(e)) for v in views.values()]
                continue
            rows = []
            written = {f.path.stem.rsplit("-", 1)[-1] if len(views) > 1 else "": f for f in files}
            for vname, v in views.items():
                f = written.get(vname)
                if f is None:
                    why = next(n for n in files[0].notes if n.startswith(f"{vname} not written"))
                    rows.append((v, None, why))
                    continue
                f.path.write_text(f.text)
                rows.append((v, f.path, None))
            table[name, target] = rows
    return table


def _run_checker(target: str, entries: list[dict]) -> dict:
    python, paths, script = LAUNCHERS[target]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, paths)), CUDA_VISIBLE_DEVICES="",
               JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    manifest = Path(entries[0]["path"]).with_name(f"manifest-{target.replace('@', '_')}.json")
    manifest.write_text(json.dumps(entries))
    res = subprocess.run([str(python), str(CHECKS / script), str(manifest)], env=env,
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def checked(exports):
    """target -> {"launcher": its name and version, "results": {file path: result}}."""
    out = {}
    for target in TARGETS:
        if not LAUNCHERS[target][0].exists():
            continue
        entries = []
        for (name, t), rows in exports.items():
            if t != target:
                continue
            for v, path, _ in rows:
                if path is None:
                    continue
                e = {"path": str(path), "world_size": v.devices}
                if target == "megatron":
                    e |= _megatron_entry(path, path.read_text()) | {"arch": _arch(v.device)}
                    if e["env"] is not None:
                        e["environ"] = {"CUDA_DEVICE_MAX_CONNECTIONS": e["env"]}
                entries.append(e)
        got = _run_checker(target, entries) if entries else {"launcher": target, "results": []}
        out[target] = {"launcher": got["launcher"],
                       "results": {r["path"]: r for r in got["results"]}}
    return out


def _need(checked, target):
    if target not in checked:
        pytest.skip(f"{target}: launcher not installed at {LAUNCHERS[target][0]}; run "
                    f"scripts/launchers_env.sh")


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("plan", PLANS)
def test_every_written_file_is_accepted(plan, target, exports, checked):
    _need(checked, target)
    assert VERSIONS[target].split()[-1] in checked[target]["launcher"]
    rows = exports[plan, target]
    bad = {str(p): checked[target]["results"][str(p)]["error"] for _, p, _ in rows
           if p is not None and not checked[target]["results"][str(p)]["ok"]}
    assert not bad, "\n".join(f"{Path(p).name}: {e[:400]}" for p, e in bad.items())
    for v, p, why in rows:      # a part not written says why in one line
        assert p is not None or (why and "\n" not in why)
