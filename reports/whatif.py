"""``whatif(model, options)``: plan every hardware option, replay it, and tabulate purchasing metrics.

Every option is planned with :func:`planner.plan` and its plan replayed in the discrete-event
simulator (:func:`simulator.plan_sim.simulate_any`: one pipeline, or a data-parallel plan's
pipelines and the gradient sync across them) on the cluster the plan runs on (a node-group cluster
carved as the plan says, :func:`simulator.plan_sim.plan_cluster`); the simulated step time drives
every rate. Each row also gives the chosen shape in one line (:func:`shape_summary`).
Formulas (all from the simulated step time ``T`` s, prices ``P`` USD per hour, power ``W`` watts):

* training: tokens/s = global_batch x seq_len / T; USD per million tokens = P / (tokens/s x 3600)
  x 1e6; time to train = token budget / tokens/s; cost to train = P x time to train (h); energy =
  W x time to train (h) / 1000 kWh.
* inference (Mochi): a video is ``sampling_steps x cfg_passes`` DiT forwards (samples), so
  videos/h = samples/s x 3600 / (sampling_steps x cfg_passes); USD per video = P / videos/h; the
  fleet meeting a demand of D videos/h needs ceil(D / videos/h) copies of the option.

Ranges: ``*_low``/``*_high`` use the low/high price at the nominal throughput; ``*_best``/``*_worst``
also move throughput over the device profiles' disagreeing figures and, for a prior (never
calibrated) profile, its matmul efficiency +/-20% (:mod:`reports.uncertainty`). Each row's
``profiles`` says per device kind whether its profile is calibrated or a prior; ``df.attrs["profiles"]``
lists every device kind of the report with its status and origin
(:mod:`hardware_profiles.calibration`).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any

import pandas as pd

from zoo.costing import workload as make_workload
from ir import DataParallelPlan
from zoo.model_files import resolve_model
from hardware_profiles.calibration import calibration_origin, calibration_status
from planner import Goal, PlanOptions
from planner import plan as run_plan
from planner.errors import PlannerError
from planner.precision import best_precision, precisions
from reports.citations import cite
from reports.errors import ReportError
from reports.pricing import (
    cluster_power_watts,
    cluster_price,
    figure_rows,
    parse_prices,
)
from reports.recommend import pareto_front, recommendation
from reports.sweep import SweepResult, SweepSpec, generate, parse_spec
from reports.uncertainty import alternatives_outcomes
from simulator.plan_sim import plan_cluster, plan_meshes, simulate_any
from hardware_profiles.carve import GroupShape
from reports.spec import Option, OptionLike, read_yaml, to_option

DEFAULT_GLOBAL_BATCH = 256
"""Samples per training step when none is given (2M tokens at sequence length 8192), as ``mpmd plan``."""
DEFAULT_TIME_LIMIT_S = 10.0
"""Planner wall-clock budget per option when neither the option nor the caller sets one, s."""
HEADROOM = 0.1
"""Fraction of device memory the planner keeps free (PlanOptions default)."""

Progress = Callable[[int, int, str], None]


def _mesh_summary(plan, cluster, idle: bool = True) -> str:
    """E.g. ``8 meshes: 8 x h100-sxm(8) DP1xTP8`` (meshes in pipeline order, runs collapsed; with
    ``idle``, how many of the cluster's meshes the plan leaves idle); for a data-parallel plan each
    part's, ``" | "``-separated. ``cluster`` is the one the plan runs on."""
    if isinstance(plan, DataParallelPlan):
        text = " | ".join(f"part {i + 1}: {_mesh_summary(p, cluster, idle=False)}"
                          for i, p in enumerate(plan.parts))
        n, total = len(plan_meshes(plan)), len(cluster.meshes)
        return text + (f" ({total - n} of {total} meshes idle)" if idle and n < total else "")
    parts: list[list[Any]] = []
    for m in plan.rank_mesh:
        lay = plan.layouts[m]
        dev, n = plan.devices.get(m, (cluster.meshes[m].device.name, cluster.meshes[m].num_devices))
        rc = " recompute" if plan.recompute.get(m) else ""
        key = f"{dev}({n}) DP{lay.data}xTP{lay.tensor}{' FSDP' if lay.fsdp else ''}{rc}"
        if parts and parts[-1][1] == key:
            parts[-1][0] += 1
        else:
            parts.append([1, key])
    n, total = len(plan.rank_mesh), len(cluster.meshes)
    used = f" (of {total}; the others idle)" if idle and n < total else ""
    return f"{n} mesh{'es' if n > 1 else ''}{used}: " + ", ".join(f"{k} x {key}" for k, key in parts)


def _layout_text(layouts) -> str:
    """Distinct layouts, compact: ``tp8``, ``dp2 tp4``, ``dp8 fsdp`` (``/``-separated)."""
    out = []
    for lay in layouts:
        bits = ([f"dp{lay.data}"] if lay.data > 1 else []) + ([f"tp{lay.tensor}"] if lay.tensor > 1 else [])
        text = " ".join(bits + (["fsdp"] if lay.fsdp else [])) or "dp1"
        if text not in out:
            out.append(text)
    return "/".join(out)


def shape_summary(plan, cluster) -> str:
    """The chosen shape in one line.

    A plan carved from node groups: per group, its meshes and the nodes each spans, then the
    layouts, e.g. ``h100: 4 x (2 nodes x 8), dp2 tp8``. A data-parallel plan: each part's with its
    batch share, e.g. ``96 samples: h100: ... | 32 samples: tpu: ...``. A plan on a cluster that
    lists its meshes: per device kind, e.g. ``h100-sxm: 8 x 8, tp8``.
    """
    if isinstance(plan, DataParallelPlan):
        return " | ".join(f"{p.global_batch} samples: {shape_summary(p, cluster)}" for p in plan.parts)
    out = []
    if plan.carving:
        for c in plan.carving:
            shape = GroupShape.from_json(c)
            g = cluster.groups.get(shape.group)
            mine = [m for m in plan.rank_mesh if m.startswith(f"{shape.group}.")]
            desc = shape.describe(g.devices_per_node) if g is not None else f"{len(mine)} meshes"
            out.append(f"{shape.group}: {desc}, {_layout_text(plan.layouts[m] for m in mine)}")
        return "; ".join(out)
    kinds: dict[str, list[str]] = {}
    for m in plan.rank_mesh:
        kinds.setdefault(plan.devices.get(m, (cluster.meshes[m].device.name, 0))[0]
                         or cluster.meshes[m].device.name, []).append(m)
    for dev, ms in kinds.items():
        sizes = sorted({cluster.meshes[m].num_devices for m in ms})
        out.append(f"{dev}: {len(ms)} x {'/'.join(map(str, sizes))}, "
                   f"{_layout_text(plan.layouts[m] for m in ms)}")
    return "; ".join(out)


def _devices(cluster) -> str:
    count: dict[str, int] = {}
    for m in cluster.meshes.values():
        count[m.device.name] = count.get(m.device.name, 0) + m.num_devices
    return " + ".join(f"{n} {d}" for d, n in count.items())


def profile_rows(clusters: Iterable[Any]) -> list[dict[str, str]]:
    """Every device kind of ``clusters`` (first-seen order) as ``{"device", "status", "origin"}``:
    "calibrated" or "prior" and where its matmul efficiency came from
    (:func:`hardware_profiles.calibration.calibration_origin`)."""
    seen: dict[str, dict[str, str]] = {}
    for c in clusters:
        for m in c.meshes.values():
            d = m.device
            seen.setdefault(d.name, {"device": d.name, "status": calibration_status(d),
                                     "origin": cite(calibration_origin(d))})
    return list(seen.values())


def _base_row(opt: Option, prices: Mapping[str, tuple[float, float]]) -> dict[str, Any]:
    lo, hi, _ = cluster_price(opt.cluster, prices)
    return {"option": opt.label, "cluster": opt.cluster.name, "devices": _devices(opt.cluster),
            "profiles": "; ".join(f"{r['device']} {r['status']}" for r in profile_rows([opt.cluster])),
            "num_devices": opt.cluster.num_devices, "feasible": False, "reason": "",
            "usd_per_hour_low": lo, "usd_per_hour_high": hi,
            "power_kw": cluster_power_watts(opt.cluster) / 1e3, "note": opt.note,
            "plan": None, "sim": None}


def _metrics(row: dict[str, Any], res, sim, outcomes, cfg, w, cluster, tokens: float | None,
             demand: float | None, deadline_days: float | None) -> None:
    """Fill ``row`` with the rates and costs of a feasible option (see the module docstring).
    ``cluster`` is the one the plan runs on (:func:`simulator.plan_sim.plan_cluster`)."""
    p, pred = res.plan, res.prediction
    T = sim.step_time_s
    fits = [o for o in outcomes if o.fits]
    t_best = min([T] + [T * o.step_time_s / o.base_step_time_s for o in fits])
    t_worst = max([T] + [T * o.step_time_s / o.base_step_time_s for o in fits])
    lo, hi = row["usd_per_hour_low"], row["usd_per_hour_high"]
    parts = p.parts if isinstance(p, DataParallelPlan) else (p,)
    row.update({
        "feasible": True,
        "meshes": _mesh_summary(p, cluster),
        "shape": shape_summary(p, cluster), "pipelines": len(parts), "carved": bool(p.carving),
        "stages": sum(len(x.stages) for x in parts),
        "schedule": " | ".join(f"{x.schedule.name} x {x.microbatches}" for x in parts)
                    if len(parts) > 1 else p.schedule.name,
        "microbatches": sum(x.microbatches for x in parts),
        "step_time_s": T, "predicted_step_time_s": pred.step_time_s,
        "mfu": sim.mfu, "bubble_mean": sum(sim.bubble.values()) / len(sim.bubble),
        "bubble_max": max(sim.bubble.values()),
        "memory_headroom": min(1 - sim.peak_memory_bytes[m] / cluster.meshes[m].device.memory_bytes
                               for m in plan_meshes(p)),
        "samples_per_s": p.global_batch / T,
        "alternatives": "; ".join(o.describe() for o in outcomes if o.changes),
        "alternatives_fit": all(o.fits for o in outcomes),
        "alternatives_nofit": "; ".join(o.describe().split(" (")[0] for o in outcomes if not o.fits),
        "solver_status": p.search.status,
        "solver_gap": p.search.gap if p.search.gap is not None else math.nan,
        "sim_errors": "; ".join(sim.errors),
    })
    hours = lambda seconds: seconds / 3600.0
    if w.training:
        tok = p.global_batch * p.seq_len
        tps, tps_best, tps_worst = tok / T, tok / t_best, tok / t_worst
        row.update({"tokens_per_s": tps, "tokens_per_s_best": tps_best, "tokens_per_s_worst": tps_worst,
                    "usd_per_mtok_low": lo / (tps * 3600) * 1e6,
                    "usd_per_mtok_high": hi / (tps * 3600) * 1e6,
                    "usd_per_mtok_best": lo / (tps_best * 3600) * 1e6,
                    "usd_per_mtok_worst": hi / (tps_worst * 3600) * 1e6,
                    "tokens_per_usd": tps * 3600 / lo if lo > 0 else math.nan})
        if tokens:
            secs, s_best, s_worst = tokens / tps, tokens / tps_best, tokens / tps_worst
            row.update({"time_to_train_days": secs / 86400, "time_to_train_days_best": s_best / 86400,
                        "time_to_train_days_worst": s_worst / 86400,
                        "cost_to_train_usd_low": lo * hours(secs), "cost_to_train_usd_high": hi * hours(secs),
                        "cost_to_train_usd_best": lo * hours(s_best),
                        "cost_to_train_usd_worst": hi * hours(s_worst),
                        "energy_kwh": row["power_kw"] * hours(secs)})
            if deadline_days:
                row["meets_deadline"] = secs / 86400 <= deadline_days
                row["meets_deadline_worst"] = s_worst / 86400 <= deadline_days
    else:
        per_video = cfg.sampling_steps * cfg.cfg_passes
        vph = p.global_batch / T * 3600 / per_video
        vph_best = p.global_batch / t_best * 3600 / per_video
        vph_worst = p.global_batch / t_worst * 3600 / per_video
        row.update({"videos_per_hour": vph, "videos_per_hour_best": vph_best,
                    "videos_per_hour_worst": vph_worst,
                    "seconds_per_video": 3600 / vph,
                    "usd_per_video_low": lo / vph, "usd_per_video_high": hi / vph,
                    "usd_per_video_best": lo / vph_best, "usd_per_video_worst": hi / vph_worst,
                    "videos_per_usd": vph / lo if lo > 0 else math.nan,
                    "energy_kwh_per_video": row["power_kw"] / vph})
        if demand:
            n, n_worst = math.ceil(demand / vph - 1e-9), math.ceil(demand / vph_worst - 1e-9)
            row.update({"replicas": n, "replicas_worst": n_worst,
                        "fleet_usd_per_hour_low": n * lo, "fleet_usd_per_hour_high": n * hi,
                        "fleet_usd_per_hour_worst": n_worst * hi})


@functools.lru_cache(maxsize=4)
def _mochi_components(frames: int, steps: int) -> tuple:
    """The Mochi pipeline's components, traced once per what-if (``zoo.mochi_pipeline``)."""
    from zoo.mochi_pipeline import components

    return components("mochi", frames, steps)


def latency_row(cluster, cfg) -> dict[str, Any]:
    """The latency plan of one whole Mochi video at batch 1 on ``cluster``
    (:func:`planner.video.plan_video` over ``zoo.mochi_pipeline``'s encoder, ``cfg``'s DiT steps
    and the decoder): ``latency_s_per_video`` and ``latency_plan`` (each component's layout), or
    ``latency_reason`` when no assignment fits."""
    from planner.video import plan_video

    frames = 6 * (cfg.latent_frames - 1) + 1
    try:
        vp = plan_video(_mochi_components(frames, cfg.sampling_steps), cluster, HEADROOM)
    except PlannerError as e:
        return {"latency_s_per_video": math.nan, "latency_reason": str(e).splitlines()[0]}
    return {"latency_s_per_video": vp.seconds_per_video,
            "latency_plan": "; ".join(f"{o.component} {o.describe()} {o.total_s:.1f} s"
                                      for o in vp.components)}


def whatif(model: str, options: Iterable[OptionLike] = (), *, sweep: SweepSpec | Mapping | str | None = None,
           global_batch: int | None = None, seq_len: int | None = None, tokens: float | None = None,
           videos_per_hour: float | None = None, deadline_days: float | None = None,
           prices: Iterable[str] | Mapping[str, Any] | None = None,
           time_limit_s: float | None = None, title: str | None = None,
           progress: Progress | None = None, base_dir=None,
           precision: str = "bf16") -> pd.DataFrame:
    """Plan, simulate and cost every option; one DataFrame row per option.

    Args:
        model: zoo model name (``zoo.list_models()``), a shipped config's name or a model file
            (``zoo.model_files.resolve_model``).
        options: cluster paths / bundled stems, :class:`~hardware_profiles.types.Cluster` objects,
            :class:`~reports.spec.Option` objects, or mappings ``{cluster, label, time_limit_s, ...}``.
        sweep: a budget sweep (:class:`~reports.sweep.SweepSpec`, its YAML mapping, or a path);
            its generated clusters are appended to ``options``.
        global_batch / seq_len: samples per step and tokens per sample (defaults: 256 for training,
            one video = ``sampling_steps x cfg_passes`` samples for Mochi; the model's seq_len).
        tokens: training token budget (time/cost/energy to train). videos_per_hour: inference
            demand (fleet size). deadline_days: the training deadline the recommendation checks.
        prices: USD per device-hour overrides, ``["h100-sxm=2:3"]`` or ``{"h100-sxm": (2, 3)}``.
        time_limit_s: planner budget per option, s (an option's own ``time_limit_s`` wins).
        progress: called ``(done, total, label)`` before each option and once at the end.
        precision: the training precision recipe every option plans in
            (:data:`ir.precision.PRECISIONS`), or ``"auto"``: one search per recipe all of an
            option's device kinds run, the fastest kept (:mod:`planner.precision`). An option
            whose devices do not run the named recipe is infeasible with that reason. The
            ``precision`` column says which recipe each row's plan runs.

    Returns:
        DataFrame, one row per option in input order; infeasible options have ``feasible=False``
        and the planner's one-line ``reason``. Object columns ``plan`` and ``sim`` hold the
        :class:`~ir.Plan` (or :class:`~ir.DataParallelPlan`) and
        :class:`~simulator.engine.SimResult` (None when infeasible). ``shape`` is the chosen shape
        in one line (:func:`shape_summary`: carved meshes, replicas, batch shares), ``pipelines``
        the number of data-parallel pipelines (1 for one pipeline), ``carved`` whether the plan
        carved node groups into meshes. ``profiles`` says per device kind whether its profile is
        calibrated or a prior (a prior widens the best/worst range, :mod:`reports.uncertainty`).
        ``df.attrs`` holds the run's context: model, kind, workload, prices and their sources,
        the device profiles' calibration (:func:`profile_rows`), Pareto frontier,
        recommendation, sweep summary.

    Raises:
        ReportError: no options, a bad option, sweep spec or price.
        zoo.ZooError: unknown model.
    """
    price_map = parse_prices(prices)
    opts = [to_option(o, base_dir) for o in options]
    sweep_res: SweepResult | None = None
    if sweep is not None:
        spec = sweep if isinstance(sweep, SweepSpec) else parse_spec(
            read_yaml(sweep, "sweep") if isinstance(sweep, str) else sweep)
        sweep_res = generate(spec, price_map)
        opts += [Option(c.cluster, c.label, max_tensor=c.max_tensor) for c in sweep_res.kept]
    if not opts:
        raise ReportError("no options to compare; pass --options CLUSTER.yaml ... or --sweep SPEC.yaml")
    cfg = resolve_model(model)
    if global_batch is None:
        global_batch = DEFAULT_GLOBAL_BATCH if cfg.training else cfg.sampling_steps * cfg.cfg_passes
    w = make_workload(cfg, global_batch=global_batch, seq_len=seq_len)
    default_tl = time_limit_s or DEFAULT_TIME_LIMIT_S
    rows = []
    for i, opt in enumerate(opts):
        if progress:
            progress(i, len(opts), opt.label)
        row = _base_row(opt, price_map)
        po = PlanOptions(time_limit_s=opt.time_limit_s or default_tl,
                         schedules=opt.schedules, microbatches=opt.microbatches,
                         max_tensor=opt.max_tensor or PlanOptions().max_tensor, headroom=HEADROOM)
        t0 = time.monotonic()
        try:
            tried = [run_plan(replace(w, precision=r), opt.cluster, po)
                     for r in precisions(precision, opt.cluster, w.training)]
            res = best_precision(tried, Goal())
        except PlannerError as e:
            row["reason"] = str(e).splitlines()[0]
            row["plan_wall_s"] = time.monotonic() - t0
            rows.append(row)
            continue
        row["plan_wall_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        lc = plan_cluster(res.plan, opt.cluster)      # carved as the plan says (node groups)
        wr = replace(w, precision=res.plan.precision)
        sim = simulate_any(res.plan, wr, lc)
        row["sim_wall_s"] = time.monotonic() - t1
        outcomes = alternatives_outcomes(res.plan, wr, lc, headroom=HEADROOM)
        row["plan"], row["sim"] = res.plan, sim
        row["precision"] = res.plan.precision
        _metrics(row, res, sim, outcomes, cfg, wr, lc, tokens, videos_per_hour, deadline_days)
        if cfg.family == "mochi":
            row.update(latency_row(opt.cluster, cfg))
        rows.append(row)
    if progress:
        progress(len(opts), len(opts), "done")
    clusters = [o.cluster for o in opts]
    df = pd.DataFrame(rows)
    df.attrs.update({
        "model": cfg.name, "kind": "training" if cfg.training else "inference",
        "title": title or f"What-if: {cfg.name}",
        "global_batch": w.global_batch, "seq_len": w.seq_len, "tokens": tokens,
        "precision": precision,
        "videos_per_hour": videos_per_hour, "deadline_days": deadline_days,
        "samples_per_video": cfg.sampling_steps * cfg.cfg_passes if not cfg.training else None,
        "time_limit_s": default_tl, "headroom": HEADROOM,
        "price_overrides": {k: list(v) for k, v in price_map.items()},
        "figures": figure_rows(clusters, price_map),
        "profiles": profile_rows(clusters),
        "sweep": None if sweep_res is None else {
            "budget_usd_per_hour": sweep_res.spec.budget_usd_per_hour,
            "kept": len(sweep_res.kept), "over_budget": sweep_res.over_budget,
            "too_many_types": sweep_res.too_many_types,
            "cut_by_max_options": sweep_res.cut_by_max_options,
            "max_device_types": sweep_res.spec.max_device_types},
    })
    df.attrs["pareto"] = pareto_front(df)
    df.attrs["recommendation"] = recommendation(df)
    return df
