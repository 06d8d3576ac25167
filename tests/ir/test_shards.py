"""The one rule for a layout that can run a model (ir.shards.layout_problem): exact phrases for
each way a degree fails, and properties: an accepted tensor degree splits heads and widths
evenly and gives each device a whole number of key/value heads (or a whole group sharing one),
which is what the zoo's tensor shard and the compiler's split assume."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

import zoo
from ir import IRError, ShardDims, layout_problem

OPT = ShardDims(heads=16, kv_heads=16, widths=(4096,), model="opt-350m")
LLAMA = ShardDims(heads=64, kv_heads=8, widths=(28672,), model="llama3-70b")
MOE = ShardDims(heads=48, kv_heads=8, widths=(16384,), experts=8, model="mixtral")


@pytest.mark.parametrize("dims,tensor,expert,why", [
    (OPT, 3, 1, "tensor parallel 3 does not divide opt-350m's 16 attention heads"),
    (OPT, 32, 1, "tensor parallel 32 does not divide opt-350m's 16 attention heads"),
    (ShardDims(12, 6, (3072,)), 4, 1, "tensor parallel 4 does not divide 6 key/value heads"),
    (ShardDims(24, 8, (3072,)), 12, 1, "tensor parallel 12 is not a multiple of 8 key/value heads "
                                       "(each is replicated over tensor / kv_heads devices)"),
    (ShardDims(32, 8, (1000,)), 16, 1, "tensor parallel 16 does not divide MLP width 1000"),
    (MOE, 1, 3, "expert parallel 3 does not divide mixtral's 8 experts"),
    (OPT, 1, 2, "expert parallel 2 does not divide opt-350m's 0 experts"),
])
def test_each_way_a_layout_cannot_run(dims, tensor, expert, why):
    assert layout_problem(dims, tensor, expert) == why


def test_layouts_that_run():
    assert [t for t in range(1, 129) if layout_problem(LLAMA, t) is None] == [1, 2, 4, 8, 16, 32, 64]
    assert layout_problem(MOE, 8, 8) is None and layout_problem(MOE, 16, 4) is None
    assert layout_problem(None, 3, 5) is None          # no dimensions: any layout
    with pytest.raises(IRError):
        layout_problem(OPT, 0)
    with pytest.raises(IRError, match="kv_heads 3 must be positive, the second dividing"):
        ShardDims(heads=32, kv_heads=3, widths=(8,))


def test_the_zoo_gives_its_models_dimensions():
    assert zoo.shard_dims(zoo.get_config("llama3-70b")) == ShardDims(64, 8, (28672,), 0, "llama3-70b")
    assert zoo.shard_dims(zoo.get_config("mochi-dit-10b")).widths == (8192, 4096)
    from zoo.model_files import resolve_model
    ds = zoo.shard_dims(resolve_model("deepseek-v3"))     # latent attention: a K and V per head
    assert (ds.heads, ds.kv_heads, ds.widths, ds.experts) == (128, 128, (18432, 2048), 256)


@given(st.integers(1, 64), st.integers(1, 8), st.integers(1, 4096), st.integers(1, 128))
def test_an_accepted_degree_splits_evenly(group, kv, width, tensor):
    dims = ShardDims(heads=kv * group, kv_heads=kv, widths=(width,))
    if layout_problem(dims, tensor) is not None:
        return
    assert dims.heads % tensor == 0 and width % tensor == 0
    kv_per_device = max(kv // tensor, 1)
    assert (dims.heads // tensor) % kv_per_device == 0      # the shard is a valid model too
    assert kv % tensor == 0 if tensor <= kv else tensor % kv == 0
