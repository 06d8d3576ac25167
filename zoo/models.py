"""The zoo's models as JAX programs whose layers are named computations (imports JAX).

Models: ``llama3-8b``, ``llama3-70b``, ``gpt3-175b``, ``mochi-dit-10b``, ``t5-xxl-encoder``,
``mochi-vae-decoder`` (the last three inference only), ``llama-tiny`` (CPU training test model),
``mochi-dit-tiny``, ``t5-tiny-encoder``, ``mochi-vae-tiny`` (CPU inference test models), and
:func:`gpt_config` for Megatron-style GPT runs.

Parameters are a pytree ``{"embed": dict, "blocks": [dict per layer], "head": dict}``. Layers are
named ``"embed"``, ``"block0"`` .. ``"block{L-1}"``, ``"head"`` (:func:`layer_names`); each is a
function of ``(layer_params, *inputs)`` (:func:`layer_fns`) and an instance of a unique fragment
body (:func:`body_of`: ``"embed"``, ``"decoder_block"``, ``"head"``; Mochi: ``"embed"``,
``"asymm_dit_block"``, ``"asymm_dit_block_final"``, ``"head"``; T5: ``"embed"``, ``"t5_block"``,
``"head"``; Mochi VAE decoder: ``"embed"``, ``"res_block{k}"`` and ``"upsample{k}"`` by level
(:func:`zoo.mochi_vae.bodies`), ``"head"``).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from compiler.named import named_computation
from zoo import decoder, hybrid, mochi, mochi_vae, t5
from zoo.config import ModelConfig, ZooError, get_config, gpt_config, list_models
from zoo.layers import init_from_shapes, shapes_to_specs

__all__ = [
    "init_params", "param_shapes", "param_count", "layer_names", "layer_fns", "body_of", "forward_loss",
    "forward", "batch_spec", "example_batch", "layer_param_shapes",
]


def _cfg(cfg: ModelConfig | str) -> ModelConfig:
    return cfg if isinstance(cfg, ModelConfig) else get_config(cfg)


def layer_names(cfg: ModelConfig | str) -> tuple[str, ...]:
    """Named computations in program order: ``("embed", "block0", ..., "block{L-1}", "head")``."""
    cfg = _cfg(cfg)
    return ("embed", *(f"block{i}" for i in range(cfg.layers)), "head")


def _block_index(cfg: ModelConfig, name: str) -> int:
    if name.startswith("block") and name[5:].isdigit() and int(name[5:]) < cfg.layers:
        return int(name[5:])
    raise ZooError(f"{cfg.name!r} has no layer {name!r}; layers are embed, block0..block"
                   f"{cfg.layers - 1}, head")


def body_of(cfg: ModelConfig | str, layer_name: str) -> str:
    """The unique fragment body that layer ``layer_name`` instantiates.

    Raises:
        ZooError: ``layer_name`` is not one of :func:`layer_names`.
    """
    cfg = _cfg(cfg)
    if layer_name in ("embed", "head"):
        return layer_name
    i = _block_index(cfg, layer_name)
    if cfg.family == "mochi":
        return "asymm_dit_block_final" if i == cfg.layers - 1 else "asymm_dit_block"
    if cfg.family == "t5":
        return t5.BLOCK
    if cfg.family == "mochi_vae":
        return mochi_vae.bodies(cfg)[i]
    if cfg.hybrid:
        return hybrid.BODIES[cfg.hybrid_pattern[i]]
    if cfg.moe and i < cfg.dense_layers:
        return "dense_block"
    if cfg.linear_layer(i):
        return "linear_block"
    return "sliding_block" if cfg.layer_window(i) else "decoder_block"


def _body_shapes(cfg: ModelConfig, body: str) -> dict[str, tuple[int, ...]]:
    if cfg.family == "mochi_vae":
        return mochi_vae.body_shapes(cfg, body)
    if cfg.family == "t5":
        return {"embed": t5.embed_shapes, "head": t5.head_shapes,
                t5.BLOCK: t5.block_shapes}[body](cfg)
    mod = mochi if cfg.family == "mochi" else decoder
    if body == "embed":
        return mod.embed_shapes(cfg)
    if body == "head":
        return mod.head_shapes(cfg)
    if cfg.family == "mochi":
        return mochi.block_shapes(cfg, final=body == "asymm_dit_block_final")
    if body in hybrid.BODIES.values():
        return hybrid.block_shapes(cfg, body)
    return decoder.block_shapes(cfg, dense=body == "dense_block",   # sliding: the same weights
                                linear=body == "linear_block")


def layer_param_shapes(cfg: ModelConfig | str, layer_name: str) -> dict[str, jax.ShapeDtypeStruct]:
    """One layer's parameters as ``jax.ShapeDtypeStruct`` (no memory)."""
    cfg = _cfg(cfg)
    return shapes_to_specs(_body_shapes(cfg, body_of(cfg, layer_name)), cfg.jnp_dtype)


