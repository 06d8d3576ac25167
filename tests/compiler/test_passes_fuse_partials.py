"""fuse_partials: a mesh's small inferred partial results made inside the backward they read.

Hand-built programs (two microbatches' backward accumulating a gradient, then the partial sum of
squares that gradient clipping sends to another mesh): the partial joins the last backward, the
first backward computes it too (a result nothing reads) so the two keep one body, values are
unchanged and the verifier accepts the result; a partial reading a value its backward does not
have, or making a large result, is left alone. Then the guide's example step (a GPT with tied
embeddings and optax ``clip_by_global_norm`` + ``adamw`` on 4 meshes of 2 CPU devices): its
exact executable count, issue 49's limit (the step without the update + one per mesh), and its
results against ``jax.jit``.
"""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import jax
import numpy as np
import pytest
from jax import lax

import compiler
from compiler.driver import PIPELINE
from compiler.passes.fuse_partials import fuse_partials
from compiler.program import (Eqn, Fragment, Origin, Program, TensorType, Transfer, body_key,
                              eval_body)
from compiler.verify import verify

ROOT = Path(__file__).resolve().parents[2]
T = TensorType((4,), "float32")
BIG = TensorType((64, 64), "float32")
S = TensorType((), "float32")


def eq(prim, ins, out, **params):
    return Eqn(prim, params, tuple(ins), (out,))


def backward(cc, x, acc_in, acc_out, g, t=T):
    """A user backward fragment of stage 0, call counter ``cc``: ``acc_out = acc_in + x * x``."""
    body = (eq(lax.mul_p, [x, x], g), eq(lax.add_p, [acc_in, g], acc_out))
    return Fragment("m1", (Origin("layer", 1),), (x, acc_in), (acc_out,), body, 0, cc)


def partial(src, out, mid, axes=(0,)):
    """The inferred partial: ``sum(src ** 2)``."""
    body = (eq(lax.mul_p, [src, src], mid), eq(lax.reduce_sum_p, [mid], out, axes=axes,
                                                  out_sharding=None))
    return Fragment("m1", (), (src,), (out,), body)


def program(t=T, extra_input=False, big_result=False):
    """zeros -> B0 -> B1 -> partial (sent to m2, where it is doubled); the gradient is an output."""
    zeros = Fragment("m1", (), ("x0",), ("a0",), (eq(lax.sub_p, ["x0", "x0"], "a0"),))
    ops = [zeros, backward(0, "x0", "a0", "a1", "g0"), backward(1, "x1", "a1", "a2", "g1")]
    types = {v: t for v in ("x0", "x1", "a0", "a1", "a2", "g0", "g1", "m")}
    types.update(s=S, s2=S, d=S, y=S)
    if extra_input:   # the partial also reads a value of m1 that the backward does not read
        body = partial("a2", "s", "m").body + (eq(lax.add_p, ["s", "y"], "s2"),)
        ops.append(Fragment("m1", (), ("a2", "y"), ("s2",), body))
        inputs, meshes, sent = ("x0", "x1", "y"), ("m1", "m1", "m1"), "s2"
    elif big_result:  # the squares themselves, not their sum
        ops.append(Fragment("m1", (), ("a2",), ("m",), partial("a2", "s", "m").body[:1]))
        inputs, meshes, sent = ("x0", "x1"), ("m1", "m1"), "m"
    else:
        ops.append(partial("a2", "s", "m"))
        inputs, meshes, sent = ("x0", "x1"), ("m1", "m1"), "s"
    ops += [Transfer(sent, "m1", "m2", "r"),
            Fragment("m2", (), ("r",), ("d",), (eq(lax.add_p, ["r", "r"], "d"),))]
    types["r"] = types["d"] = types[sent]
    return Program(("m1", "m2"), inputs, meshes, ("a2", "d"), ("m1", "m2"), tuple(ops), types)


