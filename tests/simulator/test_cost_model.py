"""Tests of simulator.cost_model.layer_time: the roofline (max) and the additive (sum) combination."""

from __future__ import annotations

import dataclasses

import pytest

from ir import LayerCost, Layout
from hardware_profiles import load_device
from hardware_profiles.types import Link, MeshSpec
from simulator.cost_model import layer_time

COST = LayerCost(name="block", fwd_flops_per_sample=4e12, bwd_flops_per_sample=8e12,
                 bwd_input_flops_per_sample=4e12, fwd_bytes_fixed=2e9, fwd_bytes_per_sample=1e9,
                 bwd_bytes_fixed=4e9, bwd_bytes_per_sample=2e9, param_count=1000,
                 param_bytes=2000.0, activation_bytes_per_sample=1e6,
                 residual_bytes_per_sample=1e7, tp_allreduce_bytes_per_sample=0.0)


def _mesh(roofline: str) -> MeshSpec:
    dev = dataclasses.replace(load_device("h100-sxm"), roofline=roofline, backward_efficiency=1.0,
                              elementwise_traffic=0.0)
    return MeshSpec("m", dev, 2, {"data": 2}, Link(1e11, 1e-6))


@pytest.mark.parametrize("kind,flops,nbytes", [("F", 4e12, 2e9 + 1e9), ("B", 8e12, 4e9 + 2e9)])
def test_max_and_sum_rooflines(kind, flops, nbytes):
    lay = Layout(data=2, tensor=1)
    m, s = _mesh("max"), _mesh("sum")
    rate, bw = m.device.achievable_flops("bf16"), m.device.achievable_bandwidth
    compute, memory = flops / rate, nbytes / bw       # 2 samples over data 2: one per device
    assert layer_time(COST, kind, 2, m, lay) == pytest.approx(max(compute, memory), rel=1e-12)
    assert layer_time(COST, kind, 2, s, lay) == pytest.approx(compute + memory, rel=1e-12)


OTHER = dataclasses.replace(COST, fwd_other_bytes_per_sample=3e9, bwd_other_bytes_per_sample=5e9,
                            bwd_input_other_bytes_per_sample=4e9)


@pytest.mark.parametrize("kind,split,other", [("F", False, 3e9), ("B", False, 5e9),
                                               ("B", True, 4e9), ("W", True, 1e9)])
def test_elementwise_traffic_adds_after_the_roofline(kind, split, other):
    lay = Layout(data=2, tensor=1)
    m = _mesh("max")
    half = dataclasses.replace(m, device=dataclasses.replace(m.device, elementwise_traffic=0.5))
    base = layer_time(OTHER, kind, 2, m, lay, split_backward=split)
    assert base == layer_time(COST, kind, 2, m, lay, split_backward=split)   # fraction 0: no change
    extra = 0.5 * other / m.device.achievable_bandwidth                       # one sample per device
    assert layer_time(OTHER, kind, 2, half, lay, split_backward=split) == pytest.approx(
        base + extra, rel=1e-12)


ATTN = dataclasses.replace(COST, attention_fwd_flops_per_sample=1e12,
                           attention_bwd_flops_per_sample=2.5e12)


@pytest.mark.parametrize("kind,split,gemm_flops,attention,backward", [
    ("F", False, 3e12, 1e12, False), ("B", False, 5.5e12, 2.5e12, True),
    ("B", True, 1.5e12, 2.5e12, True), ("W", True, 4e12, 0.0, True)])
