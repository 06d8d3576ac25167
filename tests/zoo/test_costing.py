"""Tests of the workload costing: FLOPs against the analytic count, linear fits, the contract."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import pytest

from zoo import costing
import zoo
from ir import Workload
from ir.workload import causal_fraction
from pathlib import Path
from zoo import ZooError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["llama3-8b", "llama3-70b", "gpt3-175b"])
def test_traced_training_flops_match_analytic(name):
    """The unfused kernel's FLOPs are the analytic count (full s x s scores); a fused kernel's
    are the same with the attention term's ``12`` replaced by the forward's 4 plus a backward
    of 10 (the scores recomputed) times the causal share of the blocks."""
    cfg = zoo.get_config(name, attention_kernel="unfused")
    w = costing.workload(cfg, global_batch=4)
    per_sample = sum(w.costs[n].fwd_flops_per_sample + w.costs[n].bwd_flops_per_sample
                     for n in w.layers)
    analytic = costing.analytic_training_flops(cfg, 4 * cfg.seq_len)
    assert per_sample * 4 == pytest.approx(w.step_flops, rel=1e-12)
    assert abs(w.step_flops / analytic - 1) < 0.05, w.step_flops / analytic
    assert abs(w.param_count - zoo.param_count(cfg, unique=False)) == 0

    flash = costing.workload(name, global_batch=4)
    attention = 12.0 * cfg.layers * cfg.heads * cfg.head_dim * cfg.seq_len * 4 * cfg.seq_len
    fused = analytic - attention + attention * 14 / 12 * causal_fraction(cfg.seq_len)
    assert abs(flash.step_flops / fused - 1) < 0.05, flash.step_flops / fused
    assert flash.step_flops < w.step_flops


@pytest.mark.parametrize("name", ["llama3-8b", "gpt3-175b"])
def test_the_fused_attention_core_is_costed_apart(name):
    """A decoder block under the fused kernel names its attention core's FLOP: the forward's
    ``4 s^2 H d`` (``Q K^T``, ``P V``) times the causal share, within the softmax's FLOP (about
    7 per score, under 2%), and a backward 2.5x that, all input gradient; the unfused kernel
    names none (its matmuls are ordinary batched GEMMs)."""
    cfg = zoo.get_config(name)
    c = costing.workload(cfg, global_batch=2).costs["decoder_block"]
    core = 4.0 * cfg.seq_len ** 2 * cfg.heads * cfg.head_dim * causal_fraction(cfg.seq_len)
    assert c.attention_fwd_flops_per_sample == pytest.approx(core, rel=0.02)
    assert c.attention_bwd_flops_per_sample == pytest.approx(
        2.5 * c.attention_fwd_flops_per_sample, rel=0.01)
    assert c.attention_bwd_flops_per_sample <= c.bwd_input_flops_per_sample
    plain = costing.workload(zoo.get_config(name, attention_kernel="unfused"), global_batch=2)
    assert plain.costs["decoder_block"].attention_fwd_flops_per_sample == 0.0
    assert plain.costs["decoder_block"].attention_bwd_flops_per_sample == 0.0
    assert costing.workload(cfg, global_batch=2).costs["head"].attention_fwd_flops_per_sample == 0.0


def test_flashattention_2_computes_and_moves_what_the_fused_kernel_does_and_says_so():
    """``flash2`` names FlashAttention-2 as the kernel: the trace's FLOP and bytes are the fused
    kernel's, and the block's ``attention_kernel`` tells the cost model which rate to charge; the
    embedding and the head, which have no attention core, name none."""
    fa = costing.workload(zoo.get_config("llama3-8b"), global_batch=2)
    fa2 = costing.workload(zoo.get_config("llama3-8b", attention_kernel="flash2"), global_batch=2)
    a, b = fa.costs["decoder_block"], fa2.costs["decoder_block"]
    assert (a.attention_kernel, b.attention_kernel) == ("", "flash2")
    assert dataclasses.replace(b, attention_kernel="") == a
    assert fa2.costs["head"].attention_kernel == fa2.costs["embed"].attention_kernel == ""
    # a mean body (gpt-oss's sliding and full layers, costed as one) keeps the kernel's name
    from zoo.model_files import resolve_model
    oss = costing.workload(zoo.get_config(resolve_model("gpt-oss-20b"), seq_len=512,
                                          attention_kernel="flash2"), global_batch=1)
    assert oss.costs["decoder_block"].attention_kernel == "flash2"


def test_causal_fraction_counts_the_blocks_on_and_below_the_diagonal():
    assert causal_fraction(128) == 1.0                       # one block: computed whole
    assert causal_fraction(256) == 0.75                      # 3 of 4 blocks
    assert causal_fraction(8192) == pytest.approx(65 / 128)  # 64 x 65 / 2 of 64^2
    assert causal_fraction(129) == 0.75                      # a partial block counts whole
    with pytest.raises(Exception, match="positive"):
        causal_fraction(0)


def test_an_unknown_attention_kernel_is_refused():
    with pytest.raises(ZooError, match="attention_kernel = 'paged' is not one of flash, flash2, unfused"):
        zoo.get_config("llama-tiny", attention_kernel="paged")


def test_workload_shape_and_contract():
    w = costing.workload("llama3-8b", 16)
    assert isinstance(w, Workload)
    assert w.layers == ("embed", *["decoder_block"] * 32, "head")
    assert (w.seq_len, w.global_batch, w.training, w.dtype_bytes) == (8192, 16, True, 2)
    assert "Llama 3" in w.source
    blk = w.costs["decoder_block"]
    assert blk.activation_bytes_per_sample == 8192 * 4096 * 2
    assert blk.tp_allreduce_bytes_per_sample == 2 * 8192 * 4096 * 2
    assert w.costs["embed"].tp_allreduce_bytes_per_sample == 8192 * 4096 * 2
    # SwiGLU (3.5h inner, three saved tensors) keeps a little more than GPT's 34 s h
    assert 34 * 8192 * 4096 < blk.residual_bytes_per_sample < 40 * 8192 * 4096
    assert blk.param_bytes == blk.param_count * 2
    assert blk.fwd_bytes_fixed == pytest.approx(blk.param_bytes, rel=0.01)   # weights read once


def test_gpt3_residuals_match_megatron_34sh():
    # Korthikanti et al. 2022 ("Reducing Activation Recomputation"), eq. 1 with flash attention
    # (no 5 a s / h term) and no dropout: 34 s h bytes per layer per sample in 16-bit
    blk = costing.workload("gpt3-175b", 1).costs["decoder_block"]
    assert blk.residual_bytes_per_sample == pytest.approx(34 * 2048 * 12288, rel=0.02)


def _tiny():
    return zoo.get_config("llama-tiny", seq_len=64)


def test_per_sample_fields_scale_linearly():
    cfg = _tiny()
    for body in ("embed", "decoder_block", "head"):
        c = costing.body_cost(cfg, body)
        three = costing._probe(cfg, body, 3)          # not one of the fitted points (1, 2)
        assert three["fwd_flops"] == pytest.approx(3 * c.fwd_flops_per_sample, rel=0.01)
        assert three["bwd_flops"] == pytest.approx(3 * c.bwd_flops_per_sample, rel=0.01)
        assert three["fwd_bytes"] == pytest.approx(c.fwd_bytes_fixed + 3 * c.fwd_bytes_per_sample,
                                                   rel=0.01)
        assert three["bwd_bytes"] == pytest.approx(c.bwd_bytes_fixed + 3 * c.bwd_bytes_per_sample,
                                                   rel=0.01)
        assert three["out_bytes"] == pytest.approx(3 * c.activation_bytes_per_sample)


def test_backward_split_and_residuals():
    cfg = _tiny()
    w = costing.workload(cfg, 2)
    blk, emb, head = w.costs["decoder_block"], w.costs["embed"], w.costs["head"]
    assert blk.activation_bytes_per_sample == 64 * 512 * 4          # float32
    for c in (blk, head):
        assert c.residual_bytes_per_sample > 0
        w_part = c.bwd_flops_per_sample - c.bwd_input_flops_per_sample
        assert c.bwd_input_flops_per_sample + w_part == c.bwd_flops_per_sample
        assert 0.3 < c.bwd_input_flops_per_sample / c.bwd_flops_per_sample < 0.8
        assert 1.8 < c.bwd_flops_per_sample / c.fwd_flops_per_sample < 2.2
    assert emb.bwd_input_flops_per_sample == 0                      # token ids have no gradient
    for c in (blk, head):    # norms, activations, adds and the loss move bytes outside the matmuls
        assert 0 < c.bwd_input_other_bytes_per_sample <= c.bwd_other_bytes_per_sample
        assert c.fwd_other_bytes_per_sample > 0
    assert head.activation_bytes_per_sample == 0                    # the loss scalar


def test_other_bytes_count_every_non_matmul_op_unfused():
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    w = jax.ShapeDtypeStruct((16, 32), jnp.float32)
    _, _, other, _ = costing._costs(lambda x, w: jnp.log(jnp.exp(x @ w)), x, w)
    out = 8 * 32 * 4
    assert other == 2 * out + 2 * out       # exp and log each read and write


def test_seq_len_override_and_cache():
    a = costing.workload(_tiny(), 1)
    b = costing.workload("llama-tiny", 1, seq_len=64)
    assert a.costs["decoder_block"] is b.costs["decoder_block"]      # lru_cache hit
    c = costing.workload("llama-tiny", 1, seq_len=32)
    assert c.seq_len == 32
    assert c.costs["decoder_block"].fwd_flops_per_sample < a.costs["decoder_block"].fwd_flops_per_sample


def test_mochi_is_forward_only_and_matches_analytic():
    cfg = zoo.get_config("mochi-dit-10b")
    w = costing.workload("mochi-dit-10b", 1)
    assert not w.training and w.seq_len == 44520 + 256
    assert w.layers == ("embed", *["asymm_dit_block"] * 47, "asymm_dit_block_final", "head")
    for c in w.costs.values():
        assert c.bwd_flops_per_sample == 0 and c.bwd_bytes_per_sample == 0
        assert c.residual_bytes_per_sample == 0
    assert abs(w.param_count - 10.0e9) / 10.0e9 < 0.02
    # analytic forward: 2 * (per-token matmul params) * tokens + 4 * S^2 * h per block
    blk = zoo.layer_param_shapes(cfg, "block0")
    n_x = sum(math.prod(blk[k].shape) for k in ("qkv_x", "proj_x", "mlp_x_gate", "mlp_x_up",
                                                 "mlp_x_down"))
    n_y = sum(math.prod(blk[k].shape) for k in ("qkv_y", "proj_y", "mlp_y_gate", "mlp_y_up",
                                                 "mlp_y_down"))
    S, N, T = w.seq_len, cfg.visual_tokens, cfg.text_tokens
    analytic = 2 * (n_x * N + n_y * T) + 4 * S * S * cfg.hidden
    assert w.costs["asymm_dit_block"].fwd_flops_per_sample == pytest.approx(analytic, rel=0.05)
    x_bytes = (N * cfg.hidden + T * cfg.hidden_y + cfg.hidden) * 2
    assert w.costs["asymm_dit_block"].activation_bytes_per_sample == x_bytes
    assert w.costs["asymm_dit_block"].tp_allreduce_bytes_per_sample == \
        2 * (N * cfg.hidden + T * cfg.hidden_y) * 2
    with pytest.raises(ZooError, match="latent"):
        costing.workload("mochi-dit-10b", 1, seq_len=1024)


def test_errors():
    with pytest.raises(ZooError, match="unknown model 'nope'"):
        costing.workload("nope", 1)
    with pytest.raises(ZooError, match="global_batch=0"):
        costing.workload("llama-tiny", 0)
    with pytest.raises(ZooError, match="no fragment body"):
        costing.body_cost(_tiny(), "mlp")


def test_ops_are_counted_per_layer_and_kind():
    """Primitive ops of each body's forward and backward: the embedding is a gather, the head a
    matmul and its loss, the block the most; a mixture of experts' routing adds to both passes;
    an inference model has no backward; the counts do not depend on the microbatch."""
    from zoo.model_files import load_model_file

    w = costing.workload("llama-tiny", 8).costs
    assert 0 < w["embed"].fwd_ops < w["head"].fwd_ops < w["decoder_block"].fwd_ops
    assert 0 < w["embed"].bwd_ops < w["head"].bwd_ops < w["decoder_block"].bwd_ops
    assert costing.workload("llama-tiny", 2).costs["decoder_block"].fwd_ops == w["decoder_block"].fwd_ops
    moe = costing.workload(load_model_file(ROOT / "zoo/configs/tiny-moe.yaml"), 8).costs["decoder_block"]
    assert moe.fwd_ops > w["decoder_block"].fwd_ops and moe.bwd_ops > w["decoder_block"].bwd_ops
    dec = costing.workload(load_model_file(ROOT / "zoo/configs/llama-tiny-decode.yaml"), 4)
    assert all(c.bwd_ops == 0 and c.fwd_ops > 0 for c in dec.costs.values())
