"""Tests of the Mochi VAE decoder (zoo/mochi_vae.py): published config and parameter count, the
causal Conv3D, per-frame GroupNorm and depth-to-space against direct computations, the tiny
decoder's forward, and its costing."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from zoo import ZooError, costing
from zoo.mochi_vae import bodies, causal_conv3d, group_norm, layer_fns, output_shape


def test_decoder_is_the_published_config():
    # genmo/mochi-1-preview vae/config.json: decoder_block_out_channels [128, 256, 512, 768],
    # layers_per_block [3, 3, 4, 6, 3], temporal_expansions [1, 2, 3], spatial [2, 2, 2]
    c = zoo.get_config("mochi-vae-decoder")
    assert (c.family, c.training, c.latent_channels, c.out_channels, c.norm_groups) == \
        ("mochi_vae", False, 12, 3, 32)
    assert (c.vae_channels, c.vae_blocks, c.temporal_expansions, c.spatial_expansions) == \
        ((128, 256, 512, 768), (3, 3, 4, 6, 3), (1, 2, 3), (2, 2, 2))
    dit = zoo.get_config("mochi-dit-10b")        # the DiT's latent is the decoder's input
    assert (c.latent_frames, c.latent_height, c.latent_width) == \
        (dit.latent_frames, dit.latent_height, dit.latent_width) == (28, 60, 106)
    assert output_shape(c, 1) == (1, 3, 163, 480, 848)      # 6 (28 - 1) + 1 frames of 480x848
    assert bodies(c) == ("res_block0",) * 9 + ("upsample0",) + ("res_block1",) * 4 + \
        ("upsample1",) + ("res_block2",) * 3 + ("upsample2",) + ("res_block3",) * 3
    assert c.layers == 22 and zoo.body_of(c, "block21") == "res_block3"


def test_param_count_is_the_published_decoders():
    c = zoo.get_config("mochi-vae-decoder")

    def res(ch):                      # 2 x (27 C^2 conv + C bias) + 2 GroupNorms (weight, bias)
        return 2 * (27 * ch * ch + ch) + 4 * ch

    def up(cin, cout, t, s):          # linear cin -> cout t s^2, with bias
        return (cin + 1) * cout * t * s * s

    expect = (12 * 768 + 768 + 9 * res(768) + up(768, 512, 3, 2) + 4 * res(512)
              + up(512, 256, 2, 2) + 3 * res(256) + up(256, 128, 1, 2) + 3 * res(128)
              + 128 * 3 + 3)
    assert zoo.param_count(c) == expect == 362_526_595
    # published: 362M (Genmo's README, 'AsymmVAE Model Specs'; Tenstorrent guide Sec. 6,
    # 'VAE (Decoder) 362M, ~724 MB bf16'): 362.53M written to the whole million below it
    assert zoo.param_count(c) // 10**6 == 362


def _edge_pad(x):
    return np.pad(x, ((0, 0), (0, 0), (2, 0), (1, 1), (1, 1)), mode="edge")


def test_causal_conv3d_is_a_valid_convolution_of_the_edge_padded_input():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 4, 6)).astype(np.float32)      # [B, C, T, H, W]
    w = rng.standard_normal((3, 3, 3, 3, 4)).astype(np.float32)      # [kt, kh, kw, Cin, Cout]
    b = rng.standard_normal(4).astype(np.float32)
    got = np.asarray(causal_conv3d(jnp.asarray(x), jnp.asarray(w), jnp.asarray(b)))
    assert got.shape == (2, 4, 5, 4, 6)
    xp = _edge_pad(x)
    direct = jax.lax.conv_general_dilated(xp, w, (1, 1, 1), "VALID",
                                          dimension_numbers=("NCDHW", "DHWIO", "NCDHW"))
    np.testing.assert_allclose(got, np.asarray(direct) + b[:, None, None, None], atol=1e-5)
    # and tap by tap: out[t, i, j] = sum over the window xp[t .. t+2, i .. i+2, j .. j+2]
    taps = sum(np.einsum("bcthw,cd->bdthw", xp[:, :, a:a + 5, e:e + 4, f:f + 6], w[a, e, f])
               for a in range(3) for e in range(3) for f in range(3))
    np.testing.assert_allclose(got, taps + b[:, None, None, None], atol=1e-4)


def test_causal_conv3d_sees_no_later_frame_and_repeats_the_first():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 6, 3, 3)).astype(np.float32)
    w, b = rng.standard_normal((3, 3, 3, 2, 2)).astype(np.float32), np.zeros(2, np.float32)
    y = np.asarray(causal_conv3d(x, w, b))
    later = x.copy()
    later[:, :, 4:] += 10.0
    np.testing.assert_allclose(np.asarray(causal_conv3d(later, w, b))[:, :, :4], y[:, :, :4],
                               atol=1e-5)
    # frame 0 sees three copies of frame 0: a video constant in time stays constant
    still = np.repeat(x[:, :, :1], 6, axis=2)
    ys = np.asarray(causal_conv3d(still, w, b))
    np.testing.assert_allclose(ys, np.repeat(ys[:, :, :1], 6, axis=2), atol=1e-5)


def test_group_norm_is_per_frame():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 3, 4, 5)).astype(np.float32) * 3 + 1
    w, b = rng.standard_normal(8).astype(np.float32), rng.standard_normal(8).astype(np.float32)
    got = np.asarray(group_norm(x, w, b, 4, 1e-5))
    want = np.empty_like(x)
    for n in range(2):
        for t in range(3):
            for g in range(4):
                blk = x[n, 2 * g:2 * g + 2, t].astype(np.float64)
                want[n, 2 * g:2 * g + 2, t] = (blk - blk.mean()) / np.sqrt(blk.var() + 1e-5)
    want = want * w[:, None, None, None] + b[:, None, None, None]
    np.testing.assert_allclose(got, want, atol=1e-4)


def test_upsample_is_diffusers_depth_to_space():
    cfg = zoo.get_config("mochi-vae-tiny")
    up = layer_fns(cfg)["upsample0"]                  # 32 -> 24 channels, x3 frames, x2 space
    t, s, cout = 3, 2, 24
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 32, 2, 2, 3)).astype(np.float32)
    p = {"proj": rng.standard_normal((32, cout * t * s * s)).astype(np.float32),
         "proj_b": rng.standard_normal(cout * t * s * s).astype(np.float32)}
    got = np.asarray(up(p, x))
    assert got.shape == (1, cout, 6, 4, 6)
    y = np.einsum("bcthw,cd->bdthw", x, p["proj"]) + p["proj_b"][:, None, None, None]
    # diffusers: view(B, C, st, sh, sw, T, H, W): channel c * (t s s) + i (s s) + j s + k
    for c in (0, 7, 23):
        for T in range(2):
            for i in range(t):
                for j in range(s):
                    for k in range(s):
                        ch = c * t * s * s + i * s * s + j * s + k
                        np.testing.assert_allclose(got[0, c, T * t + i, j::s, k::s],
                                                   y[0, ch, T], atol=1e-4)


def test_tiny_decoder_runs_forward_to_the_video_shape():
    cfg = zoo.get_config("mochi-vae-tiny")
    dit = zoo.get_config("mochi-dit-tiny")             # decodes the tiny DiT's latent
    assert (cfg.latent_channels, cfg.latent_frames, cfg.latent_height, cfg.latent_width) == \
        (dit.latent_channels, dit.latent_frames, dit.latent_height, dit.latent_width)
    params = zoo.init_params(cfg, jax.random.PRNGKey(0))
    batch = zoo.example_batch(cfg, jax.random.PRNGKey(1), 1)
    out = jax.jit(zoo.forward(cfg))(params, batch)
    assert out.shape == output_shape(cfg, 1) == (1, 3, 7, 64, 64)      # 6 (2 - 1) + 1 frames
    assert np.isfinite(np.asarray(out)).all() and float(jnp.std(out)) > 0


def test_workload_is_traced_forward_only():
    cfg = zoo.get_config("mochi-vae-decoder")
    w = costing.workload("mochi-vae-decoder", 1)
    assert w.layers == ("embed", *bodies(cfg), "head") and not w.training
    assert w.param_count == 362_526_595 and w.seq_len == 28 * 60 * 106
    for c in w.costs.values():
        assert c.bwd_flops_per_sample == 0 and c.tp_allreduce_bytes_per_sample == 0
        assert c.context_kv_bytes_per_sample == 0 and c.attention_fwd_flops_per_sample == 0
    # a residual block is two 3x3x3 convolutions: 2 x 2 x 27 C^2 FLOP per position (the norms
    # and SiLUs add under 1%); level 3 is 128 channels over 168 frames of 480 x 848
    for k, (ch, pos) in enumerate([(768, 28 * 60 * 106), (512, 84 * 120 * 212),
                                   (256, 168 * 240 * 424), (128, 168 * 480 * 848)]):
        blk = w.costs[f"res_block{k}"]
        assert blk.fwd_flops_per_sample == pytest.approx(4 * 27 * ch * ch * pos, rel=0.01)
        assert blk.activation_bytes_per_sample == ch * pos * 2
        # the two convolutions read the padded input and weights and write their output
        assert blk.fwd_bytes_per_sample >= 2 * 2 * ch * pos * 2
    assert w.costs["head"].activation_bytes_per_sample == 3 * 163 * 480 * 848 * 2
    tiny = costing.workload("mochi-vae-tiny", 1)
    assert tiny.layers[0] == "embed" and tiny.layers[-1] == "head" and len(tiny.layers) == 11
    with pytest.raises(ZooError, match="mochi_vae seq_len is fixed by the latent size"):
        costing.workload("mochi-vae-tiny", 1, seq_len=64)


@pytest.mark.parametrize("fields,match", [
    (dict(vae_blocks=(3, 3, 4, 6)), "vae_blocks = [(]3, 3, 4, 6[)] does not have 5 entries"),
    (dict(norm_groups=5), "norm_groups = 5 does not divide every width"),
    (dict(layers=21), "layers = 21 is not the 22 residual blocks and up-block projections"),
    (dict(heads=4, kv_heads=4), "hidden = 768 is not the widest level 768 with one head"),
    (dict(vae_channels=(128, 256, 512, 7.5)), "vae_channels = .* is not a tuple of whole numbers"),
    (dict(patch_size=2), "patch_size = 2 applies to family mochi only, not mochi_vae"),
])
def test_bad_vae_configs_are_refused(fields, match):
    with pytest.raises(ZooError, match=match):
        zoo.get_config("mochi-vae-decoder", **fields)


def test_a_list_read_back_from_a_plan_is_the_tuple():
    cfg = zoo.get_config("mochi-vae-decoder")
    back = zoo.get_config("mochi-vae-decoder", vae_channels=[128, 256, 512, 768])
    assert back == cfg and hash(back) == hash(cfg)


def test_vae_fields_belong_to_the_vae():
    with pytest.raises(ZooError, match="norm_groups = 32 applies to family mochi_vae only"):
        zoo.get_config("llama-tiny", norm_groups=32)
    assert math.prod(zoo.get_config("mochi-vae-decoder").temporal_expansions) == 6
