"""Render a what-if DataFrame: self-contained HTML (plots as base64 PNG), CSV and Markdown.

The HTML references nothing outside itself (no scripts, stylesheets, fonts or images by URL); the
CSV holds every numeric column of :func:`reports.whatif` (SI units, USD); the Markdown holds the
same summary table as the HTML plus the recommendation and the sources of every figure used.
Both say, per device kind, whether its profile is calibrated or a prior (``df.attrs["profiles"]``)
and list the re-predictions that widen each option's best/worst range.
"""

from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from hardware_profiles.calibration import PRIOR_UNCERTAINTY
from reports import plots
from ir.files import write_atomic
from reports.errors import ReportError

OBJECT_COLUMNS = ("plan", "sim")


def _f(x, fmt: str = "{:.3g}") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return fmt.format(x)


def _rng(lo, hi, fmt: str = "{:.3g}") -> str:
    if lo is None or (isinstance(lo, float) and not math.isfinite(lo)):
        return "-"
    a, b = fmt.format(lo), fmt.format(hi)
    return a if a == b else f"{a}-{b}"


def _money(x) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    if abs(x) >= 1e6:
        return f"${x / 1e6:.3g}M"
    if abs(x) >= 1e3:
        return f"${x / 1e3:.3g}k"
    return f"${x:.3g}"


def _money_rng(lo, hi) -> str:
    a, b = _money(lo), _money(hi)
    return a if a == b else f"{a}-{b}"


def _present(x) -> bool:
    return x is not None and not (isinstance(x, float) and not math.isfinite(x))


def _flag(x) -> bool:
    """A boolean cell (``numpy.bool_`` in an all-feasible frame, NaN in an infeasible row)."""
    return _present(x) and bool(x)


def _pipelines(r) -> int:
    x = r.get("pipelines")
    return int(x) if _present(x) else 1


def plan_text(r) -> str:
    """The "Plan" cell of a feasible row: meshes, schedule, microbatches and stages (a data-parallel
    plan: each pipeline's meshes and schedule)."""
    stages = int(r["stages"])
    pipelines = _pipelines(r)
    if pipelines > 1:
        return (f"data parallel over {pipelines} pipelines: {r['meshes']}; schedules {r['schedule']}, "
                f"{stages} stages in all")
    return (f"{r['meshes']}; {r['schedule']} x {int(r['microbatches'])} microbatches, "
            f"{stages} stage{'s' if stages > 1 else ''}")


def _shaped(df: pd.DataFrame) -> bool:
    """Whether any feasible option was carved from node groups or split into several pipelines
    (the summary then has a "Shape" column)."""
    return any(r["feasible"] and (_flag(r.get("carved")) or _pipelines(r) > 1)
               for r in df.to_dict("records"))


