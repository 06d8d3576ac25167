"""The IR verifier: structural invariants every pass must keep (run between passes in tests).

Checks: every value defined once and before use (top level and inside fragment bodies); every
fragment body closed over its declared inputs, its outputs defined in its body; every op on one
mesh of the topology; fragment operands on the fragment's mesh (or still meshless before mesh
inference); transfers from the value's mesh to a different mesh; every value typed; once no
meshless op remains, every input and output on a mesh, outputs on their requested meshes.
"""

from __future__ import annotations

from compiler.errors import VerificationError
from compiler.program import Fragment, MeshlessOp, NamedComputation, Program, Transfer, value_meshes


def _fail(msg: str) -> None:
    raise VerificationError(msg)


def verify(p: Program) -> None:
    """Raise :class:`VerificationError` (naming the value and op) if ``p`` is malformed."""
    defined: set[str] = set()

    def define(v: str, where: str) -> None:
        if v in defined:
            _fail(f"value {v} is defined twice (again by {where})")
        if v not in p.types:
            _fail(f"value {v} (defined by {where}) has no type")
        defined.add(v)

    if len(p.input_meshes) != len(p.inputs) or len(p.output_meshes) != len(p.outputs):
        _fail("input_meshes/output_meshes lengths differ from inputs/outputs")
    for v in p.inputs:
        define(v, "the program inputs")
    meshes = value_meshes(p)
    assigned = not any(isinstance(op, (MeshlessOp, NamedComputation)) for op in p.ops)
    for k, op in enumerate(p.ops):
        where = f"op {k} ({type(op).__name__})"
        for v in op.inputs:
            if v not in defined:
                _fail(f"value {v} is used by {where} before it is defined")
        if isinstance(op, (Fragment, NamedComputation)):
            if isinstance(op, Fragment):
                if op.mesh not in p.meshes:
                    _fail(f"{where} is on mesh {op.mesh!r}, not in the topology {list(p.meshes)}")
                for v in op.inputs:
                    m = meshes.get(v)
                    if m is not None and m != op.mesh or (m is None and assigned):
                        _fail(f"value {v} on mesh {m!r} is an operand of {where} on mesh "
                              f"{op.mesh!r}; a transfer is missing")
            local = set(op.inputs)
            for e in op.body:
                for a in e.inputs:
                    if isinstance(a, str) and a not in local:
                        _fail(f"value {a} is read in the body of {where} but is neither an "
                              f"operand nor defined earlier in the body")
                for o in e.outputs:
                    define(o, where)
                    local.add(o)
            body_defs = {o for e in op.body for o in e.outputs}
            for v in op.outputs:
                if v not in body_defs:
                    _fail(f"result {v} of {where} is not defined in its body")
        elif isinstance(op, Transfer):
            m = meshes.get(op.value)
            if m != op.src:
                _fail(f"transfer of {op.value} ({where}) claims source mesh {op.src!r} but the "
                      f"value is on {m!r}")
            if op.src == op.dst:
                _fail(f"transfer of {op.value} ({where}) goes from mesh {op.src!r} to itself")
            if op.dst not in p.meshes:
                _fail(f"transfer of {op.value} ({where}) targets mesh {op.dst!r}, not in the "
                      f"topology")
            define(op.out, where)
        else:
            for o in op.outputs:
                define(o, where)
    for k, v in enumerate(p.outputs):
        if v not in defined:
            _fail(f"program output {k} ({v}) is not defined")
        want = p.output_meshes[k]
        if assigned and want is not None and meshes.get(v) != want:
            _fail(f"program output {k} ({v}) is on mesh {meshes.get(v)!r}, requested {want!r}")
    if assigned:
        for v, m in zip(p.inputs, p.input_meshes):
            if m is None:
                _fail(f"program input {v} has no mesh after mesh inference")
