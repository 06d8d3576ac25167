"""merge_inferred: each mesh's inferred fragments merged into as few as their dependencies allow.

Hand-built programs (what the passes before it leave of an optimizer step): per-mesh partial
sums sent to one mesh, a global scale sent back, per-mesh updates; the exact fragments after the
pass, the verifier, every mesh's user fragments in their order, and the values unchanged. A
hypothesis test checks the same on random programs.
"""

import numpy as np
from hypothesis import given, strategies as st
from jax import lax

from compiler.passes import merge_inferred_fragments
from compiler.program import Eqn, Fragment, Lit, Origin, Program, TensorType, Transfer, eval_body
from compiler.verify import verify

T = TensorType((4,), "float32")
S = TensorType((), "float32")


def eq(prim, ins, out, **params):
    return Eqn(prim, params, tuple(ins), (out,))


def frag(mesh, ins, outs, body, origin=None, cc=None):
    o = (Origin(origin),) if origin else ()
    return Fragment(mesh, o, tuple(ins), tuple(outs), tuple(body), 0 if origin else None, cc)


def inferred(mesh, out, prim, ins, **params):
    return frag(mesh, [a for a in ins if isinstance(a, str)], [out], [eq(prim, ins, out, **params)])


def run(p, args):
    env = dict(zip(p.inputs, args))
    for op in p.ops:
        if isinstance(op, Transfer):
            env[op.out] = env[op.value]
        else:
            env.update(zip(op.outputs, eval_body(op.body, op.inputs, op.outputs,
                                                 [env[v] for v in op.inputs])))
    return [np.asarray(env[v]) for v in p.outputs]


def summary(p):
    out = []
    for op in p.ops:
        if isinstance(op, Transfer):
            out.append(f"{op.value}:{op.src}->{op.dst}")
        else:
            kind = op.origin[0].name if op.origin else "inferred"
            out.append(f"{op.mesh} {kind} [{' '.join(e.outputs[0] for e in op.body)}]")
    return out


def user_order(p):
    return {m: [op.origin for op in p.ops if isinstance(op, Fragment) and op.mesh == m
                and op.is_user] for m in p.meshes}


def clip_step():
    """Two meshes: a backward fragment each, then sum-of-squares partials, the global norm on
    m1 (from m2's partial sent over), the scale sent back, and each mesh's update."""
    two = Lit(2, "int32")
    ops = [
        frag("m1", ["w1"], ["g1"], [eq(lax.mul_p, ["w1", Lit(3.0, "float32")], "g1")], "l1"),
        frag("m2", ["w2"], ["g2"], [eq(lax.mul_p, ["w2", Lit(5.0, "float32")], "g2")], "l2"),
        inferred("m1", "q1", lax.integer_pow_p, ["g1"], y=2),
        inferred("m1", "s1", lax.reduce_sum_p, ["q1"], axes=(0,), out_sharding=None),
        inferred("m2", "q2", lax.integer_pow_p, ["g2"], y=2),
        inferred("m2", "s2", lax.reduce_sum_p, ["q2"], axes=(0,), out_sharding=None),
        Transfer("s2", "m2", "m1", "s2@1"),
        inferred("m1", "n", lax.add_p, ["s1", "s2@1"]),
        inferred("m1", "r", lax.rsqrt_p, ["n"], accuracy=None),
        Transfer("r", "m1", "m2", "r@2"),
        inferred("m1", "u1", lax.mul_p, ["g1", "r"]),
        inferred("m1", "w1n", lax.sub_p, ["w1", "u1"]),
        inferred("m2", "u2", lax.mul_p, ["g2", "r@2"]),
        inferred("m2", "w2n", lax.sub_p, ["w2", "u2"]),
    ]
    types = {v: T for v in "w1 w2 g1 g2 q1 q2 u1 u2 w1n w2n".split()}
    types.update({v: S for v in "s1 s2 s2@1 n r r@2".split()})
    return Program(("m1", "m2"), ("w1", "w2"), ("m1", "m2"), ("w1n", "w2n"), ("m1", "m2"),
                   tuple(ops), types)


