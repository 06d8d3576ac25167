"""runtime.video: the spatially sharded decoder (shard_map, ppermute halos, psum GroupNorm) against
jax.jit of the unsharded decoder, and the tiny pipeline's plan run end to end through mpmd video."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from click.testing import CliRunner

import zoo
from mpmd.cli.main import main
from runtime.video import VideoRunError, sharded_decoder
from zoo.config import get_config

DEC = get_config("mochi-vae-tiny")


@pytest.mark.parametrize("degree", [2, 4, 8])
def test_sharded_decoder_matches_jit(degree):
    params = zoo.init_params(DEC, jax.random.PRNGKey(1))
    latent = jax.random.normal(jax.random.PRNGKey(2), (1, 4, 2, 8, 8), np.float32)
    ref = np.asarray(jax.jit(zoo.forward(DEC))(params, {"latent": latent}))
    out = np.asarray(sharded_decoder(DEC, jax.devices()[:degree])(params, latent))
    assert out.shape == ref.shape == (1, 3, 7, 64, 64)
    assert np.max(np.abs(out - ref)) <= 1e-5


def test_sharded_decoder_refuses_a_degree_that_does_not_divide_the_height():
    with pytest.raises(VideoRunError, match="spatial degree 3 does not divide mochi-vae-tiny's "
                                            "latent height 8"):
        sharded_decoder(DEC, jax.devices()[:3])


@pytest.mark.slow
def test_mpmd_video_runs_the_tiny_plan_within_tolerance():
    r = CliRunner().invoke(main, ["video", "--pipeline", "mochi-tiny", "--cluster",
                                  "hardware_profiles/clusters/cpu_uneven.yaml",
                                  "--decoder-spatial", "4", "--run"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "decoder on devices [2, 3, 4, 5] (spatial 4 (height)" in r.output
    err = float(r.output.split("max |video - jax.jit| = ")[1].split()[0])
    assert err <= 1e-5


def test_sharded_decoder_runs_on_its_devices_with_the_costed_exchanges():
    """The decoder really runs height-sharded: each of the 4 devices holds a quarter of the
    video's rows, and the compiled program has one collective-permute per halo direction of every
    3x3x3 convolution and one all-reduce per GroupNorm statistic, the exchanges
    simulator.spatial costs for the same layers (zoo.mochi_pipeline.vae_spatial_layers)."""
    from zoo.costing import workload
    from zoo.mochi_pipeline import vae_spatial_layers

    params = zoo.init_params(DEC, jax.random.PRNGKey(1))
    latent = jax.random.normal(jax.random.PRNGKey(2), (1, 4, 2, 8, 8), np.float32)
    fn = sharded_decoder(DEC, jax.devices()[:4])
    hlo = fn.lower(params, latent).compile().as_text()
    layers = vae_spatial_layers(DEC, dict(workload(DEC, 1).costs))
    convs, norms = sum(x.convs for x in layers), sum(x.norms for x in layers)
    assert (convs, norms) == (12, 12)
    assert len(re.findall(r" collective-permute(?:-start)?\(", hlo)) == 2 * convs
    assert len(re.findall(r" all-reduce(?:-start)?\(", hlo)) == 2 * norms
    out = fn(params, latent)
    shards = sorted((s.device.id, s.data.shape) for s in out.addressable_shards)
    assert shards == [(i, (1, 3, 7, 16, 64)) for i in range(4)]
