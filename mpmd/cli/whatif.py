"""``mpmd whatif``: plan several hardware options and write a purchasing report (HTML, CSV, MD);
the terminal gets the few columns a buyer compares first (:func:`buyer_table`)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ir.precision import PRECISIONS

from ir.files import InputError, check_output
from mpmd.cli.common import console, guard
from mpmd.cli.params import MAX_GLOBAL_BATCH, MAX_SEQ_LEN, MAX_TIME_LIMIT_S, FiniteFloat, int_range

if TYPE_CHECKING:   # pandas and rich tables load when the command runs
    import pandas as pd
    from rich.table import Table

REPORT_SUFFIXES = (".html", ".csv", ".md")
"""The report's files, ``OUT.html``, ``OUT.csv``, ``OUT.md`` (``reports.render.report_paths``)."""


def check_report_stem(out: str, screenshot: bool) -> None:
    """Check, before any planning, that the report can be written at stem ``out`` (a report
    suffix on it is dropped, as ``reports.render.report_paths`` does): ``OUT`` is no folder and
    each of its files, ``OUT.png`` too with ``screenshot``, passes :func:`ir.files.check_output`.

    Raises:
        InputError: one line naming the path that cannot be written.
    """
    stem = Path(out)
    if stem.suffix in REPORT_SUFFIXES:
        stem = stem.with_suffix("")
    if stem.is_dir():
        raise InputError(f"{out}: cannot write the what-if report there (it is a directory); "
                         f"fix: give a file stem such as {stem / 'report'} (writes .html, .csv, .md)")
    for suffix in REPORT_SUFFIXES + ((".png",) if screenshot else ()):
        check_output(stem.with_name(stem.name + suffix), "what-if report")


@click.command()
@click.option("--model", default=None,
              help="As for mpmd plan: a zoo model (e.g. llama3-70b), a shipped config's name or a "
                   "model file; 'mpmd models' lists them. An --example sets it.")
@click.option("--options", "options", multiple=True, type=click.Path(dir_okay=False),
              help="Cluster YAMLs or bundled cluster names to compare: several after one "
                   "--options (--options a.yaml b.yaml), or --options repeated.")
@click.argument("more_options", nargs=-1, type=click.Path(dir_okay=False), metavar="[MORE...]")
@click.option("--sweep", "sweep_path", default=None, type=click.Path(dir_okay=False),
              help="Budget sweep spec YAML (see reports/sweep.py).")
@click.option("--example", default=None,
              help="Bundled example (reports/examples/NAME.yaml), e.g. llama70b-1t.")
@click.option("--global-batch", type=int_range(1, MAX_GLOBAL_BATCH), default=None,
              help="Samples per step.")
@click.option("--seq-len", type=int_range(1, MAX_SEQ_LEN), default=None, help="Tokens per sample.")
@click.option("--tokens", type=FiniteFloat(min=0, min_open=True, max=1e18), default=None,
              help="Training token budget, e.g. 1e12.")
@click.option("--videos-per-hour", type=FiniteFloat(min=0, min_open=True, max=1e9), default=None,
              help="Inference demand (Mochi): videos per hour.")
@click.option("--deadline-days", type=FiniteFloat(min=0, min_open=True, max=1e5), default=None,
              help="Training deadline the recommendation checks, days.")
@click.option("--price", "prices", multiple=True,
              help="DEVICE=LOW:HIGH USD per device-hour override (repeatable).")
@click.option("--time-limit", type=FiniteFloat(min=0.1, max=MAX_TIME_LIMIT_S), default=None,
              help="Planner wall-clock budget per option, s (default 10, or the example's).")
@click.option("--precision", type=click.Choice((*PRECISIONS, "auto")), default=None,
              help="Training precision recipe every option plans in (default bf16, or the "
                   "example's): as for mpmd plan; auto: per option, every recipe all its devices "
                   "run, the fastest kept. An option whose devices lack the recipe is infeasible.")
@click.option("--screenshot/--no-screenshot", default=True, show_default=True,
              help="Also write OUT.png, the report's first screen (needs chromium; skipped without).")
@click.option("--out", type=click.Path(), default=None,
              help="Output stem: writes OUT.html, OUT.csv, OUT.md (default whatif/<example or "
                   "model> in the working directory).")