def test_an_optimizer_step_ends_in_one_fragment_per_mesh_on_each_side_of_the_global_norm():
    p = clip_step()
    got = merge_inferred_fragments(p)
    verify(got)
    assert summary(got) == [
        "m1 l1 [g1]",
        "m2 l2 [g2]",
        "m2 inferred [q2 s2]",           # m2's partial, sent as soon as it is computed
        "s2:m2->m1",
        "m1 inferred [q1 s1 n r u1 w1n]",  # m1's partial, the norm and m1's update: one fragment
        "r:m1->m2",
        "m2 inferred [u2 w2n]",          # m2's update waits for the scale
    ]
    assert user_order(got) == user_order(p)
    args = [np.arange(4, dtype=np.float32) + 1, np.arange(4, dtype=np.float32) - 2]
    for a, b in zip(run(got, args), run(p, args)):
        np.testing.assert_array_equal(a, b)


def test_work_that_does_not_wait_for_the_norm_leaves_the_partial_fragment_for_the_update():
    """An optimizer's work that does not need the global norm (here ``d2 = 0.9 w2``, traced
    before the scale arrives) runs in the update's fragment, not in the one that makes the partial
    norm: that fragment makes only what it sends (one result, not the moments), and its send goes
    as soon as the partial is made."""
    p = clip_step()
    ops = list(p.ops)
    at = next(k for k, op in enumerate(ops) if isinstance(op, Transfer) and op.value == "s2")
    ops.insert(at, inferred("m2", "d2", lax.mul_p, ["w2", Lit(0.9, "float32")]))
    last = next(k for k, op in enumerate(ops) if isinstance(op, Fragment) and op.outputs == ("w2n",))
    ops[last] = inferred("m2", "w2n", lax.sub_p, ["d2", "u2"])
    p = Program(p.meshes, p.inputs, p.input_meshes, p.outputs, p.output_meshes, tuple(ops),
                {**p.types, "d2": T})
    verify(p)
    got = merge_inferred_fragments(p)
    verify(got)
    assert summary(got) == [
        "m1 l1 [g1]",
        "m2 l2 [g2]",
        "m2 inferred [q2 s2]",           # only what m2 sends
        "s2:m2->m1",
        "m1 inferred [q1 s1 n r u1 w1n]",
        "r:m1->m2",
        "m2 inferred [d2 u2 w2n]",       # d2 joins the update instead of passing to it
    ]
    partial = next(op for op in got.ops if isinstance(op, Fragment) and "s2" in op.outputs)
    assert partial.outputs == ("s2",)
    assert user_order(got) == user_order(p)
    args = [np.arange(4, dtype=np.float32) + 1, np.arange(4, dtype=np.float32) - 2]
    for a, b in zip(run(got, args), run(p, args)):
        np.testing.assert_array_equal(a, b)


def test_a_fragment_that_would_read_its_own_group_through_another_mesh_starts_a_new_one():
    # m1: a -> m2: b -> m1: c. Merging a and c would make a cycle through m2.
    ops = [inferred("m1", "a", lax.neg_p, ["x"]),
           Transfer("a", "m1", "m2", "a@2"),
           inferred("m2", "b", lax.exp_p, ["a@2"], accuracy=None),
           Transfer("b", "m2", "m1", "b@1"),
           inferred("m1", "c", lax.add_p, ["b@1", "a"]),
           inferred("m1", "d", lax.neg_p, ["x"])]
    types = {v: T for v in "x a a@2 b b@1 c d".split()}
    p = Program(("m1", "m2"), ("x",), ("m1",), ("c", "d"), ("m1", "m1"), tuple(ops), types)
    got = merge_inferred_fragments(p)
    verify(got)
    assert summary(got) == ["m1 inferred [a]", "a:m1->m2", "m2 inferred [b]", "b:m2->m1",
                            "m1 inferred [c d]"]


