"""The simpy discrete-event engine: replays a :class:`SimProgram` into a Timeline and metrics.

Model (all times in seconds):
    - Each mesh has one **compute stream**: a simpy process that runs the mesh's ``order``
      sequentially. An op starts when the previous op in the order is done, all its ``deps`` are
      done and all its ``inputs`` transfers have arrived (and, for meshes that share a host, when
      it holds one of the host's slots), and no earlier than the previous op's end plus its
      ``recv_s`` (a blocking receive on the compute stream, drawn as a ``recv:<op>`` interval
      ending there on the mesh's ``/recv`` track). Memory: ``alloc_bytes`` at start,
      ``free_bytes`` at end.
    - Each mesh has a **send stream** and a **receive stream**, separate from compute, so transfers
      overlap compute. Each **link** is a contended resource. A transfer becomes ready when its
      ``src_op`` ends and runs for ``duration_s`` holding its source's send stream, its link and
      its destination's receive stream at once.
    - Contention is **FIFO serialisation** (no bandwidth sharing): every send stream, receive
      stream and link serves its transfers one at a time, in order of (ready time, transfer id);
      a transfer starts when it is first in line on all three and all three are idle. Because
      all queues use the same global order, this cannot deadlock.
    - Each mesh has a **collective stream** running its ``SimProgram.collectives`` in list order:
      a collective starts when the stream is free and ``after_fraction`` of its ``after_op`` has
      run (measured from that op's actual start and duration); ops listed in ``SimOp.waits``
      wait for it. Collectives are not link-contended (they use the mesh's own fabric).
    - Host slots: a mesh with ``host_of[mesh] = h`` takes one of ``host_slots[h]`` (default 1)
      slots for each op it runs; waiting ops get slots in order of (request time, op id).
    - Deterministic tie breaks: resource grants made at one instant are decided after every other
      event at that instant (a simpy event of priority 2, after URGENT=0 and NORMAL=1), in order of
      (request time, id). Same program and knobs: same timeline.

Errors: exceeding a mesh's memory capacity is recorded in ``SimResult.errors`` (first time per
mesh) or raised with ``raise_on_error=True``; a deadlock (ops left when no event can happen)
raises :class:`SimError` naming the stuck op of each mesh; failed links/meshes (knobs) end the
step early with ``SimResult.failure`` set and no exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush
from typing import Any, Mapping

import simpy
from simpy.events import Event, EventPriority, Timeout

from ir import Timeline, TimelineEvent
from simulator.knobs import Knobs
from simulator.metrics import summarize
from simulator.program import SimError, SimProgram
import pandas as pd

_LATE = EventPriority(2)
"""simpy event priority for resource arbitration: after URGENT (0) and NORMAL (1) at one instant."""


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one simulated step.

    Attributes:
        timeline: compute events on ``"<mesh>/compute"``, transfers on ``"<src>/send"``,
            ``"<dst>/recv"`` and ``"link:<name>"``; per-mesh memory samples ``(time_s, bytes)``.
        step_time_s: end of the last event, s (when ``failure`` is set: the failure time).
        busy_s / bubble: per-mesh compute seconds and idle fraction ``1 - busy / step``.
        peak_memory_bytes: per-mesh peak per-device memory, bytes.
        link_bytes: bytes moved per link.
        flops: model FLOP of the ops that ran.
        mfu: ``flops / (step_time_s * peak_flops)`` (0 without a peak).
        errors: capacity violations, one line each.
        failure: where and when a failed link or mesh (see :class:`Knobs`) stopped the step, or None.
    """

    timeline: Timeline
    step_time_s: float
    busy_s: Mapping[str, float]
    bubble: Mapping[str, float]
    peak_memory_bytes: Mapping[str, float]
    link_bytes: Mapping[str, float]
    flops: float
    mfu: float
    errors: tuple[str, ...] = ()
    failure: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def events_df(self):
        """The timeline's events as a pandas DataFrame (one row per event, plus ``duration_s``)."""
        cols = ("name", "kind", "track", "mesh", "stage", "microbatch", "start_s", "end_s", "bytes")
        df = pd.DataFrame([tuple(getattr(e, c) for c in cols) for e in self.timeline.events],
                          columns=list(cols))
        df["duration_s"] = df["end_s"] - df["start_s"]
        return df

    def metrics(self) -> dict[str, Any]:
        """JSON-ready metrics: step time, MFU, per-mesh busy/bubble/peak memory, per-link bytes."""
        return {"step_time_s": self.step_time_s, "mfu": self.mfu, "flops": self.flops,
                "busy_s": dict(self.busy_s), "bubble": dict(self.bubble),
                "peak_memory_bytes": dict(self.peak_memory_bytes),
                "link_bytes": dict(self.link_bytes), "errors": list(self.errors),
                "failure": self.failure}

    def raise_on_errors(self) -> None:
        """Raise :class:`SimError` with the first error or the failure, if any."""
        if self.errors:
            raise SimError(self.errors[0])
        if self.failure:
            raise SimError(self.failure)


