"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each torchtitan
export through torchtitan's own ``ConfigManager.parse_args`` (0.3: ``--module/--config`` with the
exported module on ``sys.path``; 0.2: ``--job.config_file``), then ``ParallelDims`` built on the
config's degrees and the world size and its device mesh built on a fake process group
(``torch.testing._internal.distributed.fake_pg``: no GPU, no other process), then the
gradient-accumulation arithmetic of torchtitan's trainer; the parsed values as JSON on stdout.

Usage: python torchtitan_check.py MANIFEST.json, a list of {"path": ..., "world_size": N}."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import traceback
from contextlib import redirect_stderr, redirect_stdout


def _jsonable(x):
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)
                if not f.name.startswith("_")}
    if isinstance(x, (list, tuple)):
        return [_jsonable(i) for i in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    return type(x).__name__


def _mesh(parallelism, world: int) -> dict:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from torchtitan.distributed import ParallelDims

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    if hasattr(ParallelDims, "from_config"):
        dims = ParallelDims.from_config(parallelism, world)
    else:
        dims = ParallelDims(dp_shard=parallelism.data_parallel_shard_degree,
                            dp_replicate=parallelism.data_parallel_replicate_degree,
                            cp=parallelism.context_parallel_degree,
                            tp=parallelism.tensor_parallel_degree,
                            pp=parallelism.pipeline_parallel_degree,
                            ep=parallelism.expert_parallel_degree,
                            etp=parallelism.expert_tensor_parallel_degree, world_size=world)
    import torchtitan.distributed.parallel_dims as pd
    pd.device_type = "cpu"
    mesh = dims.build_mesh() if hasattr(dims, "build_mesh") else dims.world_mesh
    dist.destroy_process_group()
    return {"mesh_shape": list(mesh.shape), "mesh_dims": list(mesh.mesh_dim_names or ()),
            "dp_shard": dims.dp_shard, "dp_replicate": dims.dp_replicate}


def check(entry: dict, version: str) -> dict:
    from torchtitan.config.manager import ConfigManager

    path = entry["path"]
    if version.startswith("0.2"):
        argv = ["--job.config_file", path]
    else:
        sys.path.insert(0, os.path.dirname(path))
        argv = ["--module", os.path.basename(path)[:-3], "--config", "mpmd_plan"]
    log = io.StringIO()
    try:
        with redirect_stdout(log), redirect_stderr(log):
            cfg = ConfigManager().parse_args(argv)
            mesh = _mesh(cfg.parallelism, entry["world_size"])
            t, p = cfg.training, cfg.parallelism
            batch = p.data_parallel_replicate_degree * mesh["dp_shard"]
            gbs = t.global_batch_size if t.global_batch_size > 0 else t.local_batch_size * batch
            assert gbs % (t.local_batch_size * batch) == 0, (
                f"global batch size must be multiple of local batch size times data-parallel "
                f"degree ({gbs} % ({t.local_batch_size} * {batch}) != 0)")   # the trainer's check
            accumulation = gbs // (t.local_batch_size * batch)
    except SystemExit as e:
        return {"path": path, "ok": False, "error": f"exit {e.code}: {log.getvalue()[-300:]}"}
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"path": path, "ok": False,
                "error": f"{type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"}
    model = (cfg.model_spec.model if hasattr(cfg, "model_spec") else None)
    flavor = (cfg.model_spec.flavor if hasattr(cfg, "model_spec") else cfg.model.flavor)
    name = (cfg.model_spec.name if hasattr(cfg, "model_spec") else cfg.model.name)
    ac = cfg.activation_checkpoint
    return {"path": path, "ok": True, "values": {
        "model": name, "flavor": flavor, "model_config": _jsonable(model),
        "training": _jsonable(t), "parallelism": _jsonable(p), "accumulation": accumulation,
        "activation_checkpoint": (getattr(ac, "mode", None) if ac is not None else "none")
        if version.startswith("0.2") else ("none" if ac is None else type(ac).__qualname__),
        **mesh}}


def main() -> None:
    from importlib.metadata import version as dist_version

    import torchtitan
    version = getattr(torchtitan, "__version__", None) or dist_version("torchtitan")
    entries = json.load(open(sys.argv[1]))
    out = {"launcher": f"torchtitan {version}", "results": [check(e, version) for e in entries]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
