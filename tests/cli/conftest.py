"""What the CLI tests share: ``mpmd`` run as a fresh process, with the packages it imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]

HEAVY = frozenset({"jax", "ortools", "pydantic"})
"""The packages an input check must come before (read from ``-X importtime``, not from a clock)."""


@pytest.fixture
def fresh_mpmd(tmp_path: Path) -> Callable[..., tuple[int, list[str], str, set[str]]]:
    """``fresh_mpmd(*args)`` runs ``python -X importtime -m mpmd ARGS`` in a new process whose
    working directory is ``tmp_path``; it returns the exit status, the lines written on stderr
    (the import-time lines left out), stdout, and which of :data:`HEAVY` were imported."""
    def run(*args: str) -> tuple[int, list[str], str, set[str]]:
        res = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpmd", *args],
                             cwd=tmp_path, capture_output=True, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        said = [ln for ln in res.stderr.splitlines() if not ln.startswith("import time:")]
        imported = {ln.split("|")[-1].strip().split(".")[0] for ln in res.stderr.splitlines()
                    if ln.startswith("import time:")}
        return res.returncode, said, res.stdout, imported & HEAVY

    return run