def test_the_attention_core_runs_at_the_kernel_rate_of_its_sequence_length(
        kind, split, gemm_flops, attention, backward):
    lay = Layout(data=2, tensor=1)
    m = _mesh("max")
    dev = dataclasses.replace(m.device, attention_efficiency=0.8, attention_half_tokens=600.0,
                              attention_backward_efficiency=0.7,
                              attention_backward_half_tokens=1200.0, backward_efficiency=0.9)
    mesh = dataclasses.replace(m, device=dev)
    gemm = dev.achievable_flops("bf16")
    eff = (0.7 * 2048 / (2048 + 1200)) if backward else 0.8 * 2048 / (2048 + 600)
    want = gemm_flops / (gemm * (0.9 if backward else 1.0)) + attention / (gemm * eff)
    got = layer_time(ATTN, kind, 2, mesh, lay, split_backward=split, seq_len=2048)
    assert got == pytest.approx(want, rel=1e-12)          # compute-bound: one sample per device
    # a device without a measured kernel rate runs the core at its GEMM rate, as before
    plain = dataclasses.replace(mesh, device=dataclasses.replace(
        dev, attention_efficiency=1.0, attention_backward_efficiency=None,
        attention_half_tokens=0.0, attention_backward_half_tokens=0.0))
    assert layer_time(ATTN, kind, 2, plain, lay, split_backward=split, seq_len=2048) == \
        pytest.approx(layer_time(COST, kind, 2, plain, lay, split_backward=split, seq_len=2048),
                      rel=1e-12)


@pytest.mark.parametrize("kind,attention,backward", [("F", 1e12, False), ("B", 2.5e12, True)])
def test_flashattention_2_runs_the_core_at_its_share_of_the_profiles_kernel_rate(
        kind, attention, backward):
    """A core costed as FlashAttention-2 (``LayerCost.attention_kernel`` ``"flash2"``) takes
    ``1 / flash2_attention`` as long as the profile's own kernel; its GEMMs are untouched."""
    lay = Layout(data=2, tensor=1)
    m = _mesh("max")
    dev = dataclasses.replace(m.device, attention_efficiency=0.8, attention_half_tokens=600.0,
                              attention_backward_efficiency=0.7,
                              attention_backward_half_tokens=1200.0, flash2_attention=0.62)
    mesh = dataclasses.replace(m, device=dev)
    gemm = dev.achievable_flops("bf16")
    eff = (0.7 * 2048 / (2048 + 1200)) if backward else 0.8 * 2048 / (2048 + 600)
    fa3 = layer_time(ATTN, kind, 2, mesh, lay, seq_len=2048)
    fa2 = layer_time(dataclasses.replace(ATTN, attention_kernel="flash2"), kind, 2, mesh, lay,
                     seq_len=2048)
    assert fa2 - fa3 == pytest.approx(attention / (gemm * eff) * (1 / 0.62 - 1), rel=1e-9)
    assert load_device("h100-sxm").flash2_attention == 0.62      # FlashAttention-3 paper, Figs 5-6
    assert load_device("a100-80gb-sxm").flash2_attention == 1.0  # its kernel is FA2 itself


def test_an_unknown_attention_kernel_on_a_layer_is_refused():
    from ir import IRError
    with pytest.raises(IRError, match="attention_kernel 'fa3'"):
        dataclasses.replace(COST, attention_kernel="fa3")


def test_attention_flops_must_lie_within_the_pass_flops():
    from ir import IRError
    with pytest.raises(IRError, match="attention core FLOP"):
        dataclasses.replace(COST, attention_fwd_flops_per_sample=5e12)
    with pytest.raises(IRError, match="attention core FLOP"):
        dataclasses.replace(COST, attention_bwd_flops_per_sample=4.5e12)


# --------------------------------------------------------------------------- wave quantisation
A100_TILING = (108, 256, 128)


@pytest.mark.parametrize("rows,cols,expected", [
    (2048, 2304, 144 / 216),      # 8 x 18 = 144 tiles: 2 waves of 108 SMs, the second a third full
    (6144, 2304, 1.0),            # 24 x 18 = 432 tiles = 4 full waves
    (100, 100, 1 / 108),          # one partial tile on one SM
    (0, 2304, 1.0),               # an empty GEMM loses nothing
])
def test_wave_utilisation_exact(rows, cols, expected):
    from simulator.cost_model import wave_utilisation

    assert wave_utilisation(rows, cols, A100_TILING) == pytest.approx(expected, rel=1e-12)


H, S = 2304, 1024
GPT_BLOCK = dataclasses.replace(COST, activation_bytes_per_sample=S * H * 2, param_count=12 * H * H)


