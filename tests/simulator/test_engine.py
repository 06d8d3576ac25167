"""Exact expectations of the simpy engine and the lowering on tiny hand-built programs."""

from __future__ import annotations

import pytest

from ir import FragmentRef, ScheduleTable, Timeline, TimelineEvent
from simulator.engine import simulate
from simulator.knobs import Knobs
from simulator.lowering import BoundaryCost, FragmentCost, TailOp, lower_schedule
from simulator.metrics import summarize
from simulator.program import SimError, SimOp, SimProgram, SimTransfer


def op(i, mesh, dur, deps=(), inputs=(), alloc=0.0, free=0.0, kind="F", stage=0, mb=0, flops=0.0):
    return SimOp(id=i, name=f"o{i}", kind=kind, mesh=mesh, stage=stage, microbatch=mb,
                 duration_s=dur, deps=tuple(deps), inputs=tuple(inputs), alloc_bytes=alloc,
                 free_bytes=free, flops=flops)


def tr(i, src_op, src, dst, link, dur, nbytes=100.0):
    return SimTransfer(id=i, name=f"t{i}", src_op=src_op, src_mesh=src, dst_mesh=dst, link=link,
                       bytes=nbytes, duration_s=dur)


def spans(res, track):
    return [(e.name, e.start_s, e.end_s) for e in res.timeline.events if e.track == track]


def pipeline_2x2(**kw) -> SimProgram:
    """Mesh a runs F0.0, F0.1 (1 s each); mesh b runs F1.0, F1.1 (2 s each); A-transfers 0.5 s."""
    ops = (op(0, "a", 1.0, mb=0), op(1, "a", 1.0, mb=1),
           op(2, "b", 2.0, inputs=(0,), stage=1, mb=0, flops=10.0),
           op(3, "b", 2.0, inputs=(1,), stage=1, mb=1, flops=10.0))
    trs = (tr(0, 0, "a", "b", "ab", 0.5), tr(1, 1, "a", "b", "ab", 0.5))
    return SimProgram(meshes=("a", "b"), order={"a": (0, 1), "b": (2, 3)}, ops=ops, transfers=trs,
                      **kw)


def test_pipeline_exact_times_and_overlap():
    res = simulate(pipeline_2x2(peak_flops=2.0))
    assert spans(res, "a/compute") == [("o0", 0.0, 1.0), ("o1", 1.0, 2.0)]
    # the first transfer overlaps mesh a's second op
    assert spans(res, "a/send") == [("t0", 1.0, 1.5), ("t1", 2.0, 2.5)]
    assert spans(res, "link:ab") == [("t0", 1.0, 1.5), ("t1", 2.0, 2.5)]
    assert spans(res, "b/recv") == [("t0", 1.0, 1.5), ("t1", 2.0, 2.5)]
    assert spans(res, "b/compute") == [("o2", 1.5, 3.5), ("o3", 3.5, 5.5)]
    assert res.step_time_s == 5.5
    assert res.busy_s == {"a": 2.0, "b": 4.0}
    assert res.bubble == {"a": pytest.approx(1 - 2 / 5.5), "b": pytest.approx(1 - 4 / 5.5)}
    assert res.link_bytes == {"ab": 200.0}
    assert res.mfu == pytest.approx(20.0 / (5.5 * 2.0))
    assert res.errors == () and res.failure is None
    m = res.metrics()
    assert m["step_time_s"] == 5.5 and m["link_bytes"] == {"ab": 200.0}
    df = res.events_df()
    assert len(df) == 10 and set(df["track"]) == {"a/compute", "b/compute", "a/send", "b/recv",
                                                  "link:ab"}
    assert df["duration_s"].sum() == pytest.approx(2 + 4 + 3 * 1.0)


