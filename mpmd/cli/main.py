"""``mpmd``: the command-line interface.

Every project error becomes one line on stderr and exit status 2, with no traceback and no
half-written output file (outputs go to a temporary file that is renamed into place).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console
from rich.markup import escape   # error text quotes user input: '[/]' there is not markup

from mpmd.cli.params import (MAX_GLOBAL_BATCH, MAX_MICROBATCHES, MAX_SEQ_LEN, MAX_TENSOR,
                             MAX_TIME_LIMIT_S, FiniteFloat, int_range)
from hardware_profiles.paths import resolve_cluster_path
from ir.files import write_atomic
from zoo.config import list_models
from zoo.model_files import config_fields, resolve_model

console = Console(width=None if sys.stdout.isatty() else 120)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 200)


def _user_errors() -> tuple[type[BaseException], ...]:
    """Every package's base error: the errors a user's input can cause.

    Only packages already imported can have raised one, so none is imported here: an error found
    before the heavy imports (an unknown model, a missing cluster file) is reported in
    milliseconds."""
    errs: list[type[BaseException]] = [FileNotFoundError, IsADirectoryError, json.JSONDecodeError]
    for mod, name in (("ir.files", "InputError"), ("ir", "IRError"),
                      ("hardware_profiles.types", "ProfileError"), ("planner.errors", "PlannerError"),
                      ("simulator.plan_costs", "CostError"), ("zoo.config", "ZooError"),
                      ("simulator.schedules", "ScheduleError"), ("simulator.program", "SimError"),
                      ("compiler.errors", "CompilerError"), ("reports", "ReportError"),
                      ("launchers.view", "LauncherError")):
        cls = getattr(sys.modules.get(mod), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errs.append(cls)
    return tuple(errs)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a command, turning user errors into one line and exit status 2."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except _user_errors() as e:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if isinstance(e, FileNotFoundError) and e.filename:
                msg = f"no such file: {e.filename}; check the path"
            elif isinstance(e, json.JSONDecodeError):
                msg = f"malformed JSON ({e.msg} at line {e.lineno}); regenerate the file"
            err_console.print(f"[bold red]error:[/] {escape(msg)}", highlight=False, soft_wrap=True)
            sys.exit(2)

    return wrapper


class _OneLineGroup(click.Group):
    """The ``mpmd`` group: a usage error (unknown flag, bad flag value, missing argument) is one
    line on stderr naming the value and where the help is, exit status 2, as every other error."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            rv = super().main(args, prog_name or "mpmd", complete_var, standalone_mode=False, **extra)
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


@main.command()
@_guard
def profiles() -> None:
    """List the bundled device profiles."""
    from hardware_profiles import profiles_table

    console.print(profiles_table())


@main.command("plan")
@click.option("--model", required=True,
              help="Zoo model name (e.g. llama3-70b), or a model file: a Hugging Face config.json "
                   "(Llama, Mistral, Qwen2/3, Gemma 1-3, GPT-2, GPT-NeoX, OPT) or a YAML model spec.")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False),
              help="Cluster spec YAML.")
@click.option("--global-batch", type=int_range(1, MAX_GLOBAL_BATCH), default=None,
              help="Samples per step (default: the model's).")
@click.option("--seq-len", type=int_range(1, MAX_SEQ_LEN), default=None,
              help="Tokens per sample (default: the model's).")
@click.option("--time-limit", type=FiniteFloat(min=0.1, max=MAX_TIME_LIMIT_S), default=30.0, show_default=True,
              help="Search budget in seconds of work on the reference 2-core machine (about its wall "
                   "time there; node-group clusters): the same plan on any machine, a busy one takes "
                   "longer; the wall clock cuts the search at 3x this.")
@click.option("--schedule", "schedules", multiple=True,
              help="Restrict to these schedules (repeatable).")
@click.option("--microbatches", "microbatches", multiple=True, type=int_range(1, MAX_MICROBATCHES),
              help="Restrict to these microbatch counts (repeatable).")
@click.option("--max-tensor", type=int_range(1, MAX_TENSOR), default=8, show_default=True,
              help="Largest tensor-parallel degree considered.")
@click.option("--even-split", is_flag=True, help="Force the usual hand split (equal layers per stage).")
@click.option("--no-fsdp", is_flag=True, help="Do not consider fully sharded data parallel layouts.")
@click.option("--objective", type=click.Choice(["time", "cost"]), default="time", show_default=True,
              help="time: the shortest step; cost: the lowest USD per step (with --min-throughput, "
                   "among plans that reach it). Either may use part of the cluster.")
@click.option("--min-throughput", type=FiniteFloat(min=1e-9, max=1e18), default=None,
              help="Throughput floor, tokens per second.")
@click.option("--max-usd-per-hour", type=FiniteFloat(min=1e-9, max=1e12), default=None,
              help="Budget: the plan's devices cost at most this, USD per hour.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the plan JSON here.")
