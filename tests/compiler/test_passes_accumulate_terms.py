"""An inferred term in a microbatch gradient sum (an L2 penalty outside the named pieces) is added
after the sum (``passes/accumulate_terms.py``): every microbatch's backward on a mesh keeps one
body, the sum is accumulated in place, and loss, gradients and update match ``jax.jit``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.frontend import jit
from compiler.named import named_computation

M = 4
L1 = named_computation(lambda w, h: jnp.tanh(h @ w), name="l1")
L2 = named_computation(lambda w, h: jnp.tanh(h @ w), name="l2")


def step(l2: float):
    def loss(ws, xs):
        tot = 0.0
        for m in range(M):
            tot = tot + jnp.mean(L2(ws[1], L1(ws[0], xs[m])) ** 2)
        return tot / M + l2 * sum(jnp.sum(w ** 2) for w in ws)

    def s(ws, xs):
        value, g = jax.value_and_grad(loss)(ws, xs)
        return value, g, [w - 0.1 * d for w, d in zip(ws, g)]
    return s


@pytest.fixture(scope="module")
def setup():
    d = jax.devices()
    topo = {"m1": Mesh(np.array(d[0:2]), ("x",)), "m2": Mesh(np.array(d[2:4]), ("x",))}
    cfg = MpmdConfig(topo, assignment={"l1": "m1", "l2": "m2"}, microbatches=M)
    k = jax.random.PRNGKey(0)
    ws = [jax.random.normal(jax.random.fold_in(k, i), (8, 8)) / 3 for i in range(2)]
    return cfg, ws, jax.random.normal(k, (M, 4, 8))


def test_an_l2_term_leaves_every_backward_one_body_and_matches_jit(setup):
    cfg, ws, xs = setup
    lo = jit(step(1e-2), cfg, verify=True).lower(ws, xs)
    plain = jit(step(0.0), cfg).lower(ws, xs)
    for mp in lo.exported.programs.values():
        assert len({s.executable for s in mp.steps if getattr(s, "kind", "") == "B"}) == 1
    # the L2 term costs at most one inferred executable more than the step without it
    assert len(lo.exported.executables) <= len(plain.exported.executables) + 1
    assert [n for n, _ in lo.history].index("separate_inferred_terms") < \
        [n for n, _ in lo.history].index("absorb")
    got, want = lo.compile()(ws, xs), jax.jit(step(1e-2))(ws, xs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
