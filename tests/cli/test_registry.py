"""The ``mpmd`` commands are plain modules, registered by name in ``mpmd.cli.main``: every command
module's command is listed, and a command module that fails to import fails ``mpmd`` with its
error instead of its command silently vanishing."""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import mpmd.cli
from mpmd.cli.main import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]

COMMAND_MODULES = {"calibrate": "calibrate", "export": "export", "models": "models",
                   "plan": "plan", "profiles": "profiles", "run": "run", "serve": "serve-plan",
                   "simulate": "simulate", "validate": "validate", "video": "video",
                   "whatif": "whatif"}
"""Every command module of ``mpmd.cli`` -> the command it defines."""


def _module_commands() -> dict[str, str]:
    """The click commands defined at the top level of each module of ``mpmd.cli`` (the ``mpmd``
    group itself left out): module name -> command name (one per module)."""
    found: dict[str, str] = {}
    for info in pkgutil.iter_modules(mpmd.cli.__path__):
        mod = importlib.import_module(f"mpmd.cli.{info.name}")
        for obj in vars(mod).values():
            if (isinstance(obj, click.Command) and obj is not main and obj.callback is not None
                    and obj.callback.__module__ == mod.__name__):
                assert info.name not in found, f"mpmd.cli.{info.name} defines two commands"
                assert obj.name is not None
                found[info.name] = obj.name
    return found


def test_every_command_module_defines_one_command_and_it_is_registered() -> None:
    assert _module_commands() == COMMAND_MODULES
    assert {name: getattr(cmd.callback, "__module__", None)
            for name, cmd in main.commands.items()} == {
        name: f"mpmd.cli.{mod}" for mod, name in COMMAND_MODULES.items()}
    assert len(COMMANDS) == len(main.commands)
    assert all(c.name is not None and main.commands[c.name] is c for c in COMMANDS)


def test_help_lists_every_command() -> None:
    r = CliRunner().invoke(main, ["--help"])
    assert r.exit_code == 0, r.output
    listed = r.output.split("Commands:\n", 1)[1].splitlines()
    assert sorted(line.split()[0] for line in listed if line.strip()) == sorted(
        COMMAND_MODULES.values())


BROKEN = """
import importlib.abc, importlib.util, runpy, sys

TARGET = sys.argv[1]


class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    '''Loads TARGET as a module whose first import fails, as a missing dependency would.'''

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == TARGET else None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        import mpmd_test_missing_dependency  # noqa: F401


sys.meta_path.insert(0, Broken())
sys.argv = ["mpmd", *sys.argv[2:]]
runpy.run_module("mpmd", run_name="__main__")
"""


@pytest.mark.parametrize("module, command", sorted(COMMAND_MODULES.items()))
def test_a_broken_command_module_fails_mpmd_loudly(module: str, command: str,
                                                    tmp_path: Path) -> None:
    """``python -m mpmd CMD --help`` with ``mpmd.cli.MODULE`` failing to import: the import error
    and its traceback on stderr, exit status 1, nothing on stdout; not "No such command"."""
    res = subprocess.run([sys.executable, "-c", BROKEN, f"mpmd.cli.{module}", command, "--help"],
                         cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = res.stderr.splitlines()
    assert (res.returncode, res.stdout) == (1, ""), res.stderr
    assert lines[0] == "Traceback (most recent call last):", res.stderr
    assert lines[-1] == ("ModuleNotFoundError: No module named "
                         "'mpmd_test_missing_dependency'"), res.stderr
    assert "No such command" not in res.stderr


def test_the_same_script_runs_the_command_when_nothing_is_broken(tmp_path: Path) -> None:
    """The check above is not vacuous: with a module name that no command has, the same script
    prints the command's help and exits 0."""
    res = subprocess.run([sys.executable, "-c", BROKEN, "mpmd.cli.not_a_command", "plan",
                          "--help"], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert (res.returncode, res.stderr) == (0, ""), res.stderr
    assert res.stdout.startswith("Usage: mpmd plan [OPTIONS]"), res.stdout
