"""Rendering and writing of CLI outputs: the plan table (pipeline and data-parallel plans, carved
meshes, schedule candidates), JSON Schema validation, atomic writes."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from ir.files import write_atomic  # noqa: F401  (moved to ir.files; re-exported for old imports)

from ir import CROSS_ENTROPY, SearchReport
from ir.workload import ATTENTION_KERNELS
from ir.plan_file import SCHEMA_PATH
from mpmd.cli.plan_search import search_block

if TYPE_CHECKING:   # the planner loads OR-Tools: the commands import it only when they run
    from hardware_profiles.types import Cluster
    from ir import DataParallelPlan, Plan, Workload
    from planner import PlanResult
    from collections.abc import Sequence

    from zoo.config import ModelConfig


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validate_plan_json(doc: dict[str, Any]) -> None:
    """Check a plan dict (a pipeline plan or a data-parallel plan, as
    :func:`ir.any_plan_to_json` writes them) against ``ir/plan.schema.json``
    (raises jsonschema.ValidationError)."""
    import jsonschema

    jsonschema.validate(doc, plan_schema())


def params_text(n: int) -> str:
    """A parameter count in billions or millions: ``"70.6B"``, ``"27.5M"``, ``"0.3M"``."""
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def model_origin(model: str) -> str:
    """Where a ``--model`` value's model comes from: ``"the zoo"``, a shipped config
    (``"zoo/configs/DeepSeek-V3.json"``) or the model file as given."""
    from zoo.config import list_models
    from zoo.model_files import is_model_file, shipped_models

    if is_model_file(model):
        return model
    shipped = shipped_models().get(model.lower())
    if model not in list_models() and shipped is not None:
        return f"zoo/configs/{shipped.name}"
    return "the zoo"


def devices_text(cluster: Cluster) -> str:
    """A cluster's devices by kind, e.g. ``"48 devices: 16 h100-sxm (2 meshes of 8), 32
    blackhole-p150b (4 meshes of 8)"``; a cluster of node groups counts nodes."""
    units: dict[str, list[tuple[int, int]]] = {}    # device -> (nodes or meshes, devices each)
    if cluster.groups:
        unit = "node"
        for g in cluster.groups.values():
            units.setdefault(g.device.name, []).append((g.nodes, g.devices_per_node))
    else:
        unit = "mesh"
        for m in cluster.meshes.values():
            units.setdefault(m.device.name, []).append((1, m.num_devices))
    parts, total = [], 0
    for device, us in units.items():
        n, count, sizes = sum(a * b for a, b in us), sum(a for a, _ in us), {b for _, b in us}
        total += n
        plural = unit + ("es" if unit == "mesh" else "s") if count != 1 else unit
        each = f" of {sizes.pop()}" if len(sizes) == 1 else ""
        parts.append(f"{n:,} {device} ({count:,} {plural}{each})")
    return f"{total:,} device{'s' * (total != 1)}: " + ", ".join(parts)


