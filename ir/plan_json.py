"""Plans as JSON documents (format ``mpmd-plan/1``; schema ``ir/plan.schema.json``): writing and
parsing :class:`~ir.plan.Plan` and :class:`~ir.plan.DataParallelPlan`."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

from ir.errors import IRError
from ir.plan import DataParallelPlan, Layout, Plan, StagePlan
from ir.precision import RECIPES
from ir.workload import CROSS_ENTROPY
from ir.report import Prediction, SearchReport
from ir.schedule import FragmentRef, ScheduleTable


PLAN_FORMAT = "mpmd-plan/1"


def schedule_to_json(t: ScheduleTable, rank_mesh: tuple[str, ...]) -> dict[str, Any]:
    return {
        "name": t.name,
        "microbatches": t.microbatches,
        "num_stages": t.num_stages,
        "split_backward": t.split_backward,
        "forward_only": t.forward_only,
        "stage_rank": list(t.stage_rank),
        "order": {rank_mesh[r]: [f.to_json() for f in frags] for r, frags in enumerate(t.order)},
    }


def _header(plan: "Plan | DataParallelPlan") -> dict[str, Any]:
    """The keys every plan document starts with."""
    return {"format": PLAN_FORMAT, "model": plan.model, "cluster": plan.cluster,
            "cluster_path": plan.cluster_path, "global_batch": plan.global_batch,
            "seq_len": plan.seq_len,
            **({"precision": plan.precision} if plan.precision not in ("", "bf16") else {}),
            **({"cross_entropy": plan.cross_entropy} if plan.cross_entropy != "fused" else {}),
            **({"model_config": dict(plan.model_config)} if plan.model_config else {})}


def plan_to_json(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict following ``ir/plan.schema.json``."""
    return {
        **_header(plan),
        "merge_last_stage": plan.merge_last_stage,
        "grad_sync": plan.grad_sync,
        "stages": [{"index": s.index, "layers": [s.first, s.last], "mesh": s.mesh}
                   for s in plan.stages],
        "meshes": {m: {"device": plan.devices.get(m, ("", 0))[0],
                       "num_devices": plan.devices.get(m, ("", l.devices))[1],
                       "layout": {"data": l.data, "tensor": l.tensor, "fsdp": l.fsdp,
                                  **({"context": l.context,
                                      "context_method": l.context_method}
                                     if l.context > 1 else {}),
                                  **({"hsdp": l.hsdp} if l.hsdp > 1 else {}),
                                  **({"tp_overlap": True} if l.tp_overlap else {}),
                                  **({"expert": l.expert} if l.expert > 1 else {}),
                                  **({"expert_tensor": l.etp} if l.folded and l.expert > 1
                                     else {}),
                                  **({"expert_dispatch": l.expert_dispatch}
                                     if l.expert_dispatch != "alltoall" else {}),
                                  **({"grad_reduce": l.grad_reduce}
                                     if l.grad_reduce != "fp32" else {}),
                                  **({"optimizer_state": l.optimizer_state}
                                     if l.optimizer_state != "fp32" else {})},
                       "recompute": bool(plan.recompute.get(m, False))}
                   for m, l in plan.layouts.items()},
        "rank_mesh": list(plan.rank_mesh),
        "schedule": schedule_to_json(plan.schedule, plan.rank_mesh),
        "predicted": plan.predicted.to_json() if plan.predicted is not None else {},
        "solver": plan.search.to_json(),
        "carving": [dict(c) for c in plan.carving],
        "schedules": [dict(c) for c in plan.schedules],
    }


def data_parallel_to_json(plan: DataParallelPlan) -> dict[str, Any]:
    """A :class:`DataParallelPlan` as a JSON-ready dict: the parts as plans, plus the sync."""
    return {
        **_header(plan),
        "parts": [plan_to_json(p) for p in plan.parts],
        "sync": {"link": plan.sync_link, "bytes": plan.sync_bytes, "seconds": plan.sync_s},
        "reason": plan.reason,
        "predicted": plan.predicted.to_json() if plan.predicted is not None else {},
        "solver": plan.search.to_json(),
    }


def any_plan_to_json(plan: "Plan | DataParallelPlan") -> dict[str, Any]:
    """:func:`plan_to_json` or :func:`data_parallel_to_json`, whichever ``plan`` is."""
    return data_parallel_to_json(plan) if isinstance(plan, DataParallelPlan) else plan_to_json(plan)


@contextmanager
def _parsing() -> Iterator[None]:
    """Turn a missing key or a malformed value met while parsing a plan into one-line IRError."""
    try:
        yield
    except KeyError as e:
        raise IRError(f"plan is missing key {e.args[0]!r}; regenerate it with 'mpmd plan'") from None
    except (TypeError, ValueError) as e:
        if isinstance(e, IRError):
            raise
        raise IRError(f"plan has a malformed value ({e}); regenerate it with 'mpmd plan'") from None


def _prediction(d: Mapping[str, Any]) -> Prediction | None:
    """A plan dict's ``"predicted"`` object, or None when it has none (an empty object, as a
    hand-written plan or a data-parallel plan's part may)."""
    got = d.get("predicted")
    return Prediction.from_json(got) if got else None


