"""The pass driver: runs named pure passes Program -> Program in order, optionally verifying.

:func:`default_pipeline` is the compiler's pass order for an :class:`~compiler.core.config.MpmdConfig`:

0. loops and calls (``passes/loops.py``, ``passes/calls.py``): ``unroll_for_loops``,
``from_unroll_to_call_counter``, ``erase_unused_callee_block_arguments``,
``sink_negligible_ops_into_call_op``, ``call_inline`` (each returns a loop-free program unchanged),
1. ``unroll`` (call counters), 2. ``assignment`` (mesh assignment + direct transfers),
3. ``inference`` (mesh inference), 4. ``dce``, 5. ``absorb`` (inferred into user fragments),
then ``transfer_aware_merge`` (if asked: inferred code moved across a transfer that it shrinks),
6. ``split_backward`` (only for schedules with W), 7. ``merge_stages``, 8. ``schedule``,
9. ``merge_forward_backward`` (if asked), 10. ``merge_rules`` (if any), then
``split_transfer_independent`` (if asked: after every merge, which would undo it), 11.
``merge_transfers``,
12. ``remove_transfer_cycles``, 13. ``copy_constants``, 14. ``dce``, 15. ``dedup``,
16. ``sharding`` (SPMD propagation).
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Sequence

from compiler.core.config import MpmdConfig
from compiler.core.passes import (call_inline, erase_unused_callee_block_arguments,
                                  from_unroll_to_call_counter, sink_negligible_ops_into_call_op,
                                  unroll_for_loops)
from compiler.core.passes.transfer_aware import (
    split_and_prioritize_transfer_independent_computations, transfer_aware_merge)
from compiler.core.passes import (absorb_inferred_fragments, assign_meshes, copy_constants,
                             fragment_dce, fragment_dedup, infer_meshes, merge_by_rules,
                             merge_forward_backward, merge_stages, merge_transfers,
                             propagate_shardings, remove_transfer_cycles, schedule_fragments,
                             split_backward, unroll_call_counters)
from compiler.core.passes.sharding import spec_of
from compiler.core.program import Program
from compiler.core.verify import verify as verify_program

Pass = tuple[str, Callable[[Program], Program]]


def run_passes(p: Program, passes: Sequence[Pass], *, verify: bool = False,
               history: list[tuple[str, Program]] | None = None) -> Program:
    """Run ``passes`` in order; with ``verify``, verify the input and every pass's result.

    Raises:
        VerificationError: a pass produced a malformed program (message starts with its name).
    """
    if verify:
        verify_program(p)
    for name, fn in passes:
        p = fn(p)
        if history is not None:
            history.append((name, p))
        if verify:
            try:
                verify_program(p)
            except Exception as e:
                raise type(e)(f"after pass {name!r}: {e}") from None
    return p


def default_pipeline(config: MpmdConfig, in_specs: dict[int, object] | None = None) -> list[Pass]:
    """The compiler's passes for ``config`` (see the module docstring)."""
    passes: list[Pass] = [
        ("unroll_for_loops", unroll_for_loops),
        ("from_unroll_to_call_counter", partial(from_unroll_to_call_counter, place=config.place)),
        ("erase_unused_callee_block_arguments", erase_unused_callee_block_arguments),
        ("sink_negligible_ops_into_call_op", sink_negligible_ops_into_call_op),
        ("call_inline", call_inline),
        ("unroll", partial(unroll_call_counters, microbatches=config.microbatches)),
        ("assignment", partial(assign_meshes, place=config.place,
                               input_meshes=dict(config.input_meshes),
                               output_meshes=dict(config.output_meshes))),
        ("inference", partial(infer_meshes, infer_transfers=config.infer_transfers)),
        ("dce", fragment_dce),
        ("absorb", absorb_inferred_fragments),
    ]
    if config.transfer_aware_merge:
        passes.append(("transfer_aware_merge", transfer_aware_merge))
    if config.wants_split_backward():
        passes.append(("split_backward", split_backward))
    passes += [("merge_stages", merge_stages),
               ("schedule", partial(schedule_fragments, schedule=config.schedule))]
    if config.merge_forward_backward:
        passes.append(("merge_forward_backward", merge_forward_backward))
    if callable(config.merge_rules) or config.merge_rules:
        passes.append(("merge_rules", partial(merge_by_rules, rules=config.merge_rules)))
    specs = in_specs if in_specs is not None else dict(config.in_specs)

    def sharding(p: Program) -> Program:
        s = {k: spec_of(v, len(p.types[p.inputs[k]].shape)) for k, v in specs.items()}
        return propagate_shardings(p, config.topology, s)

    if config.split_transfer_independent:
        passes.append(("split_transfer_independent",
                       split_and_prioritize_transfer_independent_computations))
    passes += [("merge_transfers", merge_transfers),
               ("remove_transfer_cycles", remove_transfer_cycles),
               ("copy_constants", copy_constants),
               ("dce", fragment_dce),
               ("dedup", fragment_dedup),
               ("sharding", sharding)]
    return passes
