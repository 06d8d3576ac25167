"""A named computation whose body cannot be traced is reported in one line naming the piece, the
user's line and what to do (before: JAX's TracerArrayConversionError from inside the frontend,
``frontend.py:142``, or a ConcretizationTypeError naming only ``named.py``)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from compiler.config import MpmdConfig
from compiler.errors import CompilerError
from compiler.frontend import jit, trace_program
from compiler.named import named_computation

THIS = __file__


def topology():
    d = jax.devices()
    return {"m0": Mesh(np.array(d[:1]), ("x",)), "m1": Mesh(np.array(d[1:2]), ("x",))}


def lower_error(step, names) -> str:
    cfg = MpmdConfig(topology=topology(), assignment={n: "m0" for n in names})
    with pytest.raises(CompilerError) as e:
        jit(step, cfg).lower(jnp.ones((4, 4)), jnp.ones((2, 4)))
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_state_stored_outside_a_named_computation_is_reported_as_a_leak():
    # BatchNorm-like: the body writes its running mean into a Python dict (a module's state)
    stats = {}

    def norm(w, x):
        y = x @ w
        stats["mean"] = jnp.mean(y, axis=0)  # the leaked value is made here
        return y - stats["mean"]

    def step(w, x):
        y = named_computation(norm, name="norm")(w, x)
        return jnp.sum(y ** 2), stats["mean"]

    msg = lower_error(step, ["norm"])
    line = norm.__code__.co_firstlineno + 2
    assert msg.startswith(f"named computation 'norm' leaked a traced value float32[4] made at "
                          f"{THIS}:{line}:")
    assert "return the new value from the named computation instead" in msg
    assert "mutable=['batch_stats']" in msg


def test_the_same_state_returned_from_the_named_computation_compiles():
    def norm(w, x):
        y = x @ w
        mean = jnp.mean(y, axis=0)
        return y - mean, mean

    def step(w, x):
        y, mean = named_computation(norm, name="norm")(w, x)
        return jnp.sum(y ** 2), mean

    cfg = MpmdConfig(topology=topology(), assignment={"norm": "m0"})
    args = (jnp.arange(16.0).reshape(4, 4) / 16, jnp.ones((2, 4)))
    got = jit(step, cfg).lower(*args).compile()(*args)
    want = jax.jit(step)(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)


def float_of_traced(w, x):
    return x @ w * float(jnp.sum(x))


def numpy_of_traced(w, x):
    return x @ w + np.asarray(x).mean()


def branch_on_traced(w, x):
    if jnp.sum(x) > 0:
        return x @ w
    return -x @ w


def index_with_traced(w, x):
    return x @ w * [1.0, 2.0][jnp.argmax(w[0])]


@pytest.mark.parametrize("body, kind, advice", [
    (float_of_traced, "ConcretizationTypeError", "keep it a jax array"),
    (numpy_of_traced, "TracerArrayConversionError", "use jnp"),
    (branch_on_traced, "TracerBoolConversionError", "use jnp.where or lax.cond"),
    (index_with_traced, "TracerIntegerConversionError", "pass it as a static Python int"),
])
def test_a_concrete_value_taken_inside_a_named_computation_names_it_and_the_line(body, kind,
                                                                                 advice):
    def step(w, x):
        h = named_computation(body, name="piece")(w, x)
        return jnp.sum(named_computation(jnp.tanh, name="after")(h))

    msg = lower_error(step, ["piece", "after"])
    line = body.__code__.co_firstlineno + 1
    assert msg.startswith(f"named computation 'piece' cannot be traced at {THIS}:{line} "
                          f"({body.__name__}): {kind}: ")
    assert advice in msg and "traces each named computation once" in msg


def test_the_innermost_named_computation_is_named():
    inner = named_computation(float_of_traced, name="inner")

    def step(w, x):
        return jnp.sum(named_computation(lambda w, x: inner(w, x) + 1, name="outer")(w, x))

    msg = lower_error(step, ["outer"])
    assert msg.startswith("named computation 'inner' cannot be traced")


def test_errors_outside_named_computations_are_jaxs_own():
    def step(w, x):
        return named_computation(jnp.tanh, name="t")(x @ w) * float(jnp.sum(x))

    with pytest.raises(jax.errors.ConcretizationTypeError):
        trace_program(step, (jnp.ones((4, 4)), jnp.ones((2, 4))), meshes=("m0",))
    with pytest.raises(TypeError, match="dot_general requires"):  # not a tracer error: as is
        trace_program(named_computation(lambda a: jnp.dot(a, jnp.ones(3)), name="bad"),
                      (jnp.ones(4),), meshes=("m0",))
