"""Best and worst case of a plan under the device profiles' disagreeing figures.

A device profile's ``alternatives`` are published figures that disagree with the ones the model
uses (e.g. Blackhole p150b: 16 GB per chip in Tenstorrent's Mochi guide vs 32 GB from the vendor).
For each alternative that can change a plan's cost (the compute dtype's peak FLOP/s, memory
capacity and bandwidth, scale-up bandwidth and latency) the SAME plan is re-predicted with the
figure swapped in (:func:`planner.predict.predict`, exact schedule replay): step time moves, or
the plan stops fitting memory. The plan is not re-searched; a plan that no longer fits is reported
as such ("re-plan needed"), not silently replaced.

A device whose profile is a prior (never fitted to a measured run:
:func:`hardware_profiles.calibration.calibration_status`) adds two more outcomes: the same plan
with that device's matmul efficiency scaled by (1 - u) and (1 + u), capped at 1.0, u =
:data:`hardware_profiles.calibration.PRIOR_UNCERTAINTY` (0.20, the H100 prior's error against
published runs before calibration). A calibrated profile adds none.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ir import DataParallelPlan, Plan, Workload
from hardware_profiles.calibration import PRIOR_UNCERTAINTY, is_calibrated
from hardware_profiles.types import Alternative, Cluster, DeviceProfile, Link, MeshSpec
from planner.predict import predict
from reports.citations import cite
from simulator import cost_model as cm
from simulator.plan_sim import part_workloads, plan_meshes, simulate_data_parallel

PERF_FIELDS = ("memory_bytes", "memory_bandwidth", "scale_up_bandwidth", "scale_up_latency")
"""Profile fields (besides the compute dtype's ``peak_flops``) whose alternatives can move a plan."""
PRIOR_FIELD = f"matmul_efficiency (prior, +/-{PRIOR_UNCERTAINTY:.0%})"
"""``AltOutcome.field`` of the outcomes that widen a prior profile's range."""


@dataclass(frozen=True, slots=True)
class AltOutcome:
    """The plan re-predicted with one alternative figure.

    Attributes:
        device / field / value / source: the alternative (SI units).
        step_time_s: predicted step time with it, s.
        fits: whether the plan still fits memory (with the planner's headroom).
        base_step_time_s: the prediction with the figures the model uses, s.
    """

    device: str
    field: str
    value: float
    source: str
    step_time_s: float
    base_step_time_s: float
    fits: bool

    @property
    def changes(self) -> bool:
        return (not self.fits) or abs(self.step_time_s / self.base_step_time_s - 1) > 1e-6

    def describe(self) -> str:
        what = self.field.replace("_", " ")
        if self.field.startswith("peak_flops"):
            val = f"{self.value / 1e12:g} TFLOP/s"
        elif self.field == "memory_bytes":
            val = f"{self.value / 1e9:.4g} GB"
        elif self.field.endswith("bandwidth"):
            val = f"{self.value / 1e9:g} GB/s"
        elif self.field.endswith("latency"):
            val = f"{self.value * 1e6:g} us"
        else:
            val = f"{self.value:g}"
        if not self.fits:
            effect = "the plan no longer fits memory (re-plan needed)"
        else:
            effect = f"step time {(self.step_time_s / self.base_step_time_s - 1) * 100:+.1f}%"
        return f"{self.device} {what} = {val} ({self.source}): {effect}"


def prior_alternatives(dev: DeviceProfile) -> list[Alternative]:
    """For a prior (uncalibrated) profile, its matmul efficiency scaled by (1 - PRIOR_UNCERTAINTY)
    and (1 + PRIOR_UNCERTAINTY), capped at 1.0 (a value equal to the profile's own is left out);
    none for a calibrated profile."""
    if is_calibrated(dev):
        return []
    eff, out = dev.matmul_efficiency, []
    for factor in (1 - PRIOR_UNCERTAINTY, 1 + PRIOR_UNCERTAINTY):
        value = min(1.0, eff * factor)
        if value != eff:
            capped = ", capped at 1" if value < eff * factor else ""
            out.append(Alternative("matmul_efficiency", value,
                                   f"never fitted: {eff:g} x {factor:g}{capped}"))
    return out


def _swap(dev: DeviceProfile, alt: Alternative) -> DeviceProfile:
    if alt.field.startswith("peak_flops."):
        key = alt.field.split(".", 1)[1]
        return replace(dev, peak_flops={**dev.peak_flops, key: alt.value})
    return replace(dev, **{alt.field: alt.value})


def _swap_cluster(cluster: Cluster, device: str, alt: Alternative) -> Cluster:
    meshes: dict[str, MeshSpec] = {}
    for name, m in cluster.meshes.items():
        if m.device.name != device:
            meshes[name] = m
            continue
        new_dev = _swap(m.device, alt)
        intra = m.intra_link
        # the loader copies the device's scale-up figures into intra_link unless the file set one
        if intra.source.startswith(f"device {device} scale_up") and alt.field.startswith("scale_up_"):
            intra = Link(new_dev.scale_up_bandwidth, new_dev.scale_up_latency, intra.source)
        meshes[name] = replace(m, device=new_dev, intra_link=intra)
    return replace(cluster, meshes=meshes)


def relevant(dev: DeviceProfile, dtype: str) -> list[Alternative]:
    """The device's alternatives that can change a plan computed in ``dtype``."""
    return [a for a in dev.alternatives
            if a.field in PERF_FIELDS or a.field == f"peak_flops.{dtype}"]


def _step_and_fit(plan: "Plan | DataParallelPlan", workload: Workload, cluster: Cluster,
                  headroom: float) -> tuple[float, bool]:
    """(step time, fits memory) of ``plan``: the planner's exact replay for one pipeline; for a
    data-parallel plan every part's fit and the step of its replay on the discrete-event engine
    (contention-free, so equal to the planner's: parts, then the sync across them, then the
    optimizer)."""
    if not isinstance(plan, DataParallelPlan):
        p = predict(plan, workload, cluster, headroom=headroom)
        return p.step_time_s, p.fits

    ws = part_workloads(plan, workload)
    fits = all(predict(p, w, cluster, headroom=headroom).fits for p, w in zip(plan.parts, ws))
    return simulate_data_parallel(plan, ws, cluster).step_time_s, fits


def alternatives_outcomes(plan: "Plan | DataParallelPlan", workload: Workload, cluster: Cluster, *,
                          headroom: float = 0.1) -> list[AltOutcome]:
    """Re-predict ``plan`` once per relevant alternative of the devices it uses, and twice more per
    device whose profile is a prior (:func:`prior_alternatives`, reported with field
    :data:`PRIOR_FIELD`). ``cluster`` is the one the plan runs on
    (:func:`simulator.plan_sim.plan_cluster`); ``workload`` the whole step's (a data-parallel
    plan's parts take their batch shares of it).

    Raises:
        simulator.plan_costs.CostError: the plan does not match the workload or cluster.
    """
    dtype = cm.compute_dtype(workload)
    base, _ = _step_and_fit(plan, workload, cluster, headroom)
    devices = {cluster.meshes[m].device.name: cluster.meshes[m].device for m in plan_meshes(plan)}
    out = []
    for name, dev in devices.items():
        tried = [(a.field, a) for a in relevant(dev, dtype)]
        tried += [(PRIOR_FIELD, a) for a in prior_alternatives(dev)]
        for field, alt in tried:
            step, fits = _step_and_fit(plan, workload, _swap_cluster(cluster, name, alt), headroom)
            out.append(AltOutcome(name, field, alt.value, cite(alt.source), step, base, fits))
    return out