def summary_table(df: pd.DataFrame) -> pd.DataFrame:
    """The human table (strings), one row per option, same for HTML, Markdown and the console.
    When an option's plan carves node groups into meshes or splits the batch over several
    pipelines, a "Shape" column gives each option's shape in one line (meshes per node group, the
    nodes each spans, layouts; batch shares)."""
    training = df.attrs.get("kind", "training") == "training"
    shaped = _shaped(df)
    rows = []
    for r in df.to_dict("records"):
        row = {"Option": r["option"], "Devices": r["devices"]}
        if not r["feasible"]:
            row["Plan"] = "infeasible: " + r["reason"]
            rows.append(row)
            continue
        g = lambda k, r=r: r.get(k, math.nan)
        row["Plan"] = plan_text(r)
        if shaped:
            row["Shape"] = (str(r.get("shape", "-")) if _flag(r.get("carved")) or _pipelines(r) > 1
                            else "the cluster's meshes")
        row["Step (s)"] = _f(r["step_time_s"], "{:.3f}")
        if training:
            row["Tokens/s (best-worst)"] = (f"{g('tokens_per_s'):,.0f} ({g('tokens_per_s_best'):,.0f}-"
                                            f"{g('tokens_per_s_worst'):,.0f})")
        else:
            row["Videos/h (best-worst)"] = (f"{g('videos_per_hour'):.2f} ({g('videos_per_hour_best'):.2f}-"
                                            f"{g('videos_per_hour_worst'):.2f})")
            if "latency_s_per_video" in r:
                row["Latency plan, 1 video (s)"] = (
                    f"{g('latency_s_per_video'):.1f}: {r.get('latency_plan')}"
                    if math.isfinite(g("latency_s_per_video")) else
                    f"none: {r.get('latency_reason')}")
        row["MFU"] = _f(100 * r["mfu"], "{:.1f}%")
        row["Bubble mean/max"] = f"{100 * r['bubble_mean']:.0f}%/{100 * r['bubble_max']:.0f}%"
        row["Mem headroom"] = _f(100 * r["memory_headroom"], "{:.0f}%") + (
            "" if r.get("alternatives_fit", True) else "; no fit under an alternative figure")
        row["$/h (low-high)"] = _rng(r["usd_per_hour_low"], r["usd_per_hour_high"], "{:.4g}")
        if training:
            row["$/Mtok (low-high) [best-worst]"] = (
                f"{_rng(g('usd_per_mtok_low'), g('usd_per_mtok_high'), '{:.3g}')} "
                f"[{_rng(g('usd_per_mtok_best'), g('usd_per_mtok_worst'), '{:.3g}')}]")
            if "time_to_train_days" in r and math.isfinite(g("time_to_train_days")):
                row["Days to train (best-worst)"] = (
                    f"{g('time_to_train_days'):.1f} ({g('time_to_train_days_best'):.1f}-"
                    f"{g('time_to_train_days_worst'):.1f})")
                row["Cost to train (low-high)"] = _money_rng(g("cost_to_train_usd_low"),
                                                             g("cost_to_train_usd_high"))
                row["Energy (MWh)"] = _f(g("energy_kwh") / 1e3, "{:,.1f}")
            if "meets_deadline" in r and isinstance(r["meets_deadline"], bool):
                row["Meets deadline"] = ("yes" if r["meets_deadline"] else "no") + (
                    "" if r["meets_deadline_worst"] == r["meets_deadline"] else " (worst: no)")
        else:
            row["$/video (low-high) [best-worst]"] = (
                f"{_rng(g('usd_per_video_low'), g('usd_per_video_high'), '{:.3g}')} "
                f"[{_rng(g('usd_per_video_best'), g('usd_per_video_worst'), '{:.3g}')}]")
            row["kWh/video"] = _f(g("energy_kwh_per_video"), "{:.3f}")
            if "replicas" in r and math.isfinite(g("replicas")):
                row["Copies for demand"] = f"{int(g('replicas'))} (worst {int(g('replicas_worst'))})"
                row["Fleet $/h (low-high)"] = _rng(g("fleet_usd_per_hour_low"),
                                                   g("fleet_usd_per_hour_high"), "{:.4g}")
        gap = r.get("solver_gap", math.nan)
        row["Solver"] = str(r.get("solver_status", "")) + (
            f" gap {100 * gap:.0f}%" if isinstance(gap, float) and math.isfinite(gap) and gap > 0 else "")
        if df.attrs.get("sweep") and "tokens_per_usd" in r:
            row["Tokens per $ (low price)"] = _f(g("tokens_per_usd"), "{:,.0f}")
        rows.append(row)
    out = pd.DataFrame(rows).fillna("-")
    return out