def _fan_in(link0, link1, dst0, dst1, first_tr_from="a"):
    """Meshes a and b each finish a 1 s op at t=1 and send a 1 s transfer."""
    ops = (op(0, "a", 1.0), op(1, "b", 1.0), op(2, "c", 0.0, inputs=(0, 1)))
    if dst1 != "c":
        ops = ops[:2] + (op(2, "c", 0.0, inputs=(0,)), op(3, "d", 0.0, inputs=(1,)))
    ta, tb = ("a", 0, dst0, link0), ("b", 1, dst1, link1)
    pair = (ta, tb) if first_tr_from == "a" else (tb, ta)
    trs = tuple(tr(i, src_op, src, dst, ln, 1.0) for i, (src, src_op, dst, ln) in enumerate(pair))
    if first_tr_from != "a":
        ops = tuple(SimOp(**{**{f: getattr(o, f) for f in SimOp.__slots__},
                             "inputs": tuple(1 - t for t in o.inputs)}) for o in ops)
    meshes = ("a", "b", "c") + (("d",) if len(ops) == 4 else ())
    order = {o.mesh: () for o in ops}
    for o in ops:
        order[o.mesh] += (o.id,)
    return SimProgram(meshes=meshes, order=order, ops=ops, transfers=trs)


def test_link_contention_serialises_fifo_by_transfer_id():
    res = simulate(_fan_in("L", "L", "c", "d"))
    assert spans(res, "link:L") == [("t0", 1.0, 2.0), ("t1", 2.0, 3.0)]
    assert spans(res, "d/compute") == [("o3", 3.0, 3.0)]
    # same ready time: the lower transfer id goes first
    res = simulate(_fan_in("L", "L", "c", "d", first_tr_from="b"))
    assert spans(res, "link:L") == [("t0", 1.0, 2.0), ("t1", 2.0, 3.0)]
    assert [e.mesh for e in res.timeline.events if e.track == "link:L"] == ["b", "a"]


def test_distinct_links_run_in_parallel_but_share_the_receive_stream():
    res = simulate(_fan_in("L0", "L1", "c", "d"))
    assert spans(res, "link:L0") == [("t0", 1.0, 2.0)]
    assert spans(res, "link:L1") == [("t1", 1.0, 2.0)]
    res = simulate(_fan_in("L0", "L1", "c", "c"))
    assert spans(res, "c/recv") == [("t0", 1.0, 2.0), ("t1", 2.0, 3.0)]
    assert spans(res, "c/compute") == [("o2", 3.0, 3.0)]


def test_send_stream_serialises_two_sends():
    ops = (op(0, "a", 1.0), op(1, "b", 0.0, inputs=(0,)), op(2, "c", 0.0, inputs=(1,)))
    trs = (tr(0, 0, "a", "b", "ab", 2.0), tr(1, 0, "a", "c", "ac", 1.0))
    res = simulate(SimProgram(meshes=("a", "b", "c"), order={"a": (0,), "b": (1,), "c": (2,)},
                              ops=ops, transfers=trs))
    assert spans(res, "a/send") == [("t0", 1.0, 3.0), ("t1", 3.0, 4.0)]
    assert res.step_time_s == 4.0


@pytest.mark.parametrize("slots,expect_b", [(1, (1.0, 3.0)), (2, (0.0, 2.0))])
def test_host_slots_serialise_meshes(slots, expect_b):
    ops = (op(0, "a", 1.0), op(1, "b", 2.0))
    prog = SimProgram(meshes=("a", "b"), order={"a": (0,), "b": (1,)}, ops=ops,
                      host_of={"a": "h", "b": "h"}, host_slots={"h": slots})
    res = simulate(prog)
    assert spans(res, "a/compute") == [("o0", 0.0, 1.0)]
    assert spans(res, "b/compute") == [("o1",) + expect_b]


def test_host_slot_tie_goes_to_lower_op_id():
    ops = (op(0, "b", 2.0), op(1, "a", 1.0))
    prog = SimProgram(meshes=("a", "b"), order={"a": (1,), "b": (0,)}, ops=ops,
                      host_of={"a": "h", "b": "h"})
    res = simulate(prog)
    assert spans(res, "b/compute") == [("o0", 0.0, 2.0)]
    assert spans(res, "a/compute") == [("o1", 2.0, 3.0)]


