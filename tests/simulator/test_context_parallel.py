"""Tests of context parallelism in the cost model (simulator.context_parallel and its use in
simulator.cost_model): token-local terms on the device's share of the tokens, the exchange by
method, memory and the gradient sync over data x context."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from ir import LayerCost, Layout, ShardDims, layout_problem
from ir.errors import IRError
from hardware_profiles import load_device
from hardware_profiles.collectives import all_gather, all_to_all, reduce_scatter
from hardware_profiles.types import Link, MeshSpec
from simulator import cost_model as cm
from simulator.context_parallel import context_exchange, context_parallel_comm
from zoo.costing import workload

KV, QKVO = 3e7, 1.2e8        # bytes per sample of K+V and of Q+K+V+O over the sequence
COST = LayerCost(name="block", fwd_flops_per_sample=4e12, bwd_flops_per_sample=8e12,
                 bwd_input_flops_per_sample=4e12, fwd_bytes_fixed=2e9, fwd_bytes_per_sample=1e9,
                 bwd_bytes_fixed=4e9, bwd_bytes_per_sample=2e9, param_count=1000,
                 param_bytes=2000.0, activation_bytes_per_sample=1e6,
                 residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=4e6,
                 attention_fwd_flops_per_sample=1e12, attention_bwd_flops_per_sample=2.5e12,
                 context_kv_bytes_per_sample=KV, context_qkvo_bytes_per_sample=QKVO)
LINK = Link(1e11, 2e-6)


def _mesh(devices: int = 8) -> MeshSpec:
    """One flat fabric of ``devices`` (a single link level: every group crosses ``LINK``)."""
    dev = dataclasses.replace(load_device("h100-sxm"), gemm_tiling=None)
    return MeshSpec("m", dev, devices, {"data": devices}, LINK)


@pytest.mark.parametrize("kind", ["F", "B", "W"])
@pytest.mark.parametrize("method", ["ring", "allgather", "alltoall"])
def test_token_local_terms_are_the_folded_data_parallel_ones(kind, method):
    """Every term but the exchange is what data parallel over data x context charges: the device
    holds 1/context of each sample's tokens, as folding context into data gives it whole samples
    of 1/context as many (the same tokens)."""
    mesh = _mesh()
    cp = Layout(2, 2, context=2, context_method=method)
    folded = Layout(4, 2)
    attention_s = (COST.attention_fwd_flops_per_sample if kind == "F"
                   else COST.attention_bwd_flops_per_sample if kind == "B" else 0.0)
    rate = mesh.device.achievable_flops("bf16") * mesh.device.attention_rate(0, backward=kind != "F")
    local = 4 / 4            # 4 samples over data 2 x context 2: one share each
    extra = context_parallel_comm(COST, kind, local, mesh, cp, attention_s * local / rate / 2,
                                  mesh.device.comm_interference)
    assert cm.layer_time(COST, kind, 4, mesh, cp, split_backward=kind == "W") == pytest.approx(
        cm.layer_time(COST, kind, 4, mesh, folded, split_backward=kind == "W") + extra, rel=1e-12)
    assert (extra > 0) == (kind != "W")


def test_exchange_bytes_and_seconds_by_method():
    """The formulas of the module docstring, on one flat link (tensor 2: half the heads)."""
    mesh, c, t, local = _mesh(), 4, 2, 0.5
    full = KV * local * c / t                 # the whole sequence's K/V of the local heads
    ring = Layout(1, t, context=c)
    assert context_exchange(COST, "F", local, mesh, ring) == pytest.approx(
        (full * 3 / 4, all_gather(full, c, LINK)))
    assert context_exchange(COST, "B", local, mesh, ring) == pytest.approx(
        (2 * full * 3 / 4, 2 * all_gather(full, c, LINK)))
    ag = Layout(1, t, context=c, context_method="allgather")
    assert context_exchange(COST, "B", local, mesh, ag) == pytest.approx(
        (2 * full * 3 / 4, all_gather(full, c, LINK) + reduce_scatter(full, c, LINK)))
    a2a = Layout(1, t, context=c, context_method="alltoall")
    q = (QKVO - KV) / 2 * local / t
    kv = KV * local / t
    assert context_exchange(COST, "F", local, mesh, a2a) == pytest.approx(
        (QKVO * local / t * 3 / 4, all_to_all(q + kv, c, LINK) + all_to_all(q, c, LINK)))
    assert context_exchange(COST, "W", local, mesh, ring) == (0.0, 0.0)
    assert context_exchange(dataclasses.replace(COST, context_kv_bytes_per_sample=0.0), "F",
                            local, mesh, ring) == (0.0, 0.0)


@given(attention=st.floats(0.0, 1.0), interference=st.floats(0.0, 0.5))
def test_ring_hides_its_passes_under_the_attention(attention, interference):
    """A ring's exposed time is at most its passes (nothing hidden) and at least what exceeds
    the attention core; the other methods expose everything."""
    mesh, lay = _mesh(), Layout(2, 1, context=4)
    _, comm = context_exchange(COST, "F", 1.0, mesh, lay)
    exposed = context_parallel_comm(COST, "F", 1.0, mesh, lay, attention, interference)
    assert max(comm - attention, 0.0) - 1e-15 <= exposed <= comm + interference * comm + 1e-15
    ag = Layout(2, 1, context=4, context_method="allgather")
    assert context_parallel_comm(COST, "F", 1.0, mesh, ag, attention, interference) == \
        context_exchange(COST, "F", 1.0, mesh, ag)[1]


def test_memory_and_gradient_sync_over_data_x_context():
    """A stage's residuals, activations and optimizer shard are those of the folded layout (the
    same tokens and replicas per device) plus the exchange's transient keys and values; the
    gradients reduce over data x context."""
    w = workload("llama-tiny", 8, 1024)
    mesh = _mesh()
    for method in ("ring", "allgather", "alltoall"):
        cp, folded = Layout(2, 2, context=2, context_method=method), Layout(4, 2)
        a, b = cm.stage_memory(w, 0, 4, cp, 8.0), cm.stage_memory(w, 0, 4, folded, 8.0)
        assert (a.static_bytes, a.residual_bytes_per_microbatch) == (
            b.static_bytes, b.residual_bytes_per_microbatch)
        assert a.activation_bytes_per_microbatch > b.activation_bytes_per_microbatch
        assert cm.grad_sync_time(w, 0, 4, mesh, cp) == cm.grad_sync_time(w, 0, 4, mesh, folded)
        assert cm.optimizer_time(w, 0, 4, mesh, cp) == cm.optimizer_time(w, 0, 4, mesh, folded)


def test_traced_exchange_bytes():
    """Llama 3 8B at 8,192 tokens: K and V are 8 heads x 128 x 8,192 tokens x 2 bytes each (32 MiB
    together); Q and the output 32 heads each (160 MiB with K and V). The embedding has none."""
    w = workload("llama3-8b", 8, 8192)
    block = w.costs["decoder_block"]
    assert block.context_kv_bytes_per_sample == 2 * 8 * 128 * 8192 * 2
    assert block.context_qkvo_bytes_per_sample == (2 * 32 + 2 * 8) * 128 * 8192 * 2
    assert w.costs["embed"].context_kv_bytes_per_sample == 0.0


def test_layout_rule_for_context_parallel():
    dims = ShardDims(heads=8, kv_heads=8, widths=(1536,), model="tiny")
    assert layout_problem(dims, 2, context=2, context_method="ring", seq_len=1024) is None
    assert layout_problem(dims, 2, context=2, context_method="ring", seq_len=1026) == (
        "context parallel 2 (ring) splits the sequence into 4 chunks, which do not divide 1026 "
        "tokens")
    assert layout_problem(dims, 2, context=2, context_method="alltoall", seq_len=1026) is None
    assert layout_problem(dims, 2, context=8, context_method="alltoall") == (
        "all-to-all context parallel 8 x tensor parallel 16 does not divide tiny's 8 attention "
        "heads")
    assert layout_problem(dims, 2, context=8, context_method="allgather") is None
    with pytest.raises(IRError):
        layout_problem(dims, 1, context=0)


def test_layout_context_fields():
    lay = Layout(4, 8, context=2, context_method="alltoall")
    assert (lay.devices, lay.replicas, str(lay)) == (64, 8, "dp4xcp2xtp8-alltoall")
    assert Layout(4, 8, context=1, context_method="alltoall") == Layout(4, 8)
    assert Layout(2, 2, fsdp=True, context=2).shard == 4
    assert Layout(2, 2, expert=8, context=2, expert_tensor=1).expert_data == 1
    with pytest.raises(ValueError, match="context must be >= 1"):
        Layout(4, 8, context=0)
    with pytest.raises(ValueError, match="context_method"):
        Layout(4, 8, context=2, context_method="ulysses")
