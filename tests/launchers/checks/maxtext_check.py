"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each MaxText
config through MaxText's own ``pyconfig.initialize`` (the file as the config on the train
command line, its ``base_config`` MaxText's ``base.yml``, the model's config from
``model_name``), for the part's target topology as MaxText's ahead-of-time compilation names it
(``internal_compile_num_devices`` the part's devices, ``compile_topology_num_slices`` its
slices: the cluster's TPU slices, or its GPU nodes, which MaxText's ``a3`` topology counts as one
slice each), then MaxText's own mesh-shape check (``max_utils.fill_unspecified_mesh_axes``: the
``ici_*`` axes against the devices per slice, the ``dcn_*`` axes against the slices, as
``create_device_mesh`` asserts); the parsed values as JSON on stdout.

JAX's distributed start-up (``max_utils.maybe_initialize_jax_distributed_system``: a
coordinator on every host) cannot run here and is skipped.

Usage: python maxtext_check.py MANIFEST.json, a list of {"path": ..., "world_size": N,
"slices": S, "overrides": [...]} (S derived from the plan's cluster file, not from the exported
file; overrides: the ``key=value`` words of the file's own launch line)."""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout

def check(entry: dict) -> dict:
    from maxtext.configs import pyconfig
    from maxtext.utils import max_utils

    max_utils.maybe_initialize_jax_distributed_system = lambda *a, **k: None
    path = entry["path"]
    out_dir = tempfile.mkdtemp()
    log = io.StringIO()
    try:
        with redirect_stdout(log), redirect_stderr(log):
            world, slices = entry["world_size"], entry["slices"]
            cfg = pyconfig.initialize(["train.py", path, f"base_output_directory={out_dir}",
                                       "enable_checkpointing=false", "internal_compile=true",
                                       f"internal_compile_num_devices={world}",
                                       f"compile_topology_num_slices={slices}",
                                       *entry.get("overrides", [])])
            max_utils.fill_unspecified_mesh_axes(list(cfg.ici_parallelism), world // slices,
                                                 "ICI")
            max_utils.fill_unspecified_mesh_axes(list(cfg.dcn_parallelism), slices, "DCN")
        keys = cfg.get_keys()
    except SystemExit as e:
        return {"path": path, "ok": False, "error": f"exit {e.code}: {log.getvalue()[-1500:]}"}
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"path": path, "ok": False,
                "error": f"{type(e).__name__}: {str(e)[:600]} ({os.path.basename(tb.filename)}:{tb.lineno})"}
    values = {k: (x if isinstance(x, (int, float, str, bool, type(None))) else str(x))
              for k, x in keys.items()}
    return {"path": path, "ok": True, "values": values}


def main() -> None:
    from importlib.metadata import version

    entries = json.load(open(sys.argv[1]))
    out = {"launcher": f"maxtext {version('maxtext')}", "results": [check(e) for e in entries]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
