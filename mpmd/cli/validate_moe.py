"""``mpmd validate --fit-moe`` (and the last step of ``--fit``): each device kind's
mixture-of-experts token path, three figures: the time per routed (token, expert, hidden) element
(``DeviceProfile.routed_element``, :func:`simulator.cost_model.token_path_time`), the time per
routed (token, expert) pair (``forward_routing_pair`` / ``backward_routing_pair``, a third and
two thirds of it) and the host-synchronised dropless all-to-all dispatch's time per pair on top
(``dropless_routing_pair``, fitted only for a kind with rows that pay it and rows that do not:
token-dropping or DeepEP/HybridEP, else 0), fitted on the kind's MoE rows of the published-training CSV with every other
efficiency of its profile held (:func:`simulator.token_path_fit.fit_token_path`), reported with
its leave-one-source-out errors and, with ``--profiles-out DIR``, written into
``DIR/DEVICE.yaml``'s ``efficiency:`` block as ``routed_element_ps``, ``forward_routing_pair_ns``,
``backward_routing_pair_ns`` and ``dropless_routing_pair_ns``.

Dense rows fit the chip's GEMM and memory efficiencies; a mixture of experts' rows are held out of
that fit (:func:`mpmd.cli.validate.held_out`) and fit this one term instead, so the MoE error the
report shows after the fit is what one figure per device kind leaves."""

from __future__ import annotations

import re
from datetime import date
from pathlib import Path

FIT_MOE_COMMAND = "mpmd validate --fit-moe"
KEY = "routed_element_ps"
PAIR_KEYS = ("forward_routing_pair_ns", "backward_routing_pair_ns")
DROPLESS_KEY = "dropless_routing_pair_ns"


def origin(device: str, setups, f) -> str:
    """The origin line written beside a fitted value: rows, sources, and the fit's errors."""
    sources = ", ".join(dict.fromkeys(s.row.source for s in setups))
    return (f"fitted by `{FIT_MOE_COMMAND}` over the {f.rows} {device} mixture-of-experts rows "
            f"of the published-training CSV (sources: {sources}), every other efficiency held: "
            f"MAPE {f.mape:.1f}% (without the token path {f.mape_without:.1f}%); three figures per "
            f"kind, {f.seconds * 1e12:.1f} ps per routed token x expert x hidden element, "
            f"{f.pair_seconds * 1e9:.1f} ns per routed token x expert pair (forward a third, the "
            f"input gradient the rest) and {f.dropless_seconds * 1e9:.1f} ns more per pair of a "
            f"dropless dispatch, least MAPE on each row's step linear in all three "
            f"(simulator.token_path_fit), {date.today().isoformat()}")


def pair_origin(f, what: str) -> str:
    """The origin line of a per-pair key: the same fit as ``routed_element_ps``, ``what`` of it."""
    return (f"fitted with routed_element_ps by `{FIT_MOE_COMMAND}` (see its origin): {what} of "
            f"the {f.pair_seconds * 1e9:.1f} ns per routed token x expert pair, "
            f"{date.today().isoformat()}")


def dropless_origin(f) -> str:
    """The origin line of ``dropless_routing_pair_ns``: the same fit, its third figure."""
    return (f"fitted with routed_element_ps by `{FIT_MOE_COMMAND}` (see its origin): a dropless "
            f"all-to-all dispatch's time per routed token x expert pair beside the "
            f"{f.pair_seconds * 1e9:.1f} ns every dispatch pays (0 where the kind's rows do not "
            f"hold both runs that pay it and runs that do not: token-dropping, DeepEP/HybridEP), {date.today().isoformat()}")


