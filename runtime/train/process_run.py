"""One process of ``mpmd run PLAN --processes N``: train the plan's meshes of this process.

Every process of a run calls :func:`run_worker` with the same plan and its own ``process_id``. The
plan's meshes are split over the processes in order (:func:`compiler.distributed.assign_meshes`);
a process starts ``jax.distributed`` with as many CPU devices as its meshes have and gloo as the CPU
collectives, compiles the whole training step exactly as the single-process ``mpmd run`` does
(:func:`runtime.train.run.compile_plan`, same seed, same parameters, same batches), and runs its
meshes' per-mesh programs with :func:`compiler.distributed.run_process`: activations and
gradients cross processes as two-device ``ppermute`` collectives. Each process updates (Adam) the
parameters of its own meshes. At the end every process's losses, step times, executed order and
timelines are gathered to process 0 over the same engine
(:func:`compiler.distributed.allgather`), which merges them into a
:class:`DistributedReport`, writes the merged Perfetto trace and the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import jax
import numpy as np
from rich.console import Console
from rich.table import Table

from compiler.distributed import (DistributedError, allgather, assign_meshes, barrier, prepare,
                                  process_topology, run_process)
from hardware_profiles.types import Cluster
from ir import Plan, Timeline, TimelineEvent
from ir.files import write_atomic
from runtime.train import check
from runtime.train.join import JOIN_TIMEOUT_S, ProcessRunError, roll_call, split_coordinator
from runtime.train.layouts import plan_mesh_axes
from runtime.train.step import (RunError, adam_init, adam_update, compile_plan, load_run_plan,
                                measured_step_time, run_cluster, split_microbatches)
from simulator.trace import write_chrome_trace

#: seconds a finished process waits at ``jax.distributed.shutdown`` for the others
SHUTDOWN_TIMEOUT_S = 60


@dataclass(frozen=True)
class DistributedReport:
    """What a multi-process ``mpmd run`` measured (SI units), merged over its processes.

    Attributes:
        plan_path: the plan file. processes: how many processes ran.
        groups: per process, its meshes.
        losses: the loss of each step (from the process holding the loss).
        step_times_s: per step, the last step end over all processes (one time axis: every step
            starts at a barrier of all processes).
        order: mesh -> the calls it executed in the last step.
        order_mismatches: meshes whose executed order differs from the plan (one line each).
        timelines: per step, the merged timeline of all processes.
    """

    plan_path: str
    processes: int
    groups: tuple[tuple[str, ...], ...]
    losses: tuple[float, ...]
    step_times_s: tuple[float, ...]
    order: Mapping[str, tuple[str, ...]]
    order_mismatches: tuple[str, ...]
    timelines: tuple[Timeline, ...] = field(default=(), repr=False)

    @property
    def measured_step_s(self) -> float:
        return measured_step_time(self.step_times_s)

    def to_json(self) -> dict[str, Any]:
        return {"plan_path": self.plan_path, "processes": self.processes,
                "groups": [list(g) for g in self.groups], "losses": list(self.losses),
                "step_times_s": list(self.step_times_s),
                "order": {m: list(v) for m, v in self.order.items()},
                "order_mismatches": list(self.order_mismatches),
                "timelines": [t.to_json() for t in self.timelines]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "DistributedReport":
        return DistributedReport(
            plan_path=d["plan_path"], processes=int(d["processes"]),
            groups=tuple(tuple(g) for g in d["groups"]), losses=tuple(d["losses"]),
            step_times_s=tuple(d["step_times_s"]),
            order={m: tuple(v) for m, v in d["order"].items()},
            order_mismatches=tuple(d["order_mismatches"]),
            timelines=tuple(timeline_from_json(t) for t in d["timelines"]))


def timeline_from_json(d: Mapping[str, Any]) -> Timeline:
    """The inverse of :meth:`ir.Timeline.to_json`."""
    return Timeline(tuple(TimelineEvent(**e) for e in d["events"]),
                    {m: tuple(tuple(p) for p in v) for m, v in d.get("memory", {}).items()})


def merge_timelines(timelines: list[Timeline]) -> Timeline:
    """One timeline of several processes' timelines of the same step (same time axis), events in
    start order."""
    events = sorted((e for t in timelines for e in t.events), key=lambda e: (e.start_s, e.track))
    memory: dict[str, tuple] = {}
    for t in timelines:
        memory.update(t.memory)
    return Timeline(tuple(events), memory)


def start_distributed(coordinator: str, processes: int, process_id: int, local_devices: int, *,
                      loopback: bool, join_timeout_s: float = JOIN_TIMEOUT_S,
                      say: Callable[[str], None] | None = None) -> None:
    """Start ``jax.distributed`` for this process: ``local_devices`` CPU devices, gloo collectives.
    Must run before JAX starts a backend. With ``loopback`` the coordinator binds 127.0.0.1 only.

    First every process meets the others at ``coordinator`` (:func:`runtime.train.join.roll_call`:
    it says whom it waits for, on stderr or through ``say``), so a process that never comes ends
    the wait after ``join_timeout_s`` in one error line, not in ``jax.distributed``'s abort.

    Raises:
        ProcessRunError: a malformed coordinator address or process id, a coordinator host that
            does not resolve, or a process that did not join within ``join_timeout_s``.
    """
    split_coordinator(coordinator)
    if not 0 <= process_id < processes:
        raise ProcessRunError(f"--process-id {process_id} is outside 0..{processes - 1}; give each "
                              f"process a distinct id below --processes {processes}")
    roll_call(coordinator, processes, process_id, join_timeout_s, loopback=loopback,
              **({"say": say} if say is not None else {}))
    jax.config.update("jax_num_cpu_devices", local_devices)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # every process has joined: jax.distributed's own wait is short (its timeout ends in an abort)
    jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id,
                               initialization_timeout=int(max(join_timeout_s, JOIN_TIMEOUT_S)),
                               shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
                               coordinator_bind_address=coordinator if loopback else None)


def _allgather_json(obj: Any) -> list[Any]:
    """Every process's ``obj`` (JSON-able), gathered over jax.distributed, in process order."""
    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    sizes = allgather(np.array([data.size], dtype=np.int32)).reshape(-1)
    buf = np.zeros(int(sizes.max()), dtype=np.uint8)
    buf[:data.size] = data
    rows = allgather(buf)
    return [json.loads(bytes(r[:n]).decode()) for r, n in zip(rows, sizes)]