def plan_inputs(model: str, cfg: ModelConfig, workload: Workload, cluster: Cluster, *,
                batch_given: bool, seq_given: bool) -> Group:
    """What ``mpmd plan`` plans, printed before the plan: the model (its parameters, total and
    active per token, and dtype), the global batch and sequence length (each said to be a default,
    and whose, when the flag was not given) and the cluster's devices by kind (for a mesh listing,
    how the planner reads it: as node groups, or as listed and why, in one line). ``model`` is the
    ``--model`` value, ``cfg`` the model it names and ``workload`` its traced step."""
    from zoo import active_param_count, param_count
    from zoo.model_files import SEQ_LEN_CAP
    from hardware_profiles.carve import listing_reading

    where = model_origin(model)
    total, active = param_count(cfg), active_param_count(cfg)
    params = f"{params_text(total)} parameters" + (
        f" ({params_text(active)} active per token)" if active != total else "")
    b, s = workload.global_batch, workload.seq_len
    samples = f"{b:,} sample{'s' * (b != 1)}"
    if batch_given:
        batch = f"{samples} (--global-batch)"
    elif cfg.training:
        batch = f"{samples} (mpmd plan's default; --global-batch sets it)"
    elif cfg.family == "mochi":
        batch = (f"{samples}: one video, {cfg.sampling_steps} sampling steps x "
                 f"{cfg.cfg_passes} guidance passes (the default; --global-batch sets it)")
    else:
        batch = f"{samples}: one request (the default; --global-batch sets it)"
    if seq_given:
        seq = "--seq-len"
    elif cfg.family == "mochi":
        seq = "the model's: latent video and text tokens"
    elif where == "the zoo":
        seq = "default: the zoo model's"
    elif where.lower().endswith(".json"):
        seq = f"default: the config's context length, at most {SEQ_LEN_CAP:,}"
    else:
        seq = "default: the model spec's"
    t = Table.grid(padding=(0, 2))
    t.add_column()
    t.add_column()
    for k, v in (("model", f"{cfg.name} from {where}: {params} in {cfg.dtype}"),
                 ("layers", layers_text(workload.layers)),
                 ("global batch", batch),
                 ("sequence length", f"{s:,} tokens per sample ({seq})"),
                 ("tokens per step", f"{b * s:,}"),
                 *((("precision", precision_text(workload.precision)),) if cfg.training else ()),
                 *((("loss", f"{workload.cross_entropy}: {CROSS_ENTROPY[workload.cross_entropy].describe} "
                    f"(--cross-entropy)"),) if cfg.training and workload.cross_entropy != "fused"
                   else ()),
                 *((("attention", f"{cfg.attention_kernel}: {ATTENTION_KERNELS[cfg.attention_kernel].split(':')[0]} "
                    f"(--attention-kernel)"),) if cfg.attention_kernel != "flash" else ()),
                 ("cluster", f"{cluster.name}, {devices_text(cluster)}"),
                 *((("read", reading),) if (reading := listing_reading(cluster)) else ())):
        t.add_row(k, escape(v))
    return _titled("inputs", t)


def layers_text(layers: tuple[str, ...]) -> str:
    """The layer numbers the stage table's ``layers`` column counts, as runs of one kind:
    ``"82 in the stage table: 0 embedding, 1-80 decoder blocks, 81 head"``. Layers are the
    workload's (``ir.Workload.layers``: the embedding and the head count as layers of their own,
    so an 80-block model's stages cover layers 0-81)."""
    kinds = {"embed": "embedding", "head": "head", "decoder_block": "decoder blocks",
             "block": "decoder blocks"}
    runs: list[list[Any]] = []
    for i, name in enumerate(layers):
        kind = re.sub(r"[_.]?\d+$", "", name)
        if runs and runs[-1][0] == kind:
            runs[-1][2] = i
        else:
            runs.append([kind, i, i])
    parts = []
    for k, a, b in runs:
        what = kinds.get(k, k.replace("_", " "))
        if a == b:
            parts.append(f"{a} {what.removesuffix('s') if what.endswith('blocks') else what}")
        else:
            parts.append(f"{a}-{b} {what if what.endswith('s') else what + 's'}")
    if len(parts) > 6:
        parts = parts[:3] + ["...", parts[-1]]
    return f"{len(layers)} in the stage table: " + ", ".join(parts)


def precision_text(name: str) -> str:
    """A recipe as the plan's inputs print it: ``"fp8: FP8 E4M3/E5M2 with one scale per tensor
    ...; attention, norms, embedding and LM head in bf16 (--precision)"``, or for BF16 that it is
    the default."""
    from ir.precision import recipe

    r = recipe(name)
    if not r.low_precision:
        return "bf16: every GEMM in the model's dtype (the default; --precision sets it)"
    return f"{r.name}: {r.describe}; attention, norms, embedding and LM head in bf16 (--precision)"


