"""The MPMD compiler passes: pure functions Program -> Program (one module per pass or family)."""

from compiler.passes.absorb import absorb_inferred_fragments
from compiler.passes.accumulate import accumulate_uniformly, fold_zero_adds
from compiler.passes.assignment import assign_meshes
from compiler.passes.calls import (call_inline, erase_unused_callee_block_arguments,
                                   sink_negligible_ops_into_call_op)
from compiler.passes.constants import copy_constants
from compiler.passes.dce import fragment_dce, fragment_dedup
from compiler.passes.inference import infer_meshes
from compiler.passes.loops import from_unroll_to_call_counter, unroll_for_loops
from compiler.passes.merge_inferred import merge_inferred_fragments
from compiler.passes.merging import merge_by_rules, merge_forward_backward, merge_stages
from compiler.passes.scheduling import (comparator, gpipe_key, one_f_one_b_key,
                                        schedule_fragments)
from compiler.passes.sharding import propagate_shardings
from compiler.passes.split_backward import split_backward
from compiler.passes.transfers import merge_transfers, remove_transfer_cycles
from compiler.passes.unroll import unroll_call_counters

__all__ = ["absorb_inferred_fragments", "accumulate_uniformly", "fold_zero_adds", "assign_meshes", "copy_constants", "fragment_dce",
           "fragment_dedup", "infer_meshes", "merge_by_rules", "merge_forward_backward",
           "merge_stages", "merge_inferred_fragments", "comparator", "gpipe_key", "one_f_one_b_key", "schedule_fragments",
           "propagate_shardings", "split_backward", "merge_transfers", "remove_transfer_cycles",
           "unroll_call_counters", "unroll_for_loops", "from_unroll_to_call_counter",
           "erase_unused_callee_block_arguments", "sink_negligible_ops_into_call_op",
           "call_inline"]