def run(p, args):
    env = dict(zip(p.inputs, args))
    for op in p.ops:
        if isinstance(op, Transfer):
            env[op.out] = env[op.value]
        else:
            env.update(zip(op.outputs, eval_body(op.body, op.inputs, op.outputs,
                                                 [env[v] for v in op.inputs])))
    return [np.asarray(env[v]) for v in p.outputs]


def test_the_partial_joins_the_last_backward_and_every_microbatch_keeps_one_body():
    p = program()
    q = fuse_partials(p)
    verify(q)
    frags = [op for op in q.ops if isinstance(op, Fragment)]
    assert [(f.mesh, f.is_user, f.call_counter) for f in frags] == \
        [("m1", False, None), ("m1", True, 0), ("m1", True, 1), ("m2", False, None)]
    b0, b1 = frags[1], frags[2]
    assert b1.outputs == ("a2", "s")                       # the partial, now B1's result
    assert len(b0.outputs) == 2 and b0.outputs[0] == "a1"  # B0's copy: a result nothing reads
    assert body_key(b0, q) == body_key(b1, q)              # one executable for both
    assert b0.inputs == ("x0", "a0") and b1.inputs == ("x1", "a1")   # no operand added
    args = [np.arange(4, dtype=np.float32), np.ones(4, np.float32)]
    for a, b in zip(run(q, args), run(p, args)):
        np.testing.assert_array_equal(a, b)
    assert fuse_partials(q) is q


def test_a_partial_reading_more_than_its_backward_or_making_a_large_result_stays_apart():
    for p in (program(extra_input=True), program(t=BIG, big_result=True)):
        assert fuse_partials(p) is p
    big_operands = program(t=BIG)                 # large operands, a small result: fused
    assert fuse_partials(big_operands) is not big_operands


class _Effectful:
    """A primitive with an effect (as a debug print's): its copies would repeat it."""

    name, multiple_results, effects = "effectful", False, frozenset({"io"})


def test_a_partial_with_an_effect_stays_apart():
    p = program()
    ops = list(p.ops)
    g = ops[3]
    ops[3] = replace(g, body=g.body + (Eqn(_Effectful(), {}, ("s",), ("e",)),))
    q = replace(p, ops=tuple(ops), types={**p.types, "e": S})
    assert fuse_partials(q) is q


def split_program(rest_readers=1):
    """B0, B1 on ``BIG`` values, then a fragment making both the partial ``s = sum((2 a2) ** 2)``
    (sent to m2) and ``h = 2 a2`` (large), which ``rest_readers`` later fragments of m1 read
    (the update after the global norm comes back, as with an L2 term added to the gradients)."""
    zeros = Fragment("m1", (), ("x0",), ("a0",), (eq(lax.sub_p, ["x0", "x0"], "a0"),))
    ops = [zeros, backward(0, "x0", "a0", "a1", "g0"), backward(1, "x1", "a1", "a2", "g1")]
    body = (eq(lax.add_p, ["a2", "a2"], "h"),) + partial("h", "s", "m", axes=(0, 1)).body
    ops += [Fragment("m1", (), ("a2",), ("h", "s"), body), Transfer("s", "m1", "m2", "r"),
            Fragment("m2", (), ("r",), ("d",), (eq(lax.add_p, ["r", "r"], "d"),)),
            Transfer("d", "m2", "m1", "n")]
    outs = []
    for k in range(rest_readers):
        body = (eq(lax.reduce_sum_p, ["h"], f"t{k}", axes=(0, 1), out_sharding=None),
                eq(lax.mul_p, [f"t{k}", "n"], f"u{k}"))
        ops.append(Fragment("m1", (), ("h", "n"), (f"u{k}",), body))
        outs.append(f"u{k}")
    types = {v: BIG for v in ("x0", "x1", "a0", "a1", "a2", "g0", "g1", "m", "h")}
    types.update(s=S, r=S, d=S, n=S, t0=S, t1=S, u0=S, u1=S)
    return Program(("m1", "m2"), ("x0", "x1"), ("m1", "m1"), tuple(outs), ("m1",) * len(outs),
                   tuple(ops), types)