@_guard
def plan_command(model: str, cluster_path: str, global_batch: int | None, seq_len: int | None,
                 time_limit: float, schedules: tuple[str, ...], microbatches: tuple[int, ...],
                 max_tensor: int, even_split: bool, no_fsdp: bool, objective: str,
                 min_throughput: float | None, max_usd_per_hour: float | None,
                 out: str | None) -> None:
    """Plan MODEL on CLUSTER: stage assignment, layouts and schedule.

    On a cluster described as node groups the plan also says how the nodes are carved into meshes
    (which nodes each mesh spans, the pipeline replicas it carries), and may split the batch over
    several pipelines (data parallelism across device kinds): the table then has one section per
    pipeline, its batch share, and the gradient sync across them. A cluster file that lists meshes
    which are whole nodes of one kind per group, joined alike, is planned the same way, as the node
    groups it describes; 'carve: fixed' in the file keeps its meshes as listed.

    --objective cost, --min-throughput and --max-usd-per-hour plan on part of a node-group cluster
    too (each group at all, half or a quarter of its nodes, or left out), pricing the devices a
    plan uses at the cluster file's price_usd_per_device_hour (else the device profile's); the
    table then has a "cost" row.

    Searches that run over a few seconds show progress on stderr. Ctrl-C stops the search and
    keeps the best plan found so far: the table is printed and, with --out, the plan is written,
    marked "interrupted" in its solver record. That exits 0, as when --time-limit cuts the search
    short: a usable plan was produced (scripts can tell from the JSON). Ctrl-C before any feasible
    plan writes nothing and exits 2; a second Ctrl-C aborts at once, writes nothing and exits 130.
    """
    # the input first, before the planner, pydantic and JAX load (a typo is refused in ~0.2 s)
    cfg = resolve_model(model)            # ZooError: unknown model ("did you mean"), bad file
    resolve_cluster_path(cluster_path)    # ProfileError: no such file, with "did you mean"
    from mpmd.cli.output import plan_table, search_gap_text, validate_plan_json
    from mpmd.cli.search_ui import Aborted, CtrlC, SearchProgress
    from ir import any_plan_to_json, with_model_config
    from hardware_profiles import load_cluster
    from planner import Goal, PlanOptions, plan
    from planner.api import TRAIN_SCHEDULES, PlanInterrupted

    for s in schedules:
        if s not in TRAIN_SCHEDULES:
            raise click.BadParameter(f"unknown schedule {s!r}; use one of {', '.join(TRAIN_SCHEDULES)}")
    cluster = load_cluster(cluster_path)
    workload = _workload(cfg, global_batch, seq_len)
    # Ctrl-C handling spans the search and the output, so a second Ctrl-C never leaves a file
    with CtrlC() as ctrl_c:
        try:
            with SearchProgress(err_console, f"{cfg.name} on {cluster.name}") as bar:
                opts = PlanOptions(time_limit_s=time_limit, schedules=schedules or None,
                                   microbatches=microbatches or None, max_tensor=max_tensor,
                                   even_split=even_split, fsdp=not no_fsdp)
                result = plan(workload, cluster, opts, bar,
                              goal=Goal(objective, min_throughput, max_usd_per_hour), stop=ctrl_c.stop)
            ctrl_c.searching = False
            ctrl_c.check()
            if result.interrupted:
                sv = result.plan.solver
                err_console.print(f"interrupted after {sv.get('search_wall_s', 0):.0f} s; "
                                  f"best plan so far, {search_gap_text(sv)}",
                                  highlight=False, soft_wrap=True)
            console.print(plan_table(result, cluster))
            ctrl_c.check()
            if out:
                chosen = (with_model_config(result.plan, config_fields(cfg))
                          if cfg.name not in list_models() else result.plan)
                doc = any_plan_to_json(chosen)   # a pipeline plan or a data-parallel plan
                validate_plan_json(doc)
                text = json.dumps(doc, indent=1)
            with ctrl_c.committing():
                if out:
                    write_atomic(Path(out), text)
        except (Aborted, PlanInterrupted) as e:
            if isinstance(e, Aborted) or ctrl_c.aborted:
                err_console.print("aborted by a second Ctrl-C; nothing written", highlight=False)
                sys.exit(130)
            err_console.print(f"{e}; nothing written", highlight=False, soft_wrap=True)
            sys.exit(2)
    if out:
        console.print(f"wrote {out}")


DEFAULT_GLOBAL_BATCH = 256
"""Samples per training step when --global-batch is not given (2M tokens at sequence length 8192)."""


def _workload(cfg, global_batch: int | None, seq_len: int | None):
    """The traced workload of ``cfg`` (a ``zoo.ModelConfig``); inference models default to one
    video or request."""
    from zoo.costing import workload

    if global_batch is None:
        global_batch = (DEFAULT_GLOBAL_BATCH if cfg.training
                        else getattr(cfg, "sampling_steps", 1) * getattr(cfg, "cfg_passes", 1))
    return workload(cfg, global_batch=global_batch, seq_len=seq_len)


def _extra_commands() -> None:
    """Attach the commands whose implementations live in other packages, when present."""
    for mod in ("mpmd.cli.simulate", "mpmd.cli.run", "mpmd.cli.validate", "mpmd.cli.whatif",
                "mpmd.cli.export", "mpmd.cli.serve"):
        try:
            m = __import__(mod, fromlist=["register"])
        except ImportError:
            continue
        m.register(main, _guard)


_extra_commands()

if __name__ == "__main__":
    main()
