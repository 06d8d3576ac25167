"""``mpmd video --run``: one video of a tiny Mochi-shaped pipeline through its latency plan on JAX
devices, checked against ``jax.jit`` of the same program on one device.

The program (:func:`video_fn`, after diffusers' ``MochiPipeline``): the T5 encoder over the
prompt and the negative prompt (2 rows), then ``sampling_steps`` Euler steps of the DiT from
Gaussian noise, each over both guidance passes (the latent twice, the timestep, the encoded
prompt / negative prompt) with classifier-free guidance (``runtime.train.generate``'s sigma
schedule, guidance and update), then the VAE decoder over the denoised latent.

The run (:func:`run_video`) places each component where the plan puts it: the plan's meshes are
consecutive slices of ``jax.devices()`` in the cluster's order, a component's group the plan's
``first .. first + devices`` of its mesh.

- Encoder and DiT: one ``jax.jit`` per component on a ``(data, context, tensor)`` device mesh of
  the plan's layout: weights Megatron-sharded over ``tensor`` (projections into heads and MLP
  inner widths column-split, projections out row-split), the guidance rows over ``data`` and the
  tokens over ``context`` as input shardings; XLA's SPMD partitioner inserts the collectives
  (context parallelism runs as its sequence sharding, not a ring kernel).
- Decoder: a ``jax.shard_map`` over the plan's spatial degree ``s``: the latent split along its
  height, each device decoding its rows. Before every 3x3x3 convolution a device receives its
  neighbours' boundary rows by ``jax.lax.ppermute`` (the devices at the two ends repeat their own
  edge row: the convolution's replicate padding); every GroupNorm's mean and variance are
  ``jax.lax.psum`` s over the devices (two passes, as :func:`zoo.mochi_vae.group_norm`);
  upsampling (depth-to-space) and the 1x1 projections are local. The compiled program holds
  exactly the exchanges :mod:`simulator.spatial` costs for the same layers (two
  collective-permutes per convolution, two all-reduces per GroupNorm; checked by
  ``tests/runtime/test_video_run.py``). A plan's frame chunks are not run: they cut the planned
  activations, not the arithmetic (a causal decoder decodes chunks exactly), so the run decodes
  every frame at once and its video is the same.

The output video is compared with ``jax.jit(video_fn)`` on one device from the same parameters,
prompt and noise: :class:`VideoRunReport.max_abs_error`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import zoo
from zoo import mochi_vae
from zoo.config import ModelConfig
from zoo.mochi_pipeline import pipeline
from runtime.train.generate import CFG_SCALE, sigma_schedule

__all__ = ["VideoRunError", "VideoRunReport", "video_fn", "sharded_decoder", "run_video",
           "init_pipeline"]


class VideoRunError(ValueError):
    """A plan the tiny run cannot place; the message names the value and the fix."""


@dataclass(frozen=True)
class VideoRunReport:
    """What :func:`run_video` measured: the video's shape, the largest absolute difference from
    ``jax.jit`` of the unsharded program, each component's wall seconds (first run, compile
    included), the devices each ran on (global ``jax.devices()`` ids) and its layout text."""

    shape: tuple[int, ...]
    max_abs_error: float
    seconds: dict[str, float]
    devices: dict[str, tuple[int, ...]]
    layouts: dict[str, str]


def init_pipeline(name: str, seed: int = 0, frames: int = 0, steps: int = 0
                  ) -> tuple[tuple[ModelConfig, ModelConfig, ModelConfig], dict, dict]:
    """``((enc, dit, dec) configs, params {"encoder", "dit", "decoder"}, inputs {"tokens" int32
    [2, S] (prompt, negative prompt), "noise" [1, C, F, H, W]})`` drawn from ``seed``."""
    _, enc, dit, dec = pipeline(name, frames, steps)
    k = jax.random.split(jax.random.PRNGKey(seed), 5)
    params = {"encoder": zoo.init_params(enc, k[0]), "dit": zoo.init_params(dit, k[1]),
              "decoder": zoo.init_params(dec, k[2])}
    tokens = jax.random.randint(k[3], (2, dit.text_tokens), 0, enc.vocab, jnp.int32)
    noise = jax.random.normal(k[4], (1, dit.latent_channels, dit.latent_frames,
                                     dit.latent_height, dit.latent_width), dit.jnp_dtype)
    return (enc, dit, dec), params, {"tokens": tokens, "noise": noise}


def _sampler(dit: ModelConfig):
    """``(params, text [2, T, td], noise [1, ...]) -> latent [1, ...]``: Euler steps with CFG."""
    fwd = zoo.forward(dit)
    sig = sigma_schedule(dit.sampling_steps)

    def sample(params, text, noise):
        z = noise
        for i in range(dit.sampling_steps):
            batch = {"latent": jnp.concatenate([z, z]),
                     "timestep": jnp.full((2,), sig[i], jnp.float32), "text": text}
            v_c, v_u = jnp.split(fwd(params, batch), 2)
            z = z + float(sig[i] - sig[i + 1]) * (v_u + CFG_SCALE * (v_c - v_u))
        return z
    return sample


def video_fn(cfgs: tuple[ModelConfig, ModelConfig, ModelConfig]):
    """``(params, inputs) -> video [1, 3, frames, H, W]``: the whole pipeline, unsharded."""
    enc, dit, dec = cfgs
    encode, sample, decode = zoo.forward(enc), _sampler(dit), zoo.forward(dec)

    def video(params, inputs):
        text = encode(params["encoder"], {"tokens": inputs["tokens"]})
        z = sample(params["dit"], text, inputs["noise"])
        return decode(params["decoder"], {"latent": z})
    return video


def _halo_conv(x: jax.Array, w: jax.Array, b: jax.Array, s: int) -> jax.Array:
    """:func:`zoo.mochi_vae.causal_conv3d` of a height shard ``x [B, C, T, h, W]`` inside a
    ``shard_map`` over axis ``"h"`` of ``s`` devices: neighbours' rows by ``ppermute``."""
    kt, kh, kw = w.shape[:3]
    r = (kh - 1) // 2
    if s > 1 and r:
        first, last = x[:, :, :, :r], x[:, :, :, -r:]
        from_above = jax.lax.ppermute(last, "h", [(i, i + 1) for i in range(s - 1)])
        from_below = jax.lax.ppermute(first, "h", [(i + 1, i) for i in range(s - 1)])
        idx = jax.lax.axis_index("h")
        edge_top = jnp.repeat(x[:, :, :, :1], r, axis=3)
        edge_bottom = jnp.repeat(x[:, :, :, -1:], r, axis=3)
        above = jnp.where(idx == 0, edge_top, from_above)
        below = jnp.where(idx == s - 1, edge_bottom, from_below)
        x = jnp.concatenate([above, x, below], axis=3)
        hpad = (0, 0)
    else:
        hpad = (r, r)
    xp = jnp.pad(x, ((0, 0), (0, 0), (kt - 1, 0), hpad, ((kw - 1) // 2,) * 2), mode="edge")
    y = jax.lax.conv_general_dilated(xp, w.astype(x.dtype), (1, 1, 1), "VALID",
                                     dimension_numbers=("NCDHW", "DHWIO", "NCDHW"))
    return y + b.astype(y.dtype)[:, None, None, None]


def _group_norm(x: jax.Array, w: jax.Array, b: jax.Array, groups: int, eps: float,
                rows: int) -> jax.Array:
    """:func:`zoo.mochi_vae.group_norm` of a height shard: sums ``psum``-ed over ``"h"``
    (``rows``: the whole height)."""
    B, C, T, h, W = x.shape
    xf = x.astype(jnp.float32).reshape(B, groups, C // groups, T, h, W)
    n = (C // groups) * rows * W
    mu = jax.lax.psum(jnp.sum(xf, axis=(2, 4, 5), keepdims=True), "h") / n
    var = jax.lax.psum(jnp.sum(jnp.square(xf - mu), axis=(2, 4, 5), keepdims=True), "h") / n
    y = ((xf - mu) * jax.lax.rsqrt(var + eps)).reshape(B, C, T, h, W)
    y = y * w.astype(jnp.float32)[:, None, None, None] + b.astype(jnp.float32)[:, None, None, None]
    return y.astype(x.dtype)


def sharded_decoder(cfg: ModelConfig, devices: list[Any]):
    """``(params, latent [B, C, F, H, W]) -> video``: the decoder as a ``jax.shard_map`` over
    ``devices`` (the spatial degree ``s = len(devices)``), height split (module docstring).

    Raises:
        VideoRunError: ``s`` does not divide the latent height.
    """
    s = len(devices)
    if cfg.latent_height % s:
        raise VideoRunError(f"spatial degree {s} does not divide {cfg.name}'s latent height "
                            f"{cfg.latent_height}; use a divisor of it")
    fns = mochi_vae.layer_fns(cfg)
    bodies = mochi_vae.bodies(cfg)
    g, eps = cfg.norm_groups, cfg.norm_eps

    def local(params, latent):
        x = fns["embed"](params["embed"], {"latent": latent})
        rows = cfg.latent_height
        for p, body in zip(params["blocks"], bodies):
            if body.startswith("res_block"):
                h = jax.nn.silu(_group_norm(x, p["norm1"], p["norm1_b"], g, eps, rows))
                h = _halo_conv(h, p["conv1"], p["conv1_b"], s)
                h = jax.nn.silu(_group_norm(h, p["norm2"], p["norm2_b"], g, eps, rows))
                x = x + _halo_conv(h, p["conv2"], p["conv2_b"], s)
            else:
                x = fns[body](p, x)
                rows *= cfg.spatial_expansions[-int(body[len("upsample"):]) - 1]
        return fns["head"](params["head"], x)

    mesh = Mesh(np.array(devices), ("h",))
    spec = P(None, None, None, "h", None)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), spec), out_specs=spec))


_COLUMN = ("q", "k", "v", "wi_0", "wi_1", "qkv_x", "qkv_y", "mlp_x_gate", "mlp_x_up",
           "mlp_y_gate", "mlp_y_up")
_ROW = ("o", "wo", "proj_x", "proj_y", "mlp_x_down", "mlp_y_down")


def _param_sharding(params: Any, mesh: Mesh) -> Any:
    """Megatron's split of a transformer's weights over the mesh's ``tensor`` axis (column-split
    projections into heads / MLP widths, row-split projections out); the rest replicated."""
    t = mesh.shape["tensor"]

    def one(path, leaf):
        name = str(getattr(path[-1], "key", ""))
        if leaf.ndim == 2 and name in _COLUMN and leaf.shape[1] % t == 0:
            return NamedSharding(mesh, P(None, "tensor"))
        if leaf.ndim == 2 and name in _ROW and leaf.shape[0] % t == 0:
            return NamedSharding(mesh, P("tensor", None))
        return NamedSharding(mesh, P())
    return jax.tree_util.tree_map_with_path(one, params)


def _layout_mesh(devices: list[Any], data: int, context: int, tensor: int) -> Mesh:
    return Mesh(np.array(devices).reshape(data, context, tensor), ("data", "context", "tensor"))


def _group(plan: Any, name: str, mesh_devices: dict[str, list[Any]]) -> list[Any]:
    o = next(c for c in plan.components if c.component == name)
    return mesh_devices[o.mesh][o.first:o.first + o.devices]


def run_video(plan: Any, cluster: Any, name: str = "mochi-tiny", seed: int = 0,
              frames: int = 0, steps: int = 0) -> VideoRunReport:
    """Run one video of pipeline ``name`` as ``plan`` (a :class:`planner.video.VideoPlan` on
    ``cluster``) places it, and compare with ``jax.jit`` of :func:`video_fn` on one device.

    Raises:
        VideoRunError: the cluster has more devices than JAX has.
    """
    have = jax.devices()
    need = sum(m.num_devices for m in cluster.meshes.values())
    if need > len(have):
        raise VideoRunError(f"cluster {cluster.name} has {need} devices but JAX has "
                            f"{len(have)}; run on a cluster of at most {len(have)} devices "
                            f"(hardware_profiles/clusters/cpu_uneven.yaml)")
    mesh_devices: dict[str, list[Any]] = {}
    at = 0
    for m in cluster.meshes.values():
        mesh_devices[m.name] = list(have[at:at + m.num_devices])
        at += m.num_devices
    cfgs, params, inputs = init_pipeline(name, seed, frames, steps)
    enc, dit, dec = cfgs
    ref = jax.jit(video_fn(cfgs))(jax.device_put(params, have[0]), jax.device_put(inputs, have[0]))
    ref = np.asarray(jax.block_until_ready(ref))

    seconds: dict[str, float] = {}
    layouts = {c.component: c.describe() for c in plan.components}
    groups = {c.component: _group(plan, c.component, mesh_devices) for c in plan.components}
    lay = {c.component: c.layout for c in plan.components}

    # encoder: the prompt and the negative prompt, rows over data, tokens over context
    t0 = time.perf_counter()
    L = lay["encoder"]
    mesh = _layout_mesh(groups["encoder"], L.data, L.context, L.tensor)
    p_enc = jax.device_put(params["encoder"], _param_sharding(params["encoder"], mesh))
    tok = jax.device_put(inputs["tokens"], NamedSharding(mesh, P("data", "context")))
    text = jax.block_until_ready(jax.jit(zoo.forward(enc))(p_enc, {"tokens": tok}))
    seconds["encoder"] = time.perf_counter() - t0

    # DiT: every step's guidance passes over data, tokens (visual) over context
    t0 = time.perf_counter()
    L = lay["dit"]
    mesh = _layout_mesh(groups["dit"], L.data, L.context, L.tensor)
    p_dit = jax.device_put(params["dit"], _param_sharding(params["dit"], mesh))
    text_d = jax.device_put(text, NamedSharding(mesh, P("data")))
    noise = jax.device_put(inputs["noise"], NamedSharding(mesh, P()))
    z = jax.block_until_ready(jax.jit(_sampler(dit))(p_dit, text_d, noise))
    seconds["dit"] = time.perf_counter() - t0

    # decoder: the latent's height over the spatial group, halos by ppermute
    t0 = time.perf_counter()
    devs = groups["decoder"]
    decode = sharded_decoder(dec, devs)
    dmesh = Mesh(np.array(devs), ("h",))
    p_dec = jax.device_put(params["decoder"], NamedSharding(dmesh, P()))
    z_d = jax.device_put(z, NamedSharding(dmesh, P(None, None, None, "h", None)))
    video = np.asarray(jax.block_until_ready(decode(p_dec, z_d)))
    seconds["decoder"] = time.perf_counter() - t0

    ids = {k: tuple(d.id for d in v) for k, v in groups.items()}
    return VideoRunReport(tuple(video.shape), float(np.max(np.abs(video - ref))), seconds, ids,
                          layouts)
