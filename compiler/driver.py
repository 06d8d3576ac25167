"""The pass driver: the compiler's pass pipeline, written once as data, and the loop that runs it.

:data:`PIPELINE` is every pass in order, each a :class:`PassSpec`: its name, how it is built from
the :class:`~compiler.config.MpmdConfig` (and the input shardings), when the config asks for it,
and what the program must already be for it to run (:data:`PRECONDITIONS`: checked, with the
verifier, between passes when ``run_passes(..., verify=True)``). :func:`default_pipeline` is
the passes a config runs; ``docs/architecture.md`` lists :data:`PIPELINE` and a test holds the two
equal (``tests/compiler/test_driver.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Sequence

from compiler.calls import CallOp, ForLoop
from compiler.config import MpmdConfig
from compiler.errors import VerificationError
from compiler.passes import (absorb_inferred_fragments, accumulate_uniformly, assign_meshes,
                             call_inline, copy_constants, erase_unused_callee_block_arguments,
                             fold_zero_adds, fragment_dce, fragment_dedup,
                             from_unroll_to_call_counter, infer_meshes, merge_by_rules,
                             merge_forward_backward, merge_inferred_fragments, merge_stages, merge_transfers,
                             propagate_shardings, remove_transfer_cycles, schedule_fragments,
                             sink_negligible_ops_into_call_op, split_backward,
                             unroll_call_counters, unroll_for_loops)
from compiler.passes.concat_transfers import concat_transfers
from compiler.passes.fuse_partials import fuse_partials
from compiler.passes.sharding import spec_of
from compiler.passes.accumulate_terms import separate_inferred_terms
from compiler.passes.stacked import fold_stacked_slices
from compiler.passes.transfer_aware import (
    split_and_prioritize_transfer_independent_computations, transfer_aware_merge)
from compiler.program import MeshlessOp, NamedComputation, Program
from compiler.verify import verify as verify_program

Pass = tuple[str, Callable[[Program], Program]]
"""A pass as the driver runs it: its name and ``Program -> Program``."""

PRECONDITIONS: dict[str, Callable[[Program], bool]] = {
    "loop-free": lambda p: not any(isinstance(op, (ForLoop, CallOp)) for op in p.ops),
    "assigned": lambda p: not any(isinstance(op, (ForLoop, CallOp, NamedComputation))
                                  for op in p.ops),
    "on meshes": lambda p: not any(isinstance(op, (ForLoop, CallOp, NamedComputation, MeshlessOp))
                                   for op in p.ops),
}
"""What a pass may need the program to be: ``loop-free`` (no ``ForLoop``/``CallOp``: loops and calls
are gone), ``assigned`` (also every named computation a fragment on a mesh), ``on meshes`` (also
no meshless op left: mesh inference has run)."""


def _always(config: MpmdConfig) -> bool:
    return True


def _sharding(config: MpmdConfig, specs: Mapping[int, object]) -> Callable[[Program], Program]:
    def sharding(p: Program) -> Program:
        s = {k: spec_of(v, len(p.types[p.inputs[k]].shape)) for k, v in specs.items()}
        return propagate_shardings(p, config.topology, s)
    return sharding


@dataclass(frozen=True, slots=True)
class PassSpec:
    """One pass of :data:`PIPELINE`.

    Attributes:
        name: the pass's name (in the history, errors and the docs).
        build: ``(config, in_specs) -> (Program -> Program)``.
        when: whether ``config`` runs the pass; ``when_doc`` says so in words (``""``: always).
        requires: :data:`PRECONDITIONS` the input program must meet.
    """

    name: str
    build: Callable[[MpmdConfig, Mapping[int, object]], Callable[[Program], Program]]
    requires: tuple[str, ...] = ()
    when: Callable[[MpmdConfig], bool] = _always
    when_doc: str = ""


def _fixed(fn: Callable[[Program], Program]) -> Callable[[MpmdConfig, Any], Callable[[Program], Program]]:
    return lambda config, specs: fn


_LF, _AS, _OM = ("loop-free",), ("assigned",), ("on meshes",)

PIPELINE: tuple[PassSpec, ...] = (
    # loops and calls (passes/loops.py, passes/calls.py): each returns a loop-free program unchanged
    PassSpec("unroll_for_loops", _fixed(unroll_for_loops)),
    PassSpec("from_unroll_to_call_counter",
             lambda c, s: partial(from_unroll_to_call_counter, place=c.place)),
    PassSpec("erase_unused_callee_block_arguments", _fixed(erase_unused_callee_block_arguments)),
    PassSpec("sink_negligible_ops_into_call_op", _fixed(sink_negligible_ops_into_call_op)),
    PassSpec("call_inline", _fixed(call_inline)),
    PassSpec("unroll", lambda c, s: partial(unroll_call_counters, microbatches=c.microbatches), _LF),
    PassSpec("fold_stacked_slices", _fixed(fold_stacked_slices), _LF),
    PassSpec("assignment", lambda c, s: partial(assign_meshes, place=c.place,
                                                input_meshes=dict(c.input_meshes),
                                                output_meshes=dict(c.output_meshes)), _LF),
    PassSpec("inference", lambda c, s: partial(infer_meshes, infer_transfers=c.infer_transfers),
             _AS),
    PassSpec("dce", _fixed(fragment_dce), _OM),
    PassSpec("fold_zero_adds", _fixed(fold_zero_adds), _OM),
    PassSpec("separate_inferred_terms", _fixed(separate_inferred_terms), _OM),
    PassSpec("absorb", _fixed(absorb_inferred_fragments), _OM),
    PassSpec("transfer_aware_merge", _fixed(transfer_aware_merge), _OM,
             lambda c: c.transfer_aware_merge, "config.transfer_aware_merge"),
    PassSpec("split_backward", _fixed(split_backward), _OM,
             lambda c: c.wants_split_backward(), "the schedule has W fragments"),
    PassSpec("merge_stages", _fixed(merge_stages), _OM),
    PassSpec("schedule", lambda c, s: partial(schedule_fragments, schedule=c.schedule), _OM),
    PassSpec("accumulate", _fixed(accumulate_uniformly), _OM),
    PassSpec("merge_forward_backward", _fixed(merge_forward_backward), _OM,
             lambda c: c.merge_forward_backward, "config.merge_forward_backward"),
    PassSpec("merge_rules", lambda c, s: partial(merge_by_rules, rules=c.merge_rules), _OM,
             lambda c: callable(c.merge_rules) or bool(c.merge_rules), "config.merge_rules"),
    PassSpec("merge_inferred", _fixed(merge_inferred_fragments), _OM),
    PassSpec("split_transfer_independent",
             _fixed(split_and_prioritize_transfer_independent_computations), _OM,
             lambda c: c.split_transfer_independent, "config.split_transfer_independent"),
    PassSpec("merge_transfers", _fixed(merge_transfers), _OM),
    PassSpec("remove_transfer_cycles", _fixed(remove_transfer_cycles), _OM),
    PassSpec("concat_transfers", _fixed(concat_transfers), _OM),
    PassSpec("copy_constants", _fixed(copy_constants), _OM),
    PassSpec("dce", _fixed(fragment_dce), _OM),
    PassSpec("dedup", _fixed(fragment_dedup), _OM),
    PassSpec("fuse_partials", _fixed(fuse_partials), _OM, lambda c: c.fuse_partials,
             "config.fuse_partials"),
    PassSpec("sharding", _sharding, _OM),
)
"""The compiler's passes in order. ``fold_zero_adds`` before ``absorb`` and ``accumulate`` after
``schedule`` (``passes/accumulate.py``) make sums across microbatches one add per fragment, so the
fragments of all microbatches keep one body (``accumulate`` accumulates in the scheduled order);
``split_transfer_independent`` runs after every merge, which would undo it."""

_REQUIRES = {(s.name, s.requires) for s in PIPELINE}


def default_pipeline(config: MpmdConfig, in_specs: Mapping[int, object] | None = None) -> list[Pass]:
    """The passes ``config`` runs, in :data:`PIPELINE` order; ``in_specs`` (argument index ->
    sharding spec) defaults to ``config.in_specs``."""
    specs = in_specs if in_specs is not None else dict(config.in_specs)
    return [(s.name, s.build(config, specs)) for s in PIPELINE if s.when(config)]


def requirements(name: str) -> tuple[str, ...]:
    """The :data:`PRECONDITIONS` that the :data:`PIPELINE` pass ``name`` needs (``()`` for a pass
    outside it)."""
    return next((r for n, r in _REQUIRES if n == name), ())


def run_passes(p: Program, passes: Sequence[Pass], *, verify: bool = False,
               history: list[tuple[str, Program]] | None = None) -> Program:
    """Run ``passes`` in order; with ``verify``, verify the input and every pass's result, and
    check each :data:`PIPELINE` pass's preconditions before it runs.

    Raises:
        VerificationError: a pass produced a malformed program (the message starts with its name),
            or a pass was given a program it cannot take (its unmet precondition named).
    """
    if verify:
        verify_program(p)
    for name, fn in passes:
        if verify:
            unmet = [r for r in requirements(name) if not PRECONDITIONS[r](p)]
            if unmet:
                raise VerificationError(f"pass {name!r} needs a program that is {unmet[0]}; run "
                                        f"the passes before it in compiler.driver.PIPELINE order")
        p = fn(p)
        if history is not None:
            history.append((name, p))
        if verify:
            try:
                verify_program(p)
            except Exception as e:
                raise type(e)(f"after pass {name!r}: {e}") from None
    return p
