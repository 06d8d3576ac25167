"""What every ``mpmd`` command shares: the consoles and :func:`guard`, which turns a user error
into one line on stderr and exit status 2, with no traceback.

Light on purpose (click and rich only): every command module imports it when ``mpmd`` starts,
before any command has checked its input.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Callable, ParamSpec, TypeVar

from rich.console import Console
from rich.markup import escape   # error text quotes user input: '[/]' there is not markup

console = Console(width=None if sys.stdout.isatty() else 120)
"""Where the commands print their results (stdout)."""
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)
"""Where errors, progress and notes go (stderr)."""

P = ParamSpec("P")
R = TypeVar("R")

USER_ERRORS = (("ir.files", "InputError"), ("ir", "IRError"),
               ("hardware_profiles.types", "ProfileError"), ("planner.errors", "PlannerError"),
               ("simulator.plan_costs", "CostError"), ("zoo.config", "ZooError"),
               ("simulator.schedules", "ScheduleError"), ("simulator.program", "SimError"),
               ("compiler.errors", "CompilerError"), ("reports", "ReportError"),
               ("launchers.view", "LauncherError"))
"""(module, class) of every package's base error: the errors a user's input can cause."""


def user_errors() -> tuple[type[BaseException], ...]:
    """The classes of :data:`USER_ERRORS` already imported, with the file and JSON errors.

    Only packages already imported can have raised one, so none is imported here: an error found
    before the heavy imports (an unknown model, a missing cluster file) is reported in
    milliseconds."""
    errs: list[type[BaseException]] = [FileNotFoundError, IsADirectoryError, json.JSONDecodeError]
    for mod, name in USER_ERRORS:
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errs.append(cls)
    return tuple(errs)


def guard(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a command, turning user errors into one line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except user_errors() as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if isinstance(e, FileNotFoundError) and e.filename:
                msg = f"no such file: {e.filename}; check the path"
            elif isinstance(e, json.JSONDecodeError):
                msg = f"malformed JSON ({e.msg} at line {e.lineno}); regenerate the file"
            err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            sys.exit(2)

    return wrapper
