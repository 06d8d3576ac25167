"""``mpmd validate --serving [--csv CSV] [--fit] [--profiles-out DIR] [--out FILE.md]``: published
serving measurements (``reports/validation/published_serving.csv``) against the serving cost model
(:mod:`runtime.calibration.serving_rows`).

Without ``--fit``: every row predicted on its kind's bundled profile, with the error per kind,
engine and metric. With ``--fit``: each chip with rows (``DeviceProfile.chip``) is fitted on the
rows of its main engine, the rows re-scored on the fitted values, and each fitted row predicted
again under a fit without it (leave-one-row-out); ``--profiles-out DIR`` writes every kind of a
fitted chip's profile there with the fitted values and their origins (``hardware_profiles/devices``
updates the bundled ones). Nothing is written without ``--out`` or ``--profiles-out``.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SERVING_CSV = ROOT / "reports" / "validation" / "published_serving.csv"
COMMAND = "mpmd validate --serving --fit"

YAML_KEYS = {"matmul_efficiency": ("efficiency", "matmul", 1.0, "{:.3f}"),
             "memory_efficiency": ("efficiency", "memory", 1.0, "{:.3f}"),
             "decode_layer_overhead": ("efficiency", "decode_layer_overhead_us", 1e6, "{:.1f}"),
             "prefill_layer_overhead": ("efficiency", "prefill_layer_overhead_us", 1e6, "{:.1f}"),
             "logit_overhead": ("efficiency", "logit_overhead_ns", 1e9, "{:.3f}"),
             "scale_up_latency": ("scale_up", "latency_us", 1e6, "{:.2f}")}
"""Fit parameter -> (YAML section, key, factor from SI, format) in a device profile file."""


def _group(scored):
    out = defaultdict(list)
    for s in scored:
        out[(s.row.device, s.row.engine, s.row.metric)].append(s)
    return out


def summary_lines(scored) -> list[str]:
    """A Markdown table of the mean signed and absolute error per kind, engine and metric."""
    from runtime.calibration.serving_rows import mape

    lines = ["| device | engine | metric | rows | mean error | mean abs error | max abs error |",
             "|---|---|---|---:|---:|---:|---:|"]
    for (dev, eng, metric), v in sorted(_group(scored).items()):
        mean = 100 * sum(s.error for s in v) / len(v)
        mx = 100 * max(abs(s.error) for s in v)
        lines.append(f"| {dev} | {eng} | {metric} | {len(v)} | {mean:+.1f}% | {mape(v):.1f}% | "
                     f"{mx:.1f}% |")
    return lines


def row_lines(scored) -> list[str]:
    """Every row: label, metric, measured, predicted, error."""
    from runtime.calibration.serving_rows import metric_label

    lines = ["| line | source | row | metric | measured | predicted | error |",
             "|---:|---|---|---|---:|---:|---:|"]
    for s in scored:
        lines.append(f"| {s.row.line} | {s.row.source} | {metric_label(s.row)} | {s.row.metric} | "
                     f"{s.row.value:.4g} | {s.predicted:.4g} | {100 * s.error:+.1f}% |")
    return lines


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def write_fitted_profile(path: Path, values: dict, origin: str, out: Path) -> None:
    """Device YAML ``path`` with each fitted value (``values``: fit parameter -> SI value) set in
    place, its ``origin`` (``source`` under ``scale_up``) replaced by ``origin``, written to
    ``out`` atomically. A key the file lacks is added at the end of its section."""
    import yaml

    from ir.files import write_atomic

    text = path.read_text()
    for name, v in values.items():
        section, key, factor, fmt = YAML_KEYS[name]
        cite = "source" if section == "scale_up" else "origin"
        entry = (f"  {key}:\n    value: {fmt.format(v * factor)}\n"
                 f"    {cite}: {_quote(origin)}\n")
        start = text.index(f"\n{section}:\n") + 1
        body = start + len(section) + 2
        m = re.search(r"\n(?=\S)", text[body:])
        end = body + (m.start() + 1 if m else len(text) - body)
        block = text[body:end]
        k = re.search(rf"^  {re.escape(key)}:\n(?:    .*\n|      .*\n)*", block, re.M)
        block = (block[:k.start()] + entry + block[k.end():]) if k else block + entry
        text = text[:body] + block + text[end:]
    yaml.safe_load(text)       # the result must still parse
    write_atomic(out, text)


def run(csv_path: str | None, fit: bool, profiles_out: str | None, out: str | None,
        console) -> None:
    """Print (and with ``out`` write) the serving validation; with ``fit``, fit and (with
    ``profiles_out``) write the fitted profiles.

    Raises:
        CalibrationError: an unreadable CSV (one line).
    """
    from hardware_profiles.loader import DEVICES_DIR, load_device
    from ir.files import write_atomic
    from runtime.calibration import serving_rows as S

    path = csv_path or str(DEFAULT_SERVING_CSV)
    rows = S.read_rows(path)
    scored, skipped = S.score(rows)
    lines = ["# Validation against published serving measurements", "",
             f"Generated by `mpmd validate --serving{' --fit' if fit else ''}` from "
             f"`{Path(path).name}` (sources: `reports/validation/README.md`, section \"Published "
             f"serving rows\"). Error = predicted / measured - 1. **{len(scored)} of {len(rows)} "
             f"rows scored** on the bundled profiles.", "", *summary_lines(scored), ""]
    fitted_rows = []
    if fit:
        chips = dict.fromkeys((load_device(r.device).chip or r.device) for r in rows
                              if not any(k.line == r.line for k in skipped))
        for chip in chips:
            devices = S.chip_kinds(chip)
            kind_rows = [r for r in rows if r.device in devices]
            engine = S.fit_engine(kind_rows)
            use = [r for r in kind_rows if r.engine == engine]
            f = S.fit_chip(use, devices)
            fitted = {k: S.with_values(d, f.values) for k, d in devices.items()}
            after = S.score(kind_rows, fitted)[0]
            loo = S.leave_one_out(use, devices, f)
            fitted_rows += after
            by_metric = defaultdict(list)
            for s in loo:
                by_metric[s.row.metric].append(s)
            loo_text = ", ".join(f"{m} {S.mape(v):.1f}% ({len(v)} rows)"
                                 for m, v in sorted(by_metric.items()))
            shown = ", ".join(f"{k} {_show(k, v)}" for k, v in f.values.items())
            origin = (f"fitted by `{COMMAND}` on the {f.rows} {engine} rows of chip {chip} "
                      f"({', '.join(sorted({r.device for r in use}))}) in "
                      f"reports/validation/published_serving.csv: fit MAPE {f.mape:.1f}%, "
                      f"leave-one-row-out {loo_text}")
            written = []
            if profiles_out:
                for name in devices:
                    dest = Path(profiles_out) / f"{name}.yaml"
                    write_fitted_profile(DEVICES_DIR / f"{name}.yaml", f.values, origin, dest)
                    written.append(str(dest))
            lines += [f"## Fit: chip {chip} ({', '.join(devices)}), engine {engine}", "",
                      f"{f.rows} rows, {f.evaluations} evaluations: {shown}; fit MAPE "
                      f"{f.mape:.1f}%. Leave-one-row-out: {loo_text}. "
                      + (f"Written to {', '.join(f'`{w}`' for w in written)}." if written else
                         "Not written (no `--profiles-out`)."), "", *summary_lines(after), ""]
    lines += ["## Rows" + (" (fitted values)" if fit else ""), "",
              *row_lines(fitted_rows if fit else scored), ""]
    if skipped:
        lines += ["## Not scored", "", "| line | source | model | reason |", "|---|---|---|---|",
                  *[f"| {k.line} | {k.source} | {k.model} | {k.reason} |" for k in skipped], ""]
    text = "\n".join(lines)
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    if out:
        write_atomic(Path(out), text)
        console.print(f"wrote {out}")


def _show(name: str, v: float) -> str:
    section, key, factor, fmt = YAML_KEYS[name]
    unit = key.rsplit("_", 1)[-1] if key.endswith(("_us", "_ns")) else ""
    return fmt.format(v * factor) + (f" {unit}" if unit else "")
