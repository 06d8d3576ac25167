"""The printed program, read back: :func:`parse_program` is the inverse of
:func:`compiler.program.print_program`, so a pass test reads "input program -> one pass -> expected
program" as text, independent of the frontend and of the passes before it.

``print_program(parse_program(text)) == text`` for every program the printer writes without loops
(``ForLoop``/``CallOp`` are not read). Values get the printed names (``%arg0`` -> ``arg0``,
``%3#1`` -> ``v3_1``, a fragment's ``%b2`` -> ``f3_b2``); a fragment's block arguments are its
operands, as in the IR. Primitives are found by name among ``jax.lax``'s (and ``add_any``); a name
outside them reads as an :class:`OpaquePrimitive`, which prints the same and cannot be evaluated.
Equation parameters are read as Python literals (a dtype name as that dtype, any other word as
text); the printer leaves out ``None`` and nested jaxprs, so a parsed equation has them absent.
The topology's meshes are not printed: pass ``meshes``, or they are the meshes named, in order of
first mention. Requested output meshes are read as the meshes the outputs are printed on.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import jax.lax
import numpy as np
from jax._src import ad_util
from jax.extend.core import Primitive

from compiler.errors import CompilerError
from compiler.program import (_DT, CONSTANT, Atom, Eqn, Fragment, Lit, MeshlessOp, NamedComputation,
                              Origin, Program, Spec, TensorType, Transfer)

__all__ = ["OpaquePrimitive", "ParseError", "parse_program"]


class ParseError(CompilerError):
    """Text that is not a printed program (the message names the line and what was expected)."""


@dataclass(frozen=True)
class OpaquePrimitive:
    """A primitive known only by its printed name: prints as it was read, cannot be evaluated."""

    name: str
    multiple_results: bool = False

    def bind(self, *args: Any, **params: Any) -> Any:
        raise ParseError(f"primitive {self.name!r} was read from text and cannot be evaluated")

    def get_bind_params(self, params: Any) -> Any:
        return params


@lru_cache(maxsize=1)
def _primitives() -> dict[str, Any]:
    prims = {p.name: p for p in (getattr(jax.lax, n) for n in dir(jax.lax) if n.endswith("_p"))
             if isinstance(p, Primitive)}
    prims[ad_util.add_jaxvals_p.name] = ad_util.add_jaxvals_p
    prims["constant"] = CONSTANT
    return prims


_LONG = {v: k for k, v in _DT.items()}
_RES = re.compile(r"^(%\d+)(?::(\d+))? = (.*)$")
_TYPE = re.compile(r"^(\w+)\[([\d,]*)\](?:@([\w.+-]+)(\[.*\])?)?$")


def _split(s: str, sep: str = ",") -> list[str]:
    """``s`` split at ``sep`` outside brackets and quotes, each part stripped; ``[]`` for blank."""
    out, depth, cur, quote = [], 0, "", False
    for ch in s:
        if ch == '"':
            quote = not quote
        elif not quote and ch in "([{":
            depth += 1
        elif not quote and ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0 and not quote:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()] if cur.strip() else out


def _type(s: str, where: str) -> tuple[TensorType, str | None, Spec | None]:
    m = _TYPE.match(s.strip())
    if not m:
        raise ParseError(f"{where}: {s!r} is not a type like f32[2] or f32[2]@m1")
    dt, dims, mesh, spec = m.groups()
    shape = tuple(int(d) for d in dims.split(",") if d)
    parsed = None
    if spec is not None:
        parsed = tuple(tuple(a.strip().strip('"') for a in dim[1:-1].split(",") if a.strip())
                       for dim in _split(spec[1:-1]))
    return TensorType(shape, _LONG.get(dt, dt)), mesh, parsed


def _literal(s: str) -> Any:
    try:
        return ast.literal_eval(s)
    except (ValueError, SyntaxError):
        try:
            return np.dtype(s)
        except (TypeError, ValueError):
            return s


def _params(s: str) -> dict[str, Any]:
    """``k=v k2=v2`` (values may hold spaces and ``=`` inside brackets) -> ``{k: literal(v)}``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        depth += {"(": 1, "[": 1, "{": 1, ")": -1, "]": -1, "}": -1}.get(ch, 0)
        if ch == " " and depth == 0 and re.match(r"\w+=", s[i + 1:]):
            parts.append(s[start:i])
            start = i + 1
    parts.append(s[start:])
    out: dict[str, Any] = {}
    for part in parts:
        k, _, v = part.partition("=")
        out[k] = _literal(v)
    return out