def recipe_origin(cluster: "Cluster", recipe: str) -> str:
    """Where the cluster's devices' efficiency for ``recipe`` comes from: ``"prior"`` if any
    device's is a prior, ``"fitted"`` if every one was fitted on published runs, else
    ``"measured"``; ``"-"`` for BF16 (the profiles' own calibration)."""
    from hardware_profiles import recipe_origin as device_origin

    if recipe == "bf16":
        return "-"
    specs = cluster.groups.values() if cluster.groups else cluster.meshes.values()
    kinds = {device_origin(s.device, recipe) for s in specs}
    for kind in ("prior", "derived", "measured"):     # the weakest origin among the devices
        if kind in kinds:
            return kind
    return "fitted"


def precision_table(results: "Sequence[PlanResult]", chosen: "PlanResult",
                    cluster: "Cluster") -> Group:
    """``mpmd plan --precision auto``'s comparison: one row per recipe searched, its replayed
    step, tokens per second, MFU (against that recipe's peak), its speed-up over the first
    (BF16) and where the devices' efficiency for it comes from (:func:`recipe_origin`: a prior
    is a guess until published runs in that recipe fit it), the chosen one marked."""
    t = Table(show_edge=False, pad_edge=False)
    for h in ("precision", "step (s)", "tokens/s", "MFU", "vs " + results[0].plan.precision,
              "efficiency"):
        t.add_column(h, justify="left" if h in ("precision", "efficiency") else "right")
    base = results[0].prediction.step_time_s
    for r in results:
        p = r.prediction
        mark = " (chosen)" if r is chosen else ""
        t.add_row(escape(r.plan.precision + mark), f"{p.step_time_s:.3f}",
                  f"{p.tokens_per_s:,.0f}", f"{p.mfu * 100:.1f}%",
                  f"{base / p.step_time_s:.2f}x" if p.step_time_s > 0 else "-",
                  recipe_origin(cluster, r.plan.precision))
    return _titled("precisions searched", t)


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f}"


def search_gap_text(search: SearchReport) -> str:
    """The search-wide gap of a plan's :class:`~ir.SearchReport`, or why it is unknown: "gap
    12.3%" or "gap unknown: 7 of 12 candidates not searched" (their bound was never computed)."""
    total, done = search.candidates_total, search.candidates
    if total is not None and done is not None and done < total:
        return f"gap unknown: {total - done} of {total} candidates not searched"
    if search.search_gap is None:
        return "gap unknown"
    return f"gap {search.search_gap * 100:.1f}%"


