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
    from runtime.calibration.device_serving import is_serving_csv

    if is_serving_csv(csv_path):
        text = serving_markdown(csv_path, profile)
        console.print(text, markup=False, highlight=False, soft_wrap=True)
        if out:
            write_atomic(Path(out), text)
            console.print(f"wrote {out}")
        return
    timings = read_timings(csv_path)
    device = load_device(profile or profile_for(timings))
    comparisons = compare(timings, device)
    text = markdown(comparisons, device.name, csv_path)
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    if out:
        write_atomic(Path(out), text)
        console.print(f"wrote {out}")


def serving_markdown(csv_path: str, profile: str | None) -> str:
    """Serving steps (``bench_device_serving.py``) against the serving cost model, as Markdown:
    the mean signed / absolute error per item, then every row."""
    from hardware_profiles.loader import load_device
    from runtime.calibration.device_layers import KIND_PROFILES
    from runtime.calibration.device_serving import compare, read_steps
    from runtime.calibration.fit import CalibrationError

    steps = read_steps(csv_path)
    if not steps:
        raise CalibrationError(f"{csv_path} has no rows; fix: write it with "
                               "benchmarks/bench_device_serving.py")
    kind = steps[0].device_kind
    name = profile or KIND_PROFILES.get(kind)
    if name is None:
        raise CalibrationError(f"no bundled profile for device kind {kind!r}; fix: pass "
                               "--profile ID")
    device = load_device(name)
    comps = compare(steps, device)
    lines = [f"Serving steps of `{csv_path}` ({kind}) against the serving cost model on profile "
             f"`{device.name}` (`mpmd validate --layers {csv_path}`). Error = predicted / measured "
             "- 1 (negative: the model is too fast).", "",
             "| rows | n | mean error | mean abs error | max abs error |", "|---|---:|---:|---:|---:|"]
    for item in ("decode", "prefill"):
        sub = [c for c in comps if c.timing.item == item]
        if sub:
            errs = [c.error for c in sub]
            lines.append(f"| {item} | {len(sub)} | {100 * sum(errs) / len(errs):+.1f}% | "
                         f"{100 * sum(map(abs, errs)) / len(errs):.1f}% | "
                         f"{100 * max(map(abs, errs)):.1f}% |")
    lines += ["", "| row | measured (ms) | predicted (ms) | error |", "|---|---:|---:|---:|"]
    lines += [f"| {c.timing.label} | {c.timing.seconds * 1e3:.2f} | {c.predicted * 1e3:.2f} | "
              f"{100 * c.error:+.1f}% |" for c in comps]
    return "\n".join(lines) + "\n"