def _memory_prog(capacity=None):
    ops = (op(0, "a", 1.0, alloc=5.0), op(1, "a", 1.0, alloc=5.0), op(2, "a", 1.0, free=5.0),
           op(3, "a", 1.0, free=5.0))
    return SimProgram(meshes=("a",), order={"a": (0, 1, 2, 3)}, ops=ops,
                      baseline_bytes={"a": 10.0},
                      capacity_bytes={} if capacity is None else {"a": capacity})


def test_memory_curve_and_peak():
    res = simulate(_memory_prog())
    assert res.timeline.memory["a"] == ((0.0, 10.0), (0.0, 15.0), (1.0, 20.0), (3.0, 15.0),
                                        (4.0, 10.0))
    assert res.peak_memory_bytes == {"a": 20.0}
    assert res.errors == ()


def test_capacity_error_text_and_raise():
    res = simulate(_memory_prog(capacity=18.0))
    assert res.errors == (
        "mesh 'a' needs 20 bytes per device at t=1 s (o1 starts), over its capacity 18 by 2 bytes; "
        "keep fewer microbatches in flight, recompute, or give the stage a larger mesh",)
    assert res.step_time_s == 4.0
    with pytest.raises(SimError, match=r"^mesh 'a' needs 20 bytes per device at t=1 s"):
        simulate(_memory_prog(capacity=18.0), raise_on_error=True)
    with pytest.raises(SimError, match="over its capacity 18"):
        res.raise_on_errors()


def test_deadlock_names_the_stuck_op_of_each_mesh():
    ops = (op(0, "a", 1.0), op(1, "a", 1.0, deps=(3,)), op(2, "b", 1.0, inputs=(0,)),
           op(3, "b", 1.0))
    trs = (tr(0, 1, "a", "b", "ab", 1.0),)
    prog = SimProgram(meshes=("a", "b"), order={"a": (0, 1), "b": (2, 3)}, ops=ops, transfers=trs)
    with pytest.raises(SimError) as ei:
        simulate(prog)
    assert str(ei.value) == (
        "deadlock at t=1 s: o1 waits for op o3 on mesh 'b'; o2 waits for transfer t0 from o1 on "
        "mesh 'a' (not sent); make the per-mesh orders consistent with the dependencies")


def test_failed_link_and_mesh_report_where_and_when():
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_links={"ab": 1.25}))
    assert res.failure == "link 'ab' failed at 1.25 s while transferring t0"
    assert res.step_time_s == 1.25
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_links={"ab": 1.75}))
    assert res.failure == "link 'ab' failed at 1.75 s with 1 transfer(s) left"
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_meshes={"b": 3.0}))
    assert res.failure == "mesh 'b' failed at 3 s while running o2"
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_meshes={"a": 2.25}))
    assert res.failure == "mesh 'a' failed at 2.25 s while transferring t1"
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_meshes={"b": 0.5}))
    assert res.failure == "mesh 'b' failed at 0.5 s while o2 waits for transfer t0 from o0 on " \
                          "mesh 'a' (not sent)"
    # a failure after the mesh's or link's last use does not fail the step
    res = simulate(pipeline_2x2(), knobs=Knobs(failed_links={"ab": 2.5}, failed_meshes={"a": 3}))
    assert res.failure is None and res.step_time_s == 5.5


