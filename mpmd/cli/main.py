"""``mpmd``: the command-line interface.

One module per command, each registered below by name: a command module that fails to import
fails ``mpmd`` itself, with its traceback. Every project error becomes one line on stderr and exit
status 2, with no traceback and no half-written output file (outputs go to a temporary file that
is renamed into place): :func:`mpmd.cli.common.guard`.

The command modules import only click, rich and the light input checks when ``mpmd`` starts; each
command imports the planner, the simulator, the compiler or JAX when it runs, after checking its
input, so a typo is refused in a fraction of a second.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Literal, NoReturn, overload

import click

from mpmd.cli import (calibrate, export, models, plan, profiles, run, serve, simulate,
                      validate, video, whatif)
from rich.markup import escape   # error text quotes user input: '[/]' there is not markup

from mpmd.cli.common import err_console


class _OneLineGroup(click.Group):
    """The ``mpmd`` group: a usage error (unknown flag, bad flag value, missing argument) is one
    line on stderr naming the value and where the help is, exit status 2, as every other error.
    ``mpmd`` alone prints the short usage (:meth:`short_usage`) on stderr, exit status 2 as click
    gives a group called with no command."""

    def short_usage(self, ctx: click.Context) -> str:
        """The usage line and the command list, then where the rest is."""
        f = ctx.make_formatter()
        self.format_usage(ctx, f)
        self.format_commands(ctx, f)
        f.write_paragraph()
        f.write_text(f"Run '{ctx.command_path} COMMAND --help' for a command's options.")
        return f.getvalue().rstrip("\n")

    @overload
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: Literal[True] = True,
             **extra: Any) -> NoReturn: ...

    @overload
    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = ...,
             **extra: Any) -> Any: ...

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        try:
            rv = super().main(args, prog_name or "mpmd", complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            if not standalone_mode:
                raise
            click.echo(self.short_usage(e.ctx), err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            if not standalone_mode:
                raise
            ctx = getattr(e, "ctx", None)
            where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
            msg = " ".join(e.format_message().split()).rstrip(".")
            err_console.print(f"[bold red]error:[/] {escape(msg + where)}", highlight=False,
                              soft_wrap=True)
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            if not standalone_mode:
                raise
            err_console.print("[bold red]error:[/] interrupted; nothing written", highlight=False)
            sys.exit(130)
        if standalone_mode:
            sys.exit(rv if isinstance(rv, int) else 0)
        return rv


@click.group(cls=_OneLineGroup)
def main() -> None:
    """MPMD auto-planner, simulator and compiler for heterogeneous accelerator clusters."""


COMMANDS: tuple[click.Command, ...] = (
    profiles.profiles, models.models, plan.plan_command, simulate.simulate, run.run,
    calibrate.calibrate, validate.validate, whatif.whatif, export.export, serve.serve_plan,
    video.video)
"""Every ``mpmd`` command, from its own module."""

for _command in COMMANDS:
    main.add_command(_command)

if __name__ == "__main__":
    main()
