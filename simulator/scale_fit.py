"""Scale as physics: fit a device kind's synchronisation jitter on one model's runs at several
sizes and check the fit on the others.

A published table that runs one model at several cluster sizes (MaxText's v5e rows at 1, 4 and 16
slices; torchtitan's 8 and 128 H100) measures how throughput per device falls with scale. Two
mechanisms set that fall in :mod:`simulator.cost_model` / :mod:`simulator.plan_costs`: the
collectives that cross more of the fabric (level by level, :class:`hardware_profiles.types.Span`)
and the synchronous step waiting for the slowest of more hosts
(:func:`hardware_profiles.types.straggler_factor`, ``DeviceProfile.sync_jitter``). The first is
fixed by the fabric's published figures; the second is fitted here, on ONE group (the largest;
ties: the median by model size, so the others check interpolation and extrapolation both ways),
and every other group is a check: its predicted drop from its smallest to each larger size
against the measured drop, in percentage points.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from hardware_profiles.types import DeviceProfile
from simulator.validation_setup import Setup, StepFn, attention_kernel, eager, power_limit
from simulator.validate import evaluate

JITTER_GRID = tuple(round(0.0025 * k, 4) for k in range(0, 41))
"""Candidate ``sync_jitter`` values, 0 to 10% in steps of 0.25%."""


@dataclass(frozen=True, slots=True)
class Drop:
    """One row of a scale group against the group's smallest run: sizes in devices, drops of
    the metric per device in percent (positive = slower per device at the larger size)."""

    group: str
    devices: int
    base_devices: int
    measured_pct: float
    predicted_pct: float

    @property
    def error_pp(self) -> float:
        return abs(self.predicted_pct - self.measured_pct)


@dataclass(frozen=True, slots=True)
class ScaleFit:
    """The fitted jitter, the group it was fitted on, and every group's drops under it."""

    jitter: float
    fit_group: str
    drops: tuple[Drop, ...]

    def checks(self) -> tuple[Drop, ...]:
        """The drops of the groups the jitter was NOT fitted on."""
        return tuple(d for d in self.drops if d.group != self.fit_group)


def _key(s: Setup) -> tuple:
    r = s.row
    return (r.source, r.model, r.device, r.tp, r.pp, s.micro_batch, r.recompute, s.schedule,
            r.seq_len, bool(r.fsdp), r.global_batch / r.gpus, eager(r)[0], power_limit(r)[0],
            r.memory_bandwidth_gb_per_s, attention_kernel(r)[0], r.precision)


def scale_groups(setups: Sequence[Setup]) -> dict[str, list[Setup]]:
    """Rows of one model and per-device configuration (source, model, device, tensor and
    pipeline degree, micro batch, recompute, schedule, sequence, FSDP, samples per device, and how
    the run ran: eager or compiled, power cap, memory bandwidth, attention kernel, precision) at two
    or more device counts, keyed ``"source model"``, each sorted by device count."""
    by: dict[tuple, list[Setup]] = {}
    for s in setups:
        by.setdefault(_key(s), []).append(s)
    out = {}
    for k, g in by.items():
        if len({s.row.gpus for s in g}) >= 2:
            name = f"{k[0]} {k[1]}"
            while name in out:
                name += "'"
            out[name] = sorted(g, key=lambda s: s.row.gpus)
    return out


def per_device(row, value: float) -> float:
    """``value`` of ``row``'s metric as throughput per device (higher = faster): an iteration
    time becomes samples per device per second (``global_batch / (seconds x devices)``; a scale
    group keeps samples per device fixed, so this is ``1 / seconds`` up to a constant); every
    other metric is per device already."""
    if row.metric == "iteration_s":
        return row.global_batch / (value * row.gpus)
    return value


def drops(groups: dict[str, list[Setup]], device: DeviceProfile, step_fn: StepFn
          ) -> tuple[Drop, ...]:
    """Each group's measured and predicted drop from its smallest run, on ``device``."""
    out = []
    for name, g in groups.items():
        res = evaluate(g, device, step_fn)
        base = res[0]
        m0 = per_device(base.row, base.row.value)
        p0 = per_device(base.row, base.predicted)
        for r in res[1:]:
            m = per_device(r.row, r.row.value)
            p = per_device(r.row, r.predicted)
            out.append(Drop(name, r.row.gpus, base.row.gpus, (1 - m / m0) * 100, (1 - p / p0) * 100))
    return tuple(out)


def fit_jitter(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn,
               grid: Sequence[float] = JITTER_GRID) -> ScaleFit | None:
    """Fit ``device.sync_jitter`` on one scale group (see the module docstring): the grid value
    whose predicted drops of that group are closest to the measured ones (mean absolute
    percentage points; ties keep the smaller jitter; the ascending scan stops once the error is
    0.5 points above the best, since a larger jitter only slows the larger runs more). None when
    ``setups`` hold no group."""
    groups = scale_groups(setups)
    if not groups:
        return None
    most = max(len(g) for g in groups.values())
    tied = [n for n, g in groups.items() if len(g) == most]
    tied.sort(key=lambda n: groups[n][0].workload.step_flops / groups[n][0].row.global_batch)
    pick = tied[(len(tied) - 1) // 2]
    best: tuple[float, float] | None = None
    for j in grid:
        d = drops({pick: groups[pick]}, replace(device, sync_jitter=j), step_fn)
        err = sum(x.error_pp for x in d) / len(d)
        if best is None or err < best[0] - 1e-9:
            best = (err, j)
        elif err > best[0] + 0.5:        # past the minimum: larger jitter only slows more
            break
    assert best is not None
    fitted = replace(device, sync_jitter=best[1])
    return ScaleFit(best[1], pick, drops(groups, fitted, step_fn))


def scale_section(device: str, f: ScaleFit | None) -> str:
    """The Markdown section of one device kind's scale fit."""
    if f is None:
        return (f"### Scale: {device}\n\nNo model runs at two sizes in this kind's rows: "
                f"`sync_jitter` is not identifiable and stays at the profile's value.\n")
    lines = [f"### Scale: {device}", "",
             f"`sync_jitter` fitted on **{f.fit_group}**: **{f.jitter:.4f}** (the step waits for "
             f"the slowest host: x (1 + jitter sqrt(2 ln hosts))). Drop in throughput per device "
             f"from each group's smallest run; the other groups are checks:", "",
             "| group | devices | from | measured drop | predicted drop | error (pp) | role |",
             "|---|---|---|---|---|---|---|"]
    for d in f.drops:
        role = "fitted" if d.group == f.fit_group else "check"
        lines.append(f"| {d.group} | {d.devices} | {d.base_devices} | {d.measured_pct:.1f}% | "
                     f"{d.predicted_pct:.1f}% | {d.error_pp:.1f} | {role} |")
    checks = f.checks()
    if checks:
        lines += ["", f"Checks: max error {max(d.error_pp for d in checks):.1f} pp over "
                      f"{len(checks)} drops."]
    return "\n".join(lines) + "\n"