def test_stragglers_degraded_links_and_jitter():
    res = simulate(pipeline_2x2(), knobs=Knobs(stragglers={"a": 2.0}, degraded_links={"ab": 0.5}))
    assert spans(res, "a/compute") == [("o0", 0.0, 2.0), ("o1", 2.0, 4.0)]
    assert spans(res, "link:ab") == [("t0", 2.0, 3.0), ("t1", 4.0, 5.0)]
    assert res.step_time_s == 7.0
    j1 = simulate(pipeline_2x2(), knobs=Knobs(seed=3, jitter=0.1))
    j2 = simulate(pipeline_2x2(), knobs=Knobs(seed=3, jitter=0.1))
    j3 = simulate(pipeline_2x2(), knobs=Knobs(seed=4, jitter=0.1))
    assert j1.timeline == j2.timeline
    assert j1.timeline != j3.timeline
    assert spans(j1, "link:ab")[0][2] - spans(j1, "link:ab")[0][1] == 0.5  # transfers not jittered
    with pytest.raises(SimError, match=r"degraded_links\['x'\]=1.5 must be in \(0, 1\]"):
        Knobs(degraded_links={"x": 1.5})


def test_program_validation_messages():
    with pytest.raises(SimError, match=r"^op 'o1' is in no mesh's order; add it to order\['a'\]$"):
        SimProgram(meshes=("a",), order={"a": (0,)}, ops=(op(0, "a", 1.0), op(1, "a", 1.0)))
    with pytest.raises(SimError, match="appears twice"):
        SimProgram(meshes=("a",), order={"a": (0, 0)}, ops=(op(0, "a", 1.0),))
    with pytest.raises(SimError, match="src_mesh 'b' differs"):
        SimProgram(meshes=("a", "b"), order={"a": (0,)}, ops=(op(0, "a", 1.0),),
                   transfers=(tr(0, 0, "b", "a", "l", 1.0),))


def test_empty_program():
    res = simulate(SimProgram(meshes=("a",), order={}, ops=()))
    assert res.step_time_s == 0.0 and res.timeline.events == ()


# --------------------------------------------------------------------------- lowering
def _table_1f1b(P, M):
    order = []
    for r in range(P):
        w = min(P - r - 1, M)
        o = [FragmentRef("F", r, m) for m in range(w)]
        for i in range(M - w):
            o += [FragmentRef("F", r, w + i), FragmentRef("B", r, i)]
        o += [FragmentRef("B", r, m) for m in range(M - w, M)]
        order.append(tuple(o))
    return ScheduleTable("1f1b", P, P, M, tuple(range(P)), tuple(order))


def _frag(r, f):
    return FragmentCost(duration_s=1.0 if f.kind == "F" else 2.0, flops=1.0, residual_bytes=3.0)


def test_lower_1f1b_two_ranks_exact():
    table = _table_1f1b(2, 2)
    prog = lower_schedule(table, ("x", "y"), _frag,
                          lambda a, b, f: BoundaryCost(link="xy", bytes=8.0, duration_s=0.5),
                          tail=lambda m: (TailOp("allreduce", 0.25), TailOp("optimizer", 0.5)),
                          baseline_bytes={"x": 100.0, "y": 100.0}, peak_flops=1.0)
    assert [o.name for o in prog.ops] == ["F0.0", "F0.1", "B0.0", "B0.1", "F1.0", "B1.0", "F1.1",
                                          "B1.1", "allreduce@x", "optimizer@x", "allreduce@y",
                                          "optimizer@y"]
    assert [(t.name, prog.ops[t.src_op].name, t.dst_mesh) for t in prog.transfers] == [
        ("G1.0", "B1.0", "x"), ("G1.1", "B1.1", "x"), ("A0.0", "F0.0", "y"), ("A0.1", "F0.1", "y")]
    assert prog.ops[2].deps == (0,) and prog.ops[2].inputs == (0,)   # B0.0: F0.0 + G1.0
    assert prog.ops[5].deps == (4,) and prog.ops[5].inputs == ()     # B1.0 after F1.0
    assert prog.ops[0].alloc_bytes == 3.0 and prog.ops[2].free_bytes == 3.0
    res = simulate(prog)
    assert spans(res, "y/compute")[:4] == [("F1.0", 1.5, 2.5), ("B1.0", 2.5, 4.5),
                                           ("F1.1", 4.5, 5.5), ("B1.1", 5.5, 7.5)]
    assert spans(res, "x/compute") == [("F0.0", 0.0, 1.0), ("F0.1", 1.0, 2.0), ("B0.0", 5.0, 7.0),
                                       ("B0.1", 8.0, 10.0), ("allreduce@x", 10.0, 10.25),
                                       ("optimizer@x", 10.25, 10.75)]
    assert res.step_time_s == 10.75
    assert res.peak_memory_bytes == {"x": 106.0, "y": 103.0}
    assert res.timeline.memory["x"][-1] == (10.0, 100.0)
    assert res.flops == 8.0