def write_entry(path: Path, value_ps: float, why: str, *, out: Path, key: str = KEY) -> None:
    """Write device YAML ``path`` to ``out`` (atomically) with ``efficiency.<key>`` (default
    ``routed_element_ps``) set to ``value_ps`` (in the key's unit) and its origin ``why``:
    replaced where the block has it, else appended to the block. Every other line is kept as it
    was."""
    from ir.files import write_atomic

    text = path.read_text()
    start = text.index("\nefficiency:\n") + 1
    body = start + len("efficiency:\n")
    m = re.search(r"\n(?=\S)", text[body:])
    end = body + (m.start() + 1 if m else len(text) - body)
    quoted = "'" + why.replace("'", "''") + "'"
    entry = f"  {key}:\n    value: {value_ps:g}\n    origin: {quoted}\n"
    block = text[body:end]
    old = re.search(rf"^  {key}:\n(?:    .*\n?)*", block, re.MULTILINE)
    if old:
        block = block[:old.start()] + entry + block[old.end():]
    else:
        block = (block if block.endswith("\n") else block + "\n") + entry
    write_atomic(out, text[:body] + block + text[end:])


def section(name: str, f, loso: dict) -> str:
    """The Markdown section of one kind's fit, with its leave-one-source-out table."""
    lines = [f"## Calibration: {name}, mixture-of-experts token path",
             "",
             f"{name}: **{f.seconds * 1e12:.1f} ps** per routed element and "
             f"**{f.pair_seconds * 1e9:.1f} ns** per routed pair (dropless dispatch: "
             f"**{f.dropless_seconds * 1e9:.1f} ns** more) over {f.rows} MoE rows: "
             f"MAPE {f.mape:.1f}% (without the token path: {f.mape_without:.1f}%; "
             f"{f.evaluations} simulations)."]
    if loso:
        lines += ["", "| held-out source | fitted on the others, ps / ns / dropless ns | MAPE on "
                  "the held-out rows |", "|---|---|---|"]
        lines += [f"| {src} | {fr.seconds * 1e12:.1f} / {fr.pair_seconds * 1e9:.1f} / "
                  f"{fr.dropless_seconds * 1e9:.1f} | {err:.1f}% |"
                  for src, (fr, err) in loso.items()]
        errs = list(e for _, e in loso.values())
        lines += ["", f"Leave-one-source-out: mean of the held-out MAPEs {sum(errs) / len(errs):.1f}%."]
    return "\n".join(lines)


def fit_moe(setups, devices: dict, step_fn, console, fit_info: list[str],
            profiles_out: str | None, is_moe) -> None:
    """Fit every kind of ``devices`` that has mixture-of-experts rows in ``setups`` (those for
    which ``is_moe(setup)``: :func:`mpmd.cli.validate.held_out`); update
    ``devices`` in place, append a report section per kind to ``fit_info`` and, with
    ``profiles_out``, write the kind's profile there (from ``profiles_out/DEVICE.yaml`` when an
    earlier fit step wrote it, else the bundled one)."""
    from hardware_profiles.loader import DEVICES_DIR
    from simulator import token_path_fit as TP

    for name in list(devices):
        mine = [s for s in setups if s.row.device == name and is_moe(s)]
        if not mine:
            continue
        with console.status(f"{name}: fitting the MoE token path over its {len(mine)} rows ..."):
            slopes = TP.token_path_slopes(mine, devices[name], step_fn)
            f = TP.fit_token_path(mine, devices[name], step_fn, slopes=slopes)
            loso = TP.token_path_loso(mine, devices[name], step_fn, slopes=slopes)
        devices[name] = TP.with_token_path(devices[name], f.seconds, f.pair_seconds,
                                           f.dropless_seconds)
        text = section(name, f, loso)
        console.print(text)
        fit_info.append(text)
        if profiles_out:
            dest = Path(profiles_out) / f"{name}.yaml"
            why = origin(name, mine, f)
            write_entry(dest if dest.exists() else DEVICES_DIR / f"{name}.yaml",
                        round(f.seconds * 1e12, 1), why, out=dest)
            share = (1.0 / 3.0, 2.0 / 3.0)      # cost_model.TOKEN_PATH_FORWARD_SHARE and the rest
            for key, part, what in zip(PAIR_KEYS, share, ("a third", "two thirds")):
                write_entry(dest, round(f.pair_seconds * 1e9 * part, 2),
                            pair_origin(f, what), out=dest, key=key)
            write_entry(dest, round(f.dropless_seconds * 1e9, 1), dropless_origin(f),
                        out=dest, key=DROPLESS_KEY)