def param_shapes(cfg: ModelConfig | str) -> dict[str, Any]:
    """The parameter pytree of :func:`init_params` as ``jax.ShapeDtypeStruct`` leaves."""
    cfg = _cfg(cfg)
    return {"embed": layer_param_shapes(cfg, "embed"),
            "blocks": [layer_param_shapes(cfg, f"block{i}") for i in range(cfg.layers)],
            "head": layer_param_shapes(cfg, "head")}


def init_params(cfg: ModelConfig | str, key: jax.Array) -> dict[str, Any]:
    """Real parameters (GPT-2 style init: N(0, 0.02), norms 1, biases 0) in ``cfg.dtype``.

    One compiled program draws all weights from a single normal vector (one random-number
    kernel to compile, however many leaves the model has)."""
    cfg = _cfg(cfg)
    shapes = jax.tree.map(lambda s: s.shape, param_shapes(cfg),
                          is_leaf=lambda x: isinstance(x, jax.ShapeDtypeStruct))
    return jax.jit(lambda k: init_from_shapes(shapes, cfg.jnp_dtype, k))(key)


def param_count(cfg: ModelConfig | str, *, unique: bool = True) -> int:
    """Parameters of the model. ``unique=True`` counts a tied output head once (the published
    convention); ``unique=False`` counts every layer's own copy (what the pipeline stages hold)."""
    cfg = _cfg(cfg)
    n = 0
    for leaf in jax.tree_util.tree_leaves(param_shapes(cfg)):
        size = 1
        for s in leaf.shape:
            size *= s
        n += size
    if unique and cfg.tie_embeddings:
        n -= cfg.vocab * cfg.hidden
    if unique and cfg.mtp_layers:    # the head's copy of the shared embedding table
        n -= cfg.vocab * cfg.hidden
    return n


def expert_param_count(cfg: ModelConfig | str) -> int:
    """Parameters of one mixture-of-experts block's routed experts (0 for a dense model):
    ``experts x 3 x h x expert_ffn`` (``h``: LatentMoE's latent width where set, two matrices
    for squared-ReLU experts), plus each expert's biases (``2 expert_ffn + h``) when the
    model has biases (gpt-oss); shared experts and the router are dense parameters."""
    cfg = _cfg(cfg)
    if not cfg.moe:
        return 0
    mats = 2 if cfg.mlp == "relu2" else 3                  # no gate: up and down only
    per = (mats * cfg.expert_input * cfg.expert_ffn
           + (2 * cfg.expert_ffn + cfg.hidden if cfg.bias else 0))
    return cfg.experts * per


def active_param_count(cfg: ModelConfig | str, *, embedding: bool = True) -> int:
    """Parameters one token uses (a tied head counted once): all of a dense model; for a mixture
    of experts, all but the routed experts a token does not go to (the "active parameters" MoE
    papers report: Mixtral 8x22B's 39B of 141B, Qwen3-235B-A22B's 22B). ``embedding=False``
    leaves out the input embedding table, which a token reads one row of and multiplies nothing
    by: DeepSeek's convention (its V2's 21B and V3's 37B activated match only without it)."""
    cfg = _cfg(cfg)
    unused = cfg.experts - cfg.experts_per_token if cfg.moe else 0
    moe_layers = (cfg.hybrid_pattern.count("E")
                  + (cfg.mtp_pattern.count("E") if cfg.mtp_layers else 0) if cfg.hybrid
                  else cfg.layers - cfg.dense_layers + cfg.mtp_layers)
    n = param_count(cfg) - moe_layers * unused * expert_param_count(cfg) // max(1, cfg.experts)
    return n if embedding else n - cfg.vocab * cfg.hidden


