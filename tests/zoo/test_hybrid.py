"""Hybrid Mamba-2 / attention / MoE models (zoo/hybrid.py): the SSD chunked scan against the
sequential recurrence, Nemotron 3 Nano's published counts, a tiny hybrid's forward and
backward, and a workload whose layers follow the pattern."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import zoo
from zoo import ZooError
from zoo.hybrid import ssd
from zoo.model_files import from_hf, resolve_model


def _scan(x, a, b, c):
    """h_t = exp(a_t) h_{t-1} + b_t x_t^T, y_t = c_t h_t, token by token."""
    def step(h, t):
        xt, at, bt, ct = t
        h = jnp.exp(at)[..., None, None] * h + jnp.einsum("bhp,bhn->bhpn", xt, bt)
        return h, jnp.einsum("bhpn,bhn->bhp", h, ct)
    B, L, H, P = x.shape
    h0 = jnp.zeros((B, H, P, b.shape[-1]))
    _, y = jax.lax.scan(step, h0, tuple(jnp.moveaxis(t, 1, 0) for t in (x, a, b, c)))
    return jnp.moveaxis(y, 0, 1)


@pytest.mark.parametrize("L,chunk", [(16, 4), (13, 4), (8, 8)])
def test_ssd_chunked_scan_equals_the_recurrence(L, chunk):
    k = jax.random.split(jax.random.PRNGKey(L), 4)
    x = jax.random.normal(k[0], (2, L, 3, 5))
    a = -jax.random.uniform(k[1], (2, L, 3))
    b, c = jax.random.normal(k[2], (2, L, 3, 4)), jax.random.normal(k[3], (2, L, 3, 4))
    assert jnp.allclose(ssd(x, a, b, c, chunk), _scan(x, a, b, c), atol=1e-4)
    g1 = jax.grad(lambda x, a: jnp.sum(jnp.sin(ssd(x, a, b, c, chunk))), argnums=(0, 1))(x, a)
    g2 = jax.grad(lambda x, a: jnp.sum(jnp.sin(_scan(x, a, b, c))), argnums=(0, 1))(x, a)
    for u, v in zip(g1, g2):
        assert jnp.allclose(u, v, atol=1e-3)


def test_nemotron_3_nano_counts_match_the_technical_report():
    """NVIDIA, "Nemotron 3 Nano" technical report (arXiv:2512.20848): 31.6B parameters, 3.2B
    active per forward pass (3.6B including embeddings); 52 layers (23 Mamba-2, 23 MoE, 6
    attention), 128 experts + shared, 6 per token (Megatron-Bridge Nemotron3NanoProvider)."""
    cfg = resolve_model("nemotron-3-nano-30b-a3b")
    p = cfg.hybrid_pattern
    assert (len(p), p.count("M"), p.count("E"), p.count("*")) == (52, 23, 23, 6)
    assert (cfg.hidden, cfg.mamba_heads, cfg.mamba_head_dim, cfg.ssm_state, cfg.mamba_groups,
            cfg.conv_kernel, cfg.ssm_chunk) == (2688, 64, 64, 128, 8, 4, 128)
    assert (cfg.experts, cfg.experts_per_token, cfg.expert_ffn, cfg.shared_experts, cfg.mlp) == (
        128, 6, 1856, 2, "relu2")
    assert zoo.param_count(cfg) == 31_577_937_344
    assert round(zoo.param_count(cfg) / 1e8) == 316
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e8) == 32
    assert round(zoo.active_param_count(cfg) / 1e8) == 36
    assert zoo.expert_param_count(cfg) == 128 * 2 * 2688 * 1856


def test_the_workload_follows_the_pattern():
    """Each layer its own LayerCost body; only MoE layers carry expert fields, only attention
    and Mamba layers a fused-kernel core."""
    cfg = resolve_model("tiny-hybrid")
    w = zoo.workload(cfg, 4, per_layer=True)
    assert w.layers[1:-1] == ("mamba_block", "moe_block", "attention_block", "moe_block",
                              "mamba_block", "mlp_block")
    for body, c in w.costs.items():
        assert (c.experts > 0) == (body == "moe_block"), body
        # the fused-kernel FLOP: the attention core's and the SSD scan's (zoo.fused)
        assert (c.attention_fwd_flops_per_sample > 0) == (body in ("attention_block",
                                                                   "mamba_block")), body
    assert w.costs["moe_block"].expert_param_count == 4 * 2 * 64 * 32
    assert w.costs["mamba_block"].fwd_flops_per_sample > 0


def test_tiny_hybrid_trains_forward_and_backward():
    cfg = resolve_model("tiny-hybrid")
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    assert jnp.isfinite(loss)
    for k in ("in_proj", "conv_w", "a_log", "dt_b", "d_skip", "out_proj", "gate_norm"):
        assert float(jnp.abs(grads["blocks"][0][k]).sum()) > 0, k
    assert float(jnp.abs(grads["blocks"][1]["w_up"]).sum()) > 0


def test_a_bad_pattern_is_refused_in_one_line():
    doc = {"model_type": "nemotron_h", "num_hidden_layers": 3, "hybrid_override_pattern": "MX*",
           "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 10,
           "mamba_num_heads": 4, "mamba_head_dim": 16, "ssm_state_size": 8, "n_groups": 2,
           "conv_kernel": 4}
    with pytest.raises(ZooError, match="hybrid_override_pattern = 'MX[*]' is not 3 characters"):
        from_hf(doc, "m", "m.json")


def test_the_planner_sees_one_mean_hybrid_block_that_sums_to_the_model():
    from zoo.costing import HYBRID_BODY, workload
    from zoo.model_files import resolve_model

    cfg = resolve_model("tiny-hybrid")
    mean = workload(cfg, 4)
    each = workload(cfg, 4, per_layer=True)
    assert set(mean.layers) == {"embed", HYBRID_BODY, "head"} and len(mean.layers) == len(each.layers)
    for f in ("param_count", "fwd_flops_per_sample", "bwd_flops_per_sample",
              "residual_bytes_per_sample", "expert_param_count", "alltoall_bytes_per_sample"):
        whole = sum(getattr(each.costs[b], f) for b in each.layers)
        # integer counts are rounded once per mean body: off by under one per layer at most
        assert sum(getattr(mean.costs[b], f) for b in mean.layers) == pytest.approx(
            whole, rel=1e-6, abs=len(mean.layers)), f
    assert mean.costs[HYBRID_BODY].experts == max(c.experts for c in each.costs.values())
    # a model whose blocks form one run after dense first ones keeps its bodies
    ds = workload(resolve_model("zoo/configs/tiny-mla-moe.yaml"), 4)
    assert HYBRID_BODY not in ds.layers


def test_the_mamba_layer_is_costed_as_its_fused_kernels():
    """Nemotron 3 Nano's Mamba-2 layer at 8,192 tokens as mamba_ssm runs it (zoo.fused): its
    scan's chunk intermediates are neither saved nor unfused traffic, so it keeps about what a
    layer's projections and kernel inputs are (under 80 KB a token, where the plain trace kept
    566 KB) and moves less unfused traffic than the MoE layer beside it; NVIDIA's 8-GPU B200
    layout (EP 8, micro batch 2; Megatron-Bridge perf_recipes/nemotronh/b200) then fits."""
    from zoo.costing import workload
    from simulator import cost_model as cm
    from ir import Layout

    cfg = resolve_model("nemotron-3-nano-30b-a3b")
    w = workload(cfg, 16, seq_len=8192, per_layer=True)
    mamba, moe = w.costs["mamba_block"], w.costs["moe_block"]
    assert mamba.residual_bytes_per_sample / 8192 < 80e3
    assert mamba.fwd_other_bytes_per_sample < moe.fwd_other_bytes_per_sample
    assert 0 < mamba.attention_bwd_flops_per_sample <= mamba.bwd_input_flops_per_sample
    m = cm.stage_memory(w, 0, len(w.layers), Layout(8, 1, expert=8), 16.0)
    # one microbatch in flight (no pipeline): 83 GB static, 86 GB of residuals
    assert m.static_bytes + m.residual_bytes_per_microbatch + m.working_bytes < 192e9


def test_nemotron_3_super_counts_match_its_name():
    """Nemotron 3 Super (NVIDIA/Megatron-LM examples/post_training/modelopt/conf/nvidia/
    NVIDIA-Nemotron-3-Super-120B-A12B-BF16.sh): 88 layers (40 Mamba-2, 40 LatentMoE, 8
    attention), 512 experts of 2688 at latent width 1024, 22 per token, a shared expert of 5376
    at the hidden width 4096: 120B total, 12B active without the input embedding."""
    cfg = resolve_model("nemotron-3-super-120b")
    p = cfg.hybrid_pattern
    assert (len(p), p.count("M"), p.count("E"), p.count("*")) == (88, 40, 40, 8)
    assert (cfg.hidden, cfg.moe_latent, cfg.expert_input, cfg.experts, cfg.experts_per_token,
            cfg.expert_ffn, cfg.shared_experts) == (4096, 1024, 1024, 512, 22, 2688, 2)
    assert zoo.expert_param_count(cfg) == 512 * 2 * 1024 * 2688
    assert round(zoo.param_count(cfg) / 1e9) == 121
    assert round(zoo.active_param_count(cfg, embedding=False) / 1e9) == 12


def test_nemotron_3_super_as_trained_runs_two_passes_of_its_mtp_module():
    """NVIDIA's Nemotron 3 Super pre-training recipes (Megatron-Bridge perf_recipes/nemotronh:
    ``mtp_num_layers = 2``, ``mtp_hybrid_override_pattern = "*E"``, ``mtp_use_repeated_layer``)
    are what its table name resolves to: one attention + LatentMoE module held once (its weights
    and the 2h x h projection join the count) and run twice, so the head carries two passes'
    routed experts and all-to-all bytes."""
    from zoo.costing import workload

    cfg = resolve_model("Nemotron3_Super")
    base = resolve_model("nemotron-3-super-120b")
    assert (cfg.mtp_layers, cfg.mtp_pattern, cfg.moe_latent) == (2, "*E", 1024)
    attn = 2 * 4096 * 32 * 128 + 2 * 4096 * 2 * 128
    moe = 512 * 2 * 1024 * 2688 + 4096 * 512 + 2 * 4096 * 1024 + 2 * 4096 * 5376
    extra = 2 * 4096 * 4096 + 2 * 4096 + 3 * 4096 + attn + moe    # projection, norms, blocks
    assert zoo.param_count(cfg) - zoo.param_count(base) == extra
    w = workload(cfg, 1, seq_len=4096, per_layer=True)
    head, layer = w.costs["head"], w.costs["moe_block"]
    assert head.routed_pairs_per_sample == 2 * layer.routed_pairs_per_sample == 2 * 4096 * 22
    assert head.alltoall_bytes_per_sample == 2 * layer.alltoall_bytes_per_sample
    assert head.expert_fwd_flops_per_sample == 2 * layer.expert_fwd_flops_per_sample


def test_nemotron_3_5_lightning_is_nano_with_two_mtp_passes():
    """Megatron-Bridge's Nemotron 3.5 Lightning recipe (``recipes/nemotronh/h100/nemotron_3_nano.py``
    ``nemotron_3_5_lightning_pretrain_config``) builds Nemotron 3 Nano's architecture and adds two
    passes of one attention + MoE multi-token-prediction module."""
    nano, cfg = resolve_model("nemotron-3-nano-30b-a3b"), resolve_model("Nemotron_3.5_Lightning")
    assert (cfg.mtp_layers, cfg.mtp_pattern, cfg.hybrid_pattern) == (2, "*E", nano.hybrid_pattern)
    h = 2688
    attn = 2 * h * 32 * 128 + 2 * h * 2 * 128
    moe = 128 * 2 * h * 1856 + h * 128 + 2 * h * 3712
    assert zoo.param_count(cfg) - zoo.param_count(nano) == 2 * h * h + 5 * h + attn + moe


def test_a_tiny_hybrid_with_repeated_mtp_passes_trains():
    import dataclasses

    cfg = dataclasses.replace(resolve_model("tiny-hybrid"), mtp_layers=2, mtp_pattern="*E",
                              name="tiny-hybrid-mtp")
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    assert "mtp_0_wq" in params["head"] and "mtp_1_w_up" in params["head"]
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(cfg)))(params, batch)
    one = dataclasses.replace(cfg, mtp_layers=1, name="tiny-hybrid-mtp1")
    loss1 = jax.jit(zoo.forward_loss(one))(params, batch)
    assert jnp.isfinite(loss) and float(loss) > float(loss1)       # a second pass's loss added
    for k in ("mtp_0_wq", "mtp_1_w_up", "mtp_proj", "tok"):
        assert float(jnp.abs(grads["head"][k]).sum()) > 0, k


def _latent(cfg, latent):
    import dataclasses

    return dataclasses.replace(cfg, moe_latent=latent, name=f"{cfg.name}-latent{latent}")


def test_latent_moe_runs_its_experts_and_exchange_at_the_latent_width():
    """LatentMoE (``moe_latent``): the routed experts' weights are ``[E, L, f]`` and the
    dispatched rows ``L`` wide, so the expert FLOP, the all-to-all bytes and the expert
    parameters scale by ``L / h``; two ``h x L`` projections join the dense parameters; the
    model still trains."""
    from zoo.costing import workload

    cfg = resolve_model("tiny-hybrid")
    lat = _latent(cfg, 16)
    base = workload(cfg, 4, per_layer=True).costs["moe_block"]
    moe = workload(lat, 4, per_layer=True).costs["moe_block"]
    assert moe.expert_latent == 16 and base.expert_latent == 0
    assert moe.expert_param_count == 4 * 2 * 16 * 32 == base.expert_param_count // 4
    assert moe.alltoall_bytes_per_sample == base.alltoall_bytes_per_sample / 4
    assert moe.expert_fwd_flops_per_sample == base.expert_fwd_flops_per_sample / 4
    dense = moe.param_count - moe.expert_param_count
    assert dense == base.param_count - base.expert_param_count + 2 * 64 * 16
    params = zoo.init_params(lat, jax.random.PRNGKey(0))
    assert params["blocks"][1]["w_up"].shape == (4, 16, 32)
    assert params["blocks"][1]["w_latent_down"].shape == (64, 16)
    batch = zoo.example_batch(lat, jax.random.PRNGKey(1), 2)
    loss, grads = jax.jit(jax.value_and_grad(zoo.forward_loss(lat)))(params, batch)
    assert jnp.isfinite(loss)
    for k in ("w_latent_down", "w_latent_up", "w_up", "w_down", "w_router"):
        assert float(jnp.abs(grads["blocks"][1][k]).sum()) > 0, k


def test_latent_moe_equals_the_experts_on_projected_tokens():
    """moe_swiglu with ``latent=(D, U)`` is ``moe_swiglu(x D) U`` with the router scoring ``x``:
    one token, top-1 of one expert, so the gate is 1 and routing cannot differ."""
    from zoo.layers import moe_swiglu

    k = jax.random.split(jax.random.PRNGKey(3), 5)
    x = jax.random.normal(k[0], (1, 3, 8))
    d, u = jax.random.normal(k[1], (8, 4)), jax.random.normal(k[2], (4, 8))
    w_up, w_down = jax.random.normal(k[3], (1, 4, 6)), jax.random.normal(k[4], (1, 6, 4))
    got = moe_swiglu(x, jnp.ones((8, 1)), None, w_up, w_down, top_k=1, capacity_factor=1.0,
                     latent=(d, u))
    xd = x @ d
    want = (jnp.square(jax.nn.relu(xd @ w_up[0])) @ w_down[0]) @ u
    assert jnp.allclose(got, want, atol=1e-4)


def test_a_latent_on_a_plain_decoder_is_refused():
    import dataclasses

    from zoo.schema import check_model

    cfg = dataclasses.replace(resolve_model("tiny-moe"), moe_latent=8)
    with pytest.raises(ZooError, match="moe_latent.*not a Mamba hybrid"):
        check_model(cfg)
