"""The exported MPMD program: the contract between the compiler's passes and its runtime.

After the passes run, a program is a set of per-mesh programs, each an ordered list of steps: calls
of compiled executables (one per unique fragment body and mesh) and transfers of values to other
meshes. Values are named by strings, unique in the program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Union


@dataclass(frozen=True, slots=True)
class Call:
    """Run executable ``executable`` on this mesh.

    Attributes:
        executable: key into ``ExportedProgram.executables``.
        name: the fragment instance for timelines, e.g. ``"F1.0"`` (kind, stage, microbatch).
        kind: F, B, W (or ``"FB"`` for a merged forward+backward, ``"other"`` for inferred code).
        stage / microbatch: indices (-1 when not applicable).
        inputs / outputs: value names.
        donate: positions in ``inputs`` whose buffers may be donated (last use).
    """

    executable: str
    name: str
    kind: str
    stage: int
    microbatch: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    donate: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Send:
    """Move ``value`` from this mesh to ``dst_mesh``, where it is named ``out`` with ``sharding``."""

    value: str
    dst_mesh: str
    out: str
    sharding: Any = None


Step = Union[Call, Send]


@dataclass(frozen=True, slots=True)
class MeshProgram:
    mesh: str
    steps: tuple[Step, ...]


@dataclass(frozen=True, slots=True)
class Executable:
    """A compiled fragment body for one mesh: ``fn(*inputs) -> tuple(outputs)``.

    ``donate``: the input positions whose buffers ``fn`` consumes (``donate_argnums``): those
    arrays are deleted by the call, their memory reused for its results.
    """

    key: str
    mesh: str
    fn: Callable[..., Any]
    in_shardings: tuple[Any, ...] = ()
    out_shardings: tuple[Any, ...] = ()
    donate: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True, weakref_slot=True)
class ExportedProgram:
    """Per-mesh programs plus their executables.

    Attributes:
        programs: mesh name -> its ordered steps.
        executables: key -> executable (one per unique fragment body and mesh).
        inputs: for each positional (flattened) argument, its value name, mesh and sharding.
        outputs: for each flattened result, its value name and mesh.
    """

    programs: Mapping[str, MeshProgram]
    executables: Mapping[str, Executable]
    inputs: tuple[tuple[str, str, Any], ...]
    outputs: tuple[tuple[str, str], ...]
    meta: Mapping[str, Any] = field(default_factory=dict)
