"""What every way of running a plan shares: the shipped text and its batches, the training step and
Adam, the topology a plan runs on, compiling a step, and the steady-state step time.

:mod:`runtime.train.run` (``mpmd run``), :mod:`runtime.train.generate` (a DiT sampler),
:mod:`runtime.train.data_parallel` (pipelines side by side) and :mod:`runtime.train.process_run`
(one process of a multi-process run) are siblings built on this module.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

import zoo
from zoo.model_files import plan_model
from zoo.config import ModelConfig
from compiler import frontend
from compiler.config import MpmdConfig
from compiler.errors import CompilerError
from compiler.exported import ExportedProgram
from compiler.plan_config import config_from_plan
from hardware_profiles.cluster_loader import load_cluster
from hardware_profiles.types import Cluster
from ir import DataParallelPlan, Plan, layouts_problem
from ir.plan_file import load_plan
from runtime.train.context import context_loss, context_problem, layer_splits
from runtime.train.layouts import batch_spec, param_specs, too_few_devices, topology_for_plan
from simulator.plan_sim import plan_cluster, simulate_plan

DATA_DIR = Path(__file__).parent / "data"
TEXT = DATA_DIR / "kjv_pentateuch.txt"


class RunError(CompilerError):
    """``mpmd run`` cannot proceed (bad plan path, too few devices, missing cluster)."""


def check_layouts(plan: Plan | DataParallelPlan, cfg: ModelConfig) -> None:
    """Refuse a plan with a mesh whose layout cannot run ``cfg`` (:func:`ir.shards.layout_problem`:
    a tensor degree not dividing the heads or MLP widths, an expert degree not dividing the
    experts), or context parallelism this runtime cannot run
    (:func:`runtime.train.context.context_problem`), before anything is built: the compiler
    would otherwise replicate what it cannot split and run another program than the plan.

    Raises:
        RunError: one line naming the mesh, why, and the fix.
    """
    dims = zoo.shard_dims(cfg)
    for part in plan.parts if isinstance(plan, DataParallelPlan) else (plan,):
        bad = layouts_problem(dims, part.layouts)
        if bad:
            raise RunError(bad)
    bad = context_problem(plan, cfg)
    if bad:
        raise RunError(bad)


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


def train_step_fn(cfg: ModelConfig, microbatches: int,
                  splits: Mapping[str, Any] | None = None):
    """``(params, microbatches) -> (loss, grads)``: the mean of the microbatch losses and its
    gradient; ``microbatches`` is a sequence of M ``{"tokens", "targets"}`` int32 ``[b, S]`` (see
    :func:`split_microbatches`), the loop over them unrolled (one call of each layer per microbatch).
    Each loss is divided by M before the sum, so the division is per-microbatch code that the last
    stage's fragments absorb (a division after the sum would be inferred code of one microbatch).
    ``splits``: layer name -> its context-parallel split
    (:func:`runtime.train.context.layer_splits`; None or empty: none).

    Raises:
        ValueError: the step is called with a different number of microbatches.
    """
    loss_fn = context_loss(cfg, splits or {})

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
def run_cluster(plan: Plan | DataParallelPlan, cluster_path: str | Path) -> Cluster:
    """The cluster ``plan`` runs on: the cluster file, carved into the plan's meshes when the plan
    was made for a cluster described as node groups (:func:`simulator.plan_sim.plan_cluster`).

    Raises:
        hardware_profiles.types.ProfileError: a bad cluster file, or a carving that does not fit it.
    """
    return plan_cluster(plan, load_cluster(cluster_path))


def topology_from_cluster(cluster: Cluster, devices: list | None = None) -> dict[str, Mesh]:
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


def plan_topology(plan: Plan, cluster: Cluster, devices: list | None = None) -> dict[str, Mesh]:
    """Mesh name -> ``Mesh`` shaped by the plan's layout for it (axes ``data``, ``model``, and
    ``replica`` for hybrid sharding; :func:`runtime.train.layouts.topology_for_plan`).

    Raises:
        RunError: fewer local devices than the cluster has, or a layout that does not fit its mesh.
    """
    try:
        return topology_for_plan(plan, cluster, devices if devices is not None else jax.devices())
    except ValueError as e:
        raise RunError(str(e)) from None


def place_inputs(tree: Any, exported: ExportedProgram) -> Any:
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


def simulated_step_time(plan: Plan, cluster: Cluster, cfg: ModelConfig) -> float:
    """The simulator's step time of ``plan`` as executed here (:func:`executed_plan`) on
    ``cluster``, without the optimizer op (the optimizer runs outside the MPMD program), s."""
    wl = zoo.workload(cfg, plan.global_batch, plan.seq_len)
    res = simulate_plan(executed_plan(plan), wl, cluster)
    return max((e.end_s for e in res.timeline.events if e.kind != "optimizer"), default=0.0)


def with_plan_specs(config: MpmdConfig, plan: Plan, cfg: ModelConfig, params: Any,
                    microbatches: Any) -> MpmdConfig:
    """``config`` with the plan's shardings as input specs (:mod:`runtime.train.layouts`): every
    parameter sharded as its mesh's layout says (Megatron tensor parallel over ``model``, FSDP over
    ``data``), every microbatch array split over the data axes of the mesh that reads it (the
    first stage's mesh for the tokens, the last's for the targets: the spec is adapted to each
    mesh's axes by the compiler)."""
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


def compile_step(step: Callable[..., Any], config: MpmdConfig,
                 example: tuple[Any, ...]) -> ExportedProgram:
    """``step`` compiled by the MPMD compiler for ``config`` on ``example`` arguments: the
    :class:`~compiler.exported.ExportedProgram`.

    Raises:
        RunError: no compiler frontend.
    """
    if not hasattr(frontend, "jit"):
        raise RunError("compiler.frontend.jit is not available yet; the MPMD compiler's export "
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
        exported: the :class:`~compiler.exported.ExportedProgram`.
    """

    cfg: ModelConfig
    step: Any
    params: Any
    data: Any
    first: Any
    exported: ExportedProgram


def compile_plan(plan: Plan, topology: Mapping[str, Mesh], *, seed: int = 0,
                 model_overrides: Mapping[str, Any] | None = None) -> PlanProgram:
    """Build the plan's training step, parameters and data, and compile the step over
    ``topology`` (mesh name -> ``Mesh``) into per-mesh programs.

    Raises:
        RunError: the global batch does not divide into the plan's microbatches, a layout that
            cannot run the model (:func:`check_layouts`), or no compiler.
    """
    cfg = zoo.get_config(plan_model(plan.model, plan.model_config), seq_len=plan.seq_len,
                         **dict(model_overrides or {}))
    check_layouts(plan, cfg)
    M = plan.microbatches
    if plan.global_batch % M:
        raise RunError(f"global batch {plan.global_batch} is not divisible by {M} microbatches")
    step = train_step_fn(cfg, M, layer_splits(plan, cfg, topology))
    params = zoo.init_params(cfg, jax.random.PRNGKey(seed))
    data = batches(load_text(), M, plan.global_batch // M, plan.seq_len, seed=seed)
    first = split_microbatches(next(data))
    config = config_from_plan(plan, topology, layer_names=zoo.layer_names(cfg))
    exported = compile_step(step, with_plan_specs(config, plan, cfg, params, first), (params, first))
    return PlanProgram(cfg, step, params, data, first, exported)


def load_run_plan(plan_path: str | Path | Plan | DataParallelPlan) -> Plan | DataParallelPlan:
    """The plan ``mpmd run`` executes, read through the guarded reader (a plan object is taken as
    it is).

    Raises:
        ir.files.InputError / ir.IRError: an unreadable or malformed plan file.
    """
    if isinstance(plan_path, (Plan, DataParallelPlan)):
        return plan_path
    return load_plan(plan_path)   # guarded read + schema: InputError / IRError, one line