def test_inferred_work_is_not_moved_behind_a_user_fragment_when_another_mesh_waits_for_it():
    ops = [inferred("m1", "a", lax.neg_p, ["x"]),         # sent to m2: stays before l1
           Transfer("a", "m1", "m2", "a@2"),
           frag("m1", ["x"], ["y"], [eq(lax.exp_p, ["x"], "y", accuracy=None)], "l1"),
           inferred("m1", "b", lax.neg_p, ["y"]),          # read on m1 only: sinks past l1b
           frag("m1", ["x"], ["z"], [eq(lax.sin_p, ["x"], "z", accuracy=None)], "l1b"),
           inferred("m1", "c", lax.add_p, ["b", "z"]),
           frag("m2", ["a@2"], ["e"], [eq(lax.cos_p, ["a@2"], "e", accuracy=None)], "l2")]
    types = {v: T for v in "x a a@2 y b z c e".split()}
    p = Program(("m1", "m2"), ("x",), ("m1",), ("c", "e"), ("m1", "m2"), tuple(ops), types)
    got = merge_inferred_fragments(p)
    verify(got)
    assert summary(got) == ["m1 inferred [a]", "a:m1->m2", "m1 l1 [y]", "m1 l1b [z]",
                            "m2 l2 [e]", "m1 inferred [b c]"]  # [b c]: where its result is needed


def test_a_program_without_two_inferred_fragments_of_one_mesh_is_returned_as_is():
    p = clip_step()
    one = p.with_ops([op for op in p.ops if not (isinstance(op, Fragment) and not op.is_user)
                      or op.outputs == ("q1",)])
    one = Program(one.meshes, one.inputs, one.input_meshes, ("q1",), ("m1",), one.ops, one.types)
    assert merge_inferred_fragments(one) is one


# --------------------------------------------------------------------------- random programs

PRIMS = [(lax.neg_p, {}), (lax.exp_p, {"accuracy": None}), (lax.sin_p, {"accuracy": None})]


@st.composite
def programs(draw):
    """Random programs over meshes m0..m2: user and inferred one-equation fragments reading
    earlier values of their mesh (a transfer brings a value from another mesh)."""
    meshes = ("m0", "m1", "m2")
    ops, types = [], {"x0": T, "x1": T, "x2": T}
    have = {m: [f"x{k}"] for k, m in enumerate(meshes)}
    n = draw(st.integers(2, 14))
    for k in range(n):
        m = draw(st.sampled_from(meshes))
        if draw(st.booleans()):   # bring a value over
            src = draw(st.sampled_from([s for s in meshes if s != m]))
            v = draw(st.sampled_from(have[src]))
            t = f"t{k}"
            ops.append(Transfer(v, src, m, t))
            types[t] = T
            have[m].append(t)
        a = draw(st.sampled_from(have[m]))
        b = draw(st.sampled_from(have[m]))
        out = f"v{k}"
        types[out] = T
        body = [eq(lax.add_p, [a, b], out)]
        if draw(st.integers(0, 3)) == 0:
            ops.append(frag(m, list(dict.fromkeys([a, b])), [out], body, origin=f"u{k}"))
        else:
            ops.append(frag(m, list(dict.fromkeys([a, b])), [out], body))
        have[m].append(out)
    outs = tuple(have[m][-1] for m in meshes)
    return Program(meshes, ("x0", "x1", "x2"), meshes, outs, meshes, tuple(ops), types)


@given(programs())
def test_merging_keeps_programs_valid_equal_and_in_schedule_order(p):
    verify(p)
    got = merge_inferred_fragments(p)
    verify(got)
    assert user_order(got) == user_order(p)
    count = lambda q: sum(isinstance(o, Fragment) and not o.is_user for o in q.ops)  # noqa: E731
    assert count(got) <= count(p)
    args = [np.linspace(-1, 1, 4, dtype=np.float32) * (k + 1) for k in range(3)]
    for a, b in zip(run(got, args), run(p, args)):
        np.testing.assert_array_equal(a, b)
