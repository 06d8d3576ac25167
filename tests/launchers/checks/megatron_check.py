"""Run inside the launcher environment (scripts/launchers_env.sh), not by pytest: each Megatron-LM
arguments file through Megatron-LM's own ``parse_args`` + ``validate_args``
(``megatron/training/arguments.py`` as shipped in the megatron-core wheel), then its parsed
values as JSON on stdout.

Usage: python megatron_check.py MANIFEST.json, the manifest a list of {"argv": [...],
"world_size": N, "arch": compute capability major (8 A100, 9 H100, 10 B200/GB200), "path": ...}.
No GPU here: the device's compute capability (``get_device_arch_version``,
``torch.cuda.get_device_capability``) is the manifest's ``arch`` and Transformer Engine's version
is :data:`TE_VERSION` (the range megatron-core pins), the two things ``validate_args`` asks the
GPU and the TE install for."""

from __future__ import annotations

import io
import json
import os
import sys
import traceback
from contextlib import redirect_stdout

TE_VERSION = "2.11.0"


def _patch(arch: int) -> None:
    import torch
    from packaging.version import Version

    import megatron.core.utils as core_utils
    import megatron.training.arguments as arguments

    arguments.get_device_arch_version = lambda: arch
    torch.cuda.get_device_capability = lambda *a, **k: (arch, 0)
    core_utils.get_te_version = lambda: Version(TE_VERSION)
    if hasattr(core_utils, "_te_version"):
        core_utils._te_version = Version(TE_VERSION)


def _value(x):
    if isinstance(x, (int, float, str, bool)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return [_value(i) for i in x]
    return str(x)


def check(entry: dict) -> dict:
    import megatron.training.arguments as arguments

    _patch(entry["arch"])
    os.environ["WORLD_SIZE"] = str(entry["world_size"])
    os.environ["RANK"] = "0"
    if entry.get("env") is None:     # as the file's launch line sets it, or not
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = entry["env"]
    sys.argv = ["pretrain_gpt.py", *entry["argv"]]
    log = io.StringIO()
    try:
        with redirect_stdout(log):
            args = arguments.parse_args()
            arguments.validate_args(args)
    except SystemExit as e:
        return {"path": entry["path"], "ok": False,
                "error": f"argparse exit {e.code}: {log.getvalue().strip()[-300:]}"}
    except BaseException as e:   # the launcher's own refusal: an assertion or a ValueError
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return {"path": entry["path"], "ok": False,
                "error": f"{type(e).__name__}: {e} ({os.path.basename(tb.filename)}:{tb.lineno})"}
    return {"path": entry["path"], "ok": True,
            "values": {k: _value(v) for k, v in vars(args).items()}}


def main() -> None:
    from importlib.metadata import version

    entries = json.load(open(sys.argv[1]))
    out = {"launcher": f"megatron-core {version('megatron-core')}",
           "results": [check(e) for e in entries]}
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