@pytest.mark.parametrize("P,M", [(4, 8), (3, 5)])
def test_lower_1f1b_without_transfers_matches_closed_form(P, M):
    prog = lower_schedule(_table_1f1b(P, M), tuple(f"m{r}" for r in range(P)), _frag,
                          lambda a, b, f: None)
    assert prog.transfers == ()
    res = simulate(prog)
    # 1F1B with uniform costs: (M + P - 1) * (t_F + t_B)
    assert res.step_time_s == (M + P - 1) * 3.0
    assert all(s[-1][1] == 0.0 for s in res.timeline.memory.values())


def test_lower_split_backward_frees_at_w_and_forward_only():
    table = ScheduleTable("zb", 1, 1, 2, (0,), ((FragmentRef("F", 0, 0), FragmentRef("F", 0, 1),
                                                 FragmentRef("B", 0, 0), FragmentRef("B", 0, 1),
                                                 FragmentRef("W", 0, 0), FragmentRef("W", 0, 1)),),
                          split_backward=True)
    prog = lower_schedule(table, ("a",), _frag, lambda a, b, f: None)
    assert [(o.name, o.alloc_bytes, o.free_bytes, o.deps) for o in prog.ops] == [
        ("F0.0", 3.0, 0.0, ()), ("F0.1", 3.0, 0.0, ()), ("B0.0", 0.0, 0.0, (0,)),
        ("B0.1", 0.0, 0.0, (1,)), ("W0.0", 0.0, 3.0, (2,)), ("W0.1", 0.0, 3.0, (3,))]
    fwd = ScheduleTable("inf", 1, 1, 1, (0,), ((FragmentRef("F", 0, 0),),), forward_only=True)
    prog = lower_schedule(fwd, ("a",), _frag, lambda a, b, f: None)
    assert (prog.ops[0].alloc_bytes, prog.ops[0].free_bytes) == (3.0, 3.0)


def test_lower_rejects_bad_tables():
    bad = ScheduleTable("x", 2, 2, 1, (0, 1), ((FragmentRef("F", 1, 0),), (FragmentRef("F", 0, 0),)),
                        forward_only=True)
    with pytest.raises(SimError, match="puts F1.0 on rank 0, but stage 1 belongs to rank 1"):
        lower_schedule(bad, ("a", "b"), _frag, lambda a, b, f: None)
    missing = ScheduleTable("x", 1, 1, 2, (0,), ((FragmentRef("F", 0, 0),),), forward_only=True)
    with pytest.raises(SimError, match=r"never runs F0.1; add it to rank 0's order"):
        lower_schedule(missing, ("a",), _frag, lambda a, b, f: None)
    with pytest.raises(SimError, match="rank_mesh has 2 meshes for a 1-rank"):
        lower_schedule(missing, ("a", "b"), _frag, lambda a, b, f: None)