def test_gemm_utilisation_of_a_gpt_block_exact():
    """h = 2304 from the output bytes; n = 12 h^2 / (2 h) = 6 h. At 2048 tokens: the column GEMM
    (2048 x 13824: 864 tiles, 8 full waves) loses nothing, the row GEMM (2048 x 2304: 144 tiles)
    keeps 2/3; the weight gradient (2304 x 13824: 972 tiles, 9 waves) loses nothing:
    1 / (2/3 x (1 + 3/2) / 2 + 1/3 x 1) = 6/7."""
    from simulator.cost_model import gemm_utilisation

    assert gemm_utilisation(GPT_BLOCK, 2048, 1, S, 2, A100_TILING) == pytest.approx(6 / 7, rel=1e-12)
    assert gemm_utilisation(GPT_BLOCK, 2048, 1, S, 2, None) == 1.0        # no tiling: none
    assert gemm_utilisation(GPT_BLOCK, 2048, 1, 0, 2, A100_TILING) == 1.0  # no seq_len: none
    head = dataclasses.replace(GPT_BLOCK, activation_bytes_per_sample=0.0)
    assert gemm_utilisation(head, 2048, 1, S, 2, A100_TILING) == 1.0       # no width: none


@pytest.mark.parametrize("kind", ["F", "B", "W"])
def test_layer_time_divides_compute_by_the_wave_utilisation(kind):
    dev = dataclasses.replace(load_device("a100-80gb-sxm"), backward_efficiency=1.0,
                              elementwise_traffic=0.0)
    assert dev.gemm_tiling == A100_TILING
    m = MeshSpec("m", dev, 2, {"data": 2}, Link(1e11, 1e-6))
    lay = Layout(data=2, tensor=1)
    flops = {"F": 4e12, "B": 8e12, "W": 4e12}[kind] * 2        # 4 samples over data 2
    split = kind == "W"
    t = layer_time(GPT_BLOCK, kind, 4, m, lay, split_backward=split, seq_len=S)
    assert t == pytest.approx(flops / dev.achievable_flops("bf16") * 7 / 6, rel=1e-12)
    assert layer_time(GPT_BLOCK, kind, 4, m, lay, split_backward=split) == pytest.approx(
        flops / dev.achievable_flops("bf16"), rel=1e-12)         # seq_len 0: no quantisation


# --------------------------------------------------------------------------- decode regime
def _decode_mesh(stream: float | None, overhead: float | None) -> MeshSpec:
    m = _mesh("sum")
    dev = dataclasses.replace(m.device, weight_stream_efficiency=stream,
                              decode_layer_overhead=overhead)
    return dataclasses.replace(m, device=dev)


def test_one_token_per_device_streams_weights_at_the_matrix_vector_rate_and_pays_the_layer_overhead():
    lay = Layout(data=2, tensor=1)
    plain, dec = _decode_mesh(None, None), _decode_mesh(0.9, 250e-6)
    d = dec.device
    rate, act_bw, w_bw = d.achievable_flops("bf16"), d.achievable_bandwidth, d.memory_bandwidth * 0.9
    # 2 samples of one token over data 2: one token per device, a matrix-vector product
    want = 4e12 / rate + 2e9 / w_bw + 1e9 / act_bw + 250e-6
    assert layer_time(COST, "F", 2, dec, lay, seq_len=1) == pytest.approx(want, rel=1e-12)
    # without the two profile fields: every byte at the achievable bandwidth, no layer overhead
    assert layer_time(COST, "F", 2, plain, lay, seq_len=1) == pytest.approx(
        4e12 / rate + 3e9 / act_bw, rel=1e-12)


@pytest.mark.parametrize("kind,samples,seq_len", [("F", 4, 1), ("F", 2, 128), ("B", 2, 1),
                                                  ("F", 2, 0)])
