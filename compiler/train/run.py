"""``mpmd run``: compile a plan into per-mesh programs, train on the shipped text, check the run.

:func:`run_plan` loads ``plan.json``, builds the topology from the plan's cluster file over
``jax.devices()``, compiles the training step (``compiler.core.frontend.jit(step, config_from_plan(...))``),
and runs ``steps`` real training steps of the plan's zoo model on the shipped public-domain text
(``compiler/train/data/kjv_pentateuch.txt``, bytes as tokens, vocabulary 256) with Adam in plain JAX.
It checks (a) loss and gradients against a plain ``jax.jit`` of the same step on one device,
(b) the executed per-mesh order against the plan, (c) executables against unique fragment bodies,
(d) the measured step time against the simulator's replay of the same plan on the calibrated cluster.
"""

from __future__ import annotations

import statistics
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from compiler.train import check
from compiler.train.layouts import too_few_devices
from compiler.core.errors import CompilerError
from compiler.ir import DataParallelPlan, Plan
from compiler.core.plan_config import config_from_plan
from hardware_profiles.loader import load_cluster

DATA_DIR = Path(__file__).parent / "data"
TEXT = DATA_DIR / "kjv_pentateuch.txt"


class RunError(CompilerError):
    """``mpmd run`` cannot proceed (bad plan path, too few devices, missing cluster)."""


# --------------------------------------------------------------------------- data
def load_text(path: str | Path = TEXT) -> np.ndarray:
    """The shipped text as a uint8 token array (one token per byte, vocabulary 256)."""
    return np.frombuffer(Path(path).read_bytes(), dtype=np.uint8)


def batches(tokens: np.ndarray, microbatches: int, micro_size: int, seq_len: int, *,
            seed: int = 0):
    """Yield ``{"tokens", "targets"}`` int32 ``[M, b, S]`` (targets = tokens shifted by one),
    windows drawn at deterministic random offsets."""
    rng = np.random.default_rng(seed)
    n = microbatches * micro_size
    while True:
        starts = rng.integers(0, len(tokens) - seq_len - 1, size=n)
        win = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int32)
        win = win.reshape(microbatches, micro_size, seq_len + 1)
        yield {"tokens": win[..., :-1], "targets": win[..., 1:]}


# --------------------------------------------------------------------------- step
def split_microbatches(batch: Mapping[str, Any]) -> tuple[dict, ...]:
    """``{"tokens", "targets"}`` of shape ``[M, b, S]`` -> M microbatches ``{.. [b, S]}``.

    The step takes its microbatches as separate arguments: slicing them out of one ``[M, b, S]``
    array inside the step would leave one inferred slicing fragment per microbatch (static slice
    offsets differ, so no user fragment could absorb them without per-microbatch bodies)."""
    M = len(next(iter(batch.values())))
    return tuple({k: v[m] for k, v in batch.items()} for m in range(M))


def train_step_fn(cfg: Any, microbatches: int):
    """``(params, microbatches) -> (loss, grads)``: the mean of the microbatch losses and its
    gradient; ``microbatches`` is a sequence of M ``{"tokens", "targets"}`` int32 ``[b, S]`` (see
    :func:`split_microbatches`), the loop over them unrolled (one call of each layer per microbatch).
    Each loss is divided by M before the sum, so the division is per-microbatch code that the last
    stage's fragments absorb (a division after the sum would be inferred code of one microbatch).

    Raises:
        ValueError: the step is called with a different number of microbatches.
    """
    from compiler import zoo

    loss_fn = zoo.forward_loss(cfg)

    def total(params, mbs):
        if len(mbs) != microbatches:
            raise ValueError(f"the step takes {microbatches} microbatches, got {len(mbs)}; "
                             f"split the batch with split_microbatches")
        return sum(loss_fn(params, mb) / microbatches for mb in mbs)

    def step(params, mbs):
        return jax.value_and_grad(total)(params, mbs)
    return step


