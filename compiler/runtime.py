"""The MPMD runtime: run an :class:`~compiler.exported.ExportedProgram` on local JAX devices.

Each mesh's program (an ordered list of :class:`~compiler.exported.Call` and
:class:`~compiler.exported.Send` steps) runs in its planned order. Values move between meshes with
``jax.device_put`` to the target mesh's sharding. The interleaving across meshes is deterministic:
meshes are visited in the program's mesh order, and each advances its own program step by step until
it needs a value that has not arrived yet (sent by another mesh); then the next mesh gets its turn.
A full pass in which no mesh can advance is a deadlock, reported with every blocked step.
The interleaving depends on the program only, so it is worked out once per exported program
(:func:`plan`, cached while the program lives) and replayed over a flat list of value slots:
arguments already on their input's sharding (a training loop's state after its first step) are
used as they are and the others placed by one batched ``jax.device_put``; consecutive sends of a
mesh are one batched ``jax.device_put``. Unrecorded, when every send lands on CPU devices, a send
is held until a step reads what it sends, and all sends held then go in one ``jax.device_put``
(a copy between CPU devices is made by the host when dispatched: holding it loses no overlap), and
the accumulators' zeros (``init`` calls) are made once per program and reused; a held batch of
replicated values goes to replicated targets by the batched copy under ``jax.device_put``, called
directly (:func:`_copier`: ``jax.device_put``'s own per-call work was about 0.3 ms a batch).
Calls donate the buffers their executables donate (``Executable.donate``, chosen by
:mod:`compiler.export`: last uses, never the program's inputs or outputs); a held send whose
source a call donates is sent before that call, and reused zeros are never donated.

With ``record=True`` each step is timed honestly: the step starts once its inputs are on the mesh and
ends when ``block_until_ready`` returns on its outputs, so steps run one at a time. The measured
:class:`~ir.Timeline` uses the simulator's format (tracks ``"<mesh>/compute"`` for calls,
``"<mesh>/send"`` for transfers; seconds from step start). With ``record=False`` steps are dispatched
asynchronously (JAX may overlap meshes) and the timeline is empty; the executed order is still kept.

On this project's CPU test machine, 8 CPU "devices" share 2 cores and XLA already spreads one
fragment over both (``runtime.calibration.measure`` measures the speed-up of concurrent fragments at ~1.1x), so
running one step at a time loses little; the simulator models it with ``Cluster.host_slots``.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import jax

from compiler.errors import CompilerError
from compiler.exported import Call, ExportedProgram, Send
from ir import Timeline, TimelineEvent


class MpmdRuntimeError(CompilerError, RuntimeError):
    """Base error of the runtime (a malformed program, a deadlock, a missing value)."""


class DeadlockError(MpmdRuntimeError):
    """No mesh can advance: every unfinished mesh waits for a value that nobody will send."""


@dataclass(frozen=True, slots=True)
class Execution:
    """The result of :func:`run_program`.

    Attributes:
        outputs: the program's flattened results (or the pytree, when ``meta['out_tree']`` is set).
        timeline: measured events (empty when not recorded).
        order: mesh -> names of the calls it executed, in execution order (e.g. ``("F0.0", "F0.1")``).
        steps: mesh -> every step it executed, calls and sends, as ``"call:F0.0"``/``"send:v->m"``.
        executables_called: mesh -> keys of the executables it called (distinct, first-use order).
        wall_s: seconds from the first step's start to the last step's end (inputs placed before).
    """

    outputs: Any
    timeline: Timeline
    order: Mapping[str, tuple[str, ...]]
    steps: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    executables_called: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    wall_s: float = 0.0


def _nbytes(x: Any) -> float:
    return float(sum(getattr(l, "nbytes", 0) for l in jax.tree.leaves(x)))


def _block(x: Any) -> None:
    for leaf in jax.tree.leaves(x):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()


def _last_uses(exported: ExportedProgram) -> dict[tuple[str, int], list[str]]:
    """(mesh, step index) -> values whose last read on that mesh is that step (outputs excluded)."""
    keep = {name for name, _ in exported.outputs}
    last: dict[tuple[str, str], int] = {}
    for mesh, prog in exported.programs.items():
        for i, st in enumerate(prog.steps):
            reads = st.inputs if isinstance(st, Call) else (st.value,)
            for v in reads:
                last[(mesh, v)] = i
    out: dict[tuple[str, int], list[str]] = {}
    for (mesh, v), i in last.items():
        if v not in keep:
            out.setdefault((mesh, i), []).append(v)
    return out


def call_step(exported: ExportedProgram, mesh: str, st: Call, env: Mapping[str, Any]) -> tuple:
    """Run call ``st`` of ``mesh`` on the values ``env`` holds; its outputs as a tuple.

    Raises:
        MpmdRuntimeError: the executable returned another number of values than the call names.
    """
    outs = exported.executables[st.executable].fn(*[env[v] for v in st.inputs])
    if not isinstance(outs, (tuple, list)):
        outs = (outs,)
    if len(outs) != len(st.outputs):
        raise MpmdRuntimeError(f"mesh {mesh!r} step {st.name!r}: executable {st.executable!r} "
                               f"returned {len(outs)} values, the program names {len(st.outputs)}")
    return tuple(outs)


def _check(exported: ExportedProgram, n_args: int) -> None:
    if n_args != len(exported.inputs):
        raise MpmdRuntimeError(f"program takes {len(exported.inputs)} flattened arguments, got {n_args}; "
                            f"pass the same argument structure the program was lowered with")
    for mesh, prog in exported.programs.items():
        for st in prog.steps:
            if isinstance(st, Call):
                ex = exported.executables.get(st.executable)
                if ex is None:
                    raise MpmdRuntimeError(f"mesh {mesh!r} step {st.name!r} calls unknown executable "
                                        f"{st.executable!r}; export it or fix the call")
                if ex.mesh != mesh:
                    raise MpmdRuntimeError(f"mesh {mesh!r} step {st.name!r} calls executable "
                                        f"{st.executable!r} compiled for mesh {ex.mesh!r}")
            elif isinstance(st, Send):
                if st.dst_mesh not in exported.programs:
                    raise MpmdRuntimeError(f"mesh {mesh!r} sends {st.value!r} to unknown mesh "
                                        f"{st.dst_mesh!r}; use one of {sorted(exported.programs)}")
            else:
                raise MpmdRuntimeError(f"mesh {mesh!r} has a step of unknown type {type(st).__name__}")


class _Plan:
    """What :func:`run_program` does, worked out once per exported program (:func:`plan`).

    Values live in a flat list of slots, one per (mesh, value name). ``instrs`` is the static
    round-robin interleaving of the module docstring: ``(CALL, mesh, step, fn, in_slots,
    out_slots, free)`` and ``(SEND, mesh, steps, src_slots, shardings, dst_slots, free)``, where
    consecutive sends of one mesh are one instruction (one batched ``jax.device_put``) and
    ``free`` lists the slots whose last read that instruction is (released after it).
    """

    __slots__ = ("n_slots", "inputs", "instrs", "outputs", "order", "steps", "called", "ref",
                 "defer_sends", "zeros", "donated", "gone")

    def __init__(self, n_slots, inputs, instrs, outputs, order, steps, called, ref,
                 defer_sends=False, donated=None):
        self.n_slots, self.inputs, self.instrs, self.outputs = n_slots, inputs, instrs, outputs
        self.order, self.steps, self.called, self.ref = order, steps, called, ref
        self.defer_sends = defer_sends
        self.zeros: dict[int, tuple] = {}   # instruction index -> an init call's results
        # instruction index -> the slots whose buffers that call donates (deletes)
        self.donated: dict[int, frozenset[int]] = donated or {}
        self.gone: frozenset[int] = frozenset().union(*self.donated.values())


CALL, SEND = 0, 1
_PLANS: dict[int, _Plan] = {}


def plan(exported: ExportedProgram) -> _Plan:
    """The static schedule of ``exported`` (cached while ``exported`` lives).

    Raises:
        MpmdRuntimeError: an unknown executable or mesh, an input on an unknown mesh, or an
            output never produced.
        DeadlockError: no mesh can advance; the message names each blocked step and its missing
            values (the state the round-robin stops in).
    """
    key = id(exported)
    hit = _PLANS.get(key)
    if hit is not None and hit.ref() is exported:
        return hit
    _check(exported, len(exported.inputs))
    meshes = list(exported.programs)
    slots: dict[tuple[str, str], int] = {}

    def slot(mesh: str, v: str) -> int:
        k = (mesh, v)
        if k not in slots:
            slots[k] = len(slots)
        return slots[k]

    have: dict[str, set[str]] = {m: set() for m in meshes}
    inputs = []
    for name, mesh, sharding in exported.inputs:
        if mesh not in have:
            raise MpmdRuntimeError(f"input {name!r} is placed on unknown mesh {mesh!r}; "
                                   f"use one of {sorted(have)}")
        have[mesh].add(name)
        inputs.append((slot(mesh, name), sharding))
    last = _last_uses(exported)
    pc = {m: 0 for m in meshes}
    order: dict[str, list[str]] = {m: [] for m in meshes}
    steps_done: dict[str, list[str]] = {m: [] for m in meshes}
    called: dict[str, list[str]] = {m: [] for m in meshes}
    instrs: list[tuple] = []

    def missing(mesh: str, st: Any) -> list[str]:
        reads = st.inputs if isinstance(st, Call) else (st.value,)
        return [v for v in reads if v not in have[mesh]]

    while True:
        progressed = False
        for mesh in meshes:
            prog = exported.programs[mesh].steps
            while pc[mesh] < len(prog):
                i = pc[mesh]
                st = prog[i]
                if missing(mesh, st):
                    break
                free = [slots[(mesh, v)] for v in last.get((mesh, i), ())]
                if isinstance(st, Call):
                    fn = exported.executables[st.executable].fn
                    instrs.append((CALL, mesh, i, fn, tuple(slot(mesh, v) for v in st.inputs),
                                   tuple(slot(mesh, v) for v in st.outputs), tuple(free)))
                    have[mesh].update(st.outputs)
                    order[mesh].append(st.name)
                    steps_done[mesh].append(f"call:{st.name}")
                    if st.executable not in called[mesh]:
                        called[mesh].append(st.executable)
                else:
                    src, dst = slot(mesh, st.value), slot(st.dst_mesh, st.out)
                    prev = instrs[-1] if instrs else None
                    if prev is not None and prev[0] == SEND and prev[1] == mesh \
                            and prev[2][-1] == i - 1:
                        instrs[-1] = (SEND, mesh, prev[2] + (i,), prev[3] + (src,),
                                      prev[4] + (st.sharding,), prev[5] + (dst,),
                                      prev[6] + tuple(free))
                    else:
                        instrs.append((SEND, mesh, (i,), (src,), (st.sharding,), (dst,),
                                       tuple(free)))
                    have[st.dst_mesh].add(st.out)
                    steps_done[mesh].append(f"send:{st.value}->{st.dst_mesh}")
                pc[mesh] = i + 1
                progressed = True
        if all(pc[m] >= len(exported.programs[m].steps) for m in meshes):
            break
        if not progressed:
            blocked = []
            for m in meshes:
                prog = exported.programs[m].steps
                if pc[m] < len(prog):
                    st = prog[pc[m]]
                    label = st.name if isinstance(st, Call) else f"send {st.value}->{st.dst_mesh}"
                    blocked.append(f"{m} step {pc[m]} ({label}) waits for {missing(m, st)}")
            raise DeadlockError("deadlock: " + "; ".join(blocked)
                                + "; reorder the per-mesh programs so every value is sent before "
                                  "it is needed")
    outputs = []
    for name, mesh in exported.outputs:
        if name not in have.get(mesh, ()):
            raise MpmdRuntimeError(f"output {name!r} was never produced on mesh {mesh!r}; "
                                   f"check the program's outputs")
        outputs.append(slots[(mesh, name)])
    # a slot read again as an output (or by a later step) must not be freed: _last_uses keeps
    # outputs, and a value freed on one mesh lives in its own slot
    donated: dict[int, frozenset[int]] = {}
    for k, ins in enumerate(instrs):
        if ins[0] == CALL:
            st = exported.programs[ins[1]].steps[ins[2]]
            pos = exported.executables[st.executable].donate
            if pos:
                donated[k] = frozenset(ins[4][j] for j in pos)
    p = _Plan(len(slots), tuple(inputs), tuple(instrs), tuple(outputs),
              {m: tuple(v) for m, v in order.items()},
              {m: tuple(v) for m, v in steps_done.items()},
              {m: tuple(v) for m, v in called.items()}, _ref(exported), _all_cpu(exported),
              donated)
    if len(_PLANS) > 64:
        for k in [k for k, v in _PLANS.items() if v.ref() is None]:
            del _PLANS[k]
    _PLANS[key] = p
    return p


def _all_cpu(exported: ExportedProgram) -> bool:
    """Whether every send and every executable's result lands on CPU devices only (the replay
    of :func:`_run_deferred`)."""
    shs = [st.sharding for prog in exported.programs.values() for st in prog.steps
           if isinstance(st, Send)]
    shs += [sh for e in exported.executables.values() for sh in e.out_shardings]
    try:
        return all(sh is not None and all(d.platform == "cpu" for d in sh.device_set)
                   for sh in shs)
    except AttributeError:  # pragma: no cover - a sharding without a device set
        return False


def _ref(exported: ExportedProgram) -> Any:
    try:
        return weakref.ref(exported)
    except TypeError:  # pragma: no cover - ExportedProgram has a weakref slot
        return lambda: exported


def _place(p: _Plan, flat: Sequence[Any], regs: list) -> None:
    """Put the arguments in their slots: those already on their sharding as they are, the
    others with one batched ``jax.device_put``."""
    xs, shs, at = [], [], []
    for x, (s, sh) in zip(flat, p.inputs):
        if sh is None or (isinstance(x, jax.Array) and (x.sharding is sh or x.sharding == sh)):
            regs[s] = x
        else:
            xs.append(x)
            shs.append(sh)
            at.append(s)
    if xs:
        for s, y in zip(at, jax.device_put(xs, shs)):
            regs[s] = y


def _send(regs: list, src: tuple, shs: tuple, dst: tuple) -> None:
    xs = [regs[s] for s in src]
    if all(sh is not None for sh in shs):
        ys = jax.device_put(xs, list(shs))
    else:
        ys = [x if sh is None else jax.device_put(x, sh) for x, sh in zip(xs, shs)]
    for d, y in zip(dst, ys):
        regs[d] = y


def _bad_arity(exported: ExportedProgram, mesh: str, i: int, got: int) -> MpmdRuntimeError:
    st = exported.programs[mesh].steps[i]
    return MpmdRuntimeError(f"mesh {mesh!r} step {st.name!r}: executable {st.executable!r} "
                            f"returned {got} values, the program names {len(st.outputs)}")


def run_program(exported: ExportedProgram, args: Sequence[Any] | Any, *,
                record: bool = True) -> Execution:
    """Run ``exported`` on its meshes' devices; see the module docstring for the interleaving.

    The interleaving is static: it is worked out once per exported program (:func:`plan`,
    cached) and replayed; unrecorded, every call and batched send is dispatched without waiting
    (JAX's asynchronous dispatch), and only the results are waited for.

    Args:
        exported: per-mesh programs and their executables.
        args: the positional arguments (any pytree); flattened with ``jax.tree.flatten`` they must
            match ``exported.inputs`` one to one. Arrays already on their input's sharding (the
            previous step's results, in a training loop) are used as they are.
        record: time each step (one at a time, ``block_until_ready``) into the timeline.

    Returns:
        An :class:`Execution` (outputs, measured timeline, executed per-mesh order).

    Raises:
        MpmdRuntimeError: argument count mismatch, unknown executable or mesh, or a missing output.
        DeadlockError: no mesh can advance; the message names each blocked step and missing values.
    """
    flat = jax.tree.leaves(args)
    if len(flat) != len(exported.inputs):
        _check(exported, len(flat))
    p = plan(exported)
    regs: list[Any] = [None] * p.n_slots
    _place(p, flat, regs)
    events: list[TimelineEvent] = []
    if record:
        _block([regs[s] for s, _ in p.inputs])
    t0 = time.perf_counter()
    t_end = t0
    if not record and p.defer_sends:
        _run_deferred(exported, p, regs)
        p_instrs: tuple = ()
    else:
        p_instrs = p.instrs
    for ins in p_instrs:
        if ins[0] == CALL:
            _, mesh, i, fn, ins_s, outs_s, free = ins
            if record:
                start = time.perf_counter()
            outs = fn(*[regs[s] for s in ins_s])
            if type(outs) is not tuple and type(outs) is not list:
                outs = (outs,)
            if len(outs) != len(outs_s):
                raise _bad_arity(exported, mesh, i, len(outs))
            for s, y in zip(outs_s, outs):
                regs[s] = y
            if record:
                _block(outs)
                end = time.perf_counter()
                st = exported.programs[mesh].steps[i]
                events.append(TimelineEvent(
                    name=st.name, kind=st.kind, track=f"{mesh}/compute", mesh=mesh,
                    stage=st.stage, microbatch=st.microbatch, start_s=start - t0, end_s=end - t0))
                t_end = end
        else:
            _, mesh, idx, src, shs, dst, free = ins
            if not record:
                _send(regs, src, shs, dst)
            else:
                for i, s, sh, d in zip(idx, src, shs, dst):
                    st = exported.programs[mesh].steps[i]
                    start = time.perf_counter()
                    _send(regs, (s,), (sh,), (d,))
                    _block(regs[d])
                    end = time.perf_counter()
                    events.append(TimelineEvent(
                        name=f"{st.value}->{st.dst_mesh}", kind="transfer",
                        track=f"{mesh}/send", mesh=mesh, stage=-1, microbatch=-1,
                        start_s=start - t0, end_s=end - t0, bytes=_nbytes(regs[s])))
                    t_end = end
        for s in free:
            regs[s] = None
    results = [regs[s] for s in p.outputs]
    if not record:
        _block(results)
        t_end = time.perf_counter()
    out_tree = exported.meta.get("out_tree") if exported.meta else None
    outputs: Any = jax.tree.unflatten(out_tree, results) if out_tree is not None else tuple(results)
    return Execution(outputs=outputs, timeline=Timeline(tuple(events)), order=p.order,
                     steps=p.steps, executables_called=p.called, wall_s=t_end - t0)


def _copier() -> Any:
    """``copy(xs, shardings) -> arrays``: the batched cross-device copy under ``jax.device_put``
    (``xla_client.batched_copy_array_to_devices_with_sharding``) for arrays already laid out as
    their targets are (a replicated array to a replicated sharding on as many devices, the sends
    of a replicated program), without ``jax.device_put``'s per-call work (its tree flattening,
    abstract values and per-array dispatch: about 0.3 ms a call on this project's CPU machine);
    None when this JAX lacks those internals (then ``jax.device_put`` does it all)."""
    try:
        from jax._src.array import _sharding_indices_and_eq
        from jax._src.dispatch import ArrayCopySemantics
        from jax._src.lib import xla_client as xc
        batched = xc.batched_copy_array_to_devices_with_sharding
        reuse = ArrayCopySemantics.REUSE_INPUT
    except (ImportError, AttributeError):  # pragma: no cover - another JAX version
        return None
    devs: dict[Any, Any] = {}

    def copy(xs: list, shs: list) -> list:
        dl = []
        for x, sh in zip(xs, shs):
            if not isinstance(x, jax.Array):
                return jax.device_put(xs, shs)
            try:
                same = _sharding_indices_and_eq(x.sharding, sh, len(x.shape))
            except NotImplementedError:  # pragma: no cover - a sharding without an HLO form
                same = False
            if not same or not x.is_fully_addressable:
                return jax.device_put(xs, shs)
            d = devs.get(sh)
            if d is None:
                d = devs[sh] = sh._internal_device_list.addressable_device_list
            dl.append(d)
        return batched(xs, dl, shs, [reuse] * len(xs))

    return copy


_COPY: list = []


def _batched_copy(xs: list, shs: list) -> list:
    """``jax.device_put(xs, shs)``, by :func:`_copier`'s direct path where it applies."""
    if not _COPY:
        _COPY.append(_copier())
    copy = _COPY[0]
    return copy(xs, shs) if copy is not None else jax.device_put(xs, shs)


def _run_deferred(exported: ExportedProgram, p: _Plan, regs: list) -> None:
    """The unrecorded replay on CPU devices. A send is held until a step reads what it sends (or
    the replay ends), and every held send then goes in one batched ``jax.device_put``: a copy
    between CPU devices is made by the host when it is dispatched, so holding it back loses no
    overlap, and one call copies many values for the fixed cost of one. An accumulator ``init``
    call (no operands: the zeros each microbatch's gradient is added to) runs once per program;
    later replays reuse its arrays, which no step changes (JAX arrays are immutable, and export
    donates no init call's result on CPU; an init call whose result some call donates runs every
    replay). A call that donates (deletes) the source of a held send first sends the held batch."""
    xs: list[Any] = []
    shs: list[Any] = []
    dsts: list[int] = []
    held: set[int] = set()       # the held sends' destination slots
    held_src: set[int] = set()   # and their source slots
    donated = p.donated
    gone = p.gone

    def flush() -> None:
        for d, y in zip(dsts, _batched_copy(xs, shs)):
            regs[d] = y
        xs.clear()
        shs.clear()
        dsts.clear()
        held.clear()
        held_src.clear()

    for k, ins in enumerate(p.instrs):
        if ins[0] == CALL:
            _, mesh, i, fn, ins_s, outs_s, free = ins
            if held and (not held.isdisjoint(ins_s)
                         or (k in donated and not held_src.isdisjoint(donated[k]))):
                flush()   # a held send reads a buffer this call would delete
            outs = p.zeros.get(k)
            if outs is None:
                outs = fn(*[regs[s] for s in ins_s])
                if type(outs) is not tuple and type(outs) is not list:
                    outs = (outs,)
                if len(outs) != len(outs_s):
                    raise _bad_arity(exported, mesh, i, len(outs))
                if not ins_s and exported.programs[mesh].steps[i].kind == "init" \
                        and gone.isdisjoint(outs_s):   # zeros no call donates
                    p.zeros[k] = tuple(outs)
            for s, y in zip(outs_s, outs):
                regs[s] = y
        else:
            _, mesh, idx, src, sh, dst, free = ins
            if held and not held.isdisjoint(src):
                flush()
            xs.extend(regs[s] for s in src)
            shs.extend(sh)
            dsts.extend(dst)
            held.update(dst)
            held_src.update(src)
        for s in free:
            regs[s] = None
    if held:
        flush()


def execute(exported: ExportedProgram, args: Sequence[Any] | Any, *,
            record: bool = True) -> tuple[Any, Timeline]:
    """Run ``exported`` and return ``(outputs, timeline)``; see :func:`run_program`.

    The executed per-mesh order is :func:`executed_order` of the timeline (or use
    :func:`run_program`, which reports it even when ``record=False``).
    """
    ex = run_program(exported, args, record=record)
    return ex.outputs, ex.timeline


def executed_order(timeline: Timeline) -> dict[str, tuple[str, ...]]:
    """Mesh -> names of its compute events in start order (the executed per-mesh order)."""
    per: dict[str, list[TimelineEvent]] = {}
    for e in timeline.events:
        if e.track.endswith("/compute"):
            per.setdefault(e.mesh, []).append(e)
    return {m: tuple(e.name for e in sorted(evs, key=lambda e: e.start_s)) for m, evs in per.items()}