def test_the_decode_regime_needs_a_forward_of_one_token_per_device(kind, samples, seq_len):
    lay = Layout(data=2, tensor=1)
    plain, dec = _decode_mesh(None, None), _decode_mesh(0.9, 250e-6)
    assert layer_time(COST, kind, samples, dec, lay, seq_len=seq_len) == layer_time(
        COST, kind, samples, plain, lay, seq_len=seq_len)


def test_a_layer_without_matmuls_pays_no_decode_overhead():
    lay = Layout(data=2, tensor=1)
    gather = dataclasses.replace(COST, fwd_flops_per_sample=0.0, fwd_bytes_fixed=0.0)
    plain, dec = _decode_mesh(None, None), _decode_mesh(0.9, 250e-6)
    assert layer_time(gather, "F", 2, dec, lay, seq_len=1) == layer_time(
        gather, "F", 2, plain, lay, seq_len=1)


def _routed(expert_flops: float) -> LayerCost:
    """A layer of 1 GFLOP of attention-free dense work plus ``expert_flops`` of routed experts,
    with 2 GB of parameters of which 1.5 GB are the experts'."""
    return LayerCost(name="moe", fwd_flops_per_sample=1e9 + expert_flops,
                     bwd_flops_per_sample=2 * (1e9 + expert_flops),
                     bwd_input_flops_per_sample=1e9 + expert_flops, fwd_bytes_fixed=2e9,
                     fwd_bytes_per_sample=0.0, bwd_bytes_fixed=4e9, bwd_bytes_per_sample=0.0,
                     param_count=1_000_000_000, param_bytes=2e9, activation_bytes_per_sample=0.0,
                     residual_bytes_per_sample=0.0, tp_allreduce_bytes_per_sample=0.0, experts=8,
                     expert_param_count=750_000_000, expert_fwd_flops_per_sample=expert_flops)


def test_routed_experts_run_at_their_own_roofline():
    from simulator.cost_model import expert_matmul_work

    h100 = load_device("h100-sxm")
    mesh = MeshSpec(name="one", device=h100, num_devices=1, axes={"data": 1},
                    intra_link=Link(bandwidth=1.0, latency=0.0))
    rate, bw = h100.achievable_flops("bf16"), h100.achievable_bandwidth
    cost = _routed(1e11)
    one = Layout(data=1, tensor=1)
    # forward: the experts stream their 1.5 GB once; backward twice, split half and half
    assert expert_matmul_work(cost, "F", 2.0, one) == (2e11, 1.5e9)
    assert expert_matmul_work(cost, "B", 2.0, one) == (4e11, 3e9)
    assert expert_matmul_work(cost, "B", 2.0, one, split_backward=True) == (2e11, 1.5e9)
    assert expert_matmul_work(cost, "W", 2.0, one) == (2e11, 1.5e9)
    assert expert_matmul_work(cost, "F", 2.0, Layout(data=4, tensor=1, expert=4)) == (2e11, 3.75e8)
    dense = dataclasses.replace(cost, experts=0, expert_param_count=0, expert_fwd_flops_per_sample=0)
    assert expert_matmul_work(dense, "F", 2.0, one) == (0.0, 0.0)
    # one sample: the experts (0.1 TFLOP) sit below the ridge of 1.5 GB; the dense rest (1 GFLOP,
    # 0.5 GB) too: each part pays its own weight stream, where one roofline over the whole layer
    # took max(1.01e11 FLOP, 2 GB) as if the dense part's bytes could hide under the experts' FLOP
    f = layer_time(cost, "F", 1.0, mesh, one)
    fixed = h100.layer_fixed_time("F", cost.fwd_ops)
    expected = max(1e9 / rate, 0.5e9 / bw) + max(1e11 / rate, 1.5e9 / bw)
    assert f == pytest.approx(expected + fixed, rel=1e-12)
    # well above the ridge both ways it is the FLOP, as before
    big = _routed(1e14)
    assert layer_time(big, "F", 1.0, mesh, one) == pytest.approx(
        max(1e9 / rate, 0.5e9 / bw) + 1e14 / rate + fixed, rel=1e-12)
    # a device that overlaps nothing inside a fragment (roofline "sum") adds compute and bytes
    cpu = dataclasses.replace(mesh, device=dataclasses.replace(h100, roofline="sum"))
    assert layer_time(cost, "F", 1.0, cpu, one) == pytest.approx(
        layer_time(dataclasses.replace(cost, expert_fwd_flops_per_sample=0.0), "F", 1.0, cpu, one))


