"""User-facing checks of the frontend: names a config uses that the program lacks, and failures while
tracing a named computation's body, each reported in one line that names the piece and the fix.

- :func:`check_names`: every computation name in ``MpmdConfig.assignment``,
  ``stage_assignment`` (``"layer[3]"``: iteration 3 of a loop over ``layer``), and the
  ``FragmentPattern`` names of ``schedule`` / ``merge_rules`` must label a ``jit`` equation of the
  traced step (at any depth); else :class:`~compiler.errors.ConfigError` with a "did you mean".
  Without this check a mistyped name is silently ignored and the piece is placed by inference.
- :func:`tracing_error`: a JAX tracer error (``ConcretizationTypeError``,
  ``TracerArrayConversionError``, ``TracerBoolConversionError``, ``TracerIntegerConversionError``,
  ``UnexpectedTracerError``) raised inside a named computation's body becomes a
  :class:`~compiler.errors.CompilerError` naming the piece and the user's line.
- :func:`constant`: a closed-over constant of the step's jaxpr that is still a tracer is a value a
  named computation stored outside itself (a Python-side state update, e.g. BatchNorm statistics
  written to a module attribute) and the step read afterwards; it is reported as such instead of
  JAX's ``TracerArrayConversionError`` from ``np.asarray``.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Iterable

import jax
import numpy as np

from compiler.config import FragmentPattern, MpmdConfig
from compiler.errors import CompilerError, ConfigError, did_you_mean
from compiler.named import named_computation_labels

_JAX_DIRS = tuple(os.path.dirname(m.__file__) + os.sep for m in (jax, np))
_COMPILER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def jit_names(jaxpr: Any) -> set[str]:
    """The ``name`` of every ``jit`` equation in ``jaxpr`` and the jaxprs nested in it."""
    out: set[str] = set()
    for e in jaxpr.eqns:
        if e.primitive.name in ("jit", "pjit") and "name" in e.params:
            out.add(str(e.params["name"]))
        for v in e.params.values():
            for x in (v if isinstance(v, (tuple, list)) else (v,)):
                j = getattr(x, "jaxpr", x)
                if type(j).__name__ == "Jaxpr":
                    out |= jit_names(j)
    return out


def _patterns(rules: Any) -> Iterable[FragmentPattern]:
    if callable(rules) or isinstance(rules, (str, bytes)) or not isinstance(rules, (list, tuple)):
        return
    for pair in rules:
        if isinstance(pair, (list, tuple)):
            yield from (p for p in pair if isinstance(p, FragmentPattern))


def check_names(config: MpmdConfig, jaxpr: Any) -> None:
    """Refuse a config that names a computation the traced step ``jaxpr`` does not have.

    Raises:
        ConfigError: one line naming the unknown name, the closest labels of the program and the
            fix.
    """
    present = jit_names(jaxpr)
    labels = (named_computation_labels() | config.names()) & present or present
    uses: list[tuple[str, str]] = [(n, "assignment") for n in config.assignment]
    uses += [(n, "stage_assignment") for n in config.stage_assignment]
    uses += [(p.name, "schedule") for p in _patterns(config.schedule) if p.name is not None]
    uses += [(p.name, "merge_rules") for p in _patterns(config.merge_rules) if p.name is not None]
    for name, where in uses:
        base = name[:name.index("[")] if name.endswith("]") and "[" in name else name
        if name not in present and base not in present:
            raise ConfigError(
                f"MpmdConfig.{where} names computation {name!r}, which the program does not "
                f"have; {did_you_mean(base, labels)}; fix the name in '{where}' or label that "
                f"piece with named_computation(fn, name={base!r})")


def _user_line(tb: Any) -> str:
    """``file:line (function)`` of the innermost frame outside JAX, NumPy and this package."""
    frames = [f for f in traceback.extract_tb(tb)
              if not f.filename.startswith(_JAX_DIRS + (_COMPILER_DIR,))
              and "/jaxlib/" not in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    return f" at {f.filename}:{f.lineno} ({f.name})"


_FIX = {"UnexpectedTracerError": "a traced value escaped the function that made it (stored in a "
                                 "Python object, global or module attribute); return it instead",
        "TracerArrayConversionError": "a traced array was converted to NumPy (np.asarray, "
                                      "np.* functions, a Python-side state update); use jnp "
                                      "and return new state from the named computation",
        "TracerBoolConversionError": "Python control flow (if/while/bool) depends on a traced "
                                     "value; use jnp.where or lax.cond inside the piece",
        "TracerIntegerConversionError": "a traced value was used as a Python int (an index, a "
                                        "shape, range()); pass it as a static Python int",
        "ConcretizationTypeError": "a concrete Python value (float(), int(), a shape) was taken "
                                   "from a traced value; keep it a jax array or pass it as a "
                                   "static Python value"}


def tracing_error(e: BaseException) -> CompilerError | None:
    """The error to raise for a JAX tracer error ``e`` from inside a named computation (None when
    ``e`` is not one, or was raised outside every named computation)."""
    name = getattr(e, "mpmd_named_computation", None)
    if name is None or not isinstance(e, jax.errors.JAXTypeError):
        return None
    kind = type(e).__name__
    fix = next((v for k, v in _FIX.items() if isinstance(e, getattr(jax.errors, k))),
               "make the body a pure function of its arguments")
    first = str(e).strip().splitlines()[0] if str(e).strip() else kind
    return CompilerError(f"named computation {name!r} cannot be traced{_user_line(e.__traceback__)}: "
                         f"{kind}: {first}; {fix} (the MPMD compiler traces each named "
                         f"computation once, as jax.jit does)")


def constant(c: Any) -> np.ndarray:
    """``np.asarray(c)`` for a closed-over constant of the traced step.

    Raises:
        CompilerError: ``c`` is a tracer leaked out of a named computation's body (the message
            names the computation and the line that made the value).
    """
    if not isinstance(c, jax.core.Tracer):
        return np.asarray(c)
    dbg = getattr(c, "_debug_info", None)
    name = getattr(dbg, "func_name", None) or "?"
    where = ""
    try:  # JAX internals: the user's line that made the leaked value (best effort)
        from jax._src import source_info_util
        if getattr(c, "_line_info", None) is not None:
            where = f" made at {source_info_util.summarize(c._line_info)}"
    except Exception:  # noqa: BLE001 - a private API may change; the message stays useful
        pass
    what = (f"named computation {name!r}" if name in named_computation_labels()
            else f"function {name!r}")
    raise CompilerError(
        f"{what} leaked a traced value {c.aval.str_short()}{where}: its body stored it outside "
        f"itself (a Python-side state update, e.g. BatchNorm statistics written to a module or "
        f"dict) and the step read it after the call; return the new value from the named "
        f"computation instead (with Flax: apply(..., mutable=['batch_stats']) and return the "
        f"updated collection)")