@guard
def whatif(model, options, more_options, sweep_path, example, global_batch, seq_len, tokens, videos_per_hour,
           deadline_days, prices, time_limit, precision, screenshot, out) -> None:
    """Plan every hardware option, replay it, and write a what-if purchasing report.

    The terminal shows what a buyer compares first (devices, step time, throughput, MFU, USD per
    hour and per million tokens or per video); the written HTML, CSV and Markdown hold every
    column, the best-worst ranges and the source of every figure."""
    if out:     # the output first; a default one is checked once its name is known
        check_report_stem(out, screenshot)
    if model:   # a mistyped name is refused before the planner and JAX load (did you mean ...)
        from zoo.model_files import resolve_model
        resolve_model(model)
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from reports import ReportError, load_example
    from reports import whatif as run_whatif
    from reports.render import write_report

    if more_options and not options:
        raise ReportError(f"unexpected argument {more_options[0]!r}; list the clusters to compare "
                          f"after --options, e.g. --options {' '.join(more_options)}")
    options = tuple(options) + tuple(more_options)
    spec: dict = {}
    base = None
    if example:
        spec, base = load_example(example)
        if spec.get("serving"):
            _serving(spec, base, model, options, out, screenshot, console)
            return
    if sum(bool(x) for x in (options, sweep_path)) > 1:
        raise ReportError("give --options or --sweep, not both")
    model = model or spec.get("model")
    if not model:
        raise ReportError("--model is required (or --example NAME)")
    opts = list(options) if options else list(spec.get("options", []))
    sweep = sweep_path or (spec.get("sweep") if not options else None)
    if not opts and not sweep:
        raise ReportError("nothing to compare; pass --options A.yaml B.yaml, --sweep SPEC.yaml "
                          "or --example NAME")
    pick = lambda flag, key: flag if flag is not None else spec.get(key)
    price_map = dict(spec.get("prices") or {})
    if prices:
        from reports.pricing import parse_prices
        price_map.update(parse_prices(prices))
    from zoo.model_files import resolve_model
    name = spec.get("name") or resolve_model(model).name
    out = out or f"whatif/{name}"
    check_report_stem(out, screenshot)
    # every input is read and checked before the progress bar starts, so a bad one is one line
    from reports.pricing import parse_prices as check_prices
    from reports.spec import read_yaml, to_option
    from reports.sweep import parse_spec

    check_prices(price_map)
    opts = [to_option(o, base) for o in opts]
    if sweep is not None:
        sweep = parse_spec(read_yaml(sweep, "sweep") if isinstance(sweep, str) else sweep)
    t0 = time.monotonic()
    with Progress(TextColumn("[bold]planning[/] {task.description}"), BarColumn(),
                  TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total, description=escape(label))

        df = run_whatif(model, opts, sweep=sweep, global_batch=pick(global_batch, "global_batch"),
                        seq_len=pick(seq_len, "seq_len"), tokens=pick(tokens, "tokens"),
                        videos_per_hour=pick(videos_per_hour, "videos_per_hour"),
                        deadline_days=pick(deadline_days, "deadline_days"), prices=price_map,
                        time_limit_s=pick(time_limit, "time_limit_s"),
                        title=spec.get("title"), progress=progress, base_dir=base,
                        precision=pick(precision, "precision") or "bf16")
    paths = write_report(df, out)
    if screenshot:
        from reports.browser import find_chromium
        from reports.browser import screenshot as shoot

        if find_chromium():
            paths["png"] = shoot(paths["html"], paths["html"].with_suffix(".png"))
        else:
            console.print("no chromium: skipped the screenshot (apt-get install -y chromium)")
    console.print(buyer_table(df))
    for r in df.to_dict("records"):
        if not r["feasible"]:
            console.print(f"infeasible: {escape(str(r['option']))}: {escape(str(r['reason']))}",
                          highlight=False, soft_wrap=True)
    console.print(f"[bold]Recommendation.[/] {escape(str(df.attrs['recommendation']))}",
                  highlight=False)
    console.print(f"wrote {escape(', '.join(str(p) for p in paths.values()))} "
                  f"in {time.monotonic() - t0:.0f} s; {escape(rest_text(df))}", highlight=False)


SHOWN = ("Option", "Devices", "Step (s)", "Tokens/s (best-worst)", "Videos/h (best-worst)", "MFU",
         "$/h (low-high)", "$/Mtok (low-high) [best-worst]", "$/video (low-high) [best-worst]")
"""The columns of the report's table (``reports.render.summary_table``) that :func:`buyer_table`
shows (without their best-worst ranges)."""


def rest_text(df: pd.DataFrame) -> str:
    """What the written report holds beyond :func:`buyer_table`: its other columns by name, the
    best-worst ranges and the sources."""
    from reports.render import summary_table

    rest = [c for c in summary_table(df).columns if c not in SHOWN]
    return (f"they also hold {', '.join(rest)}, " if rest else "they also hold ") + (
        "the best-worst ranges and the source of every figure")


