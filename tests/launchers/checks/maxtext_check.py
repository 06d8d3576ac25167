"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each MaxText
config through MaxText's own ``pyconfig.initialize`` (the file as the config on the train
command line, its ``base_config`` MaxText's ``base.yml``, the model's config from
``model_name``), then the product of its ``ici_*`` and ``dcn_*`` axes against the part's
devices (what MaxText's mesh creation asserts); the parsed values as JSON on stdout.

JAX's distributed start-up (``max_utils.maybe_initialize_jax_distributed_system``: a
coordinator on every host) cannot run here and is skipped.

Usage: python maxtext_check.py MANIFEST.json, a list of {"path": ..., "world_size": N}."""

from __future__ import annotations

import io
import json
import math
import os
import sys
import tempfile
import traceback
from contextlib import redirect_stderr, redirect_stdout

AXES = ("data", "fsdp", "fsdp_transpose", "sequence", "context", "context_autoregressive",
        "tensor", "tensor_transpose", "tensor_sequence", "expert", "autoregressive", "stage")


def check(entry: dict) -> dict:
    from maxtext.configs import pyconfig
    from maxtext.utils import max_utils

    max_utils.maybe_initialize_jax_distributed_system = lambda *a, **k: None
    path = entry["path"]
    out_dir = tempfile.mkdtemp()
    log = io.StringIO()
    try:
        with redirect_stdout(log), redirect_stderr(log):
            cfg = pyconfig.initialize(["train.py", path, f"base_output_directory={out_dir}",
                                       "enable_checkpointing=false"])
        keys = cfg.get_keys()
        ici = math.prod(max(1, keys.get(f"ici_{a}_parallelism", 1)) for a in AXES)
        dcn = math.prod(max(1, keys.get(f"dcn_{a}_parallelism", 1)) for a in AXES)
        assert ici * dcn == entry["world_size"], (
            f"ici x dcn parallelism {ici} x {dcn} is not the part's {entry['world_size']} devices")
    except SystemExit as e:
        return {"path": path, "ok": False, "error": f"exit {e.code}: {log.getvalue()[-400:]}"}
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
