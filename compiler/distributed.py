"""The multi-process MPMD runtime: one JAX process per mesh (or group of meshes), on ``jax.distributed``.

Every process runs the same :class:`~compiler.exported.ExportedProgram` (compiled from the same
step), but executes only the steps of its own meshes. A mesh's devices all live in one process;
``jax.devices()`` lists every process's devices (``jax.distributed.initialize`` before JAX starts
its backend), and :func:`process_topology` builds each mesh over its process's devices.

**Order.** All processes derive one serial order of every step of the program
(:func:`serial_order`: the deterministic round-robin of :func:`compiler.runtime.run_program`,
each mesh advancing until it needs a value not yet sent). Each process executes, in that order, the
steps of its meshes and its part of every transfer it takes part in. Every cross-process transfer is
a collective of exactly two processes, and both call the collectives in the one global order, so the
earliest unfinished transfer always has both parties waiting for it: no deadlock, whatever the
schedule (1F1B, interleaved, zero bubble), and each mesh still runs its own steps in planned order.

**Transfers.** A ``Send`` between meshes of different processes is a jitted ``jax.lax.ppermute``
over a two-device mesh: the sender's first mesh device and the receiver's first mesh device
(:class:`Transport`). The sender gathers the value onto its device, the receiver contributes zeros
of the same shape (known to every process from :func:`value_avals`, an abstract run of the program)
and then places what arrived with the ``Send``'s destination sharding. With CPU devices the
collective runs on gloo (``jax_cpu_collectives_implementation="gloo"``). A ``Send`` between two meshes
of one process is a ``jax.device_put``, as in the single-process runtime.

**Timeline.** With ``record=True`` each step is timed as in the single-process runtime (tracks
``"<mesh>/compute"`` and ``"<mesh>/send"``, plus ``"<mesh>/recv"`` for the receiver's side of a
cross-process transfer, which includes its wait for the sender), seconds from ``t0``; the caller
passes a ``t0`` taken right after a barrier of all processes, so the processes' timelines share one
time axis, up to the barrier's skew (the processes leave it 1.3 to 10 ms apart, measured over
10 barriers of 4 processes on this project's loaded 2-core test machine).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from compiler.exported import Call, ExportedProgram, Send
from compiler.runtime import (DeadlockError, Execution, MpmdRuntimeError, _block, _last_uses,
                              call_step)
from ir import Timeline, TimelineEvent


class DistributedError(MpmdRuntimeError):
    """The program cannot run over these processes (a mesh across processes, a bad grouping)."""


# --------------------------------------------------------------------------- placement
def assign_meshes(meshes: Sequence[str], processes: int) -> tuple[tuple[str, ...], ...]:
    """Split ``meshes`` (in order) into ``processes`` contiguous groups, sizes differing by at most
    one, larger groups first: 4 meshes over 3 processes -> ``(m0, m1), (m2,), (m3,)``.

    Raises:
        DistributedError: ``processes`` < 1 or more processes than meshes.
    """
    n = len(meshes)
    if processes < 1 or processes > n:
        raise DistributedError(f"--processes {processes} does not fit a plan of {n} meshes; "
                               f"use 1 to {n} processes (one per mesh or per group of meshes)")
    base, extra = divmod(n, processes)
    out, i = [], 0
    for p in range(processes):
        k = base + (1 if p < extra else 0)
        out.append(tuple(meshes[i:i + k]))
        i += k
    return tuple(out)


def process_topology(mesh_axes: Mapping[str, Mapping[str, int]],
                     groups: Sequence[Sequence[str]], devices: Sequence[Any] | None = None
                     ) -> dict[str, Mesh]:
    """Mesh name -> ``jax.sharding.Mesh``; the meshes of ``groups[p]`` take consecutive devices of
    process ``p`` (``device.process_index``, devices sorted by id).

    Args:
        mesh_axes: mesh name -> its axes and sizes, e.g. ``{"m0": {"data": 2}}``.
        groups: per process, its meshes (:func:`assign_meshes`).
        devices: all processes' devices (default ``jax.devices()``).

    Raises:
        DistributedError: a process has fewer devices than its meshes need.
    """
    devices = list(devices if devices is not None else jax.devices())
    out: dict[str, Mesh] = {}
    for p, group in enumerate(groups):
        mine = sorted((d for d in devices if d.process_index == p), key=lambda d: d.id)
        need = sum(int(np.prod(list(mesh_axes[m].values()))) for m in group)
        if len(mine) < need:
            raise DistributedError(f"process {p} has {len(mine)} devices but its meshes {list(group)} "
                                   f"need {need}; start it with jax_num_cpu_devices={need}")
        i = 0
        for m in group:
            axes = mesh_axes[m]
            k = int(np.prod(list(axes.values())))
            out[m] = Mesh(np.array(mine[i:i + k]).reshape(tuple(axes.values())), tuple(axes))
            i += k
    return out


def mesh_devices(exported: ExportedProgram) -> dict[str, tuple[Any, ...]]:
    """Mesh -> its devices sorted by id (read from its executables', inputs' and transfers'
    shardings, so every process knows every mesh's devices).

    Raises:
        DistributedError: a mesh's devices span processes, or a mesh has no sharding.
    """
    found: dict[str, set[Any]] = {}

    def note(mesh: str, sharding: Any) -> None:
        if sharding is not None:
            found.setdefault(mesh, set()).update(sharding.device_set)

    for ex in exported.executables.values():
        for sh in tuple(ex.in_shardings) + tuple(ex.out_shardings):
            note(ex.mesh, sh)
    for _, mesh, sh in exported.inputs:
        note(mesh, sh)
    for prog in exported.programs.values():
        for st in prog.steps:
            if isinstance(st, Send):
                note(st.dst_mesh, st.sharding)
    missing = [m for m in exported.programs if m not in found]
    if missing:
        raise DistributedError(f"meshes {missing} have no sharding to place them by; export the "
                               f"program over a topology with NamedShardings")
    for mesh, devs in found.items():
        procs = sorted({d.process_index for d in devs})
        if len(procs) != 1:
            raise DistributedError(f"mesh {mesh!r} spans processes {procs}; every mesh's devices "
                                   f"must live in one process")
    return {m: tuple(sorted(d, key=lambda x: x.id)) for m, d in found.items()}


# --------------------------------------------------------------------------- order and shapes
def serial_order(exported: ExportedProgram) -> tuple[tuple[str, int], ...]:
    """Every step of the program as ``(mesh, step index)`` in one serial order: meshes visited in
    program order, each advancing until a step reads a value not yet produced or received.

    Raises:
        DeadlockError: no mesh can advance.
    """
    have: dict[str, set[str]] = {m: set() for m in exported.programs}
    for name, mesh, _ in exported.inputs:
        have.setdefault(mesh, set()).add(name)
    meshes = list(exported.programs)
    pc = {m: 0 for m in meshes}
    order: list[tuple[str, int]] = []
    while not all(pc[m] >= len(exported.programs[m].steps) for m in meshes):
        progressed = False
        for m in meshes:
            steps = exported.programs[m].steps
            while pc[m] < len(steps):
                st = steps[pc[m]]
                reads = st.inputs if isinstance(st, Call) else (st.value,)
                if any(v not in have[m] for v in reads):
                    break
                if isinstance(st, Call):
                    have[m].update(st.outputs)
                else:
                    have[st.dst_mesh].add(st.out)
                order.append((m, pc[m]))
                pc[m] += 1
                progressed = True
        if not progressed:
            blocked = [f"{m} step {pc[m]}" for m in meshes if pc[m] < len(exported.programs[m].steps)]
            raise DeadlockError(f"deadlock: {', '.join(blocked)} wait for values nobody sends; "
                                f"reorder the per-mesh programs so every value is sent before use")
    return tuple(order)


def value_avals(exported: ExportedProgram, flat_args: Sequence[Any],
                order: Sequence[tuple[str, int]]) -> dict[str, jax.ShapeDtypeStruct]:
    """Value name -> shape and dtype, by an abstract run (``jax.eval_shape``) of every call in
    ``order``; ``flat_args`` may be arrays or ``ShapeDtypeStruct`` s."""
    avals: dict[str, jax.ShapeDtypeStruct] = {}
    for x, (name, _, _) in zip(flat_args, exported.inputs):
        dtype = x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype
        avals[name] = jax.ShapeDtypeStruct(np.shape(x), dtype)
    for mesh, i in order:
        st = exported.programs[mesh].steps[i]
        if isinstance(st, Send):
            avals[st.out] = avals[st.value]
            continue
        outs = jax.eval_shape(exported.executables[st.executable].fn,
                              *[avals[v] for v in st.inputs])
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        for v, o in zip(st.outputs, outs):
            avals[v] = jax.ShapeDtypeStruct(o.shape, o.dtype)
    return avals


# --------------------------------------------------------------------------- transport
class Transport:
    """Cross-process transfers as two-device ``ppermute`` collectives (jitted once per device pair
    and shape). Both processes call :meth:`move` for the same transfer in the same order."""

    def __init__(self) -> None:
        self._fns: dict[tuple, Any] = {}

    def _fn(self, src: Any, dst: Any) -> tuple[Any, NamedSharding]:
        key = (src.id, dst.id)
        if key not in self._fns:
            pair = Mesh(np.array([src, dst]), ("pair",))
            spec = PartitionSpec("pair")
            fn = jax.jit(jax.shard_map(lambda x: jax.lax.ppermute(x, "pair", [(0, 1)]),
                                       mesh=pair, in_specs=spec, out_specs=spec))
            self._fns[key] = (fn, NamedSharding(pair, spec))
        return self._fns[key]

    def move(self, x: Any, aval: jax.ShapeDtypeStruct, src: Any, dst: Any) -> Any:
        """Move a value from device ``src`` to device ``dst`` (of another process).

        Args:
            x: the value on the sender (any sharding of its mesh); ``None`` on the receiver.
            aval: its shape and dtype (both sides).
            src / dst: the sender's and the receiver's device.

        Returns:
            On the receiver, the value on ``dst``; on the sender, ``None``. Blocks until done.
        """
        fn, sharding = self._fn(src, dst)
        shape = (2,) + tuple(aval.shape)
        if x is not None:
            local = jax.device_put(x, src).reshape((1,) + tuple(aval.shape))
        else:
            local = jax.device_put(jnp.zeros((1,) + tuple(aval.shape), aval.dtype), dst)
        y = fn(jax.make_array_from_single_device_arrays(shape, sharding, [local]))
        y.block_until_ready()
        if x is not None:
            return None
        (shard,) = y.addressable_shards
        return shard.data.reshape(aval.shape)


# --------------------------------------------------------------------------- all processes
_GATHER: dict[int, tuple[Any, NamedSharding, Any]] = {}


def allgather(x: Any) -> np.ndarray:
    """Every process's ``x`` (a host array of the same shape and dtype in all, at most 32 bits per
    element unless ``jax_enable_x64``), stacked ``[process_count, *x.shape]`` in process order;
    every process must call it.

    A jitted ``all_gather`` over one device per process (each process's first device).
    ``jax.experimental.multihost_utils.process_allgather`` would do, but it assumes every process
    has as many devices, and here a process has as many as its meshes.

    Raises:
        DistributedError: a 64-bit ``x`` while ``jax_enable_x64`` is off (it would be truncated).
    """
    n = jax.process_count()
    if n not in _GATHER:
        devices = jax.devices()
        firsts = [min((d for d in devices if d.process_index == p), key=lambda d: d.id)
                  for p in range(n)]
        mesh = Mesh(np.array(firsts), ("proc",))
        spec = PartitionSpec("proc")
        fn = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "proc", tiled=True)[None],
                                   mesh=mesh, in_specs=spec, out_specs=spec))
        _GATHER[n] = (fn, NamedSharding(mesh, spec), firsts[jax.process_index()])
    fn, sharding, mine = _GATHER[n]
    x = np.asarray(x)
    if x.dtype.itemsize > 4 and not jax.config.jax_enable_x64:
        raise DistributedError(f"allgather of {x.dtype} would be cast to 32 bits (jax_enable_x64 "
                               f"is off); pass int32, float32 or bytes")
    local = jax.device_put(x[None], mine)
    y = fn(jax.make_array_from_single_device_arrays((n,) + x.shape, sharding, [local]))
    (shard,) = y.addressable_shards
    return np.asarray(shard.data)[0]


def barrier() -> None:
    """Return once every process has called it (an :func:`allgather` of one number)."""
    allgather(np.zeros(1, np.int32))


# --------------------------------------------------------------------------- run
@dataclass(frozen=True, slots=True)
class ProcessProgram:
    """What one process needs to run its part of ``exported`` (built once, reused every step).

    Attributes:
        exported: the whole program (identical in every process).
        process: this process's index. devices: mesh -> its devices (:func:`mesh_devices`).
        order: every step in the global serial order (:func:`serial_order`).
        avals: value name -> shape and dtype (:func:`value_avals`).
    """

    exported: ExportedProgram
    process: int
    devices: Mapping[str, tuple[Any, ...]]
    order: tuple[tuple[str, int], ...]
    avals: Mapping[str, jax.ShapeDtypeStruct] = field(repr=False)

    @property
    def owner(self) -> dict[str, int]:
        """Mesh -> the process holding its devices."""
        return {m: d[0].process_index for m, d in self.devices.items()}

    @property
    def meshes(self) -> tuple[str, ...]:
        return tuple(m for m in self.exported.programs if self.owner[m] == self.process)


def prepare(exported: ExportedProgram, flat_args: Sequence[Any],
            process: int | None = None) -> ProcessProgram:
    """The :class:`ProcessProgram` of ``process`` (default ``jax.process_index()``).

    Raises:
        DistributedError: a mesh spans processes. DeadlockError: the program cannot be ordered.
    """
    devices = mesh_devices(exported)
    order = serial_order(exported)
    avals = value_avals(exported, flat_args, order)
    return ProcessProgram(exported, jax.process_index() if process is None else process,
                          devices, order, avals)


def run_process(pp: ProcessProgram, args: Sequence[Any] | Any, *, record: bool = True,
                t0: float | None = None) -> Execution:
    """Run this process's part of the program; every process must call it with the same program.

    Args:
        pp: from :func:`prepare`.
        args: the positional arguments (any pytree, flattened as at compile time); only the values
            placed on this process's meshes are read.
        record: time each step into the timeline (steps one at a time).
        t0: ``time.perf_counter()`` the timeline counts from (default: now).

    Returns:
        An :class:`~compiler.runtime.Execution` whose ``outputs`` are the program's flattened
        results (``exported.outputs`` order), ``None`` where a result lives on another process's
        mesh; ``order``/``steps`` list this process's meshes only.

    Raises:
        MpmdRuntimeError: argument count mismatch or an executable returning the wrong count.
    """
    ex_prog = pp.exported
    flat, _ = jax.tree.flatten(args)
    if len(flat) != len(ex_prog.inputs):
        raise MpmdRuntimeError(f"program takes {len(ex_prog.inputs)} flattened arguments, got "
                               f"{len(flat)}; pass the argument structure it was lowered with")
    mine = set(pp.meshes)
    env: dict[str, dict[str, Any]] = {m: {} for m in mine}
    for x, (name, mesh, sharding) in zip(flat, ex_prog.inputs):
        if mesh in mine:
            env[mesh][name] = jax.device_put(x, sharding) if sharding is not None else x
    if record:
        for vals in env.values():
            _block(list(vals.values()))
    order: dict[str, list[str]] = {m: [] for m in pp.meshes}
    steps_done: dict[str, list[str]] = {m: [] for m in pp.meshes}
    called: dict[str, list[str]] = {m: [] for m in pp.meshes}
    events: list[TimelineEvent] = []
    t0 = time.perf_counter() if t0 is None else t0
    last = _last_uses(ex_prog)   # (mesh, step) -> values read there for the last time
    for mesh, i in pp.order:
        st = ex_prog.programs[mesh].steps[i]
        if isinstance(st, Call) and mesh in mine:
            start = time.perf_counter()
            outs = call_step(ex_prog, mesh, st, env[mesh])
            if record:
                _block(outs)
            env[mesh].update(zip(st.outputs, outs))
            order[mesh].append(st.name)
            steps_done[mesh].append(f"call:{st.name}")
            if st.executable not in called[mesh]:
                called[mesh].append(st.executable)
            if record:
                events.append(TimelineEvent(st.name, st.kind, f"{mesh}/compute", mesh, st.stage,
                                            st.microbatch, start - t0, time.perf_counter() - t0))
        elif isinstance(st, Send) and (mesh in mine or st.dst_mesh in mine):
            event = _send(pp, st, mesh, env, record, t0)
            if mesh in mine:
                steps_done[mesh].append(f"send:{st.value}->{st.dst_mesh}")
            if event is not None:
                events.append(event)
        if mesh in mine:
            for v in last.get((mesh, i), ()):
                env[mesh].pop(v, None)
    results = []
    for name, mesh in ex_prog.outputs:
        if mesh in mine and name not in env[mesh]:
            raise MpmdRuntimeError(f"output {name!r} was never produced on mesh {mesh!r}; check "
                                   f"the program's outputs")
        results.append(env[mesh][name] if mesh in mine else None)
    _block([r for r in results if r is not None])
    t_end = time.perf_counter()
    return Execution(outputs=tuple(results), timeline=Timeline(tuple(events)),
                     order={m: tuple(v) for m, v in order.items()},
                     steps={m: tuple(v) for m, v in steps_done.items()},
                     executables_called={m: tuple(v) for m, v in called.items()},
                     wall_s=t_end - t0)


_TRANSPORT = Transport()


def _send(pp: ProcessProgram, st: Send, mesh: str, env: dict[str, dict[str, Any]], record: bool,
          t0: float) -> TimelineEvent | None:
    """This process's side of ``st`` (sent by ``mesh``): a ``device_put`` when both meshes are
    local, else the sender's or the receiver's half of a :class:`Transport` move. Returns the
    timeline event (``None`` unrecorded): on the sender's send track, or the receiver's recv track."""
    mine = set(env)
    src_mine, dst_mine = mesh in mine, st.dst_mesh in mine
    aval = pp.avals[st.value]
    start = time.perf_counter()
    if src_mine and dst_mine:
        x = env[mesh][st.value]
        env[st.dst_mesh][st.out] = y = jax.device_put(x, st.sharding) if st.sharding is not None else x
    elif src_mine:
        _TRANSPORT.move(env[mesh][st.value], aval, pp.devices[mesh][0], pp.devices[st.dst_mesh][0])
        y = None
    else:
        y = _TRANSPORT.move(None, aval, pp.devices[mesh][0], pp.devices[st.dst_mesh][0])
        env[st.dst_mesh][st.out] = y = jax.device_put(y, st.sharding)
    if not record:
        return None
    _block(y)
    where, track = (mesh, f"{mesh}/send") if src_mine else (st.dst_mesh, f"{st.dst_mesh}/recv")
    return TimelineEvent(f"{st.value}->{st.dst_mesh}", "transfer", track, where, -1, -1,
                         start - t0, time.perf_counter() - t0,
                         float(np.prod(aval.shape)) * np.dtype(aval.dtype).itemsize)
