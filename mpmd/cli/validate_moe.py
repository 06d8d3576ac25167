"""``mpmd validate --fit-moe`` (and the last step of ``--fit``): each device kind's
mixture-of-experts token-path time per routed element (``DeviceProfile.routed_element``,
:func:`simulator.cost_model.token_path_time`), fitted on the kind's MoE rows of the published-
training CSV with every other efficiency of its profile held, reported with its leave-one-source-
out errors and, with ``--profiles-out DIR``, written into ``DIR/DEVICE.yaml``'s ``efficiency:``
block as ``routed_element_ps``.

Dense rows fit the chip's GEMM and memory efficiencies; a mixture of experts' rows are held out of
that fit (:func:`mpmd.cli.validate.held_out`) and fit this one term instead, so the MoE error the
report shows after the fit is what one figure per device kind leaves."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

FIT_MOE_COMMAND = "mpmd validate --fit-moe"
KEY = "routed_element_ps"


def origin(device: str, setups, f) -> str:
    """The origin line written beside a fitted value: rows, sources, and the fit's errors."""
    sources = ", ".join(dict.fromkeys(s.row.source for s in setups))
    return (f"fitted by `{FIT_MOE_COMMAND}` over the {f.rows} {device} mixture-of-experts rows "
            f"of the published-training CSV (sources: {sources}), every other efficiency held: "
            f"MAPE {f.mape:.1f}% (without the term {f.mape_without:.1f}%; scipy bounded search "
            f"over picoseconds per routed token x expert x hidden element)")


def write_entry(path: Path, value_ps: float, why: str, *, out: Path) -> None:
    """Write device YAML ``path`` to ``out`` (atomically) with ``efficiency.routed_element_ps``
    set to ``value_ps`` and its origin ``why``: replaced where the block has it, else appended
    to the block. Every other line is kept as it was."""
    from ir.files import write_atomic

    text = path.read_text()
    start = text.index("\nefficiency:\n") + 1
    body = start + len("efficiency:\n")
    m = re.search(r"\n(?=\S)", text[body:])
    end = body + (m.start() + 1 if m else len(text) - body)
    quoted = "'" + why.replace("'", "''") + "'"
    entry = f"  {KEY}:\n    value: {value_ps:g}\n    origin: {quoted}\n"
    block = text[body:end]
    old = re.search(rf"^  {KEY}:\n(?:    .*\n?)*", block, re.MULTILINE)
    if old:
        block = block[:old.start()] + entry + block[old.end():]
    else:
        block = (block if block.endswith("\n") else block + "\n") + entry
    write_atomic(out, text[:body] + block + text[end:])


def section(name: str, f, loso: dict) -> str:
    """The Markdown section of one kind's fit, with its leave-one-source-out table."""
    lines = [f"## Calibration: {name}, mixture-of-experts token path",
             "",
             f"{name}: **{f.seconds * 1e12:.1f} ps** per routed element over {f.rows} MoE rows: "
             f"MAPE {f.mape:.1f}% (without the term: {f.mape_without:.1f}%; "
             f"{f.evaluations} evaluations)."]
    if loso:
        lines += ["", "| held-out source | fitted on the others, ps | MAPE on the held-out rows |",
                  "|---|---|---|"]
        lines += [f"| {src} | {fr.seconds * 1e12:.1f} | {err:.1f}% |"
                  for src, (fr, err) in loso.items()]
    return "\n".join(lines)


def fit_moe(setups, devices: dict, step_fn, console, fit_info: list[str],
            profiles_out: str | None, is_moe) -> None:
    """Fit every kind of ``devices`` that has mixture-of-experts rows in ``setups`` (those for
    which ``is_moe(setup)``: :func:`mpmd.cli.validate.held_out`); update
    ``devices`` in place, append a report section per kind to ``fit_info`` and, with
    ``profiles_out``, write the kind's profile there (from ``profiles_out/DEVICE.yaml`` when an
    earlier fit step wrote it, else the bundled one)."""
    from hardware_profiles.loader import DEVICES_DIR
    from simulator import validate as V

    for name in list(devices):
        mine = [s for s in setups if s.row.device == name and is_moe(s)]
        if not mine:
            continue
        with console.status(f"{name}: fitting the MoE token path over its {len(mine)} rows ..."):
            f = V.fit_token_path(mine, devices[name], step_fn)
            loso = V.token_path_loso(mine, devices[name], step_fn)
        devices[name] = dataclasses.replace(devices[name], routed_element=f.seconds)
        text = section(name, f, loso)
        console.print(text)
        fit_info.append(text)
        if profiles_out:
            dest = Path(profiles_out) / f"{name}.yaml"
            write_entry(dest if dest.exists() else DEVICES_DIR / f"{name}.yaml",
                        round(f.seconds * 1e12, 1), origin(name, mine, f), out=dest)