class _Late(Event):
    """An already-successful event processed after every URGENT/NORMAL event at its instant."""

    def __init__(self, env: simpy.Environment, callback, value: Any = None,
                 delay: float = 0.0) -> None:
        super().__init__(env)
        self._ok = True
        self._value = value
        self.callbacks.append(callback)
        env.schedule(self, _LATE, delay)


class _Run:
    """State of one simulation (one-shot)."""

    def __init__(self, prog: SimProgram, knobs: Knobs) -> None:
        self.prog = prog
        self.env = env = simpy.Environment()
        self.ops = prog.ops
        self.trs = prog.transfers
        self.dur = knobs.op_durations(prog)
        self.tdur = knobs.transfer_durations(prog)
        n, nt = len(prog.ops), len(prog.transfers)
        self.op_end: list[float | None] = [None] * n
        self.op_ev: dict[int, Event] = {}
        self.op_start: list[float | None] = [None] * n
        self.start_ev: dict[int, Event] = {}
        nc = len(prog.collectives)
        self.coll_end: list[float | None] = [None] * nc
        self.coll_ev: dict[int, Event] = {}
        self.tr_end: list[float | None] = [None] * nt
        self.tr_ev: dict[int, Event] = {}
        self.out: list[list[int]] = [[] for _ in range(n)]
        for tr in prog.transfers:
            self.out[tr.src_op].append(tr.id)
        # transfer queues: send stream per mesh, receive stream per mesh, one per link
        meshes = prog.meshes
        qidx: dict[tuple[str, str], int] = {}
        for m in meshes:
            qidx["s", m] = len(qidx)
        for m in meshes:
            qidx["r", m] = len(qidx)
        for tr in prog.transfers:
            if ("l", tr.link) not in qidx:
                qidx["l", tr.link] = len(qidx)
        self.qname = [f"{k}:{v}" for k, v in qidx]
        self.tq = [(qidx["s", t.src_mesh], qidx["l", t.link], qidx["r", t.dst_mesh])
                   for t in prog.transfers]
        self.queues: list[list[tuple[float, int]]] = [[] for _ in qidx]
        self.holder = [-1] * len(qidx)
        self.dirty_q: list[int] = []
        # host slots
        self.host_of = {m: prog.host_of[m] for m in meshes if m in prog.host_of}
        hosts = sorted(set(self.host_of.values()))
        self.slots_free = {h: int(prog.host_slots.get(h, 1)) for h in hosts}
        self.slot_q: dict[str, list[tuple[float, int, Event]]] = {h: [] for h in hosts}
        self.dirty_h: list[str] = []
        self.arb_pending = False
        # bookkeeping
        self.rows: list[tuple] = []      # (name, kind, track, mesh, stage, mb, start, end, bytes)
        self.mem = {m: float(prog.baseline_bytes.get(m, 0.0)) for m in meshes}
        self.samples = {m: [(0.0, self.mem[m])] for m in meshes}
        self.peak = dict(self.mem)
        self.errors: list[str] = []
        self.over: set[str] = set()
        self.flops = 0.0
        # mesh -> (what it waits for, its op id, the op / collective / transfer id or host name)
        self.waiting: dict[str, tuple[str, int, Any]] = {}
        self.running: dict[str, int] = {}
        self.meshes_left = len(meshes)
        self.tr_left = nt
        self.mesh_tr_left = {m: 0 for m in meshes}
        self.link_tr_left: dict[str, int] = {}
        for t in prog.transfers:
            self.mesh_tr_left[t.src_mesh] += 1
            self.mesh_tr_left[t.dst_mesh] += 1
            self.link_tr_left[t.link] = self.link_tr_left.get(t.link, 0) + 1
        self.ops_left = {m: len(prog.order.get(m, ())) for m in meshes}
        by_mesh: dict[str, list[int]] = {}
        for c in prog.collectives:
            by_mesh.setdefault(c.mesh, []).append(c.id)
        self.meshes_left += len(by_mesh)
        self.finished = env.event()
        self.failure: str | None = None
        self.failure_t = 0.0
        for m in meshes:
            self._check_capacity(m, "at step start")
            env.process(self._compute(m, prog.order.get(m, ())))
        for m, ids in by_mesh.items():
            env.process(self._collective(m, ids))
        # a failure at t acts after everything else that happens at t (ends at t complete)
        for what, items in (("link", knobs.failed_links), ("mesh", knobs.failed_meshes)):
            for name, when in sorted(items.items()):
                _Late(env, self._fail, (what, name), delay=when)

    # ------------------------------------------------------------------ memory
    def _check_capacity(self, m: str, why: str) -> None:
        cap = self.prog.capacity_bytes.get(m)
        if cap is not None and self.mem[m] > cap and m not in self.over:
            self.over.add(m)
            self.errors.append(
                f"mesh {m!r} needs {self.mem[m]:.6g} bytes per device at t={self.env.now:.6g} s "
                f"({why}), over its capacity {cap:.6g} by {self.mem[m] - cap:.6g} bytes; "
                f"keep fewer microbatches in flight, recompute, or give the stage a larger mesh")

    # ------------------------------------------------------------------ arbitration
    def _request_arb(self) -> None:
        if not self.arb_pending:
            self.arb_pending = True
            _Late(self.env, self._arbitrate)

    def _arbitrate(self, _ev: Event) -> None:
        self.arb_pending = False
        env = self.env
        if self.dirty_h:
            for h in sorted(set(self.dirty_h)):
                sq = self.slot_q[h]
                while sq and self.slots_free[h] > 0:
                    self.slots_free[h] -= 1
                    heappop(sq)[2].succeed()
            self.dirty_h = []
        if self.dirty_q:
            queues, holder, tq, tdur = self.queues, self.holder, self.tq, self.tdur
            for qi in self.dirty_q:
                q = queues[qi]
                if holder[qi] >= 0 or not q:
                    continue
                key = q[0]
                tid = key[1]
                a, b, c = tq[tid]
                if holder[a] >= 0 or holder[b] >= 0 or holder[c] >= 0:
                    continue
                if queues[a][0] is not key or queues[b][0] is not key or queues[c][0] is not key:
                    continue
                heappop(queues[a])
                heappop(queues[b])
                heappop(queues[c])
                holder[a] = holder[b] = holder[c] = tid
                Timeout(env, tdur[tid], (tid, env.now)).callbacks.append(self._transfer_done)
            self.dirty_q = []

    # ------------------------------------------------------------------ transfers
    def _transfer_ready(self, tid: int) -> None:
        key = (self.env.now, tid)
        for qi in self.tq[tid]:
            heappush(self.queues[qi], key)
            self.dirty_q.append(qi)
        self._request_arb()

    def _transfer_done(self, ev: Event) -> None:
        tid, start = ev._value
        now = self.env.now
        tr = self.trs[tid]
        for qi in self.tq[tid]:
            self.holder[qi] = -1
            self.dirty_q.append(qi)
        self._request_arb()
        self.tr_end[tid] = now
        sop = self.ops[tr.src_op]
        for track, mesh in ((f"{tr.src_mesh}/send", tr.src_mesh), (f"link:{tr.link}", tr.src_mesh),
                            (f"{tr.dst_mesh}/recv", tr.dst_mesh)):
            self.rows.append((tr.name, "transfer", track, mesh, sop.stage, sop.microbatch, start,
                              now, tr.bytes))
        self.mesh_tr_left[tr.src_mesh] -= 1
        self.mesh_tr_left[tr.dst_mesh] -= 1
        self.link_tr_left[tr.link] -= 1
        w = self.tr_ev.pop(tid, None)
        if w is not None:
            w.succeed()
        self.tr_left -= 1
        if self.tr_left == 0 and self.meshes_left == 0 and not self.finished.triggered:
            self.finished.succeed()

    # ------------------------------------------------------------------ compute
    def _compute(self, m: str, order: tuple[int, ...]):
        env, ops, op_end, tr_end, dur = self.env, self.ops, self.op_end, self.tr_end, self.dur
        host = self.host_of.get(m)
        mem, samples, rows, out = self.mem, self.samples[m], self.rows, self.out
        track = f"{m}/compute"
        free_at = 0.0                     # when the stream finished its previous op
        for oid in order:
            op = ops[oid]
            for d in op.deps:
                if op_end[d] is None:
                    ev = self.op_ev.get(d)
                    if ev is None:
                        ev = self.op_ev[d] = env.event()
                    self.waiting[m] = ("op", oid, d)
                    yield ev
            for c in op.waits:
                if self.coll_end[c] is None:
                    ev = self.coll_ev.get(c)
                    if ev is None:
                        ev = self.coll_ev[c] = env.event()
                    self.waiting[m] = ("collective", oid, c)
                    yield ev
            for t in op.inputs:
                if tr_end[t] is None:
                    ev = self.tr_ev.get(t)
                    if ev is None:
                        ev = self.tr_ev[t] = env.event()
                    self.waiting[m] = ("transfer", oid, t)
                    yield ev
            if op.recv_s > 0:
                if env.now < free_at + op.recv_s:
                    yield Timeout(env, free_at + op.recv_s - env.now)
                # the blocking receive, on the mesh's receive track (not compute: not busy time)
                rows.append((f"recv:{op.name}", "transfer", f"{m}/recv", m, op.stage,
                             op.microbatch, env.now - op.recv_s, env.now, 0.0))
            if host is not None:
                ev = env.event()
                heappush(self.slot_q[host], (env.now, oid, ev))
                self.dirty_h.append(host)
                self._request_arb()
                self.waiting[m] = ("slot", oid, host)
                yield ev
            self.waiting.pop(m, None)
            start = env.now
            if op.alloc_bytes:
                mem[m] += op.alloc_bytes
                samples.append((start, mem[m]))
                if mem[m] > self.peak[m]:
                    self.peak[m] = mem[m]
                    self._check_capacity(m, f"{op.name} starts")
            self.running[m] = oid
            self.op_start[oid] = start
            sev = self.start_ev.pop(oid, None)
            if sev is not None:
                sev.succeed()
            yield Timeout(env, dur[oid])
            del self.running[m]
            end = env.now
            op_end[oid] = end
            free_at = end
            self.ops_left[m] -= 1
            self.flops += op.flops
            if host is not None:
                self.slots_free[host] += 1
                self.dirty_h.append(host)
                self._request_arb()
            if op.free_bytes:
                mem[m] -= op.free_bytes
                samples.append((end, mem[m]))
            rows.append((op.name, op.kind, track, m, op.stage, op.microbatch, start, end,
                         op.alloc_bytes))
            w = self.op_ev.pop(oid, None)
            if w is not None:
                w.succeed()
            for t in out[oid]:
                self._transfer_ready(t)
        self._stream_done()

    def _stream_done(self) -> None:
        """A mesh's compute or collective stream has run its last op; the step ends when every
        stream has and every transfer has arrived."""
        self.meshes_left -= 1
        if self.tr_left == 0 and self.meshes_left == 0 and not self.finished.triggered:
            self.finished.succeed()

    def _collective(self, m: str, ids: list[int]):
        env, dur = self.env, self.dur
        track = f"{m}/collective"
        for cid in ids:
            c = self.prog.collectives[cid]
            if self.op_start[c.after_op] is None:
                ev = self.start_ev.get(c.after_op)
                if ev is None:
                    ev = self.start_ev[c.after_op] = env.event()
                yield ev
            after_start = self.op_start[c.after_op]
            assert after_start is not None  # set before its start event succeeds
            ready = after_start + c.after_fraction * dur[c.after_op]
            if ready > env.now:
                yield Timeout(env, ready - env.now)
            start = env.now
            yield Timeout(env, c.duration_s)
            self.coll_end[cid] = env.now
            self.rows.append((c.name, c.kind, track, m, -1, -1, start, env.now, c.bytes))
            w = self.coll_ev.pop(cid, None)
            if w is not None:
                w.succeed()
        self._stream_done()

    # ------------------------------------------------------------------ failures
    def _fail(self, ev: Event) -> None:
        what, name = ev._value
        if self.finished.triggered:
            return
        now = self.env.now
        if what == "link":
            if not self.link_tr_left.get(name):
                return
            running = [tid for tid in set(self.holder) if tid >= 0 and self.trs[tid].link == name]
            if running:
                detail = f"while transferring {self.trs[running[0]].name}"
            else:
                waiting = sorted(k for qi, q in enumerate(self.queues)
                                 if self.qname[qi] == f"l:{name}" for k in q)
                detail = (f"with {self.link_tr_left[name]} transfer(s) left"
                          + (f" (next: {self.trs[waiting[0][1]].name})" if waiting else ""))
            self.failure = f"link {name!r} failed at {now:.6g} s {detail}"
        else:
            if not self.ops_left.get(name) and not self.mesh_tr_left.get(name):
                return
            if name in self.running:
                detail = f"while running {self.ops[self.running[name]].name}"
            else:
                busy = [tid for tid in set(self.holder) if tid >= 0
                        and name in (self.trs[tid].src_mesh, self.trs[tid].dst_mesh)]
                if busy:
                    detail = f"while transferring {self.trs[min(busy)].name}"
                elif name in self.waiting:
                    detail = f"while {self._describe_wait(name)}"
                else:
                    detail = f"with {self.mesh_tr_left[name]} transfer(s) left"
            self.failure = f"mesh {name!r} failed at {now:.6g} s {detail}"
        self.failure_t = now
        self.finished.succeed()

    def _describe_wait(self, m: str) -> str:
        what, oid, x = self.waiting[m]
        name = self.ops[oid].name
        if what == "op":
            return f"{name} waits for op {self.ops[x].name} on mesh {self.ops[x].mesh!r}"
        if what == "collective":
            return f"{name} waits for collective {self.prog.collectives[x].name} on mesh {m!r}"
        if what == "transfer":
            tr = self.trs[x]
            src = self.ops[tr.src_op]
            state = "not sent" if self.op_end[tr.src_op] is None else "in flight"
            return (f"{name} waits for transfer {tr.name} from {src.name} on mesh "
                    f"{tr.src_mesh!r} ({state})")
        return f"{name} waits for a slot of host {x!r}"

    def run(self) -> None:
        try:
            self.env.run(until=self.finished)
        except RuntimeError as e:
            if "No scheduled events left" not in str(e):
                raise
            stuck = [self._describe_wait(m) for m in self.prog.meshes if m in self.waiting]
            raise SimError(f"deadlock at t={self.env.now:.6g} s: " + "; ".join(stuck)
                           + "; make the per-mesh orders consistent with the dependencies") from None