def _num(x: object, fmt: str) -> str:
    """``fmt`` of a finite number, else "-" (a price the option lacks, an infeasible option)."""
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return fmt.format(x) if ok else "-"


def _money(low: object, high: object, fmt: str) -> str:
    """A price range, ``"92.72-171.4"``, or one figure when the two agree."""
    lo, hi = _num(low, fmt), _num(high, fmt)
    return lo if lo == hi else f"{lo}-{hi}"


def buyer_table(df: pd.DataFrame) -> Table:
    """The what-if result as a buyer compares it first, one row per option: its devices, step
    time, throughput (tokens/s, or videos/h for an inference model), MFU, USD per hour and per
    million tokens (or per video), each price as its low-high range; narrow enough for a
    120-column terminal. The devices column is left out when every option is named by its devices
    (a budget sweep's); a precision column is added when a plan runs a low-precision recipe
    (``--precision``). The written report has the rest (:func:`rest_text`)."""
    from rich.markup import escape
    from rich.table import Table

    training = df.attrs.get("kind", "training") == "training"
    records = df.to_dict("records")
    devices = any(str(r["option"]) != str(r["devices"]) for r in records)
    recipes = any(r.get("feasible") and r.get("precision", "bf16") != "bf16" for r in records)
    cols = ["option", *(["devices"] if devices else []), *(["precision"] if recipes else []),
            "step (s)",
            "tokens/s" if training else "videos/h", "MFU", "$/hour",
            "$/M tokens" if training else "$/video"]
    t = Table(title=escape(str(df.attrs.get("title", "What-if"))), title_justify="left")
    for c in cols:
        wrap = c in ("option", "devices")
        t.add_column(c, justify="left" if wrap else "right", no_wrap=not wrap)
    for r in records:
        row = [escape(str(r["option"])), *([escape(str(r["devices"]))] if devices else [])]
        if recipes:
            row.append(escape(str(r.get("precision", "-"))) if r["feasible"] else "-")
        if not r["feasible"]:
            t.add_row(*row, "infeasible", *["-"] * (len(cols) - len(row) - 1))
            continue
        g = lambda k: r.get(k, math.nan)
        row += [_num(g("step_time_s"), "{:.3f}"),
                _num(g("tokens_per_s"), "{:,.0f}") if training
                else _num(g("videos_per_hour"), "{:,.2f}"),
                _num(100 * g("mfu"), "{:.1f}%"),
                _money(g("usd_per_hour_low"), g("usd_per_hour_high"), "{:,.4g}"),
                _money(g("usd_per_mtok_low"), g("usd_per_mtok_high"), "{:,.3g}") if training
                else _money(g("usd_per_video_low"), g("usd_per_video_high"), "{:,.3g}")]
        t.add_row(*row)
    return t


def _serving(spec: dict, base, model, options, out, screenshot: bool, console) -> None:
    """A serving example (``serving:`` in its YAML): :func:`reports.serving.serving_whatif`."""
    import time

    from rich.markup import escape
    from rich.table import Table

    from reports.serving import COLUMNS, _cell, serving_whatif, write_serving_report

    out = out or f"whatif/{spec.get('name', 'serving')}"
    check_report_stem(out, screenshot)
    t0 = time.monotonic()
    df = serving_whatif(model or spec["model"], spec["serving"],
                        list(options) or list(spec.get("options", [])), base_dir=base,
                        title=spec.get("title"))
    paths = write_serving_report(df, out)
    if screenshot:
        from reports.browser import find_chromium
        from reports.browser import screenshot as shoot

        if find_chromium():
            paths["png"] = shoot(paths["html"], paths["html"].with_suffix(".png"))
        else:
            console.print("no chromium: skipped the screenshot (apt-get install -y chromium)")
    table = Table(title=escape(str(df.attrs["title"])), title_justify="left")
    keep = [c for c in COLUMNS if c not in ("plan", "note")]
    for c in keep:
        table.add_column(c, overflow="fold")
    for _, r in df.iterrows():
        table.add_row(*(escape(_cell(c, r[c])) for c in keep))
    console.print(table)
    console.print(f"objectives: {escape(df.attrs['objectives'])}", highlight=False)
    console.print(f"[bold]Recommendation.[/] {escape(str(df.attrs['recommendation']))}",
                  highlight=False)
    console.print(f"wrote {escape(', '.join(str(p) for p in paths.values()))} "
                  f"in {time.monotonic() - t0:.0f} s", highlight=False)