def test_a_partial_made_with_a_large_result_leaves_that_result_to_its_one_reader():
    """The partial's slice is made in the backward (and copied into B0); the large result's slice
    is made again at the start of its one reader (the update), so no large result is added to
    the backward and no fragment of its own is left."""
    p = split_program()
    q = fuse_partials(p)
    verify(q)
    frags = [op for op in q.ops if isinstance(op, Fragment)]
    assert [(f.mesh, f.is_user) for f in frags] == [("m1", False), ("m1", True), ("m1", True),
                                                   ("m2", False), ("m1", False)]
    b0, b1, upd = frags[1], frags[2], frags[4]
    assert b1.outputs == ("a2", "s") and len(b0.outputs) == 2
    assert body_key(b0, q) == body_key(b1, q)
    assert set(upd.inputs) == {"a2", "n"} and upd.body[0].outputs == ("h",)
    args = [np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64),
            np.ones((64, 64), np.float32)]
    for a, b in zip(run(q, args), run(p, args)):
        np.testing.assert_array_equal(a, b)
    # the large result read by two fragments (or a program output) is not made twice
    two = split_program(rest_readers=2)
    assert fuse_partials(two) is two


def test_the_pass_runs_after_the_last_dce_and_before_sharding():
    names = [s.name for s in PIPELINE]
    k = names.index("fuse_partials")
    assert "dce" in names[:k] and "dce" not in names[k:] and names[k + 1] == "sharding"


# --------------------------------------------------------------------------- the guide's example


@pytest.fixture(scope="module")
def gpt():
    pytest.importorskip("optax")
    spec = importlib.util.spec_from_file_location("gpt_optax", ROOT / "examples" / "gpt_optax.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpt_optax"] = mod     # its dataclasses look their module up
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop("gpt_optax", None)


def test_the_examples_step_with_optax_compiles_to_the_limit_and_matches_jit(gpt):
    """13 executables without the update, 17 with it (19 before fuse_partials: each mesh but the
    last had its partial norm as a fragment of its own; m1 and m2's are now in their backward;
    m0's also reads the tied embedding's gradient parts sent from m3, and stays apart)."""
    key = jax.random.PRNGKey(0)
    params = gpt.init_params(key)
    idx, tgt = gpt.batches(jax.random.fold_in(key, 1), gpt.MICROBATCHES)
    config = gpt.make_config()
    opt_state = gpt.OPTIMIZER.init(params)
    base = compiler.jit(gpt.grad_step, config).lower(params, idx, tgt)
    low = compiler.jit(gpt.train_step, config, verify=True).lower(params, opt_state, idx, tgt)
    n_base, n = len(base.exported.executables), len(low.exported.executables)
    assert (n_base, n) == (13, 17)
    assert n <= n_base + gpt.MESHES                       # issue 49's limit
    inferred = {}
    for f in low.program.fragments():
        if not f.is_user and f.part != "init":
            inferred[f.mesh] = inferred.get(f.mesh, 0) + 1
    assert inferred == {"m0": 2, "m1": 1, "m2": 1, "m3": 1}
    loss, grads, new_params, new_state = low.compile(executor=gpt.runtime_executor)(
        params, opt_state, idx, tgt)
    want_loss, want_grads = jax.jit(gpt.grad_step)(params, idx, tgt)
    assert abs(float(loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
    assert gpt.max_rel(grads, want_grads) <= 1e-5
    same = jax.tree.map(np.asarray, grads)    # Adam's first step compared on the same gradients
    want_p, want_s = jax.jit(gpt.adamw_update)(same, opt_state, params)
    assert max(gpt.max_rel(new_params, want_p), gpt.max_rel(new_state, want_s)) <= 1e-5
    off = compiler.jit(gpt.train_step, replace(config, fuse_partials=False)).lower(
        params, opt_state, idx, tgt)
    assert len(off.exported.executables) == 19            # each partial norm a fragment apart