def adam_init(params: Any) -> Any:
    z = jax.tree.map(jnp.zeros_like, params)
    return {"m": z, "v": jax.tree.map(jnp.zeros_like, params), "t": 0}


@jax.jit
def _adam_leaf(p, g, m, v, lr, b1t, b2t):
    b1, b2, eps = 0.9, 0.999, 1e-8
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p - lr * (m / (1 - b1t)) / (jnp.sqrt(v / (1 - b2t)) + eps)
    return p, m, v


def _like(g: Any, p: Any) -> Any:
    ps = getattr(p, "sharding", None)
    return g if ps is None or getattr(g, "sharding", None) == ps else jax.device_put(g, ps)


def adam_update(params: Any, grads: Any, state: Any, lr: float) -> tuple[Any, Any]:
    """Adam (Kingma & Ba 2015, beta1 0.9, beta2 0.999, eps 1e-8), leaf by leaf on each leaf's mesh.

    Each gradient is first placed like its parameter (a no-op when the compiler already returned it
    so), so parameters and both moments stay sharded as the plan's layout says (FSDP: over
    ``data``; tensor parallel: over ``model``)."""
    t = state["t"] + 1
    lp, tree = jax.tree.flatten(params)
    out = [_adam_leaf(p, _like(g, p), m, v, lr, 0.9 ** t, 0.999 ** t)
           for p, g, m, v in zip(lp, jax.tree.leaves(grads), jax.tree.leaves(state["m"]),
                                 jax.tree.leaves(state["v"]))]
    new_p = jax.tree.unflatten(tree, [o[0] for o in out])
    return new_p, {"m": jax.tree.unflatten(tree, [o[1] for o in out]),
                   "v": jax.tree.unflatten(tree, [o[2] for o in out]), "t": t}


# --------------------------------------------------------------------------- cluster & topology
def run_cluster(plan: Plan, cluster_path: str | Path) -> Any:
    """The cluster ``plan`` runs on: the cluster file, carved into the plan's meshes when the plan
    was made for a cluster described as node groups (:func:`simulator.plan_sim.plan_cluster`).

    Raises:
        hardware_profiles.types.ProfileError: a bad cluster file, or a carving that does not fit it.
    """
    from simulator.plan_sim import plan_cluster

    return plan_cluster(plan, load_cluster(cluster_path))


def topology_from_cluster(cluster: Any, devices: list | None = None) -> dict[str, Mesh]:
    """Mesh name -> ``jax.sharding.Mesh`` over consecutive local devices, with the cluster's axes.

    Raises:
        RunError: fewer local devices than the cluster has.
    """
    devices = list(devices if devices is not None else jax.devices())
    need = cluster.num_devices
    if len(devices) < need:
        raise RunError(too_few_devices(cluster.name, need, len(devices)))
    out, i = {}, 0
    for name, spec in cluster.meshes.items():
        shape = tuple(spec.axes.values())
        out[name] = Mesh(np.array(devices[i:i + spec.num_devices]).reshape(shape),
                         tuple(spec.axes))
        i += spec.num_devices
    return out


def plan_topology(plan: Plan, cluster: Any, devices: list | None = None) -> dict[str, Mesh]:
    """Mesh name -> ``Mesh`` shaped by the plan's layout for it (axes ``data``, ``model``, and
    ``replica`` for hybrid sharding; :func:`compiler.train.layouts.topology_for_plan`).

    Raises:
        RunError: fewer local devices than the cluster has, or a layout that does not fit its mesh.
    """
    from compiler.train.layouts import topology_for_plan

    try:
        return topology_for_plan(plan, cluster, devices if devices is not None else jax.devices())
    except ValueError as e:
        raise RunError(str(e)) from None


