"""``mpmd validate --layers CSV [--profile NAME] [--out FILE.md]``: layer timings measured on one
accelerator (``benchmarks/bench_device_layers.py``) against the cost model on a device profile
(:mod:`runtime.calibration.device_layers`): one line per row and, per kind of row, the mean signed
and absolute error. The profile is the bundled one of the rows' device kind unless ``--profile``
names another (an id or a device YAML). ``--out`` writes the same as Markdown, atomically."""

from __future__ import annotations

from pathlib import Path


def markdown(comparisons, device_name: str, csv_path: str) -> str:
    """The comparison as Markdown: a summary per group (:func:`summary`), then every row."""
    from runtime.calibration.device_layers import summary

    lines = [f"Layer timings of `{csv_path}` ({comparisons[0].timing.device_kind}) against the "
             f"cost model on profile `{device_name}` (`mpmd validate --layers {csv_path}`). "
             "Error = predicted / measured - 1 (negative: the model is too fast).", "",
             "| rows | n | mean error | mean abs error | max abs error |", "|---|---:|---:|---:|---:|"]
    for g, (n, mean, mabs, mx) in summary(comparisons).items():
        lines.append(f"| {g} | {n} | {mean * 100:+.1f}% | {mabs * 100:.1f}% | {mx * 100:.1f}% |")
    lines += ["", "| row | measured (ms) | predicted (ms) | error |", "|---|---:|---:|---:|"]
    for c in comparisons:
        pred = "-" if c.predicted is None else f"{c.predicted * 1e3:.3f}"
        err = "-" if c.error is None else f"{c.error * 100:+.1f}%"
        lines.append(f"| {c.timing.label} | {c.timing.seconds * 1e3:.3f} | {pred} | {err} |")
    return "\n".join(lines) + "\n"


def run(csv_path: str, profile: str | None, out: str | None, console) -> None:
    """Print (and with ``out`` write) the comparison.

    Raises:
        CalibrationError: an unreadable CSV or a device kind without a profile (one line).
        ProfileError: ``profile`` names no profile.
    """
    from hardware_profiles.loader import load_device
    from ir.files import write_atomic
    from runtime.calibration.device_layers import compare, profile_for, read_timings

    timings = read_timings(csv_path)
    device = load_device(profile or profile_for(timings))
    comparisons = compare(timings, device)
    text = markdown(comparisons, device.name, csv_path)
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    if out:
        write_atomic(Path(out), text)
        console.print(f"wrote {out}")
