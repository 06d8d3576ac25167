"""``named_computation``: label a piece of a JAX program so the MPMD compiler can place it.

A named computation is a nested ``jax.jit`` whose function name is the label. JAX keeps that name on
the traced ``jit`` equation (``eqn.params['name']``), and ``jax.grad`` keeps it on the backward
equation too, whose ``source_info.name_stack`` reads ``transpose(jvp(...))``: that is how the
compiler tells a forward fragment (transpose count 0) from its backward (transpose count 1).

:func:`named_computation_labels` is every label made so far in this process: the frontend tells a
named computation from any other ``jit`` in the program by it (and lists those labels when a
config names one the program lacks). An exception raised while tracing a named computation's body
carries the label in its ``mpmd_named_computation`` attribute (the innermost label), so the
frontend can report which piece failed.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

_LABELS: set[str] = set()

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
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if getattr(e, "mpmd_named_computation", None) is None:
                try:
                    e.mpmd_named_computation = name  # type: ignore[attr-defined]
                except AttributeError:  # an exception type without a __dict__
                    pass
            raise

    wrapped.__name__ = name
    wrapped.__qualname__ = name
    _LABELS.add(name)
    return jax.jit(wrapped)


def named_computation_labels() -> frozenset[str]:
    """Every label :func:`named_computation` has been given in this process."""
    return frozenset(_LABELS)