def place_inputs(tree: Any, exported: Any) -> Any:
    """``tree`` (the leading arguments of the compiled step, e.g. the parameters) with each leaf
    placed on the sharding the exported program's matching input expects (its mesh and spec)."""
    leaves, treedef = jax.tree.flatten(tree)
    return jax.tree.unflatten(treedef, [jax.device_put(x, sh) if sh is not None else x
                                        for x, (_, _, sh) in zip(leaves, exported.inputs)])


def step_outputs(outs: Any, out_tree: Any) -> Any:
    """A program run's outputs as the step's ``(loss, grads)``: flat outputs are unflattened with
    ``out_tree`` (the step's output structure)."""
    if isinstance(outs, tuple) and len(outs) == out_tree.num_leaves != 2:
        return jax.tree.unflatten(out_tree, outs)
    return outs


# --------------------------------------------------------------------------- report
@dataclass(frozen=True)
class RunReport:
    """What :func:`run_plan` measured and checked (SI units).

    ``loss_rel_errors`` / ``grad_rel_errors`` hold the checked steps' errors against ``jax.jit``
    (the gradient as one vector, :func:`compiler.train.check.tree_rel_error`; the worst single leaf is in
    ``grad_leaf_rel_errors``, for information);
    ``measured_step_s`` is :func:`measured_step_time` of the recorded steps; ``simulated_step_s``
    the simulator's step without the optimizer op (the optimizer runs outside the MPMD program here).
    ``param_shardings`` is the parameter pytree after the last step with each leaf replaced by
    ``(mesh name, PartitionSpec)`` of where it lives; ``opt_state_follows_params`` says whether
    both Adam moments of every leaf are sharded exactly like it.
    """

    plan: Plan
    losses: tuple[float, ...]
    loss_rel_errors: tuple[float, ...]
    grad_rel_errors: tuple[float, ...]
    order_mismatches: tuple[str, ...]
    executables: Mapping[str, check.ExecutableCount]
    measured_step_s: float
    simulated_step_s: float | None
    step_times_s: tuple[float, ...]
    executed_order: Mapping[str, tuple[str, ...]]
    timelines: tuple[Any, ...] = field(default=(), repr=False)
    grad_leaf_rel_errors: tuple[float, ...] = ()
    param_shardings: Any = field(default=None, repr=False)
    opt_state_follows_params: bool | None = None

    @property
    def max_rel_error(self) -> float:
        return max(self.loss_rel_errors + self.grad_rel_errors, default=0.0)

    @property
    def step_time_error(self) -> float | None:
        if self.simulated_step_s is None:
            return None
        return check.step_time_error(self.measured_step_s, self.simulated_step_s)

    @property
    def executables_ok(self) -> bool:
        return all(c.ok for c in self.executables.values())