def test_a_bf16_gradient_reduction_moves_and_holds_half_the_bytes():
    """``Layout.grad_reduce="bf16"`` (Megatron's --grad-reduce-in-bf16): the data-parallel
    reduce-scatter, FSDP's and the held gradient buffer take 2 bytes a parameter, not 4; the
    optimizer's fp32 state is untouched."""
    from ir import Workload
    from simulator.cost_model import fsdp_traffic, layer_grad_sync, stage_memory

    mesh = _mesh("max")
    fp32, bf16 = Layout(2, 1), Layout(2, 1, grad_reduce="bf16")
    op, nbytes, seconds = layer_grad_sync(COST, mesh, fp32)
    op2, nbytes2, seconds2 = layer_grad_sync(COST, mesh, bf16)
    assert op == op2 == "reduce_scatter" and nbytes == 4000.0 and nbytes2 == 2000.0
    assert seconds2 < seconds
    sharded = dataclasses.replace(fp32, fsdp=True), dataclasses.replace(bf16, fsdp=True)
    assert fsdp_traffic(COST, mesh, sharded[1])[1] < fsdp_traffic(COST, mesh, sharded[0])[1]
    w = Workload(model="t", layers=("block",), costs={"block": COST}, seq_len=1, global_batch=2)
    # 1000 parameters: weights 2000 B, gradients 4000 or 2000 B, Adam 12000 B over 2 replicas
    assert stage_memory(w, 0, 1, fp32, 1.0).static_bytes == 2000 + 4000 + 6000
    assert stage_memory(w, 0, 1, bf16, 1.0).static_bytes == 2000 + 2000 + 6000
    assert str(bf16) == "dp2xtp1-gbf16"
    with pytest.raises(ValueError, match=r"grad_reduce='fp16'\): unknown; fix: one of fp32, bf16"):
        Layout(2, 1, grad_reduce="fp16")


def test_low_precision_optimizer_state_holds_and_streams_fewer_bytes():
    """``Layout.optimizer_state``: Adam's state sharded over data parallel takes 12 bytes a
    parameter in fp32 (master + m + v), 8 with bf16 moments (Megatron's precision-aware optimizer)
    and 4 in bf16 with no master copy (MaxText's weight_dtype bfloat16); an fp32 model keeps its
    moments only (8, or 4 in bf16); the optimizer step streams bytes in proportion; weights and
    gradients are untouched; an unknown state is refused."""
    from ir import Workload
    from simulator.cost_model import optimizer_bytes, optimizer_time, stage_memory

    states = {"fp32": 12.0, "bf16-moments": 8.0, "bf16": 4.0}
    w = Workload(model="t", layers=("block",), costs={"block": COST}, seq_len=1, global_batch=2)
    mesh = _mesh("max")
    step = optimizer_time(w, 0, 1, mesh, Layout(2, 1))
    for state, nbytes in states.items():
        lay = Layout(2, 1, optimizer_state=state)
        assert optimizer_bytes(lay, 2) == nbytes
        assert optimizer_bytes(lay, 4) == (8.0 if state == "fp32" else 4.0)
        # 1000 parameters: weights 2000 B, fp32 gradients 4000 B, the state over 2 replicas
        assert stage_memory(w, 0, 1, lay, 1.0).static_bytes == 2000 + 4000 + 1000 * nbytes / 2
        assert optimizer_time(w, 0, 1, mesh, lay) == pytest.approx(step * nbytes / 12.0)
    assert str(Layout(2, 1, optimizer_state="bf16-moments")) == "dp2xtp1-optbf16-moments"
    with pytest.raises(ValueError, match=r"optimizer_state='fp16'\): unknown; fix: one of fp32, "
                                         r"bf16-moments, bf16"):
        Layout(2, 1, optimizer_state="fp16")


