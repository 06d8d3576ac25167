"""Context-parallel layout options (planner.options): the degrees the search offers, the two
exact prunings (data parallel over the same devices dominates where it can take the microbatch;
the ring dominates the all-gather), the user's fixed degree, and a plan that needs context
parallelism to fit."""

from __future__ import annotations

import dataclasses

import pytest

from ir import ShardDims
from planner import api
from planner.construct import PlanOptions
from planner.errors import InfeasibleError
from planner.options import _layouts, context_degrees
from tests.planner.conftest import cluster, device, workload

DIMS = ShardDims(heads=8, kv_heads=8, widths=(4096,), model="m")


def test_degrees_offered():
    assert context_degrees(8192, 64) == [1]                    # below CONTEXT_MIN_TOKENS
    assert context_degrees(16384, 64) == [1, 2, 4, 8, 16]      # chunks of 1,024 tokens at least
    assert context_degrees(131072, 12) == [1, 2, 4]            # powers of two dividing the devices
    assert context_degrees(4096, 64, context=4) == [4]         # fixed by the user
    assert context_degrees(4096, 6, context=4) == []
    assert context_degrees(131072, 64, context=1) == [1]


def test_context_is_offered_only_where_data_parallel_cannot_take_the_microbatch():
    mesh = cluster([("m", device("d", 100.0, 80.0), 8)]).meshes["m"]
    lays = _layouts(mesh, 2.0, 1, False, shards=DIMS, seq_len=32768)
    cp = {(lay.data, lay.context, lay.context_method) for lay in lays if lay.context > 1}
    # 2 samples over 8 devices at tensor 1: data 2 x context 4, or data 1 x context 8; data 1 x
    # context 2 (etc.) leaves devices for data parallel that 2 samples cannot fill
    assert cp == {(2, 4, "ring"), (2, 4, "alltoall"), (1, 8, "ring"), (1, 8, "alltoall")}
    assert not any(lay.context_method == "allgather" for lay in lays)
    # 8 samples: data parallel 8 takes them, so no context layout at tensor 1
    assert not any(lay.context > 1 and lay.tensor == 1
                   for lay in _layouts(mesh, 8.0, 1, False, shards=DIMS, seq_len=32768))


def test_ulysses_needs_the_heads():
    mesh = cluster([("m", device("d", 100.0, 80.0), 16)]).meshes["m"]
    lays = _layouts(mesh, 2.0, 2, False, shards=DIMS, seq_len=32768)
    ulysses = {(lay.tensor, lay.context) for lay in lays if lay.context_method == "alltoall"}
    # data 2: tensor x context 8 divides the 8 heads; data 1 (16) would not
    assert ulysses == {(1, 8), (2, 4)}


def test_a_fixed_degree_is_offered_at_any_length():
    mesh = cluster([("m", device("d", 100.0, 80.0), 8)]).meshes["m"]
    lays = _layouts(mesh, 4.0, 1, False, shards=DIMS, seq_len=1024, context=2)
    assert {(lay.data, lay.context) for lay in lays} == {(4, 2)}


def test_a_plan_that_needs_the_sequence_split():
    # eight devices, tensor parallel capped at 1 and one sample per microbatch: data parallel
    # cannot split a sample, so only context parallel 8 gives every device work
    w = workload(blocks=4, batch=8)
    costs = {k: dataclasses.replace(c, context_kv_bytes_per_sample=1e6,
                                    context_qkvo_bytes_per_sample=4e6)
             for k, c in w.costs.items()}
    w = dataclasses.replace(w, costs=costs, seq_len=32768)
    c = cluster([("a", device("a", 400.0, 80.0), 8)])
    opts = PlanOptions(time_limit_s=5, fsdp=False, max_tensor=1, microbatches=(8,))
    lay = api.plan_meshes(w, c, opts).plan.layouts["a"]
    assert (lay.data, lay.context, lay.tensor) == (1, 8, 1)
    with pytest.raises(InfeasibleError):
        api.plan_meshes(w, c, dataclasses.replace(opts, context=1))