def run_worker(plan_path: str | Path, *, process_id: int, processes: int, coordinator: str,
               steps: int = 3, cluster_path: str | Path | None = None, lr: float = 1e-3,
               seed: int = 0, model_overrides: Mapping[str, Any] | None = None,
               trace_path: str | Path | None = None, result_path: str | Path | None = None,
               loopback: bool = False, console: Any = None,
               join_timeout_s: float = JOIN_TIMEOUT_S) -> DistributedReport | None:
    """Run this process's share of ``steps`` training steps of a plan; see the module docstring.

    Args:
        plan_path: the plan file (every process reads its own copy).
        process_id / processes / coordinator: this process, how many there are, and process 0's
            ``HOST:PORT`` (``jax.distributed.initialize``).
        trace_path: process 0 writes the last step's merged Perfetto trace here.
        result_path: process 0 writes the :class:`DistributedReport` here as JSON.
        loopback: bind the coordinator to 127.0.0.1 (local launches).
        join_timeout_s: how long this process waits for the others to join (they are named on
            stderr while it waits; :func:`start_distributed`).

    Returns:
        The merged report on process 0, ``None`` on the others.

    Raises:
        ProcessRunError, runtime.train.step.RunError, compiler.distributed.DistributedError:
            bad flags, a plan this runtime cannot run, or a process grouping that splits a mesh.
    """
    plan = load_run_plan(plan_path)
    if not isinstance(plan, Plan) or plan.schedule.forward_only:
        what = "a forward-only plan" if isinstance(plan, Plan) else "a data-parallel plan"
        raise RunError(f"--processes runs one training pipeline, and {plan_path} is {what}; run it "
                       f"in one process (drop --processes)")
    cpath = cluster_path or plan.cluster_path
    if not cpath:
        raise RunError("the plan names no cluster file; pass --cluster")
    cluster = run_cluster(plan, cpath)
    groups = assign_meshes(list(cluster.meshes), processes)
    if not 0 <= process_id < processes:
        raise ProcessRunError(f"--process-id {process_id} is outside 0..{processes - 1}; give each "
                              f"process a distinct id below --processes {processes}")
    local = sum(cluster.meshes[m].num_devices for m in groups[process_id])
    start_distributed(coordinator, processes, process_id, local, loopback=loopback,
                      join_timeout_s=join_timeout_s)
    part = _train(plan, cluster, groups, steps=steps, lr=lr, seed=seed,
                  model_overrides=model_overrides, console=console)
    parts = _allgather_json(part)
    # only after success: a failed process leaves at once (its peers' shutdown would wait for it)
    jax.distributed.shutdown()
    if process_id != 0:
        return None
    report = _merge(str(plan_path), plan, groups, parts)
    if trace_path is not None and report.timelines:
        write_chrome_trace(report.timelines[-1], trace_path)
    if result_path is not None:
        write_atomic(result_path, json.dumps(report.to_json()))
    return report