def simulate(program: SimProgram, *, knobs: Knobs | None = None,
             raise_on_error: bool = False) -> SimResult:
    """Replay ``program`` (see the module docstring for the model) and summarise it.

    Args:
        program: the lowered step.
        knobs: jitter, stragglers, degraded/failed links and meshes (default: none).
        raise_on_error: raise the first memory-capacity error instead of recording it.

    Returns:
        A :class:`SimResult`.

    Raises:
        SimError: a deadlock (naming each mesh's stuck op and what it waits for), or a capacity
            error when ``raise_on_error``.
    """
    r = _Run(program, knobs or Knobs())
    r.run()
    rows = sorted(r.rows, key=lambda x: (x[6], x[7]))
    events = tuple(TimelineEvent(*x) for x in rows)
    memory = {m: tuple(s) for m, s in r.samples.items()}
    tl = Timeline(events=events, memory=memory)
    s = summarize(tl, meshes=program.meshes, flops=r.flops, peak_flops=program.peak_flops)
    step = s.step_time_s
    bubble: Mapping[str, float]
    if r.failure is not None:  # the partial step, up to the failure
        step = r.failure_t
        busy = s.busy_s
        bubble = {m: (1.0 - b / step) if step > 0 else 0.0 for m, b in busy.items()}
        mfu = r.flops / (step * program.peak_flops) if step > 0 and program.peak_flops > 0 else 0.0
    else:
        bubble, mfu = s.bubble, s.mfu
    res = SimResult(timeline=tl, step_time_s=step, busy_s=s.busy_s, bubble=bubble,
                    peak_memory_bytes=dict(r.peak), link_bytes=s.link_bytes, flops=r.flops,
                    mfu=mfu, errors=tuple(r.errors), failure=r.failure)
    if raise_on_error and res.errors:
        raise SimError(res.errors[0])
    return res