def test_host_offload_takes_its_share_of_what_a_layer_keeps_off_the_device():
    """``LayerCost.host_offload`` (activation offloading): a layer keeps ``1 - share`` of its
    residuals on the device, and under full recomputation of its input (the layer before's
    output: MaxText's offloaded ``decoder_layer_input``); static bytes and the working set stay;
    a share outside [0, 1] is refused."""
    from ir import IRError, Workload
    from simulator.cost_model import stage_memory

    def work(share: float) -> Workload:
        block = dataclasses.replace(COST, host_offload=share)
        return Workload(model="t", layers=("block", "block", "block"),
                        costs={"block": block}, seq_len=1, global_batch=2)

    lay = Layout(2, 1)
    for recompute, kept in ((False, 3 * 1e7), (True, 2 * 1e6)):   # 3 residuals; 2 inputs
        base = stage_memory(work(0.0), 0, 3, lay, 2.0, recompute)
        assert base.residual_bytes_per_microbatch == pytest.approx(kept)   # 2 samples over dp 2
        quarter = stage_memory(work(0.25), 0, 3, lay, 2.0, recompute)
        assert quarter.residual_bytes_per_microbatch == pytest.approx(0.75 * kept)
        assert stage_memory(work(1.0), 0, 3, lay, 2.0, recompute).residual_bytes_per_microbatch == 0
        assert (quarter.static_bytes, quarter.activation_bytes_per_microbatch) == (
            base.static_bytes, base.activation_bytes_per_microbatch)
    with pytest.raises(IRError, match=r"host_offload=1.5 must be a fraction in \[0, 1\]"):
        dataclasses.replace(COST, host_offload=1.5)


@pytest.mark.parametrize("ce,kept,extra", [("fused", 2.0, 0.0), ("fp32", 4.0, 2.0),
                                           ("eager", 4.0, 8.0)])
def test_the_loss_keeps_and_holds_its_logits_as_its_cross_entropy_does(ce, kept, extra):
    """A training head's logits (``logits_per_sample``) are kept for the backward at the
    cross-entropy's bytes per logit (TE's / XLA's compute-dtype buffer: 2; Megatron-Core's fp32
    softmax: 4; PyTorch's fp32 log-probabilities: 4), also under full recomputation (it reruns
    the blocks, not the loss), and its peak holds the extra copies beside them (none; the bf16
    logits: 2; two fp32 gradients: 8) in the working set; all split over tensor parallel like
    the vocab-parallel logits, and none of it in a stage without the head."""
    from ir import IRError, Workload
    from simulator.cost_model import stage_memory

    head = dataclasses.replace(COST, name="head", logits_per_sample=1e6,
                               residual_bytes_per_sample=5e5, activation_bytes_per_sample=0.0)
    w = Workload(model="t", layers=("block", "block", "head"),
                 costs={"block": COST, "head": head}, seq_len=1, global_batch=4,
                 cross_entropy=ce)
    for tensor in (1, 2):
        lay = Layout(2, tensor)
        for recompute, blocks in ((False, 2 * 1e7), (True, 1e6)):  # residuals; the 2nd input
            m = stage_memory(w, 0, 3, lay, 4.0, recompute)     # 4 samples over data 2: 2 each
            assert m.residual_bytes_per_microbatch == pytest.approx(
                2 * (blocks + 5e5 + 1e6 * kept) / tensor)
            assert m.loss_bytes == pytest.approx(2 * 1e6 * extra / tensor)
            assert m.working_bytes == pytest.approx(
                2 * m.activation_bytes_per_microbatch + m.loss_bytes)
        assert stage_memory(w, 0, 2, lay, 4.0).loss_bytes == 0.0
    assert w.loss_kept_bytes_per_logit == kept and w.loss_working_bytes_per_logit == extra
    with pytest.raises(IRError, match=r"cross_entropy 'triton' is not one of \('fused', 'fp32', "
                                      r"'eager'\)"):
        dataclasses.replace(w, cross_entropy="triton")