def _named(d: Mapping[str, Any], key: str, known: Iterable[str], default: str, what: str) -> str:
    """A plan document's ``key`` (absent: ``default``), one of ``known``.

    Raises:
        IRError: another value, named with the known ones (``what`` says what they are).
    """
    got = str(d.get(key, default))
    if got not in known:
        raise IRError(f"plan {key} {got!r} is not {what}; fix: use one of {', '.join(known)}")
    return got


def _precision(d: Mapping[str, Any]) -> str:
    """A plan document's training precision recipe (absent: ``"bf16"``)."""
    return _named(d, "precision", RECIPES, "bf16", "a known recipe")


def _cross_entropy(d: Mapping[str, Any]) -> str:
    """A plan document's loss (absent: ``"fused"``, :data:`ir.workload.CROSS_ENTROPY`)."""
    return _named(d, "cross_entropy", CROSS_ENTROPY, "fused", "known")


def data_parallel_from_json(d: Mapping[str, Any]) -> DataParallelPlan:
    """Parse a dict written by :func:`data_parallel_to_json`.

    Raises:
        IRError: a missing key or inconsistent value, named in the message.
    """
    with _parsing():
        sync = d["sync"]
        return DataParallelPlan(
            model=str(d["model"]), cluster=str(d["cluster"]), global_batch=int(d["global_batch"]),
            seq_len=int(d["seq_len"]), parts=tuple(plan_from_json(p) for p in d["parts"]),
            sync_link=str(sync["link"]), sync_bytes=float(sync["bytes"]), sync_s=float(sync["seconds"]),
            predicted=_prediction(d), search=SearchReport.from_json(d.get("solver", {})),
            cluster_path=str(d.get("cluster_path", "")), reason=str(d.get("reason", "")),
            model_config=dict(d.get("model_config", {})), precision=_precision(d),
            cross_entropy=_cross_entropy(d))


def plan_from_json(d: Mapping[str, Any]) -> Plan:
    """Parse a plan dict (as written by :func:`plan_to_json`).

    Raises:
        IRError: a missing key or inconsistent value, named in the message.
    """
    with _parsing():
        rank_mesh = tuple(str(m) for m in d["rank_mesh"])
        s = d["schedule"]
        unknown = sorted(set(s["order"]) - set(rank_mesh))
        if unknown:
            raise IRError(f"plan schedule names mesh {unknown[0]!r}, which no pipeline rank uses "
                          f"(ranks: {list(rank_mesh)}); fix 'schedule.order' or 'rank_mesh'")
        order = tuple(tuple(FragmentRef.from_json(f) for f in s["order"].get(m, []))
                      for m in rank_mesh)
        table = ScheduleTable(
            name=str(s["name"]), num_ranks=len(rank_mesh), num_stages=int(s["num_stages"]),
            microbatches=int(s["microbatches"]), stage_rank=tuple(int(r) for r in s["stage_rank"]),
            order=order, split_backward=bool(s.get("split_backward", False)),
            forward_only=bool(s.get("forward_only", False)))
        stages = tuple(StagePlan(int(x["index"]), int(x["layers"][0]), int(x["layers"][1]),
                                 str(x["mesh"])) for x in d["stages"])
        try:
            layouts = {str(m): Layout(int(v["layout"]["data"]), int(v["layout"]["tensor"]),
                                      bool(v["layout"].get("fsdp", False)),
                                      int(v["layout"].get("hsdp", 1)),
                                      bool(v["layout"].get("tp_overlap", False)),
                                      int(v["layout"].get("expert", 1)),
                                      int(v["layout"].get("expert_tensor", 0)),
                                      str(v["layout"].get("expert_dispatch", "alltoall")),
                                      int(v["layout"].get("context", 1)),
                                      str(v["layout"].get("context_method", "ring")),
                                      str(v["layout"].get("grad_reduce", "fp32")),
                                      str(v["layout"].get("optimizer_state", "fp32")))
                       for m, v in d["meshes"].items()}
        except ValueError as e:
            raise IRError(f"plan layout: {e}") from None
        for st in stages:
            if st.mesh not in layouts:
                raise IRError(f"plan stage {st.index} names mesh {st.mesh!r}, which is not under "
                              f"'meshes' ({sorted(layouts)}); fix the stage's mesh")
        return Plan(model=str(d["model"]), cluster=str(d["cluster"]), stages=stages,
                    layouts=layouts, schedule=table, rank_mesh=rank_mesh,
                    merge_last_stage=bool(d.get("merge_last_stage", False)),
                    grad_sync=str(d.get("grad_sync", "step")),
                    global_batch=int(d["global_batch"]), seq_len=int(d["seq_len"]),
                    predicted=_prediction(d), search=SearchReport.from_json(d.get("solver", {})),
                    cluster_path=str(d.get("cluster_path", "")),
                    model_config=dict(d.get("model_config", {})), precision=_precision(d),
                    cross_entropy=_cross_entropy(d),
                    devices={str(m): (str(v.get("device", "")), int(v.get("num_devices", 0)))
                             for m, v in d["meshes"].items()},
                    recompute={str(m): bool(v.get("recompute", False))
                               for m, v in d["meshes"].items()},
                    carving=tuple({"group": str(c["group"]), "nodes": int(c["nodes"]),
                                   "nodes_per_mesh": int(c.get("nodes_per_mesh", 1)),
                                   "meshes_per_node": int(c.get("meshes_per_node", 1))}
                                  for c in d.get("carving", [])),
                    schedules=tuple(dict(c) for c in d.get("schedules", [])))