class _Reader:
    def __init__(self, lines: list[str]) -> None:
        self.lines, self.i = lines, 0
        self.names: dict[str, Atom] = {}
        self.types: dict[str, TensorType] = {}
        self.specs: dict[str, Spec] = {}
        self.meshes: dict[str, None] = {}

    def where(self) -> str:
        return f"line {self.i + 1}"

    def next(self) -> str:
        if self.i >= len(self.lines):
            raise ParseError("the text ends inside a block; a printed program ends with '}'")
        line = self.lines[self.i]
        self.i += 1
        return line.strip()

    def atom(self, s: str, local: dict[str, Atom]) -> Atom:
        if s.startswith("%"):
            if s in local:
                return local[s]
            if s in self.names:
                return self.names[s]
            raise ParseError(f"{self.where()}: {s} is used before it is defined")
        value, _, dt = s.rpartition(":")
        if not value:
            raise ParseError(f"{self.where()}: {s!r} is neither a value (%name) nor a literal (1.0:f32)")
        return Lit(_literal(value), _LONG.get(dt, dt))

    def typed(self, name: str, s: str) -> str | None:
        t, mesh, spec = _type(s, self.where())
        self.types[name] = t
        if spec is not None:
            self.specs[name] = spec
        if mesh is not None:
            self.meshes.setdefault(mesh)
        return mesh

    def eqn(self, text: str, local: dict[str, Atom], out_names: Sequence[str]) -> Eqn:
        """``NAME[PARAMS] ARGS : TYPES`` (the part after ``lhs = ``)."""
        head, sep, tys = text.rpartition(" : ")
        if not sep:
            head, tys = text, ""
        mn = re.match(r"^[\w.-]+", head)
        if not mn:
            raise ParseError(f"{self.where()}: expected a primitive name in {head!r}")
        name, rest, pstr = mn.group(0), head[mn.end():], ""
        if rest.startswith("["):   # parameters may hold spaces and brackets: find the closing one
            depth, k = 0, 0
            for k, ch in enumerate(rest):
                depth += {"[": 1, "]": -1}.get(ch, 0)
                if depth == 0:
                    break
            pstr, rest = rest[1:k], rest[k + 1:]
        args = rest.strip()
        types = _split(tys)
        if len(types) != len(out_names):
            raise ParseError(f"{self.where()}: {len(out_names)} results but {len(types)} types")
        for v, t in zip(out_names, types):
            self.typed(v, t)
        prim = _primitives().get(name) or OpaquePrimitive(name, len(out_names) != 1)
        params = _params(pstr) if pstr else {}
        inputs = tuple(self.atom(a, local) for a in _split(args))
        return Eqn(prim, params, inputs, tuple(out_names))

    def region(self, k: int, operands: list[str]) -> tuple[tuple[Eqn, ...], tuple[str, ...]]:
        """A fragment's or named computation's body up to its closing line."""
        local: dict[str, Atom] = {f"%a{i}": v for i, v in enumerate(operands)}
        body: list[Eqn] = []
        while True:
            line = self.next()
            if line.startswith("return"):
                outs = tuple(str(self.atom(a, local)) for a in _split(line[len("return"):]))
                return tuple(body), outs
            lhs, sep, rhs = line.partition(" = ")
            if not sep:
                raise ParseError(f"{self.where()}: expected '%bN = ...' or 'return' in a body")
            names = []
            for a in _split(lhs):
                local[a] = f"f{k}_{a[1:]}"
                names.append(f"f{k}_{a[1:]}")
            body.append(self.eqn(rhs, local, names))

    def op(self, line: str, k: int) -> Any:
        m = _RES.match(line)
        res, n, rest = (m.group(1), int(m.group(2) or 1), m.group(3)) if m else (None, 0, line)
        outs = [] if res is None else ([f"v{res[1:]}"] if n == 1 and m.group(2) is None
                                       else [f"v{res[1:]}_{j}" for j in range(n)])
        shown = [] if res is None else ([res] if m.group(2) is None else [f"{res}#{j}" for j in range(n)])
        if rest.startswith("transfer "):
            mt = re.match(r"^transfer (\S+) : (.+) -> (.+)$", rest)
            if not mt or len(outs) != 1:
                raise ParseError(f"{self.where()}: a transfer reads 'transfer %x : T@src -> T@dst'")
            value = str(self.atom(mt.group(1), {}))
            src = self.typed(value, mt.group(2))
            dst = self.typed(outs[0], mt.group(3))
            self.names[shown[0]] = outs[0]
            return Transfer(value, src, dst, outs[0])
        mr = re.match(r"^(fragment|named_computation)<(.*)> \((.*?)\) \((.*?)\) \{$", rest)
        if mr:
            kind, attrs, operands_s, _args = mr.groups()
            operands = [str(self.atom(a, {})) for a in _split(operands_s)]
            body, ret = self.region(k, operands)
            tail = self.next()
            mt = re.match(r"^\} : \((.*)\) -> (.*)$", tail)
            if not mt:
                raise ParseError(f"{self.where()}: a region ends with '}} : (types) -> types'")
            out_t = mt.group(2)
            out_types = _split(out_t[1:-1]) if out_t.startswith("(") else [out_t]
            for v, t in zip(ret, out_types):
                self.typed(v, t)
            for s, v in zip(shown, ret):
                self.names[s] = v
            if len(ret) != len(shown):
                raise ParseError(f"{self.where()}: the region returns {len(ret)} values, "
                                 f"its result names {len(shown)}")
            return self._region_op(kind, attrs, tuple(operands), ret, body)
        if rest.startswith(("for @", "call @")):
            raise ParseError(f"{self.where()}: loops and calls (ForLoop/CallOp) are not read; "
                             f"parse the program after call_inline")
        e = self.eqn(rest, {}, outs)
        for s, v in zip(shown, outs):
            self.names[s] = v
        return MeshlessOp(e)

    def _region_op(self, kind: str, attrs: str, inputs: tuple[str, ...], outputs: tuple[str, ...],
                   body: tuple[Eqn, ...]) -> Any:
        fields = dict(re.findall(r'(\w+)=(\[.*?\]|"[^"]*"|\d+)', attrs))
        if kind == "named_computation":
            mo = re.match(r'^"([^"]*)"(?:\((\d+)\))?', attrs)
            if not mo:
                raise ParseError(f"{self.where()}: named_computation<\"name\"(n), ...> expected")
            cc = fields.get("call_counter")
            return NamedComputation(mo.group(1), int(mo.group(2) or 0), inputs, outputs, body,
                                    None if cc is None else int(cc))
        origin = tuple(Origin(nm, int(t or 0))
                       for nm, t in re.findall(r'"([^"]*)"(?:\((\d+)\))?', fields.get("origin", "[]")))
        mesh = fields["mesh"].strip('"')
        self.meshes.setdefault(mesh)
        num = lambda key: None if key not in fields else int(fields[key])  # noqa: E731
        return Fragment(mesh, origin, inputs, outputs, body, num("stage"), num("call_counter"),
                        fields.get("part", '""').strip('"'))