def _train(plan: Plan, cluster: Cluster, groups: tuple[tuple[str, ...], ...], *, steps: int, lr: float,
           seed: int, model_overrides: Mapping[str, Any] | None, console: Any) -> dict[str, Any]:
    """This process's training loop; returns its part of the report (JSON-able)."""
    topology = process_topology(plan_mesh_axes(plan, cluster), groups)
    prog = compile_plan(plan, topology, seed=seed, model_overrides=model_overrides)
    exported = prog.exported
    leaves, ptree = jax.tree.flatten(prog.params)
    n = len(leaves)
    pp = prepare(exported, jax.tree.leaves((prog.params, prog.first)))
    mine = set(pp.meshes)
    local = [i for i in range(n) if exported.inputs[i][1] in mine]
    for i in local:   # a parameter's gradient comes back on the parameter's mesh
        if exported.outputs[1 + i][1] != exported.inputs[i][1]:
            raise DistributedError(f"the gradient of parameter {i} lives on mesh "
                                   f"{exported.outputs[1 + i][1]!r}, its parameter on "
                                   f"{exported.inputs[i][1]!r}; this runtime updates each "
                                   f"parameter where its gradient is")
        sh = exported.inputs[i][2]
        leaves[i] = jax.device_put(leaves[i], sh) if sh is not None else leaves[i]
    opt = adam_init([leaves[i] for i in local])
    batch = prog.first
    run_process(pp, (jax.tree.unflatten(ptree, leaves), batch), record=False)  # compile, warm up
    losses, times, timelines, order = [], [], [], {}
    for k in range(steps):
        barrier()
        t0 = time.perf_counter()
        ex = run_process(pp, (jax.tree.unflatten(ptree, leaves), batch), t0=t0)
        outs = ex.outputs   # flat: loss, then the gradients in parameter order
        loss = outs[0]
        losses.append(None if loss is None else float(loss))
        times.append(ex.timeline.step_time_s)
        timelines.append(ex.timeline.to_json())
        order = {m: list(v) for m, v in ex.order.items()}
        if console is not None and loss is not None:
            console.print(f"step {k}: loss {losses[-1]:.4f}  process step {times[-1] * 1e3:.1f} ms")
        if local:
            new, opt = adam_update([leaves[i] for i in local], [outs[1 + i] for i in local], opt, lr)
            for i, x in zip(local, new):
                leaves[i] = x
        batch = split_microbatches(next(prog.data))
    return {"process": jax.process_index(), "meshes": sorted(mine), "losses": losses,
            "step_times_s": times, "timelines": timelines, "order": order}


def _merge(plan_path: str, plan: Plan, groups: tuple[tuple[str, ...], ...],
           parts: list[dict[str, Any]]) -> DistributedReport:
    """Process 0's merge of every process's part (:func:`_train`)."""
    steps = len(parts[0]["losses"])
    losses = []
    for k in range(steps):
        have = [p["losses"][k] for p in parts if p["losses"][k] is not None]
        if len(have) != 1:
            raise ProcessRunError(f"step {k}: {len(have)} processes report a loss, expected one")
        losses.append(float(have[0]))
    merged = tuple(merge_timelines([timeline_from_json(p["timelines"][k]) for p in parts])
                   for k in range(steps))
    order = {m: tuple(v) for p in parts for m, v in p["order"].items()}
    return DistributedReport(
        plan_path=plan_path, processes=len(parts), groups=groups, losses=tuple(losses),
        step_times_s=tuple(max(p["step_times_s"][k] for p in parts) for k in range(steps)),
        order=order, order_mismatches=tuple(check.order_mismatches(plan, order)), timelines=merged)


def print_distributed_report(report: DistributedReport, console: Any = None) -> None:
    """Print a :class:`DistributedReport` as a rich table."""
    console = console or Console()
    t = Table(title=f"mpmd run: {report.plan_path} over {report.processes} processes "
                    f"(jax.distributed, gloo)")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("ok")
    t.add_row("processes -> meshes", "; ".join(f"{i}: {','.join(g)}"
                                               for i, g in enumerate(report.groups)), "")
    t.add_row("losses", " ".join(f"{x:.6f}" for x in report.losses[:6])
              + (" ..." if len(report.losses) > 6 else ""), "")
    t.add_row("(b) per-mesh order", "as planned" if not report.order_mismatches
              else "; ".join(report.order_mismatches), "yes" if not report.order_mismatches else "NO")
    t.add_row("step time (merged timeline)", f"{report.measured_step_s * 1e3:.1f} ms", "")
    console.print(t)
