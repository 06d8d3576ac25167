"""The Mochi 1 text-to-video pipeline as the components a latency plan assigns (no JAX at import).

A video (Genmo 2024, github.com/genmoai/mochi; diffusers ``MochiPipeline``): the T5-XXL encoder
once over the prompt and the negative (empty) prompt, the DiT once per denoising step over both
classifier-free-guidance passes (the conditional and unconditional latents as a batch of 2, as
diffusers' ``MochiPipeline.__call__`` concatenates them), then the VAE decoder once over the
denoised latent. The step count is the DiT config's ``sampling_steps``: 64, Mochi's default
(diffusers ``MochiPipeline.__call__(num_inference_steps=64)``; Genmo's ``demos/cli.py`` and
``mochi_preview.infer`` default ``num_steps`` 64), CFG scale 4.5 (the Hugging Face model card's
``--cfg_scale 4.5``).

Pipelines (:data:`PIPELINES`): ``mochi`` (``t5-xxl-encoder``, ``mochi-dit-10b``,
``mochi-vae-decoder``: 480 x 848, 163 frames) and ``mochi-tiny`` (``t5-tiny-encoder``,
``mochi-dit-tiny``, ``mochi-vae-tiny``: what ``mpmd video --run`` executes on the CPU meshes).
``frames`` overrides the video length (latent frames ``(frames - 1) / 6 + 1`` for Mochi's 6x
causal temporal compression: 163 -> 28, 49 -> 9, the guide's 19 -> 4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from zoo.config import ModelConfig, ZooError, get_config

__all__ = ["PIPELINES", "Pipeline", "pipeline", "latent_frames", "components", "vae_spatial_layers"]


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Zoo names of a pipeline's three components."""

    name: str
    encoder: str
    dit: str
    decoder: str


PIPELINES = {
    "mochi": Pipeline("mochi", "t5-xxl-encoder", "mochi-dit-10b", "mochi-vae-decoder"),
    "mochi-tiny": Pipeline("mochi-tiny", "t5-tiny-encoder", "mochi-dit-tiny", "mochi-vae-tiny"),
}
"""The pipelines ``mpmd video --pipeline`` takes."""


def latent_frames(frames: int, temporal: int = 6) -> int:
    """Latent frames of a ``frames``-frame video under ``temporal``-fold causal compression.

    Raises:
        ZooError: ``frames - 1`` not a multiple of ``temporal`` (e.g. 162 frames).
    """
    if frames < 1 or (frames - 1) % temporal:
        raise ZooError(f"frames={frames}: a Mochi video has 6k + 1 frames (19, 49, 163); use "
                       f"{(max(frames, 1) - 1) // temporal * temporal + 1} or "
                       f"{((max(frames, 1) - 1) // temporal + 1) * temporal + 1}")
    return (frames - 1) // temporal + 1


def pipeline(name: str, frames: int = 0, steps: int = 0
             ) -> tuple[Pipeline, ModelConfig, ModelConfig, ModelConfig]:
    """The pipeline ``name`` and its encoder, DiT and decoder configs, the DiT and decoder at
    ``frames`` video frames (0: the configs' own), the DiT at ``steps`` sampling steps (0: its
    own).

    Raises:
        ZooError: unknown pipeline, bad frame count or step count.
    """
    if name not in PIPELINES:
        raise ZooError(f"unknown pipeline {name!r}; use one of {', '.join(PIPELINES)}")
    if steps < 0:
        raise ZooError(f"steps={steps} must be >= 1 (0: the DiT's default); fix --steps")
    p = PIPELINES[name]
    enc, dit, dec = get_config(p.encoder), get_config(p.dit), get_config(p.decoder)
    over: dict[str, int] = {}
    if frames:
        over["latent_frames"] = latent_frames(frames, math.prod(dec.temporal_expansions))
    dit = get_config(dit, **over, **({"sampling_steps": steps} if steps else {}))
    if frames:
        dec = get_config(dec, **over)
    return p, enc, dit, dec


def _dtype_bytes(cfg: ModelConfig) -> int:
    return 4 if cfg.dtype == "float32" else 2


def vae_spatial_layers(cfg: ModelConfig, costs: dict) -> tuple:
    """The decoder's layers as :class:`simulator.spatial.SpatialLayer`, in program order, from
    its config and its traced ``costs`` (``Workload.costs`` by body name): each layer's input
    rows, one input row's bytes (channels x frames x width), its 3x3x3 convolutions (halo 1 row)
    and GroupNorms (statistics: ``norm_groups x frames`` float32)."""
    from simulator.spatial import SpatialLayer
    from zoo import mochi_vae

    b = _dtype_bytes(cfg)
    n = len(cfg.vae_channels)
    T, H, W = cfg.latent_frames, cfg.latent_height, cfg.latent_width
    out = [SpatialLayer(costs["embed"], H, cfg.latent_channels * T * W * b)]
    for body in mochi_vae.bodies(cfg):
        if body.startswith("res_block"):
            c = cfg.vae_channels[n - 1 - int(body[len("res_block"):])]
            out.append(SpatialLayer(costs[body], H, c * T * W * b, convs=2,
                                    halo_rows=(mochi_vae.KERNEL - 1) // 2, norms=2,
                                    stat_bytes=cfg.norm_groups * T * 4.0))
        else:
            k = int(body[len("upsample"):])
            c = cfg.vae_channels[n - 1 - k]
            out.append(SpatialLayer(costs[body], H, c * T * W * b))
            t, s = cfg.temporal_expansions[-k - 1], cfg.spatial_expansions[-k - 1]
            T, H, W = T * t, H * s, W * s
    out.append(SpatialLayer(costs["head"], H, cfg.vae_channels[0] * T * W * b))
    return tuple(out)


def components(name: str, frames: int = 0, steps: int = 0) -> tuple:
    """The pipeline's :class:`planner.video.VideoComponent` s: encoder (runs 1, samples 2: the
    prompt and the negative prompt), DiT (runs ``sampling_steps``, samples ``cfg_passes``),
    decoder (runs 1, samples 1; spatial layers, its latent frames as the chunk limit). Traces the
    three workloads (imports JAX).

    Raises:
        ZooError: as :func:`pipeline`.
    """
    from planner.video import VideoComponent
    from zoo.costing import workload

    _, enc, dit, dec = pipeline(name, frames, steps)
    we, wd, wv = workload(enc, 1), workload(dit, 1), workload(dec, 1)
    latent = (dit.latent_channels * dit.latent_frames * dit.latent_height * dit.latent_width
              * _dtype_bytes(dit))
    text = dit.text_tokens * dit.text_dim * _dtype_bytes(enc)
    return (VideoComponent("encoder", we, 1, 2, out_bytes=2 * text),
            VideoComponent("dit", wd, dit.sampling_steps, dit.cfg_passes, out_bytes=latent,
                           guidance_bytes=latent),
            VideoComponent("decoder", wv, 1, 1, spatial=vae_spatial_layers(dec, dict(wv.costs)),
                           frames=dec.latent_frames))
