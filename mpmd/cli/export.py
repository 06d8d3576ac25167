"""``mpmd export plan.json --to megatron|megatron-bridge|torchtitan|torchtitan@0.2|maxtext``: the plan as a
launcher's input."""

from __future__ import annotations

import click

from ir.vocab import EXPORT_TARGETS
from mpmd.cli.common import console, err_console, guard


@click.command()
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False))
@click.option("--to", "target", required=True,
              type=click.Choice(EXPORT_TARGETS),
              help="Launcher: Megatron-LM arguments, Megatron-Bridge (NeMo) recipe overrides "
                   "(megatron-bridge), a torchtitan 0.3 config module, a torchtitan 0.2 job TOML "
                   "(torchtitan@0.2) or a MaxText YAML.")
@click.option("--out", type=click.Path(), default=None,
              help="File to write (default: PLAN-TARGET.args/.overrides/.py/.toml/.yml in the working "
                   "directory); a data-parallel plan writes one file per part, "
                   "STEM-part0.SUFFIX, ...")
@guard
def export(plan_path: str, target: str, out: str | None) -> None:
    """Write PLAN.json as the input of the launcher people train with.

    What the target cannot express (a layout that differs between stages, a schedule it
    lacks, several device kinds) is printed as one line per item; the file holds the closest
    setting, named in that line."""
    from ir.files import check_output, write_atomic
    from ir.plan_file import load_plan
    from launchers import export_plan
    from launchers.export import default_out

    # the output path before the plan is read; a data-parallel plan's parts, named after it,
    # are checked once known, before the first is written
    dest = check_output(out or default_out(plan_path, target), f"{target} file")

    plan = load_plan(plan_path)
    files = export_plan(plan, target, dest, source=plan_path)
    for f in files:             # every part's file, before the first is written
        check_output(f.path, f"{target} file")
    for f in files:
        write_atomic(f.path, f.text)
    notes: dict[str, list[str]] = {}
    for f in files:
        console.print(f"wrote {f.path}", highlight=False, markup=False)
        for n in f.notes:
            notes.setdefault(n, []).append(f.path.name)
    for n, names in notes.items():
        where = f" ({', '.join(names)})" if len(files) > 1 and len(names) < len(files) else ""
        err_console.print(f"{target} cannot express{where}: {n}", highlight=False,
                          markup=False, soft_wrap=True)