def _num(x: Any, fmt: str, default: str = "-") -> str:
    """``fmt`` of a number, or ``default`` for anything else (a record the planner left out)."""
    return fmt.format(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else default


def mesh_spans(plan: Plan | DataParallelPlan, cluster: Cluster) -> dict[str, str]:
    """For a plan carved from node groups: mesh -> the nodes it spans and its devices, e.g.
    ``"nodes 0-1 (2 x 8 h100-sxm)"`` or ``"node 3, slice 2 of 2 (4 h100-sxm)"``; empty for a plan
    on a cluster that lists its meshes. ``cluster`` is the carved one
    (:func:`simulator.plan_sim.plan_cluster`): it keeps the node groups it was carved from, those
    of a mesh listing the planner shaped included."""
    from hardware_profiles.carve import GroupShape

    out: dict[str, str] = {}
    for c in getattr(plan, "carving", ()):
        shape = GroupShape.from_json(c)
        g = cluster.groups.get(shape.group)
        if g is None:
            continue
        per = g.devices_per_node // shape.meshes_per_node
        for j in range(shape.num_meshes):
            first, n, part = shape.mesh_nodes(j)
            where = f"node {first}" if n == 1 else f"nodes {first}-{first + n - 1}"
            if shape.meshes_per_node > 1:
                where += f", slice {part + 1} of {shape.meshes_per_node}"
            devs = f"{n} x {per}" if n > 1 else f"{per}"
            out[f"{shape.group}.{j}"] = f"{where} ({devs} {g.device.name})"
    return out


def carving_text(plan: Plan | DataParallelPlan, cluster: Cluster) -> str:
    """The carving in one line, e.g. ``"h100: 4 x (2 nodes x 8) of 8 nodes"``; "" when none."""
    from hardware_profiles.carve import GroupShape

    out = []
    for c in getattr(plan, "carving", ()):
        shape = GroupShape.from_json(c)
        g = cluster.groups.get(shape.group)
        if g is None:
            continue
        out.append(f"{shape.group}: {shape.describe(g.devices_per_node)} of {g.nodes} nodes")
    return "; ".join(out)


def meshes_table(plan: Plan, cluster: Cluster) -> Group | None:
    """The logical meshes of a carved plan: the nodes each spans, its devices, the data-parallel
    replicas of its stage (the layout's data degree: pipeline replicas running the stage side by
    side) and its layout; None for a plan that is not carved."""
    spans = mesh_spans(plan, cluster)
    if not spans:
        return None
    t = Table()
    for col in ("mesh", "spans", "data-parallel replicas", "layout"):
        t.add_column(col, justify="right" if col == "data-parallel replicas" else "left")
    for m in plan.rank_mesh:
        t.add_row(escape(m), escape(spans.get(m, "-")), str(plan.layouts[m].data),
                  str(plan.layouts[m]) + (" recompute" if plan.recompute.get(m) else ""))
    return _titled(f"meshes carved from node groups: {carving_text(plan, cluster)}", t)


def _titled(title: str, table: Table) -> Group:
    """``table`` under a title line as wide as the console (rich wraps a table's own title to the
    table's width, which breaks a long title of a narrow table into a column of words)."""
    return Group(Text(title, style="table.title"), table)


MAX_CANDIDATE_ROWS = 12
"""Rows of the schedule candidate table shown (the rest are counted)."""


def schedules_table(plan: Plan) -> Group | None:
    """The candidate table of a plan (``Plan.schedules``: every schedule and microbatch count the
    search solved for the chosen shape, best first, at their analytic contention-free estimates:
    the plan's step time is the chosen one's discrete-event replay), compact; None when the plan
    has none."""
    rows = list(getattr(plan, "schedules", ()))
    if not rows:
        return None
    times = [r.get("step_time_s") for r in rows]
    best = min((x for x in times if isinstance(x, (int, float))), default=None)
    t = Table()
    for col in ("schedule", "microbatches", "estimate (s)", "vs best"):
        t.add_column(col, justify="left" if col == "schedule" else "right")
    for r in rows[:MAX_CANDIDATE_ROWS]:
        x = r.get("step_time_s")
        ok = isinstance(x, (int, float))
        t.add_row(escape(str(r.get("schedule", "?"))), str(r.get("microbatches", "?")),
                  f"{x:.4g}" if ok else "does not fit",
                  f"{(x / best - 1) * 100:+.1f}%" if ok and best else "-")
    if len(rows) > MAX_CANDIDATE_ROWS:
        t.add_row(f"... {len(rows) - MAX_CANDIDATE_ROWS} more", "", "", "")
    return _titled("schedule candidates of this shape (contention-free estimates; the step time "
                   "above is the chosen one's replay)", t)


def _stages_table(title: str, plan: Plan, lc: Cluster, stage_times: Any, peak: Any,
                  cap: Any) -> Group:
    stages = Table()
    for col in ("stage", "layers", "mesh", "device", "layout", "compute/mb (ms)",
                "memory used / capacity (GB)"):
        stages.add_column(col, justify="right" if "(" in col else "left")
    times = list(stage_times) if isinstance(stage_times, (list, tuple)) else []
    for i, st in enumerate(plan.stages):
        mesh = lc.meshes[st.mesh]
        t = times[i] if i < len(times) else None
        used = peak.get(st.mesh) if isinstance(peak, dict) else None
        has = cap.get(st.mesh) if isinstance(cap, dict) else None
        has = has if isinstance(has, (int, float)) else mesh.device.memory_bytes
        stages.add_row(str(st.index), f"{st.first}-{st.last - 1}", escape(st.mesh),
                       f"{mesh.num_devices}x {mesh.device.name}", str(plan.layouts[st.mesh]),
                       _num(t * 1e3 if isinstance(t, (int, float)) else None, "{:.2f}"),
                       f"{_num(used / 1e9 if isinstance(used, (int, float)) else None, '{:.1f}')} / "
                       f"{_gb(has)}")
    return _titled(title, stages)


def goal_text(goal: Mapping[str, Any]) -> str:
    """The plan's cost and goal, e.g. ``"USD 0.0123 per step (USD 96.0/h for 40 devices: a100 40);
    goal: lowest cost per step at >= 2,000,000 tokens/s; 15 sub-clusters, 6 planned"``."""
    devices = goal.get("devices") or {}
    what = "lowest cost per step" if goal.get("kind") == "cost" else "shortest step"
    limits = []
    if goal.get("min_tokens_per_s") is not None:
        limits.append(f">= {goal['min_tokens_per_s']:,.0f} tokens/s")
    if goal.get("max_usd_per_hour") is not None:
        limits.append(f"<= USD {goal['max_usd_per_hour']:g}/h")
    return (f"USD {_num(goal.get('usd_per_step'), '{:.4f}')} per step (USD "
            f"{_num(goal.get('usd_per_hour'), '{:,.1f}')}/h for {sum(devices.values())} devices: "
            + ", ".join(f"{g} {n}" for g, n in devices.items())
            + f"); goal: {what}" + (f" at {' and '.join(limits)}" if limits else "")
            + f"; {goal.get('planned', 0)} of {goal.get('sub_clusters', 0)} sub-clusters planned"
            + (", the rest pruned by their bounds" if goal.get("planned", 0) < goal.get("sub_clusters", 0) else ""))


def _mean(d: Any) -> float | None:
    vals = [v for v in d.values() if isinstance(v, (int, float))] if isinstance(d, dict) else []
    return sum(vals) / len(vals) if vals else None


def profiles_line(plan: Plan | DataParallelPlan, cluster: Cluster) -> str:
    """One line saying, per device kind the plan uses (pipeline order), whether its profile is
    calibrated or a prior, e.g. ``"profiles: a100-80gb-sxm calibrated (fitted by `mpmd validate
    --fit` on 31 rows, MAPE 5.2%); blackhole-p150b prior (never fitted: predictions may be off by
    +/-20%)"`` (:func:`hardware_profiles.calibration.calibration_summary`). ``cluster`` is the one
    the plan runs on (:func:`simulator.plan_sim.plan_cluster`)."""
    from hardware_profiles.calibration import calibration_summary
    from simulator.plan_sim import plan_meshes

    return "profiles: " + calibration_summary(cluster.meshes[m].device for m in plan_meshes(plan)
                                              if m in cluster.meshes)


def plan_table(result: PlanResult, cluster: Cluster) -> Group:
    """A readable summary of a :class:`planner.PlanResult`: stages, then step-level metrics.

    The step table has the plan's one step time, its replay; the search's objective, proven bound
    and gap follow in a block of their own (:func:`mpmd.cli.plan_search.search_block`: the gap is
    unknown while candidates were left unsearched).

    A plan carved from node groups also gets a table of its logical meshes (the nodes each spans,
    the pipeline replicas its data axis carries) and its schedule candidate table. A
    :class:`~ir.DataParallelPlan` gets one section per part (its batch share, stages,
    meshes and candidates), then the step table with the gradient all-reduce across the parts and
    the planner's reason. A line under the step table says, per device kind, whether its profile
    is calibrated or a prior (:func:`profiles_line`). ``cluster`` is the cluster as loaded
    (:func:`simulator.plan_sim.plan_cluster` carves it as the plan says).
    """
    from ir import DataParallelPlan
    from simulator.plan_sim import plan_cluster

    p, pred = result.plan, result.prediction
    lc = plan_cluster(p, cluster)
    peak = getattr(pred, "peak_memory_bytes", None)
    cap = getattr(pred, "capacity_bytes", None)
    out: list[Any] = []
    if isinstance(p, DataParallelPlan):
        for i, part in enumerate(p.parts):
            pp = part.predicted
            share = part.global_batch / p.global_batch
            title = (f"{p.model} on {p.cluster}: part {i + 1} of {len(p.parts)}, {part.global_batch} of "
                     f"{p.global_batch} samples ({share * 100:.0f}%), {part.schedule.name} x "
                     f"{part.microbatches} microbatches of {part.global_batch // part.microbatches}"
                     + (" (last stage F+B merged)" if part.merge_last_stage else ""))
            part_peak = {**(pp.peak_memory_bytes if pp else {}), **(peak or {})}
            out.append(_stages_table(title, part, lc, pp.stage_time_s if pp else None, part_peak,
                                     {**(pp.capacity_bytes if pp else {}), **(cap or {})}))
            for extra in (meshes_table(part, lc), schedules_table(part)):
                if extra is not None:
                    out.append(extra)
    else:
        out.append(_stages_table(f"{p.model} on {p.cluster}: stages", p, lc,
                                 getattr(pred, "stage_time_s", None), peak, cap))
        t = meshes_table(p, lc)
        if t is not None:
            out.append(t)
    s = Table(title="step", title_justify="left", show_header=False)
    s.add_column("metric")
    s.add_column("value", justify="right")
    mean_bubble = _mean(getattr(pred, "bubble", None))
    rows: list[tuple[str, str]] = []
    if isinstance(p, DataParallelPlan):
        rows += [("data parallel", f"{len(p.parts)} pipelines, batch shares "
                                   + " + ".join(str(x.global_batch) for x in p.parts)
                                   + f" = {p.global_batch} samples"),
                 ("gradient sync across parts", f"{p.sync_bytes / 1e9:.2f} GB over {p.sync_link} in "
                                                f"{p.sync_s * 1e3:.1f} ms, before the optimizer")]
    else:
        rows += [("schedule", p.schedule.name + (" (last stage F+B merged)" if p.merge_last_stage else "")),
                 ("microbatches", f"{p.microbatches} x {p.global_batch // p.microbatches} samples")]
    reason = p.reason if isinstance(p, DataParallelPlan) else p.search.reason
    if reason:
        rows.append(("reason", reason))
    mfu = getattr(pred, "mfu", None)
    rows += [
        ("step time", f"{_num(getattr(pred, 'step_time_s', None), '{:.3f}')} s"),
        ("tokens/s", _num(getattr(pred, "tokens_per_s", None), "{:,.0f}")),
        ("MFU", _num(mfu * 100 if isinstance(mfu, (int, float)) else None, "{:.1f}%")),
        ("bubble (mean over meshes)",
         _num(mean_bubble * 100 if mean_bubble is not None else None, "{:.1f}%")),
        ("roofline bound", f"{_num(getattr(pred, 'roofline_step_time_s', None), '{:.3f}')} s"),
    ]
    if p.search.goal is not None:
        rows.append(("cost", goal_text(p.search.goal)))
    for k, v in rows:
        s.add_row(escape(k), escape(v))
    out.append(s)
    block = search_block(p.search, getattr(pred, "step_time_s", None))
    if block is not None:
        out.append(block)
    out.append(Text(profiles_line(p, lc)))
    if not isinstance(p, DataParallelPlan):
        t = schedules_table(p)
        if t is not None:
            out.append(t)
    return Group(*out)