def parse_program(text: str, meshes: Sequence[str] | None = None) -> Program:
    """The :class:`~compiler.program.Program` that ``print_program`` printed as ``text``.

    Args:
        text: a printed program (``func @main(...) -> ... { ... }``).
        meshes: the topology's mesh names, in order (default: the meshes ``text`` names, in order
            of first mention).

    Raises:
        ParseError: text that is not a printed program (line and expectation named), or a loop.
    """
    r = _Reader([ln for ln in text.strip("\n").split("\n")])
    head = r.next()
    m = re.match(r"^func @main\((.*)\) -> (.*) \{$", head)
    if not m:
        raise ParseError("line 1: a printed program starts with 'func @main(%arg0: T, ...) -> T {'")
    inputs, input_meshes = [], []
    for a in _split(m.group(1)):
        name, _, t = a.partition(": ")
        v = name[1:]
        r.names[name] = v
        inputs.append(v)
        input_meshes.append(r.typed(v, t))
    out_t = m.group(2)
    out_types = [] if out_t == "()" else (_split(out_t[1:-1]) if out_t.startswith("(") else [out_t])
    ops = []
    while True:
        line = r.next()
        if line.startswith("return"):
            break
        ops.append(r.op(line, len(ops)))
    outputs = [str(r.atom(a, {})) for a in _split(line[len("return"):])]
    if r.next() != "}":
        raise ParseError(f"{r.where()}: a printed program ends with '}}'")
    if len(outputs) != len(out_types):
        raise ParseError(f"line 1: {len(out_types)} result types but {len(outputs)} results returned")
    output_meshes = [_type(t, "line 1")[1] for t in out_types]
    return Program(tuple(meshes) if meshes is not None else tuple(r.meshes), tuple(inputs),
                   tuple(input_meshes), tuple(outputs), tuple(output_meshes), tuple(ops),
                   dict(r.types), dict(r.specs))