def measured_step_time(times: Sequence[float]) -> float:
    """The steady-state step time of recorded steps ``times`` (s): the median of the later half.

    An untimed execution compiles every executable before step 0, but the first recorded steps
    still run slower (on this 2-core machine, 1F1B on cpu4x2 measured 2.3, 2.9, 1.9, 2.1, 2.0 s,
    then 1.82-1.88 s for steps 5-9: XLA:CPU's allocator and the caches warm up over the first
    steps), so the first half is left out; with one or two steps, the last one is used.

    Raises:
        ValueError: no steps.
    """
    if not times:
        raise ValueError("no recorded steps; run at least one step")
    return statistics.median(times[len(times) // 2:]) if len(times) > 2 else times[-1]


def executed_plan(plan: Plan) -> Plan:
    """``plan`` as this runtime executes it, for the simulator: each backward fragment is one XLA
    program that reduces its microbatch's gradients over ``data`` itself (an all-reduce, or with
    FSDP a reduce-scatter), so gradients are synced per microbatch (``grad_sync="microbatch"``)
    rather than once per step."""
    return dataclasses.replace(plan, grad_sync="microbatch")


def simulated_step_time(plan: Plan, cluster: Any, cfg: Any) -> float:
    """The simulator's step time of ``plan`` as executed here (:func:`executed_plan`) on
    ``cluster``, without the optimizer op (the optimizer runs outside the MPMD program), s."""
    from compiler.zoo.costing import workload
    from simulator.plan_sim import simulate_plan

    wl = workload(cfg, plan.global_batch, plan.seq_len)
    res = simulate_plan(executed_plan(plan), wl, cluster)
    return max((e.end_s for e in res.timeline.events if e.kind != "optimizer"), default=0.0)


def with_plan_specs(config: Any, plan: Plan, cfg: Any, params: Any, microbatches: Any) -> Any:
    """``config`` with the plan's shardings as input specs (:mod:`compiler.train.layouts`): every
    parameter sharded as its mesh's layout says (Megatron tensor parallel over ``model``, FSDP over
    ``data``), every microbatch array split over the data axes of the mesh that reads it (the
    first stage's mesh for the tokens, the last's for the targets: the spec is adapted to each
    mesh's axes by the compiler)."""
    from compiler import zoo
    from compiler.train.layouts import batch_spec, param_specs

    names = zoo.layer_names(cfg)
    specs = dict(config.in_specs)
    leaves = jax.tree.leaves(param_specs(cfg, plan, params, names),
                             is_leaf=lambda x: isinstance(x, PartitionSpec))
    specs.update({k: s for k, s in enumerate(leaves) if k not in specs})
    first = min(plan.stages, key=lambda s: s.index).mesh
    bspec = batch_spec(plan.layouts[first])
    for k in range(len(jax.tree.leaves(microbatches))):
        specs.setdefault(len(leaves) + k, bspec)
    return dataclasses.replace(config, in_specs=specs)


def _compile(step, config, example):
    from compiler.core import frontend
    if not hasattr(frontend, "jit"):
        raise RunError("compiler.core.frontend.jit is not available yet; the MPMD compiler's export "
                       "must land before 'mpmd run' can compile a plan")
    compiled = frontend.jit(step, config).lower(*example).compile()
    exported = getattr(compiled, "exported", compiled)
    return exported


@dataclass(frozen=True)
class PlanProgram:
    """A plan's training step compiled for a topology (:func:`compile_plan`).

    Attributes:
        cfg: the zoo model config. step: ``(params, microbatches) -> (loss, grads)``.
        params: the initial parameters (seeded, not yet placed on meshes).
        data: the batch iterator (:func:`batches`); ``first`` its first batch, split into
            microbatches, which the program was lowered with.
        exported: the :class:`~compiler.core.exported.ExportedProgram`.
    """

    cfg: Any
    step: Any
    params: Any
    data: Any
    first: Any
    exported: Any


def compile_plan(plan: Plan, topology: Mapping[str, Mesh], *, seed: int = 0,
                 model_overrides: Mapping[str, Any] | None = None) -> PlanProgram:
    """Build the plan's training step, parameters and data, and compile the step over
    ``topology`` (mesh name -> ``Mesh``) into per-mesh programs.

    Raises:
        RunError: the global batch does not divide into the plan's microbatches, or no compiler.
    """
    from compiler import zoo

    cfg = zoo.get_config(plan.model, seq_len=plan.seq_len, **dict(model_overrides or {}))
    M = plan.microbatches
    if plan.global_batch % M:
        raise RunError(f"global batch {plan.global_batch} is not divisible by {M} microbatches")
    step = train_step_fn(cfg, M)
    params = zoo.init_params(cfg, jax.random.PRNGKey(seed))
    data = batches(load_text(), M, plan.global_batch // M, plan.seq_len, seed=seed)
    first = split_microbatches(next(data))
    config = config_from_plan(plan, topology, layer_names=zoo.layer_names(cfg))
    exported = _compile(step, with_plan_specs(config, plan, cfg, params, first), (params, first))
    return PlanProgram(cfg, step, params, data, first, exported)


def load_run_plan(plan_path: str | Path | Plan | DataParallelPlan) -> Plan | DataParallelPlan:
    """The plan ``mpmd run`` executes, read through the guarded reader (a plan object is taken as
    it is).

    Raises:
        mpmd.files.InputError / compiler.ir.IRError: an unreadable or malformed plan file.
    """
    if isinstance(plan_path, (Plan, DataParallelPlan)):
        return plan_path
    from compiler.ir.plan_file import load_plan

    return load_plan(plan_path)   # guarded read + schema: InputError / IRError, one line


def run_plan(plan_path: str | Path | Plan, steps: int = 3, *, cluster_path: str | Path | None = None,
             lr: float = 1e-3, seed: int = 0, check_every: int = 1,
             model_overrides: Mapping[str, Any] | None = None, simulate: bool = True,
             console: Any = None, quiet: bool = False) -> RunReport:
    """Compile and run ``steps`` training steps of a plan; see the module docstring. A forward-only
    (inference) plan runs its DiT's sampler instead (``steps``, ``lr`` and ``check_every`` unused)
    and returns :class:`compiler.train.generate.GenerateReport`.

    Args:
        plan_path: a plan.json path, or a :class:`Plan`.
        steps: training steps (Adam, learning rate ``lr``).
        cluster_path: the cluster YAML (default: the plan's ``cluster_path``).
        check_every: compare against ``jax.jit`` every this many steps (the first always).
        model_overrides: zoo ``ModelConfig`` fields to override (smaller test models).
        simulate: also simulate the plan for check (d).

    Raises:
        RunError: missing cluster, too few devices, no compiler.
        mpmd.files.InputError / compiler.ir.IRError: an unreadable or malformed plan file
            (:func:`compiler.ir.plan_file.load_plan`).
    """
    from compiler.core.runtime import run_program

    plan = load_run_plan(plan_path)
    if not isinstance(plan, DataParallelPlan) and plan.schedule.forward_only:
        from compiler.train.generate import generate_plan   # inference: a DiT samples from noise
        return generate_plan(plan, cluster_path=cluster_path, seed=seed, simulate=simulate,
                             model_overrides=model_overrides, console=console, quiet=quiet)
    cpath = cluster_path or plan.cluster_path
    if isinstance(plan, DataParallelPlan):   # pipelines side by side on uneven batch shares
        from compiler.train.data_parallel import run_data_parallel
        if not cpath:
            raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
        return run_data_parallel(plan, steps, cluster_path=cpath, lr=lr, seed=seed,
                                 check_every=check_every, model_overrides=model_overrides,
                                 simulate=simulate, console=console, quiet=quiet)
    if not cpath:
        raise RunError("the plan names no cluster file; pass cluster_path (--cluster)")
    cluster = run_cluster(plan, cpath)
    topology = plan_topology(plan, cluster)
    prog = compile_plan(plan, topology, seed=seed, model_overrides=model_overrides)
    cfg, step, params, data, first = prog.cfg, prog.step, prog.params, prog.data, prog.first
    exported = prog.exported
    params = place_inputs(params, exported)
    out_tree = jax.tree.structure(jax.eval_shape(step, params, first))
    ref_dev = jax.devices()[0]
    ref_step = jax.jit(step)
    opt = adam_init(params)
    losses, lerr, gerr, leaf_err, times, timelines = [], [], [], [], [], []
    order: Mapping[str, tuple[str, ...]] = {}
    batch = first
    # one untimed execution first: compiles every executable and warms XLA's buffers, so the timed
    # steps measure running, not compiling (the report's step time is the median of steps 1..)
    run_program(exported, (params, batch), record=False)
    for i in range(steps):
        ex = run_program(exported, (params, batch))
        loss, grads = step_outputs(ex.outputs, out_tree)
        losses.append(float(loss))
        times.append(ex.timeline.step_time_s)
        timelines.append(ex.timeline)
        order = ex.order
        if i == 0 or (check_every and i % check_every == 0) or i == steps - 1:
            rl, rg = ref_step(jax.device_put(jax.device_get(params), ref_dev),
                              jax.device_put(batch, ref_dev))
            lerr.append(check.rel_error(loss, rl))
            gerr.append(check.tree_rel_error(grads, rg))
            leaf_err.append(check.max_rel_error(grads, rg))
        if not quiet and console is not None:
            console.print(f"step {i}: loss {losses[-1]:.4f}  step {times[-1] * 1e3:.1f} ms")
        params, opt = adam_update(params, grads, opt, lr)
        batch = split_microbatches(next(data))
    measured = measured_step_time(times)
    sim = simulated_step_time(plan, cluster, cfg) if simulate else None
    from compiler.zoo.costing import workload as _wl
    bodies = _wl(cfg, plan.global_batch, plan.seq_len).layers
    return RunReport(param_shardings=check.placements(params, topology),
                     opt_state_follows_params=check.same_shardings(params, opt["m"], opt["v"]),
                     plan=plan, losses=tuple(losses), loss_rel_errors=tuple(lerr),
                     grad_rel_errors=tuple(gerr), grad_leaf_rel_errors=tuple(leaf_err),
                     order_mismatches=tuple(check.order_mismatches(plan, order)),
                     executables=check.executable_counts(exported, plan, bodies),
                     measured_step_s=measured, simulated_step_s=sim, step_times_s=tuple(times),
                     executed_order=order, timelines=tuple(timelines))


def print_report(report: RunReport, console: Any = None) -> None:
    """Print a :class:`RunReport` (or a forward-only run's ``GenerateReport``) as rich tables."""
    from rich.console import Console
    from rich.table import Table

    if not isinstance(report, RunReport):
        from compiler.train.generate import print_generate_report
        return print_generate_report(report, console)

    console = console or Console()
    p = report.plan
    if isinstance(p, DataParallelPlan):
        how = " + ".join(f"{q.schedule.name} x{q.microbatches} on {q.global_batch} samples"
                         for q in p.parts)
        t = Table(title=f"mpmd run: {p.model} on {p.cluster}, data parallel: {how}")
    else:
        t = Table(title=f"mpmd run: {p.model} on {p.cluster}, {p.schedule.name}, "
                        f"{p.microbatches} microbatches")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("ok")
    t.add_row("losses", " ".join(f"{x:.4f}" for x in report.losses[:6])
              + (" ..." if len(report.losses) > 6 else ""), "")
    t.add_row("(a) max rel error vs jax.jit (loss, gradients)", f"{report.max_rel_error:.2e}"
              + (f" (worst leaf {max(report.grad_leaf_rel_errors):.1e})"
                 if report.grad_leaf_rel_errors else ""),
              "yes" if report.max_rel_error < 1e-5 else "NO")
    t.add_row("(b) per-mesh order", "as planned" if not report.order_mismatches
              else "; ".join(report.order_mismatches), "yes" if not report.order_mismatches else "NO")
    t.add_row("(c) executables = fragment bodies", ", ".join(
        str(c) for c in report.executables.values()),
        "yes" if report.executables_ok else "NO")
    if report.simulated_step_s is not None:
        err = report.step_time_error
        t.add_row("(d) step time measured / simulated",
                  f"{report.measured_step_s * 1e3:.1f} / {report.simulated_step_s * 1e3:.1f} ms "
                  f"({err * 100:.1f}%)", "yes" if err < 0.15 else "NO")
    console.print(t)
    if report.simulated_step_s is not None and report.step_time_error >= 0.15:
        console.print("step time off by more than 15%: the cpu-host profile was calibrated on "
                      "another machine or at another time; run 'mpmd calibrate --out calibrated' on "
                      "an otherwise idle machine, then 'mpmd run PLAN.json --cluster "
                      "calibrated/cpu4x2.yaml'")
