"""Tests of compiler.runtime on hand-built exported pipelines over 4 meshes of 2 CPU devices.

The helper ``pipeline_program`` lowers a tiny pipelined MLP (stage s: ``tanh(x @ w_s)``, loss the mean
square of the last stage's output) under a given schedule into an ExportedProgram by hand, so the
runtime is tested independently of the compiler's passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from compiler.exported import Call, Executable, ExportedProgram, MeshProgram, Send
from ir import FragmentRef
from compiler.runtime import (DeadlockError, MpmdRuntimeError, execute, executed_order,
                              run_program)

WIDTH, MB_ROWS = 16, 4


def meshes4() -> dict[str, Mesh]:
    devs = jax.devices()
    assert len(devs) >= 8
    return {f"m{i}": Mesh(np.array(devs[2 * i:2 * i + 2]), ("data",)) for i in range(4)}


def _stage(w, x):
    return jnp.tanh(x @ w)


def _loss(y):
    return jnp.mean(y * y)


# ---------------------------------------------------------------- schedules (per rank, as refs)
def gpipe(P_, M):
    return [[FragmentRef("F", r, m) for m in range(M)] + [FragmentRef("B", r, m) for m in range(M)]
            for r in range(P_)]


def one_f_one_b(P_, M):
    out = []
    for r in range(P_):
        w = min(P_ - r - 1, M)
        o = [FragmentRef("F", r, m) for m in range(w)]
        for i in range(M - w):
            o += [FragmentRef("F", r, w + i), FragmentRef("B", r, i)]
        o += [FragmentRef("B", r, m) for m in range(M - w, M)]
        out.append(o)
    return out


def zb_h1(P_, M):
    """1F1B with the weight gradient W of microbatch i deferred by P-r-1 backward slots."""
    out = []
    for r, o in enumerate(one_f_one_b(P_, M)):
        lag, res, done = P_ - r - 1, [], 0
        for f in o:
            res.append(f)
            if f.kind == "B":
                if f.microbatch - lag >= 0:
                    res.append(FragmentRef("W", r, f.microbatch - lag))
                    done += 1
        res += [FragmentRef("W", r, m) for m in range(done, M)]
        out.append(res)
    return out


def interleaved(P_, M, V=2):
    """Stage s on rank s % P; each rank: all F of its stages (in order), then B in reverse."""
    out = []
    for r in range(P_):
        stages = [r + v * P_ for v in range(V)]
        o = [FragmentRef("F", s, m) for s in stages for m in range(M)]
        o += [FragmentRef("B", s, m) for s in reversed(stages) for m in range(M)]
        out.append(o)
    return out


def pipeline_program(order, num_stages, stage_mesh, meshes, split=False):
    """Lower the toy pipeline under ``order`` (mesh -> refs) into an ExportedProgram by hand.

    Inputs: w_0..w_{S-1} (on their stage's mesh), x_0..x_{M-1} (on stage 0's mesh).
    Outputs: loss (sum over microbatches / M, on the last stage's mesh), then dw_0..dw_{S-1}.
    """
    S, last = num_stages, num_stages - 1
    M = 1 + max(f.microbatch for frs in order.values() for f in frs)
    act = {m: NamedSharding(meshes[m], P("data")) for m in meshes}
    rep = {m: NamedSharding(meshes[m], P()) for m in meshes}

    def f_fwd(w, x):
        return (_stage(w, x),)

    def f_bwd(w, x, g):
        _, vjp = jax.vjp(_stage, w, x)
        dw, dx = vjp(g)
        return dx, dw

    def f_bwd_last(w, x):
        l, vjp = jax.vjp(lambda w, x: _loss(_stage(w, x)) / M, w, x)
        dw, dx = vjp(jnp.ones_like(l))
        return dx, dw, l

    def f_bwd_in(w, x, g):
        return (f_bwd(w, x, g)[0],)

    def f_bwd_w(w, x, g):
        return (f_bwd(w, x, g)[1],)

    def f_acc(*xs):
        return (sum(xs[1:], xs[0]),)

    execs: dict[str, Executable] = {}

    def ex(mesh, key, fn, n_in):
        k = f"{mesh}:{key}"
        if k not in execs:
            execs[k] = Executable(k, mesh, jax.jit(fn), (rep[mesh],) * n_in)
        return k

    steps: dict[str, list] = {m: [] for m in meshes}
    for mesh, frs in order.items():
        for f in frs:
            s, m = f.stage, f.microbatch
            x, g = f"x{s}.{m}", f"g{s}.{m}"
            if f.kind == "F":
                steps[mesh].append(Call(ex(mesh, "F", f_fwd, 2), str(f), "F", s, m,
                                        (f"w{s}", x), (f"y{s}.{m}",)))
                if s < last:
                    dst = stage_mesh[s + 1]
                    if dst == mesh:
                        steps[mesh].append(Call(ex(mesh, "id", lambda a: (a,), 1), f"copy{s}.{m}",
                                                "other", s, m, (f"y{s}.{m}",), (f"x{s + 1}.{m}",)))
                    else:
                        steps[mesh].append(Send(f"y{s}.{m}", dst, f"x{s + 1}.{m}", act[dst]))
                continue
            if s == last and f.kind == "B":
                outs = (f"dx{s}.{m}", f"dw{s}.{m}", f"l{m}")
                if split:
                    steps[mesh].append(Call(ex(mesh, "Blast", lambda w, x: f_bwd_last(w, x)[::2], 2),
                                            str(f), "B", s, m, (f"w{s}", x),
                                            (f"dx{s}.{m}", f"l{m}")))
                else:
                    steps[mesh].append(Call(ex(mesh, "Blast", f_bwd_last, 2), str(f), "B", s, m,
                                            (f"w{s}", x), outs))
            elif f.kind == "W" and s == last:
                steps[mesh].append(Call(ex(mesh, "Wlast", lambda w, x: (f_bwd_last(w, x)[1],), 2),
                                        str(f), "W", s, m, (f"w{s}", x), (f"dw{s}.{m}",)))
            elif f.kind == "W":
                steps[mesh].append(Call(ex(mesh, "W", f_bwd_w, 3), str(f), "W", s, m,
                                        (f"w{s}", x, g), (f"dw{s}.{m}",)))
            else:  # B, not last
                if split:
                    steps[mesh].append(Call(ex(mesh, "Bin", f_bwd_in, 3), str(f), "B", s, m,
                                            (f"w{s}", x, g), (f"dx{s}.{m}",)))
                else:
                    steps[mesh].append(Call(ex(mesh, "B", f_bwd, 3), str(f), "B", s, m,
                                            (f"w{s}", x, g), (f"dx{s}.{m}", f"dw{s}.{m}")))
            if s > 0:
                dst = stage_mesh[s - 1]
                if dst == mesh:
                    steps[mesh].append(Call(ex(mesh, "id", lambda a: (a,), 1), f"copyg{s}.{m}",
                                            "other", s, m, (f"dx{s}.{m}",), (f"g{s - 1}.{m}",)))
                else:
                    steps[mesh].append(Send(f"dx{s}.{m}", dst, f"g{s - 1}.{m}", act[dst]))
    for s in range(S):
        mesh = stage_mesh[s]
        steps[mesh].append(Call(ex(mesh, f"acc{M}", f_acc, M), f"acc{s}", "other", s, -1,
                                tuple(f"dw{s}.{m}" for m in range(M)), (f"dw{s}",)))
    lm = stage_mesh[last]
    steps[lm].append(Call(ex(lm, f"acc{M}", f_acc, M), "loss", "other", last, -1,
                          tuple(f"l{m}" for m in range(M)), ("loss",)))
    inputs = tuple((f"w{s}", stage_mesh[s], rep[stage_mesh[s]]) for s in range(S))
    inputs += tuple((f"x0.{m}", stage_mesh[0], act[stage_mesh[0]]) for m in range(M))
    outputs = (("loss", lm),) + tuple((f"dw{s}", stage_mesh[s]) for s in range(S))
    return ExportedProgram({m: MeshProgram(m, tuple(v)) for m, v in steps.items()}, execs,
                           inputs, outputs)


def reference(ws, xs):
    def total(ws):
        out = 0.0
        for x in xs:
            for w in ws:
                x = _stage(w, x)
            out = out + _loss(x) / len(xs)
        return out
    return jax.jit(jax.value_and_grad(total))(ws)


def _data(S, M, seed=0):
    k = jax.random.split(jax.random.PRNGKey(seed), S + M)
    ws = [jax.random.normal(k[i], (WIDTH, WIDTH)) / np.sqrt(WIDTH) for i in range(S)]
    xs = [jax.random.normal(k[S + i], (MB_ROWS, WIDTH)) for i in range(M)]
    return ws, xs


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


CASES = {
    "gpipe": (lambda: gpipe(4, 4), 4, False),
    "1f1b": (lambda: one_f_one_b(4, 4), 4, False),
    "zb-h1": (lambda: zb_h1(4, 4), 4, True),
    "interleaved": (lambda: interleaved(4, 4), 8, False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_schedules_match_jit_and_order(name):
    make, S, split = CASES[name]
    meshes = meshes4()
    names = list(meshes)
    refs = make()
    order = {names[r]: refs[r] for r in range(4)}
    stage_mesh = [names[s % 4] for s in range(S)]
    prog = pipeline_program(order, S, stage_mesh, meshes, split=split)
    ws, xs = _data(S, 4)
    ex = run_program(prog, (ws, xs))
    loss, grads = ex.outputs[0], ex.outputs[1:]
    rl, rg = reference(ws, xs)
    assert _rel(loss, rl) < 1e-5
    for s in range(S):
        assert _rel(grads[s], rg[s]) < 1e-5
        assert grads[s].sharding.mesh == meshes[stage_mesh[s]]
    for mesh, frs in order.items():
        fragments = tuple(n for n in ex.order[mesh] if n[0] in "FBW" and "." in n)
        assert fragments == tuple(str(f) for f in frs)
    # the timeline: one compute event per call, honest non-overlapping intervals (one at a time)
    tl = ex.timeline
    assert executed_order(tl) == ex.order
    ev = sorted(tl.events, key=lambda e: e.start_s)
    assert all(e.end_s >= e.start_s >= 0 for e in ev)
    assert all(a.end_s <= b.start_s + 1e-9 for a, b in zip(ev, ev[1:]))
    sends = [e for e in ev if e.kind == "transfer"]
    assert sends and all(e.bytes == MB_ROWS * WIDTH * 4 for e in sends)
    assert tl.step_time_s == pytest.approx(ex.wall_s)


def test_execute_returns_outputs_and_timeline_and_unrecorded_run_matches():
    meshes = meshes4()
    names = list(meshes)
    refs = one_f_one_b(4, 2)
    prog = pipeline_program({names[r]: refs[r] for r in range(4)}, 4, names, meshes)
    ws, xs = _data(4, 2, seed=1)
    out, tl = execute(prog, (ws, xs))
    ex2 = run_program(prog, (ws, xs), record=False)
    assert ex2.timeline.events == ()
    assert float(out[0]) == float(ex2.outputs[0])
    assert ex2.order == executed_order(tl)
    calls = sum(isinstance(s, Call) for p in prog.programs.values() for s in p.steps)
    sends = sum(isinstance(s, Send) for p in prog.programs.values() for s in p.steps)
    assert len([e for e in tl.events if e.track.endswith("/compute")]) == calls
    assert len([e for e in tl.events if e.track.endswith("/send")]) == sends
    # every executable of a mesh was called by that mesh
    for m in names:
        assert set(ex2.executables_called[m]) == {k for k, e in prog.executables.items()
                                                  if e.mesh == m}


def test_deadlock_is_detected_and_names_blocked_steps():
    meshes = meshes4()
    names = list(meshes)
    refs = one_f_one_b(4, 2)
    # rank 0 runs its backwards before its forwards: B0.0 waits for a gradient that needs F0.0.
    bad = [FragmentRef("B", 0, 0), FragmentRef("B", 0, 1), FragmentRef("F", 0, 0),
           FragmentRef("F", 0, 1)]
    order = {names[0]: bad, **{names[r]: refs[r] for r in range(1, 4)}}
    prog = pipeline_program(order, 4, names, meshes)
    ws, xs = _data(4, 2)
    with pytest.raises(DeadlockError, match=r"m0 step 0 \(B0.0\) waits for \['g0.0'\].*m1 step 0 "
                                             r"\(F1.0\) waits for \['x1.0'\]"):
        run_program(prog, (ws, xs))


def test_bad_programs_raise_one_line_errors():
    meshes = meshes4()
    names = list(meshes)
    refs = gpipe(4, 1)
    prog = pipeline_program({names[r]: refs[r] for r in range(4)}, 4, names, meshes)
    ws, xs = _data(4, 1)
    with pytest.raises(MpmdRuntimeError, match="takes 5 flattened arguments, got 4"):
        run_program(prog, (ws, xs[:0]))
    bogus = ExportedProgram(prog.programs, {k: v for k, v in prog.executables.items()
                                            if k != "m0:F"}, prog.inputs, prog.outputs)
    with pytest.raises(MpmdRuntimeError, match="unknown executable 'm0:F'"):
        run_program(bogus, (ws, xs))
    missing = ExportedProgram(prog.programs, prog.executables, prog.inputs,
                              prog.outputs + (("nope", "m3"),))
    with pytest.raises(MpmdRuntimeError, match="output 'nope' was never produced on mesh 'm3'"):
        run_program(missing, (ws, xs))


def _two_sends_program():
    """m0 computes two values and sends both to m1 (consecutive sends), m1 adds them."""
    meshes = meshes4()
    s0, s1 = (NamedSharding(meshes[m], P()) for m in ("m0", "m1"))
    f = jax.jit(lambda x: (x + 1.0, x * 2.0), in_shardings=(s0,), out_shardings=(s0, s0))
    g = jax.jit(lambda a, b: a + b, in_shardings=(s1, s1), out_shardings=s1)
    progs = {"m0": MeshProgram("m0", (Call("f", "F0.0", "F", 0, 0, ("x",), ("a", "b")),
                                      Send("a", "m1", "a1", s1), Send("b", "m1", "b1", s1))),
             "m1": MeshProgram("m1", (Call("g", "F1.0", "F", 1, 0, ("a1", "b1"), ("y",)),))}
    exes = {"f": Executable("f", "m0", f, (s0,), (s0, s0)),
            "g": Executable("g", "m1", g, (s1, s1), (s1,))}
    return ExportedProgram(progs, exes, (("x", "m0", s0),), (("y", "m1"),)), s0


def test_plan_is_cached_batches_consecutive_sends_and_keeps_placed_arguments():
    from compiler.runtime import CALL, SEND, _place, plan
    prog, s0 = _two_sends_program()
    p = plan(prog)
    assert plan(prog) is p
    assert [ins[0] for ins in p.instrs] == [CALL, SEND, CALL]
    assert p.instrs[1][2] == (1, 2)            # both sends of m0, one batched device_put
    x = jnp.arange(4.0)
    ex = run_program(prog, (x,), record=False)
    np.testing.assert_array_equal(np.asarray(ex.outputs[0]), 3 * np.arange(4.0) + 1)
    assert ex.steps == {"m0": ("call:F0.0", "send:a->m1", "send:b->m1"), "m1": ("call:F1.0",)}
    # recorded, each send is still its own timed transfer event
    rec = run_program(prog, (x,))
    assert [e.name for e in rec.timeline.events if e.kind == "transfer"] == ["a->m1", "b->m1"]
    # an argument already on its input's sharding is used as it is; another is placed there
    placed = jax.device_put(x, s0)
    regs = [None] * p.n_slots
    _place(p, [placed], regs)
    assert regs[p.inputs[0][0]] is placed
    _place(p, [x], regs)
    assert regs[p.inputs[0][0]] is not x and regs[p.inputs[0][0]].sharding == s0


def test_the_direct_batched_copy_matches_device_put_and_falls_back(monkeypatch):
    """``_batched_copy``: replicated to replicated goes by the direct copy (no ``device_put``); a
    value laid out otherwise than its target (sharded, or from one device to two) and a host array
    go by ``jax.device_put``; every result equals the value on the target sharding."""
    import compiler.runtime as rt
    meshes = meshes4()
    r0, r1 = (NamedSharding(meshes[m], P()) for m in ("m0", "m1"))
    split1 = NamedSharding(meshes["m1"], P("data"))
    one = NamedSharding(Mesh(np.array(jax.devices()[6:7]), ("data",)), P())
    x = jnp.arange(8.0).reshape(4, 2)
    puts: list[int] = []
    real_put = jax.device_put

    def counting_put(xs, *a, **k):
        puts.append(len(xs) if isinstance(xs, list) else 1)
        return real_put(xs, *a, **k)

    a0, b0, c1 = (jax.device_put(x, s) for s in (r0, one, r0))
    monkeypatch.setattr(rt.jax, "device_put", counting_put)
    ys = rt._batched_copy([a0, c1 * 2.0], [r1, r1])
    assert puts == []
    for y, want in zip(ys, (x, 2.0 * x)):
        assert y.sharding == r1
        np.testing.assert_array_equal(np.asarray(y), np.asarray(want))
    for srcs, shs in (([a0], [split1]), ([b0], [r1]), ([np.asarray(x)], [r1]), ([a0, b0], [r1, r1])):
        puts.clear()
        ys = rt._batched_copy(srcs, shs)
        assert puts == [len(srcs)]
        for y, sh in zip(ys, shs):
            assert y.sharding == sh
            np.testing.assert_array_equal(np.asarray(y), np.asarray(x))


def test_cpu_replay_holds_sends_until_read_and_makes_the_zeros_once(monkeypatch):
    """Unrecorded on CPU: the sends m0 makes before m1 reads either go in one batched copy, and
    the accumulator ``init`` call runs on the first replay only (its zeros reused after)."""
    import compiler.runtime as rt
    meshes = meshes4()
    s0, s1 = (NamedSharding(meshes[m], P()) for m in ("m0", "m1"))
    inits = []
    zeros = jax.jit(lambda: jnp.zeros(4), out_shardings=s0)

    def init():
        inits.append(1)
        return zeros()

    f = jax.jit(lambda x, z: (x + z + 1.0, x * 2.0), in_shardings=(s0, s0), out_shardings=(s0, s0))
    h = jax.jit(lambda b: b - 1.0, in_shardings=(s0,), out_shardings=s0)
    g = jax.jit(lambda a, c: a + c, in_shardings=(s1, s1), out_shardings=s1)
    progs = {"m0": MeshProgram("m0", (Call("z", "init", "init", -1, -1, (), ("z",)),
                                      Call("f", "F0.0", "F", 0, 0, ("x", "z"), ("a", "b")),
                                      Send("a", "m1", "a1", s1),
                                      Call("h", "F0.1", "F", 0, 1, ("b",), ("c",)),
                                      Send("c", "m1", "c1", s1))),
             "m1": MeshProgram("m1", (Call("g", "F1.0", "F", 1, 0, ("a1", "c1"), ("y",)),))}
    exes = {"z": Executable("z", "m0", init, (), (s0,)),
            "f": Executable("f", "m0", f, (s0, s0), (s0, s0)),
            "h": Executable("h", "m0", h, (s0,), (s0,)),
            "g": Executable("g", "m1", g, (s1, s1), (s1,))}
    prog = ExportedProgram(progs, exes, (("x", "m0", s0),), (("y", "m1"),))
    x = jnp.arange(4.0)
    want = (x + 1.0) + (2.0 * x - 1.0)
    np.testing.assert_array_equal(np.asarray(run_program(prog, (x,)).outputs[0]), want)
    assert len(inits) == 1            # recorded: every call runs
    puts: list[int] = []
    copies: list[int] = []
    real_put, real_copy = jax.device_put, rt._batched_copy

    def counting_put(xs, *a, **k):
        puts.append(len(xs) if isinstance(xs, list) else 1)
        return real_put(xs, *a, **k)

    def counting_copy(xs, shs):
        copies.append(len(xs))
        return real_copy(xs, shs)

    x0 = jax.device_put(x, s0)        # on its input's sharding: not placed again
    monkeypatch.setattr(rt.jax, "device_put", counting_put)
    monkeypatch.setattr(rt, "_batched_copy", counting_copy)
    for k in range(2):
        out = run_program(prog, (x0,), record=False).outputs[0]
        np.testing.assert_array_equal(np.asarray(out), want)
        assert out.sharding == s1
    assert copies == [2, 2]           # a and c in one batched copy, on each replay
    assert puts == []                 # replicated to replicated: the direct copy, no device_put
    assert len(inits) == 2            # the zeros made on the first unrecorded replay only


def test_cpu_replay_sends_a_held_value_before_a_call_donates_it(monkeypatch):
    """Unrecorded on CPU, a send is held until read; a later call on the sending mesh that
    donates (deletes) the sent buffer makes the held batch go first. An ``init`` call whose
    zeros a call donates runs on every replay (its zeros cannot be reused); donation happens (the
    donated array is deleted) and no deleted buffer is read, replay after replay."""
    import compiler.runtime as rt
    meshes = meshes4()
    s0, s1 = (NamedSharding(meshes[m], P()) for m in ("m0", "m1"))
    inits, seen = [], []
    zeros = jax.jit(lambda: jnp.zeros(4), out_shardings=s0)

    def init():
        inits.append(1)
        return zeros()

    f = jax.jit(lambda x: x * 2.0, in_shardings=(s0,), out_shardings=s0)
    h_jit = jax.jit(lambda a, z: (a + z + 1.0, z - a), in_shardings=(s0, s0),
                    out_shardings=(s0, s0), donate_argnums=(0, 1))

    def h(a, z):
        seen.append((a, z))
        return h_jit(a, z)

    g = jax.jit(lambda a, c: a * c, in_shardings=(s1, s1), out_shardings=s1)
    progs = {"m0": MeshProgram("m0", (Call("z", "init", "init", -1, -1, (), ("z",)),
                                      Call("f", "F0.0", "F", 0, 0, ("x",), ("a",)),
                                      Send("a", "m1", "a1", s1),
                                      Call("h", "F0.1", "F", 0, 1, ("a", "z"), ("c", "d"),
                                           (0, 1)),
                                      Send("c", "m1", "c1", s1))),
             "m1": MeshProgram("m1", (Call("g", "F1.0", "F", 1, 0, ("a1", "c1"), ("y",)),))}
    exes = {"z": Executable("z", "m0", init, (), (s0,)),
            "f": Executable("f", "m0", f, (s0,), (s0,)),
            "h": Executable("h", "m0", h, (s0, s0), (s0, s0), (0, 1)),
            "g": Executable("g", "m1", g, (s1, s1), (s1,))}
    prog = ExportedProgram(progs, exes, (("x", "m0", s0),), (("y", "m1"),))
    x0 = jax.device_put(jnp.arange(4.0), s0)
    want = (2.0 * np.arange(4.0)) * (2.0 * np.arange(4.0) + 1.0)
    copies: list[int] = []
    real_copy = rt._batched_copy

    def counting_copy(xs, shs):
        copies.append(len(xs))
        return real_copy(xs, shs)

    monkeypatch.setattr(rt, "_batched_copy", counting_copy)
    for k in range(3):
        out = run_program(prog, (x0,), record=False).outputs[0]
        np.testing.assert_array_equal(np.asarray(out), want)
        a, z = seen[-1]
        assert a.is_deleted() and z.is_deleted()     # donated on CPU
    assert copies == [1, 1] * 3       # a sent before h deletes it, then c
    assert len(inits) == 3            # donated zeros are made again on each replay
    assert not x0.is_deleted()
    np.testing.assert_array_equal(np.asarray(run_program(prog, (x0,)).outputs[0]), want)