def csv_table(df: pd.DataFrame) -> pd.DataFrame:
    """The machine-readable table: every column except the plan/sim objects."""
    return df.drop(columns=[c for c in OBJECT_COLUMNS if c in df])


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def to_markdown(df: pd.DataFrame) -> str:
    """Markdown: title, recommendation, the summary table, uncertainty notes, sources."""
    t = summary_table(df)
    lines = [f"# {df.attrs.get('title', 'What-if report')}", "", _context(df), "",
             "**Recommendation.** " + df.attrs.get("recommendation", ""), "",
             "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    for _, r in t.iterrows():
        lines.append("| " + " | ".join(_md_escape(v) for v in r) + " |")
    alts = [(r["option"], r["alternatives"]) for r in df.to_dict("records")
            if r["feasible"] and r.get("alternatives")]
    if alts:
        lines += ["", "## Disagreeing device figures and prior efficiencies (same plan re-predicted)",
                  ""]
        lines += [f"- **{_md_escape(o)}**: {_md_escape(a)}" for o, a in alts]
    profiles = df.attrs.get("profiles", [])
    if profiles:
        lines += ["", "## Device profiles: calibrated or prior", "", PROFILES_NOTE, "",
                  "| Device | Efficiencies | Origin |", "|---|---|---|"]
        lines += [f"| {p['device']} | {p['status']} | {_md_escape(p['origin'])} |" for p in profiles]
    lines += ["", "## Prices and efficiencies used", "", "| Device | Figure | Value | Source |",
              "|---|---|---|---|"]
    for f in df.attrs.get("figures", []):
        lines.append(f"| {f['device']} | {f['figure']} | {_md_escape(f['value'])} | "
                     f"{_md_escape(f['source'])} |")
    return "\n".join(lines) + "\n"


PROFILES_NOTE = (
    "A calibrated profile's efficiencies were fitted to measured runs (`mpmd validate --fit`, "
    "`mpmd calibrate`); a prior's were set from published figures and never checked against a "
    "measured training step. Before calibration the H100 prior predicted published runs 7-31% "
    "too fast (mean 20%), so every option on a prior profile has its best/worst range widened by "
    "re-predicting the same plan with that device's matmul efficiency "
    f"+/-{PRIOR_UNCERTAINTY:.0%} (capped at 1).")
"""The explanation above the Markdown and HTML table of profiles (source of the 20%:
:data:`hardware_profiles.calibration.PRIOR_UNCERTAINTY`)."""


def _context(df: pd.DataFrame) -> str:
    a = df.attrs
    if a.get("kind") == "training":
        s = (f"Training {a['model']}: global batch {a['global_batch']} x {a['seq_len']} tokens per step"
             + (f", token budget {a['tokens']:.3g}" if a.get("tokens") else "")
             + (f", deadline {a['deadline_days']:g} days" if a.get("deadline_days") else "") + ".")
    else:
        s = (f"Inference {a['model']}: one video = {a['samples_per_video']} DiT forwards of "
             f"{a['seq_len']} tokens; step = {a['global_batch']} forwards"
             + (f"; demand {a['videos_per_hour']:g} videos/hour" if a.get("videos_per_hour") else "")
             + ".")
    s += (f" Each option planned with a {a.get('time_limit_s', 0):g} s planner budget (unless the "
          f"option sets its own) and replayed in the discrete-event simulator; rates use the "
          f"simulated step time. Ranking uses the LOW price; ranges show low-high price and "
          f"[best-worst] adds the device profiles' disagreeing figures and, for prior (never "
          f"calibrated) profiles, matmul efficiency +/-{PRIOR_UNCERTAINTY:.0%}.")
    sw = a.get("sweep")
    if sw:
        s += (f" Budget sweep: clusters within ${sw['budget_usd_per_hour']:g}/h at the low price, at "
              f"most {sw['max_device_types']} device types; {sw['kept']} kept, {sw['over_budget']} "
              f"over budget, {sw['too_many_types']} with too many types, "
              f"{sw['cut_by_max_options']} cut by max_options.")
    return s


def _img(png: bytes, alt: str, cls: str = "plot") -> str:
    b64 = base64.b64encode(png).decode("ascii")
    return f'<img class="{cls}" alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'


CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.2em 2em;color:#222;max-width:1500px}
h1{font-size:1.5em;margin-bottom:.2em} h2{font-size:1.15em;margin-top:1.6em;border-bottom:1px solid #ddd}
.rec{background:#eef6ee;border-left:4px solid #3a3;padding:.6em 1em;margin:.8em 0}
.ctx{color:#444;font-size:.92em}
table{border-collapse:collapse;font-size:.8em;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#f3f3f3} tr.bad td{color:#a00;background:#fff6f6}
.plots{display:flex;flex-wrap:wrap;gap:1em} img.plot{max-width:48%;min-width:420px;height:auto}
.opt{display:flex;flex-wrap:wrap;gap:1em;align-items:flex-start;border-bottom:1px solid #eee;padding:.4em 0}
.opt img{max-width:560px;height:auto} .opt div{max-width:700px;font-size:.85em}
td.src{font-size:.9em;color:#444;max-width:900px}
"""


def to_html(df: pd.DataFrame) -> str:
    """The self-contained HTML report (string)."""
    e = html.escape
    t = summary_table(df)
    head = "".join(f"<th>{e(c)}</th>" for c in t.columns)
    body = []
    for (_, r), feasible in zip(t.iterrows(), df["feasible"]):
        cls = "" if feasible else ' class="bad"'
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>")
    front = df.attrs.get("pareto", [])
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>{e(df.attrs.get('title', 'What-if report'))}</title><style>{CSS}</style></head><body>",
        f"<h1>{e(df.attrs.get('title', 'What-if report'))}</h1>",
        f"<p class='ctx'>{e(_context(df))}</p>",
        f"<div class='rec'><b>Recommendation.</b> {e(df.attrs.get('recommendation', ''))}</div>",
        f"<p class='ctx'>Pareto frontier (throughput vs low $/h): {e(', '.join(front) or '-')}.</p>",
        "<h2>Options</h2>", f"<table><tr>{head}</tr>{''.join(body)}</table>",
        "<h2>Plots</h2><div class='plots'>",
        _img(plots.throughput_vs_price(df), "throughput vs USD per hour with the Pareto frontier"),
        _img(plots.cost_vs_time(df), "cost vs time"), "</div>",
        "<h2>Simulated step per option</h2>",
    ]
    for r in df.to_dict("records"):
        if not r["feasible"]:
            parts.append(f"<div class='opt'><div><b>{e(r['option'])}</b>: no plan. "
                         f"{e(r['reason'])}</div></div>")
            continue
        p = r["plan"]
        shape = (f"<br>shape: {e(str(r['shape']))}"
                 if _present(r.get("shape")) and (_flag(r.get("carved")) or _pipelines(r) > 1)
                 else "")
        if _pipelines(r) > 1:
            sched = (f"data parallel over {_pipelines(r)} pipelines, schedules "
                     f"{e(str(r['schedule']))}, {int(r['stages'])} stages in all")
            if getattr(p, "reason", ""):
                sched += f" ({e(p.reason)})"
        else:
            sched = (f"schedule {e(str(r['schedule']))} x {int(r['microbatches'])} microbatches, "
                     f"{int(r['stages'])} stages")
        info = (f"<b>{e(r['option'])}</b> ({e(r['devices'])})<br>{e(r['meshes'])}{shape}<br>"
                f"{sched}; "
                f"simulated step {r['step_time_s']:.3f} s (planner predicted "
                f"{r['predicted_step_time_s']:.3f} s); solver {e(str(r['solver_status']))}, "
                f"gap {_f(100 * r['solver_gap'], '{:.1f}%')}, planning took {r['plan_wall_s']:.1f} s")
        if r.get("profiles"):
            info += f"<br><i>Profiles:</i> {e(r['profiles'])}"
        if r.get("alternatives"):
            info += f"<br><i>Disagreeing figures and prior efficiencies:</i> {e(r['alternatives'])}"
        if r.get("sim_errors"):
            info += f"<br><i>Simulator memory warnings:</i> {e(r['sim_errors'])}"
        if r.get("note"):
            info += f"<br><i>Note:</i> {e(r['note'])}"
        parts.append(f"<div class='opt'>{_img(plots.timeline_thumbnail(p, r['sim']), 'timeline of ' + r['option'], 'thumb')}"
                     f"<div>{info}</div></div>")
    profiles = df.attrs.get("profiles", [])
    if profiles:
        parts.append(f"<h2>Device profiles: calibrated or prior</h2><p class='ctx'>{e(PROFILES_NOTE)}"
                     "</p><table><tr><th>Device</th><th>Efficiencies</th><th>Origin</th></tr>")
        parts += [f"<tr><td>{e(p['device'])}</td><td>{e(p['status'])}</td>"
                  f"<td class='src'>{e(p['origin'])}</td></tr>" for p in profiles]
        parts.append("</table>")
    parts.append("<h2>Prices, power and efficiencies used (with sources)</h2><table>"
                 "<tr><th>Device</th><th>Figure</th><th>Value</th><th>Source</th></tr>")
    for f in df.attrs.get("figures", []):
        parts.append(f"<tr><td>{e(f['device'])}</td><td>{e(f['figure'])}</td><td>{e(f['value'])}</td>"
                     f"<td class='src'>{e(f['source'])}</td></tr>")
    parts.append("</table><p class='ctx'>Energy counts device board power (TDP) only: no host, "
                 "network or cooling. Purchase-amortized prices exclude power; cloud prices include "
                 "it. Prices overridable with --price DEVICE=LOW:HIGH or price_usd_per_device_hour in "
                 "a cluster file.</p></body></html>")
    return "\n".join(parts)


def report_paths(out: str | Path) -> dict[str, Path]:
    """``{"html", "csv", "md"}`` -> ``OUT.html``, ``OUT.csv``, ``OUT.md`` (``out`` is a path stem; a
    report suffix is dropped).

    Raises:
        ReportError: ``out`` is an existing directory.
    """
    stem = Path(out)
    if stem.suffix in (".html", ".csv", ".md"):
        stem = stem.with_suffix("")
    if stem.is_dir():
        raise ReportError(f"--out {str(out)!r} is a directory; give a file stem like reports/whatif/NAME")
    return {k: stem.with_name(stem.name + "." + k) for k in ("html", "csv", "md")}


def write_report(df: pd.DataFrame, out: str | Path) -> dict[str, Path]:
    """Write ``OUT.html``, ``OUT.csv`` and ``OUT.md`` (``out`` is a path stem; a suffix is dropped).

    Raises:
        ReportError: ``out`` is an existing directory.
    """
    paths = report_paths(out)
    write_atomic(paths["html"], to_html(df))
    write_atomic(paths["csv"], csv_table(df).to_csv(index=False, float_format="%.6g"))
    write_atomic(paths["md"], to_markdown(df))
    return paths
