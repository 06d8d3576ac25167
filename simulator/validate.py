"""Validation against published training runs: evaluate every row, fit one calibration, rank
zero-bubble schedules. Rows and metrics are in :mod:`simulator.validation_rows`, their setups in
:mod:`simulator.validation_setup`."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

from ir import FragmentRef, IRError, Plan, Workload
from ir.schedule import FragmentKind
from hardware_profiles.types import Cluster, DeviceProfile
from simulator.plan_costs import CostError, PlanCosts
from simulator.plan_sim import simulate_plan
from simulator.program import SimError
from simulator.schedules import ScheduleError
from simulator.schedules.adaptive import zero_bubble_auto

from simulator.validation_rows import (  # noqa: F401  (re-exported)
                                       DEFAULT_VOCAB, DEVICES_PER_NODE, METRICS, SCHEDULE_MAP, ZB_SCHEDULES, Row, SkippedRow,
                                       ValidationError, load_rows, load_rows_lenient, maxtext_flops, metric_from_step,
                                       narayanan_flops, palm_flops, skipped)
from simulator.validation_setup import (  # noqa: F401  (re-exported)
                                        ADAPTIVE, RULES, SCALE_OUT_LATENCY_S, Setup, StepFn, build_cluster, build_plan, expert_problem, row_etp, row_layout,
                                        attention_kernel, layer_recompute, op_recompute, row_device, row_setup, selective_recompute, split_layers, tune_virtual_stages, virtual_stage_candidates,
                                        with_efficiency)

__all__ = ["ValidationError", "Row", "Setup", "RowResult", "FitResult", "load_rows", "row_setup",
           "SkippedRow", "load_rows_lenient", "row_setups", "evaluate_rows", "ROW_ERRORS",
           "build_cluster", "build_plan", "split_layers", "selective_recompute", "narayanan_flops",
           "maxtext_flops", "palm_flops", "row_layout", "RULES", "METRICS",
           "metric_from_step", "evaluate", "ranking_agrees", "zb_rankings", "mape", "fit",
           "leave_one_source_out", "with_efficiency", "adapt_plan", "post_validation_step",
           "SCHEDULE_MAP", "ZB_SCHEDULES", "ADAPTIVE", "tune_virtual_stages",
           "virtual_stage_candidates", "FormatFit", "fit_format", "expert_problem", "row_etp"]
# the mixture-of-experts token-path fit is simulator.token_path_fit (it uses evaluate and mape)

# --------------------------------------------------------------------------- evaluation
def sim_step(plan: Plan, workload: Workload, cluster: Cluster) -> float:
    """Step time of the discrete-event replay (:func:`simulator.plan_sim.simulate_plan`), s."""
    return simulate_plan(plan, workload, cluster).step_time_s


@dataclass(frozen=True, slots=True)
class RowResult:
    setup: Setup
    step_s: float
    predicted: float

    @property
    def row(self) -> Row:
        return self.setup.row

    @property
    def ape(self) -> float:
        """Absolute percentage error of the predicted metric, %."""
        return abs(self.predicted - self.row.value) / abs(self.row.value) * 100.0


def adapt_plan(plan: Plan, workload: Workload, cluster: Cluster) -> Plan:
    """``plan`` with its ZB-1p / ZB-2p schedule rebuilt by the automatic scheduler
    (:func:`simulator.schedules.adaptive.zero_bubble_auto`) from the plan's own costs on
    ``cluster``: each stage's F, B, W fragment seconds (dispatch overhead included), each
    boundary's transfer seconds and each fragment's blocking receive, as Qi et al. profile them
    (Sec. 3), under their activation-memory budget in bytes
    (:func:`simulator.schedules.adaptive.per_rank_limits` over each stage's residual bytes per
    microbatch). Other plans are returned as is.
    """
    name = plan.schedule.name
    if name not in ADAPTIVE:
        return plan
    costs = PlanCosts(plan, workload, cluster)
    P, M = plan.schedule.num_ranks, plan.microbatches
    dur: dict[tuple[int, str], float] = {
        (s, k): costs.fragment_time(FragmentRef(k, s, 0)) for s in range(P) for k in FragmentKind}
    comm = {}
    for a in range(P):
        for b in (a - 1, a + 1):
            if 0 <= b < P:
                x = costs.boundary(a, b)
                comm[(a, b)] = 0.0 if x is None else x[2]
    limit = P if name == "zb-1p" else 2 * P
    act = [costs.residual_bytes(FragmentRef(FragmentKind.F, s, 0)) for s in range(P)]
    rcv: dict[tuple[int, str], float] = {
        (s, k): costs.recv_time(FragmentRef(k, s, 0)) for s in range(P) for k in FragmentKind}
    table = zero_bubble_auto(P, M, lambda s, k: dur[(s, k)], lambda a, b: comm[(a, b)],
                             memory_limit=limit, name=name, objective="span", activation=act,
                             receive=(lambda s, k: rcv[(s, k)]) if costs.blocking_p2p else None)
    return replace(plan, schedule=table)


def _repeat(plan: Plan, times: int) -> Plan:
    """``plan`` run ``times`` iterations back to back as one schedule (microbatch ids offset by
    M per iteration; each rank finishes iteration k before it starts k + 1)."""
    t, M = plan.schedule, plan.microbatches
    order = tuple(tuple(FragmentRef(f.kind, f.stage, f.microbatch + i * M)
                        for i in range(times) for f in o) for o in t.order)
    table = replace(t, microbatches=M * times, order=order)
    return replace(plan, schedule=table, global_batch=plan.global_batch * times)


def post_validation_step(plan: Plan, workload: Workload, cluster: Cluster,
                         step_fn: StepFn) -> float:
    """Steady-state seconds per iteration when the optimizer step is not synchronised across
    pipeline stages (Qi et al. 2024, Sec. 4 "bypassing optimizer synchronizations": the global
    gradient-norm / NaN all-reduce is replaced by a post-update validation, so each rank starts the
    next iteration right after its own last W and optimizer step, and consecutive iterations
    overlap; ZB-2p's zero bubble depends on it). Measured as the step time of two iterations run
    back to back minus that of one, plus the largest end-of-step op time (the optimizer step that
    the concatenation omits between the two iterations; an upper bound)."""
    one = step_fn(plan, workload, cluster)
    two = step_fn(_repeat(plan, 2), workload, cluster)
    costs = PlanCosts(plan, workload, cluster)
    tail = max(sum(t for _, t in costs.tail(m)) for m in plan.rank_mesh)
    return two - one + tail


def evaluate(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn = sim_step
             ) -> tuple[RowResult, ...]:
    """Simulate every setup on ``device`` and convert to the row's metric. ZB-1p / ZB-2p plans are
    first rebuilt for ``device`` (:func:`adapt_plan`) and timed by :func:`post_validation_step`.
    A remat policy's host offload (:attr:`Setup.offload_s`, :func:`simulator.remat.offload_seconds`)
    is added to the step time exposed: the plan's costs do not model the host link."""
    out = []
    for s in setups:
        cluster = build_cluster(s.row, device)
        if s.plan.schedule.name in ADAPTIVE:
            plan = adapt_plan(s.plan, s.workload, cluster)
            t = post_validation_step(plan, s.workload, cluster, step_fn)
        else:
            t = step_fn(s.plan, s.workload, cluster)
        t += s.offload_s
        out.append(RowResult(s, t, metric_from_step(s.row, t, device.peak("bf16"))))
    return tuple(out)


ROW_ERRORS: tuple[type[BaseException], ...] = (CostError, ScheduleError, SimError, IRError)
"""What a row's setup or simulation may raise that skips the row rather than the run: an
impossible setup (:class:`ValidationError`, any :class:`~simulator.plan_costs.CostError`), a
schedule the sizes do not allow, a program the engine refuses, an inconsistent workload. Callers
add their own (the CLI: the model zoo's ``ZooError``)."""


def row_setups(rows: Iterable[Row], workload_fn: Callable[[Row], Workload], *,
               step_fn: StepFn | None = None, devices: Mapping[str, DeviceProfile] | None = None,
               errors: tuple[type[BaseException], ...] = ROW_ERRORS,
               advance: Callable[[], object] | None = None
               ) -> tuple[tuple[Setup, ...], tuple[SkippedRow, ...]]:
    """(the setups of ``rows``, the rows whose :func:`row_setup` raised one of ``errors``, each a
    :class:`SkippedRow` with the error's line). ``devices`` maps a row's device id to its profile
    (for :func:`tune_virtual_stages`); ``advance()`` is called after each row."""
    setups, bad = [], []
    for r in rows:
        try:
            setups.append(row_setup(r, workload_fn, step_fn=step_fn,
                                    device=devices[r.device] if devices else None))
        except errors as e:
            bad.append(skipped(r.line, r.source, r.model, e))
        if advance:
            advance()
    return tuple(setups), tuple(bad)


def evaluate_rows(setups: Iterable[Setup], devices: Mapping[str, DeviceProfile],
                  step_fn: StepFn = sim_step, *,
                  errors: tuple[type[BaseException], ...] = ROW_ERRORS,
                  advance: Callable[[], object] | None = None
                  ) -> tuple[tuple[RowResult, ...], tuple[SkippedRow, ...]]:
    """(:func:`evaluate` of each setup on its row's device ``devices[row.device]``, the rows whose
    simulation raised one of ``errors`` as :class:`SkippedRow`). ``advance()`` after each row."""
    out: list[RowResult] = []
    bad: list[SkippedRow] = []
    for s in setups:
        try:
            out += evaluate([s], devices[s.row.device], step_fn)
        except errors as e:
            bad.append(skipped(s.row.line, s.row.source, s.row.model, e))
        if advance:
            advance()
    return tuple(out), tuple(bad)


def mape(results: Iterable[RowResult]) -> float:
    """Mean absolute percentage error, %."""
    r = [x.ape for x in results]
    return sum(r) / len(r) if r else float("nan")


def ranking_agrees(measured: Mapping[str, float], predicted: Mapping[str, float]) -> bool:
    """Whether ``predicted`` orders the schedules as ``measured`` does (higher = better): every
    pair with different measured values must keep its order; measured ties accept any order."""
    names = sorted(measured)
    if set(names) != set(predicted):
        raise ValidationError(f"ranking over {names} vs {sorted(predicted)}: give the same schedules")
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            dm = measured[a] - measured[b]
            if dm != 0 and (predicted[a] - predicted[b]) * dm <= 0:
                return False
    return True


def zb_rankings(results: Sequence[RowResult]) -> list[tuple[str, dict, dict, bool]]:
    """Per schedule-comparison group (rows of one model and global batch, e.g. Qi et al.'s) that
    has every one of :data:`ZB_SCHEDULES`: (group, measured by schedule, predicted by schedule,
    ranking agrees)."""
    groups: dict[str, dict[str, RowResult]] = {}
    for r in results:
        row = r.row
        if row.schedule in ZB_SCHEDULES:
            key = f"{row.model} b{row.global_batch}"
            groups.setdefault(key, {})[row.schedule] = r
    out = []
    for g, by in groups.items():
        if set(by) == set(ZB_SCHEDULES):
            m = {k: v.row.value for k, v in by.items()}
            p = {k: v.predicted for k, v in by.items()}
            out.append((g, m, p, ranking_agrees(m, p)))
    return out


# --------------------------------------------------------------------------- calibration
@dataclass(frozen=True, slots=True)
class FitResult:
    matmul: float
    memory: float
    overhead_s: float
    mape: float
    evaluations: int
    elementwise: float = 0.0
    disagreements: int = 0
    trials: tuple[tuple[float, float, float, float, int], ...] = field(default=())
    """(overhead s, elementwise traffic, matmul, MAPE %, zero-bubble groups ranked wrongly)."""


MAX_ERROR_PCT = 20.0
"""The largest row error a calibration accepts before trading mean error for it (issue 11's
per-kind target), %."""

NEIGHBOUR_STEP, NEIGHBOURS = 0.01, 6
"""Besides its MAPE optimum, :func:`fit` evaluates this many matmul efficiencies either side of it,
this far apart: where the optimum ranks a schedule group wrongly or leaves a row over
:data:`MAX_ERROR_PCT`, a nearby point may not."""

ELEMENTWISE_GRID = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Elementwise-traffic fractions :func:`fit` tries (0: every non-matmul op fused; 1: none)."""

MAPE_TOLERANCE = 0.1
"""Percentage points of MAPE by which a larger elementwise-traffic fraction must beat a smaller one
for :func:`fit` to take it: where the rows cannot tell the fractions apart (e.g. two runs of one
model), the smallest (the fused-kernel default, 0) is kept rather than a float-noise winner."""


def fit(setups: Sequence[Setup], device: DeviceProfile, step_fn: StepFn = sim_step, *,
        overheads_s: Sequence[float] | None = None,
        elementwise: Sequence[float] = ELEMENTWISE_GRID,
        matmul_bounds: tuple[float, float] = (0.25, 0.98), xatol: float = 2e-3) -> FitResult:
    """Fit ONE set of efficiency values to all ``setups`` (no per-row tuning).

    For each fragment overhead in ``overheads_s`` (default: the profile's own, held) and each elementwise-traffic fraction in
    ``elementwise`` (:attr:`~hardware_profiles.types.DeviceProfile.elementwise_traffic`), a bounded
    scalar search (scipy ``minimize_scalar``, method ``bounded``) over the matmul efficiency
    minimises the mean absolute percentage error; :data:`NEIGHBOURS` points either side of its
    optimum are evaluated too. Of every point evaluated, the one chosen ranks the most schedule
    groups as measured (:func:`zb_rankings`: a simulator that orders schedules wrongly misleads
    the planner whatever its mean error), then exceeds :data:`MAX_ERROR_PCT` on its worst row by
    the least, then has the lowest MAPE (a larger elementwise fraction must lower it by more than
    :data:`MAPE_TOLERANCE`). The memory efficiency is kept at the profile's (these rows are compute-bound). Step
    times come from ``step_fn``. ``trials`` lists each grid point's MAPE-optimal matmul.
    """
    from scipy.optimize import minimize_scalar

    if overheads_s is None:                     # hold the profile's own dispatch overhead
        overheads_s = (device.fragment_overhead,)
    best: FitResult | None = None
    best_key: tuple[int, float, float] = (0, 0.0, 0.0)
    trials, n = [], 0
    for o in overheads_s:
        for ew in elementwise:
            cache: dict[float, tuple[RowResult, ...]] = {}

            def run(e: float) -> tuple[RowResult, ...]:
                nonlocal n
                e = round(float(e), 3)
                if e not in cache:
                    n += 1
                    cache[e] = evaluate(setups, with_efficiency(device, e, None, o, ew), step_fn)
                return cache[e]

            res = minimize_scalar(lambda e: mape(run(e)), bounds=matmul_bounds, method="bounded",
                                  options={"xatol": xatol})
            e0 = round(float(res.x), 3)
            run(e0)
            for k in range(1, NEIGHBOURS + 1):          # the trade-offs near the optimum
                for e in (e0 - k * NEIGHBOUR_STEP, e0 + k * NEIGHBOUR_STEP):
                    if matmul_bounds[0] <= e <= matmul_bounds[1]:
                        run(e)
            here: FitResult | None = None
            here_key: tuple[int, float, float] = (0, 0.0, 0.0)
            for e, results in cache.items():
                err = mape(results)
                bad = sum(not ok for *_, ok in zb_rankings(results))
                over = max(0.0, max(r.ape for r in results) - MAX_ERROR_PCT)
                if e == e0:
                    trials.append((o, ew, e, err, bad))
                if here is None or (bad, over, err) < here_key:
                    here_key = (bad, over, err)
                    here = FitResult(matmul=e, memory=device.memory_efficiency, overhead_s=o,
                                     mape=err, evaluations=0, elementwise=ew, disagreements=bad)
            # a later (larger) elementwise fraction must earn its place: equal ranking and
            # overshoot, and a MAPE lower by more than MAPE_TOLERANCE (else it is not identified)
            if best is None or here_key[:2] < best_key[:2] or (
                    here_key[:2] == best_key[:2] and here_key[2] < best_key[2] - MAPE_TOLERANCE):
                best, best_key = here, here_key
    assert best is not None
    return replace(best, evaluations=n, trials=tuple(trials))


@dataclass(frozen=True, slots=True)
class FormatFit:
    """A low-precision recipe's GEMM efficiency relative to BF16, fitted on one kind's rows of it
    (:func:`fit_format`): ``efficiency``, the rows' MAPE at it, and its evaluations."""

    recipe: str
    efficiency: float
    mape: float
    rows: int
    evaluations: int


def fit_format(setups: Sequence[Setup], device: DeviceProfile, recipe: str,
               step_fn: StepFn = sim_step, *, bounds: tuple[float, float] = (0.3, 1.2),
               xatol: float = 2e-3) -> FormatFit:
    """Fit ``device``'s relative efficiency of ``recipe`` (``DeviceProfile.format_efficiency``)
    on ``setups`` (rows in that recipe), with everything else of the profile held (its BF16 fit
    first): a bounded scalar search (scipy ``minimize_scalar``) of the rows' mean absolute
    percentage error. One value for all rows, no per-row tuning."""
    from scipy.optimize import minimize_scalar

    cache: dict[float, float] = {}

    def err(e: float) -> float:
        e = round(float(e), 3)
        if e not in cache:
            dev = replace(device, format_efficiency={**device.format_efficiency, recipe: e})
            cache[e] = mape(evaluate(setups, dev, step_fn))
        return cache[e]

    res = minimize_scalar(err, bounds=bounds, method="bounded", options={"xatol": xatol})
    e0 = round(float(res.x), 3)
    return FormatFit(recipe, e0, err(e0), len(setups), len(cache))


def leave_one_source_out(setups: Sequence[Setup], device: DeviceProfile,
                         step_fn: StepFn = sim_step, **fit_kw) -> dict[str, tuple[FitResult, float]]:
    """For each source: fit on the other sources, then the MAPE on the held-out one, %."""
    out = {}
    for src in dict.fromkeys(s.row.source for s in setups):
        train = [s for s in setups if s.row.source != src]
        test = [s for s in setups if s.row.source == src]
        f = fit(train, device, step_fn, **fit_kw)
        dev = with_efficiency(device, f.matmul, f.memory, f.overhead_s, f.elementwise)
        out[src] = (f, mape(evaluate(test, dev, step_fn)))
    return out

