"""``named_computation``: label a piece of a JAX program so the MPMD compiler can place it.

A named computation is a nested ``jax.jit`` whose function name is the label. JAX keeps that name on
the traced ``jit`` equation (``eqn.params['name']``), and ``jax.grad`` keeps it on the backward
equation too, whose ``source_info.name_stack`` reads ``transpose(jvp(...))``: that is how the
compiler tells a forward fragment (transpose count 0) from its backward (transpose count 1).
"""

from __future__ import annotations

from typing import Any, Callable

import jax


def named_computation(fn: Callable[..., Any], *, name: str) -> Callable[..., Any]:
    """Return ``fn`` as a named computation called ``name``.

    Args:
        fn: a JAX-traceable function.
        name: the label, used by mesh assignment (``{name: mesh}``) and cost tracing.

    Raises:
        ValueError: ``name`` is empty.
    """
    if not name:
        raise ValueError("named_computation needs a non-empty name")

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapped.__name__ = name
    wrapped.__qualname__ = name
    return jax.jit(wrapped)