def layer_fns(cfg: ModelConfig | str) -> dict[str, Callable[..., Any]]:
    """For each layer name, its function (not yet named): decoders
    ``embed(p, tokens [B,S] int32) -> x [B,S,h]``, ``blockI(p, x) -> x``,
    ``head(p, x, targets [B,S] int32) -> loss`` (float32 scalar, mean cross-entropy);
    Mochi: see :mod:`zoo.mochi` (the head returns the predicted velocity); T5 encoder:
    :mod:`zoo.t5` (the head returns the hidden states); Mochi VAE decoder: :mod:`zoo.mochi_vae`
    (the head returns the video)."""
    cfg = _cfg(cfg)
    if cfg.family == "t5":
        bodies = {"embed": t5.embed_fn(cfg), t5.BLOCK: t5.block_fn(cfg), "head": t5.head_fn(cfg)}
    elif cfg.family == "mochi_vae":
        bodies = mochi_vae.layer_fns(cfg)
    elif cfg.family == "mochi":
        bodies = {"embed": mochi.embed_fn(cfg), "head": mochi.head_fn(cfg),
                  "asymm_dit_block": mochi.block_fn(cfg, final=False),
                  "asymm_dit_block_final": mochi.block_fn(cfg, final=True)}
    else:
        bodies = {"embed": decoder.embed_fn(cfg), "decoder_block": decoder.block_fn(cfg),
                  "dense_block": decoder.block_fn(cfg, dense=True), "head": decoder.head_fn(cfg),
                  "sliding_block": decoder.block_fn(cfg, window=cfg.sliding_window),
                  "linear_block": decoder.block_fn(cfg, linear=True),
                  **{b: hybrid.block_fn(cfg, b) for b in hybrid.BODIES.values()}}
    return {n: bodies[body_of(cfg, n)] for n in layer_names(cfg)}


def _named_layers(cfg: ModelConfig):
    return {n: named_computation(f, name=n) for n, f in layer_fns(cfg).items()}


def forward_loss(cfg: ModelConfig | str) -> Callable[[Any, dict], jax.Array]:
    """``(params, {"tokens": int32 [B,S], "targets": int32 [B,S]}) -> loss`` (float32 scalar),
    each layer wrapped in ``named_computation(fn, name=layer_name)``.

    Raises:
        ZooError: ``cfg`` is an inference model (use :func:`forward`).
    """
    cfg = _cfg(cfg)
    if not cfg.training:
        raise ZooError(f"{cfg.name!r} is an inference model; use zoo.forward(cfg)")
    fns = _named_layers(cfg)

    def loss(params, batch):
        x = fns["embed"](params["embed"], batch["tokens"])
        for i, p in enumerate(params["blocks"]):
            x = fns[f"block{i}"](p, x)
        return fns["head"](params["head"], x, batch["targets"])
    return loss


def forward(cfg: ModelConfig | str) -> Callable[[Any, Any], Any]:
    """``(params, batch) -> output`` with named layers: Mochi returns the velocity
    ``[B,C,F,H,W]`` for ``batch`` of :func:`batch_spec`, the T5 encoder the hidden states
    ``[B,S,h]``, the Mochi VAE decoder the video ``[B,3,frames,H,W]``; decoders return the
    loss."""
    cfg = _cfg(cfg)
    if cfg.training:
        return forward_loss(cfg)
    fns = _named_layers(cfg)

    def fwd(params, batch):
        h = fns["embed"](params["embed"], batch)
        for i, p in enumerate(params["blocks"]):
            h = fns[f"block{i}"](p, h)
        return fns["head"](params["head"], h)
    return fwd


def batch_spec(cfg: ModelConfig | str, batch: int, seq_len: int | None = None) -> dict:
    """The batch of ``batch`` samples as ``jax.ShapeDtypeStruct``: decoders
    ``{"tokens", "targets"}`` int32 ``[batch, seq_len]``; Mochi ``{"latent", "timestep", "text"}``;
    T5 encoder ``{"tokens"}`` int32 ``[batch, seq_len]``; Mochi VAE decoder ``{"latent"}``."""
    cfg = _cfg(cfg)
    if cfg.family == "mochi":
        return mochi.batch_shapes(cfg, batch)
    if cfg.family == "t5":
        return t5.batch_shapes(cfg, batch, seq_len)
    if cfg.family == "mochi_vae":
        return mochi_vae.batch_shapes(cfg, batch)
    s = jax.ShapeDtypeStruct((batch, seq_len or cfg.seq_len), jnp.int32)
    return {"tokens": s, "targets": s}


def example_batch(cfg: ModelConfig | str, key: jax.Array, batch: int,
                  seq_len: int | None = None) -> dict:
    """A random real batch matching :func:`batch_spec` (tokens uniform over the vocabulary,
    floats uniform in [0, 1)), drawn by one compiled program."""
    cfg = _cfg(cfg)
    spec = batch_spec(cfg, batch, seq_len)

    def draw(k):
        sizes = [math.prod(s.shape) for s in spec.values()]
        u = jax.random.uniform(k, (sum(sizes),), jnp.float32)
        out, at = {}, 0
        for (name, s), n in zip(spec.items(), sizes):
            v = u[at:at + n].reshape(s.shape)
            at += n
            if jnp.issubdtype(s.dtype, jnp.integer):
                v = jnp.minimum(jnp.floor(v * cfg.vocab), cfg.vocab - 1)
            out[name] = v.astype(s.dtype)
        return out
    return jax.jit(draw)(key)

