"""simulator.serving_cost on a synthetic device with round numbers and a hand-made tiny model: every
step time, all-reduce, capacity and throughput below is worked out by hand from the formulas in
the module's docstrings (not by calling the code under test)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware_profiles.collectives import one_hop_all_reduce
from hardware_profiles.loader import load_device
from hardware_profiles.types import Link, NodeGroup, Span
from ir import BatchStep, InferenceModel
from simulator.program import SimError
from simulator.serving_cost import (KV_FRACTION, Replica, kv_transfer_time, layer_overhead,
                                    load_cost, mesh_all_reduce, mesh_shape, saturation_throughput,
                                    step_cost, step_time, tp_all_reduce, tp_span)

# Synthetic device: 1e15 bf16 FLOP/s at 0.5 -> 5e14 FLOP/s; 1e12 B/s at 0.5 -> 5e11 B/s; 2 GB.
PEAK, MM_EFF, BW, MEM_EFF = 1e15, 0.5, 1e12, 0.5
RATE, BWE = PEAK * MM_EFF, BW * MEM_EFF
DEC_OVH, PRE_OVH = 1e-5, 2e-5
MEM = 2e9

# Tiny model: 2 layers, hidden 4, vocab 8, 2 KV heads, 1 GB of weights, 1 kB of KV per token,
# 2 GFLOP per token, 100 FLOP per attention pair.
LAYERS, HIDDEN, VOCAB, KV_HEADS = 2, 4, 8, 2
W, KV, FLOP, PAIR = 1e9, 1e3, 2e9, 100.0

INTRA = Link(1e9, 1e-6)         # 1 GB/s, 1 us per hop: the byte terms of 16-byte messages show


def device(**kw):
    base = dataclasses.replace(
        load_device("h100-sxm"), name="synthetic", peak_flops={"bf16": PEAK},
        matmul_efficiency=MM_EFF, memory_bandwidth=BW, memory_efficiency=MEM_EFF,
        memory_bytes=MEM, decode_layer_overhead=DEC_OVH, prefill_layer_overhead=PRE_OVH,
        logit_overhead=0.0, roofline="max", scale_up_one_hop=False)
    return dataclasses.replace(base, **kw)


def model(**kw) -> InferenceModel:
    base = InferenceModel(
        name="tiny", layers=LAYERS, hidden=HIDDEN, vocab=VOCAB, kv_heads=KV_HEADS,
        weight_format="bf16", kv_format="bf16", dense_weight_bytes=W, expert_weight_bytes=0.0,
        experts=0, experts_per_token=0, moe_layers=0, flops_per_token=(("bf16", FLOP),),
        attention_flops_per_pair=PAIR, kv_bytes_per_token=KV,
        tp_allreduce_bytes_per_token=123.0, embedding_bytes=0.0)
    return dataclasses.replace(base, **kw)


def replica(tp: int = 1, dev=None, m=None, span: Span | None = None) -> Replica:
    return Replica(m or model(), dev or device(), tp, span or Span(tp, 1, INTRA))


# ------------------------------------------------------------------------------------ one step
def test_decode_step_is_memory_bound():
    # two decodes at contexts 100 and 200: 2 tokens, 300 pairs, 300 cached tokens read, 2 written
    c = step_cost(replica(), BatchStep(decode=(100, 200)))
    assert c.compute_s == pytest.approx(2 * 2e9 / 5e14 + 100 * 300 / 5e14)       # 8.00006e-6
    assert c.memory_s == pytest.approx((1e9 + 1e3 * (300 + 2)) / 5e11)           # 2.000604e-3
    assert c.comm_s == 0.0
    assert c.overhead_s == pytest.approx(2 * 1e-5)
    assert c.total_s == pytest.approx(2.000604e-3 + 2e-5, rel=1e-12)


def test_prefill_step_is_compute_bound_with_the_prefill_overhead():
    # one prompt of 1000 tokens: 1000 x 1001 / 2 causal pairs, 1000 read (the chunk) + 1000 written
    c = step_cost(replica(), BatchStep(prefill=((0, 1000),)))
    compute = 1000 * 2e9 / 5e14 + 100 * 500500 / 5e14                            # 4.0001001e-3
    memory = (1e9 + 1e3 * 2000) / 5e11                                            # 2.004e-3
    assert (c.compute_s, c.memory_s) == pytest.approx((compute, memory), rel=1e-12)
    assert c.overhead_s == pytest.approx(2 * 2e-5)
    assert c.total_s == pytest.approx(4.0001001e-3 + 4e-5, rel=1e-12)


def test_a_chunk_after_cached_tokens():
    # 100 new tokens after 300 cached: 100 x 300 + 100 x 101 / 2 pairs, 400 read, 100 written
    c = step_cost(replica(), BatchStep(prefill=((300, 100),), decode=(50,)))
    pairs = 100 * 300 + 5050 + 50
    assert c.compute_s == pytest.approx(101 * 2e9 / 5e14 + 100 * pairs / 5e14, rel=1e-12)
    assert c.memory_s == pytest.approx((1e9 + 1e3 * (400 + 50 + 101)) / 5e11, rel=1e-12)
    assert c.overhead_s == pytest.approx(2 * 2e-5)     # a step that prefills pays the prefill time


def test_a_one_token_step_streams_weights_at_the_matrix_vector_rate():
    # a profile that measured a faster matrix-vector weight stream (0.8 of 1e12 B/s) uses it for a
    # step of one token; a step of two tokens is a matrix-matrix product at the memory rate
    dev = device(weight_stream_efficiency=0.8)
    one = step_cost(replica(dev=dev), BatchStep(decode=(100,)))
    assert one.memory_s == pytest.approx(1e9 / 8e11 + 1e3 * 101 / 5e11, rel=1e-12)
    two = step_cost(replica(dev=dev), BatchStep(decode=(100, 200)))
    assert two.memory_s == pytest.approx((1e9 + 1e3 * 302) / 5e11, rel=1e-12)


def test_sum_roofline_adds_compute_and_memory():
    c = step_cost(replica(dev=device(roofline="sum")), BatchStep(decode=(100, 200)))
    assert c.total_s == pytest.approx(8.00006e-6 + 2.000604e-3 + 2e-5, rel=1e-12)


def test_logit_overhead_per_sampled_logit():
    c = step_cost(replica(dev=device(logit_overhead=1e-9)), BatchStep(decode=(100, 200)))
    assert c.overhead_s == pytest.approx(2 * 1e-5 + 2 * 8 * 1e-9)


def test_unset_layer_overhead_falls_back_to_the_fragment_overhead():
    dev = device(decode_layer_overhead=None, prefill_layer_overhead=None, fragment_overhead=3e-5)
    assert layer_overhead(dev, prefill=False) == layer_overhead(dev, prefill=True) == 3e-5
    assert layer_overhead(device(), prefill=False) == 1e-5
    assert layer_overhead(device(), prefill=True) == 2e-5


def test_matmul_rate_per_weight_format():
    # the fp8 entry where the device has one, else its bf16 rate
    dev = device(peak_flops={"bf16": 1e15, "fp8": 2e15})
    m = model(flops_per_token=(("bf16", 1e9), ("fp8", 4e9)))
    c = step_cost(replica(dev=dev, m=m), BatchStep(decode=(1,)))
    assert c.compute_s == pytest.approx(1e9 / 5e14 + 4e9 / 1e15 + 100 / 5e14, rel=1e-12)
    c = step_cost(replica(m=m), BatchStep(decode=(1,)))
    assert c.compute_s == pytest.approx(5e9 / 5e14 + 100 / 5e14, rel=1e-12)


def test_moe_reads_the_experts_its_tokens_touch():
    m = model(expert_weight_bytes=8e8, experts=8, experts_per_token=2, moe_layers=2)
    c = step_cost(replica(m=m), BatchStep(decode=(10, 10)))     # 2 tokens: 1 - 0.75^2 of them
    assert c.memory_s == pytest.approx((1e9 + 8e8 * (1 - 0.5625) + 1e3 * 22) / 5e11, rel=1e-12)


def test_empty_step_is_refused():
    with pytest.raises(SimError, match="fix"):
        step_cost(replica(), BatchStep())


# ------------------------------------------------------------------------- tensor parallelism
def test_tp4_on_a_one_hop_fabric():
    # 16-byte all-reduces (2 tokens x hidden 4 x 2 B) over 4 devices:
    #   ring      2 x 3/4 x 16 / 1e9 + 6 x 1e-6 = 6.024e-6
    #   one-shot  2 x 1e-6 + 3 x 16 / 1e9      = 2.048e-6   <- the fastest
    #   two-shot  3 x 1e-6 + 1.5 x 16 / 1e9    = 3.024e-6
    rep = replica(4, dev=device(scale_up_one_hop=True))
    assert tp_all_reduce(16.0, rep) == pytest.approx(2.048e-6, rel=1e-12)
    c = step_cost(rep, BatchStep(decode=(100, 200)))
    assert c.compute_s == pytest.approx((2 * 2e9 + 100 * 300) / 4 / 5e14, rel=1e-12)
    # weights / 4; 2 KV heads over 4 devices: each keeps half of every token's cache
    assert c.memory_s == pytest.approx((1e9 / 4 + 1e3 / 2 * 302) / 5e11, rel=1e-12)
    assert c.comm_s == pytest.approx(2 * 2 * 2.048e-6, rel=1e-12)    # 2 per block x 2 layers
    assert c.total_s == pytest.approx(5.00302e-4 + 8.192e-6 + 2e-5, rel=1e-12)


def test_tp4_on_a_mesh_fabric():
    # not one hop: per-axis rings on a 2 x 2 mesh,
    #   2 (1/2 + 1/4) x 16 / 1e9 + 2 (1 + 1) x 1e-6 = 4.024e-6, below the ring's 6.024e-6
    rep = replica(4)
    assert mesh_all_reduce(16.0, 4, INTRA) == pytest.approx(4.024e-6, rel=1e-12)
    assert tp_all_reduce(16.0, rep) == pytest.approx(4.024e-6, rel=1e-12)
    assert step_cost(rep, BatchStep(decode=(100, 200))).comm_s == pytest.approx(4 * 4.024e-6)


def test_tp2_one_shot_equals_the_ring():
    # n = 2: ring 2 x 1/2 x 16/1e9 + 2 us = one-shot 2 us + 16/1e9 = 2.016e-6
    for dev in (device(), device(scale_up_one_hop=True)):
        rep = replica(2, dev=dev)
        assert tp_all_reduce(16.0, rep) == pytest.approx(2.016e-6, rel=1e-12)
        c = step_cost(rep, BatchStep(decode=(100, 200)))
        assert c.memory_s == pytest.approx((5e8 + 1e3 / 2 * 302) / 5e11, rel=1e-12)
        assert c.comm_s == pytest.approx(4 * 2.016e-6, rel=1e-12)


def test_tp_across_nodes_takes_nccl_ring_or_tree():
    # 4 ranks on 2 nodes; intra 1 GB/s 1 us, inter 0.1 GB/s 10 us; bus bandwidth min(1e9, 2 x 1e8)
    #   ring 2 x 3/4 x 16 / 2e8 + (4 intra + 2 inter hops) = 1.2e-7 + 4e-6 + 2e-5 = 2.412e-5
    #   tree 2 x 16 / (0.9 x 2e8) + 2 (1 intra + 1 inter)  = 1.7778e-7 + 2.2e-5    <- faster
    inter = Link(1e8, 1e-5)
    tree = 32 / (0.9 * 2e8) + 2 * (1e-6 + 1e-5)
    for one_hop in (False, True):        # the one-hop algorithms only apply inside one node
        rep = replica(4, dev=device(scale_up_one_hop=one_hop), span=Span(4, 2, INTRA, inter))
        assert tp_all_reduce(16.0, rep) == pytest.approx(tree, rel=1e-12)


def test_tp_span_of_a_node_group():
    g = NodeGroup("g", device(scale_out_efficiency=0.5), nodes=4, devices_per_node=8,
                  intra_link=INTRA, scale_out_link=Link(4e8, 5e-6))
    assert tp_span(g, 8) == Span(8, 1, INTRA)
    s = tp_span(g, 16)
    assert (s.ranks, s.nodes, s.intra) == (16, 2, INTRA)
    assert (s.inter.bandwidth, s.inter.latency) == (2e8, 5e-6)     # line rate x 0.5
    assert tp_span(g, 12).nodes == 2
    for bad in (0, 33):
        with pytest.raises(SimError, match="fix"):
            tp_span(g, bad)


def test_replica_tp_must_match_its_span():
    with pytest.raises(SimError, match="fix"):
        Replica(model(), device(), 4, Span(2, 1, INTRA))


def test_kv_share_when_tp_exceeds_the_kv_heads():
    assert [replica(tp).kv_share for tp in (1, 2, 4, 8)] == [1.0, 0.5, 0.5, 0.5]
    assert replica(8, m=model(kv_heads=8)).kv_share == 1 / 8
    assert replica(4, m=model(kv_heads=0)).kv_share == 1.0      # a head is never split


# ------------------------------------------------------------------------------ memory limits
def test_kv_capacity_tokens():
    # ((memory - weights / tp) x 0.9) / (kv bytes x share)
    assert KV_FRACTION == 0.9
    assert replica(1).kv_capacity_tokens == 900_000            # (2e9 - 1e9) x 0.9 / 1e3
    assert replica(4).kv_capacity_tokens == 3_150_000          # (2e9 - 2.5e8) x 0.9 / 500
    assert replica(2).weight_bytes_per_device == 5e8
    assert Replica(model(), device(), 1, Span(1, 1, INTRA), kv_fraction=0.5
                   ).kv_capacity_tokens == 500_000
    # the embedding is held too
    assert replica(1, m=model(embedding_bytes=5e8)).kv_capacity_tokens == 450_000


def test_check_fits_refuses_weights_larger_than_the_device():
    rep = replica(1, dev=device(memory_bytes=0.5e9))
    assert rep.kv_capacity_tokens == 0
    with pytest.raises(SimError) as e:
        rep.check_fits()
    msg = str(e.value)
    assert "\n" not in msg and "fix" in msg
    assert "1.0 GB" in msg and "0.5 GB" in msg and "tp=1" in msg
    replica(2, dev=device(memory_bytes=0.6e9)).check_fits()     # 0.5 GB each: fits


# ----------------------------------------------------------------------- saturation throughput
def test_saturation_throughput_decode_bound():
    # prompt 100, output 11, max_batch 8, chunk 8192; capacity 900000 // 111 = 8108 > 8 resident:
    #   r = min(8 / 10, 8192 / 100) = 0.8 prompts per step, d = 0.8 x 10 = 8 decodes
    #   tokens 8 + 80 = 88; context 100 + 11/2 = 105.5
    #   pairs 8 x 105.5 + 0.8 x 100 x 101 / 2 = 844 + 4040 = 4884; KV read 844 + 80 = 924
    #   compute 88 x 2e9 / 5e14 + 100 x 4884 / 5e14 = 3.520009768e-4
    #   memory (1e9 + 1e3 x (924 + 88)) / 5e11     = 2.002024e-3   <- the roofline
    #   overhead 2 x (0.8 x 2e-5 + 0.2 x 1e-5)     = 3.6e-5
    #   -> (8 + 0.8) / 2.038024e-3 tokens/s
    got = saturation_throughput(replica(), 100, 11, max_batch=8, chunk_tokens=8192)
    assert got == pytest.approx(8.8 / 2.038024e-3, rel=1e-12)


def test_saturation_throughput_prefill_bound():
    # prompt 1000, output 101, max_batch 256, chunk 2048: 256 resident (900000 // 1101 = 817)
    #   r = min(256 / 100, 2048 / 1000) = 2.048, d = 204.8; every step prefills (share 1)
    #   tokens 204.8 + 2048 = 2252.8; context 1050.5
    #   pairs 204.8 x 1050.5 + 2.048 x 500500; KV read 204.8 x 1050.5 + 2048
    d, r, ctx = 204.8, 2.048, 1050.5
    tokens = d + r * 1000
    pairs = d * ctx + r * 500500
    compute = tokens * 2e9 / 5e14 + 100 * pairs / 5e14
    memory = (1e9 + 1e3 * (d * ctx + r * 1000 + tokens)) / 5e11
    assert compute > memory
    total = compute + 2 * 2e-5
    got = saturation_throughput(replica(), 1000, 101, max_batch=256, chunk_tokens=2048)
    assert got == pytest.approx((d + r) / total, rel=1e-12)


def test_saturation_throughput_prefill_only():
    # output 1: r = chunk / prompt = 4 prompts of 1000 per step, no decodes, one token each
    tokens, pairs = 4000, 4 * 500500
    total = max(tokens * 2e9 / 5e14 + 100 * pairs / 5e14, (1e9 + 1e3 * 8000) / 5e11) + 2 * 2e-5
    got = saturation_throughput(replica(), 1000, 1, max_batch=8, chunk_tokens=4000)
    assert got == pytest.approx(4 / total, rel=1e-12)


def test_saturation_throughput_refusals():
    with pytest.raises(SimError, match="fix"):
        saturation_throughput(replica(), 0, 10, max_batch=8, chunk_tokens=8192)
    with pytest.raises(SimError, match="fix"):
        saturation_throughput(replica(dev=device(memory_bytes=0.5e9)), 10, 10, max_batch=8,
                              chunk_tokens=8192)
    # fits the weights, not one request: 1.1e9 - 1e9 = 1e8 x 0.9 / 1e3 = 90000 tokens
    with pytest.raises(SimError, match="does not fit the KV cache of 90000 tokens; fix"):
        saturation_throughput(replica(dev=device(memory_bytes=1.1e9)), 90_000, 10, max_batch=8,
                              chunk_tokens=8192)


def test_load_cost_averages_the_layer_overhead():
    c = load_cost(replica(), 1.0, 0.0, 0.0, 0.25, 0.0)
    assert c.overhead_s == pytest.approx(2 * (0.25 * 2e-5 + 0.75 * 1e-5))


# ------------------------------------------------------------------------------- collectives
def test_mesh_shape():
    assert mesh_shape(32) == (8, 4)
    assert mesh_shape(8) == (4, 2)
    assert mesh_shape(7) == (7, 1)
    assert mesh_shape(1) == (1, 1)
    assert mesh_shape(16) == (4, 4)
    assert mesh_shape(12) == (4, 3)


def test_mesh_all_reduce_by_hand():
    link = Link(1e9, 1e-6)
    # 8 = 4 x 2: 2 (3/4 + 1/8) x 1e6 / 1e9 + 2 (3 + 1) x 1e-6
    assert mesh_all_reduce(1e6, 8, link) == pytest.approx(1.75e-3 + 8e-6, rel=1e-12)
    # 32 = 8 x 4: 2 (7/8 + 3/32) = 1.9375; 2 (7 + 3) = 20 hops
    assert mesh_all_reduce(1e6, 32, link) == pytest.approx(1.9375e-3 + 20e-6, rel=1e-12)
    # 7 = 7 x 1: the ring
    assert mesh_all_reduce(1e6, 7, link) == pytest.approx(12 / 7 * 1e-3 + 12e-6, rel=1e-12)
    assert mesh_all_reduce(1e6, 1, link) == 0.0
    assert mesh_all_reduce(0.0, 8, link) == 0.0


def test_one_hop_all_reduce_picks_one_shot_small_and_two_shot_large():
    link = Link(1e9, 1e-6)
    # 4 devices, 100 B: one-shot 2 us + 3 x 100 / 1e9 = 2.3 us; two-shot 3 us + 150 / 1e9 = 3.15 us
    t, algo = one_hop_all_reduce(100.0, 4, link)
    assert algo == "one-shot" and t == pytest.approx(2.3e-6, rel=1e-12)
    # 1 MB: one-shot 2 us + 3 ms; two-shot 3 us + 1.5 ms
    t, algo = one_hop_all_reduce(1e6, 4, link)
    assert algo == "two-shot" and t == pytest.approx(3e-6 + 1.5e-3, rel=1e-12)
    # crossover at a = 1.5 nbytes / B: 666.67 B; a tie goes to one-shot
    assert one_hop_all_reduce(600.0, 4, link)[1] == "one-shot"
    assert one_hop_all_reduce(700.0, 4, link)[1] == "two-shot"
    assert one_hop_all_reduce(1e6, 1, link) == (0.0, "none")
    assert one_hop_all_reduce(0.0, 8, link) == (0.0, "none")


def test_kv_transfer_time():
    # 500 tokens x 1 kB over 1 GB/s plus 10 us
    assert kv_transfer_time(model(), 500, Link(1e9, 1e-5)) == pytest.approx(1e-5 + 5e-4)
    assert kv_transfer_time(model(), 0, Link(1e9, 1e-5)) == pytest.approx(1e-5)
    with pytest.raises(SimError, match="fix"):
        kv_transfer_time(model(), -1, Link(1e9, 1e-5))


# ------------------------------------------------------------------------------------ property
@given(tp=st.sampled_from([1, 2, 4, 8]), one_hop=st.booleans(), roofline=st.sampled_from(["max", "sum"]),
       contexts=st.lists(st.integers(1, 100_000), min_size=1, max_size=64),
       grow=st.integers(0, 63), extra=st.integers(1, 10_000), new=st.integers(1, 100_000))
def test_step_time_is_monotone_in_batch_and_context(tp, one_hop, roofline, contexts, grow, extra,
                                                    new):
    m = model(expert_weight_bytes=8e8, experts=8, experts_per_token=2, moe_layers=2)
    rep = replica(tp, dev=device(scale_up_one_hop=one_hop, roofline=roofline, logit_overhead=1e-9),
                  m=m)
    base = step_time(rep, BatchStep(decode=tuple(contexts)))
    longer = list(contexts)
    longer[grow % len(longer)] += extra
    assert step_time(rep, BatchStep(decode=tuple(longer))) >= base
    assert step_time(rep, BatchStep(decode=tuple(contexts) + (new,))) >= base