def test_summarize_measured_timeline_unions_overlaps():
    ev = (TimelineEvent("F0.0", "F", "a/compute", "a", 0, 0, 0.0, 2.0),
          TimelineEvent("F0.1", "F", "a/compute", "a", 0, 1, 1.0, 3.0),
          TimelineEvent("A0.0", "transfer", "link:l", "a", 0, 0, 2.0, 4.0, bytes=5.0),
          TimelineEvent("A0.0", "transfer", "a/send", "a", 0, 0, 2.0, 4.0, bytes=5.0))
    s = summarize(Timeline(ev, {"a": ((0.0, 1.0), (1.0, 7.0))}), meshes=("b",), flops=8.0,
                  peak_flops=1.0)
    assert s.step_time_s == 4.0
    assert s.busy_s == {"b": 0.0, "a": 3.0}
    assert s.bubble == {"b": 1.0, "a": 0.25}
    assert s.peak_memory_bytes == {"a": 7.0}
    assert s.link_bytes == {"l": 5.0} and s.send_bytes == {"a": 5.0}
    assert s.mfu == 2.0


def test_lowered_presets_agree_with_schedule_replay():
    """With deterministic costs and no transfers the engine equals the schedules' exact replay;
    with transfers it can only be slower (streams and links are contended, replay's are not)."""
    from simulator.schedules import SCHEDULES, generate, replay

    def dur(r, f):
        return {"F": 1.0, "B": 2.0, "W": 0.75}[f.kind] * (1 + 0.125 * f.stage)

    for name in SCHEDULES:
        table = generate(name, 4, 8)
        meshes = tuple(f"m{r}" for r in range(4))
        frag = lambda r, f: FragmentCost(duration_s=dur(r, f), residual_bytes=1.0)  # noqa: E731
        rep = replay(table, dur)
        res = simulate(lower_schedule(table, meshes, frag, lambda a, b, f: None))
        assert res.step_time_s == pytest.approx(rep.makespan, abs=1e-9), name
        assert all(s[-1][1] == 0.0 for s in res.timeline.memory.values()), name
        rep = replay(table, dur, lambda a, b, f: 0.25)
        res = simulate(lower_schedule(table, meshes, frag,
                                      lambda a, b, f: BoundaryCost(f"{a}-{b}.{f}", 1.0, 0.25)))
        assert res.step_time_s >= rep.makespan - 1e-9, name


def test_recv_s_holds_the_stream_after_its_previous_op_and_replay_agrees():
    """A blocking receive: an op starts at max(its inputs, previous op's end + recv_s)."""
    import dataclasses

    from simulator.schedules.check import replay

    ops = (op(0, "a", 1.0, mb=0), op(1, "a", 1.0, mb=1),
           dataclasses.replace(op(2, "b", 2.0, deps=(0,), stage=1, mb=0), recv_s=0.5),
           dataclasses.replace(op(3, "b", 2.0, deps=(1,), stage=1, mb=1), recv_s=0.5))
    res = simulate(SimProgram(meshes=("a", "b"), order={"a": (0, 1), "b": (2, 3)}, ops=ops))
    # o2: input at 1.0, stream free at 0 -> max(1.0, 0 + 0.5) = 1.0; o3: input at 2.0, stream free
    # at 3.0 -> 3.5
    assert spans(res, "b/compute") == [("o2", 1.0, 3.0), ("o3", 3.5, 5.5)]
    assert spans(res, "b/recv") == [("recv:o2", 0.5, 1.0), ("recv:o3", 3.0, 3.5)]
    assert res.busy_s["b"] == 4.0                        # receiving is not compute
    table = ScheduleTable(name="t", num_ranks=2, num_stages=2, microbatches=2, stage_rank=(0, 1),
                          order=((FragmentRef("F", 0, 0), FragmentRef("F", 0, 1)),
                                 (FragmentRef("F", 1, 0), FragmentRef("F", 1, 1))),
                          forward_only=True)
    rp = replay(table, lambda r, f: 1.0 if f.stage == 0 else 2.0,
                receive=lambda r, f: 0.5 if f.stage == 1 else 0.0)
    assert rp.start[(1, FragmentRef("F", 1, 1))] == 3.5 and rp.makespan == 5.5
    with pytest.raises(SimError, match="recv_s"):
        SimProgram(meshes=("a",), order={"a": (0,)},
                   ops=(dataclasses.replace(op(0, "a", 1.0), recv_s=-1.0),))
