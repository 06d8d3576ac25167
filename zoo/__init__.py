"""The model zoo: each model from its published config, as JAX programs whose layers are named
computations, and its costing.

Models: ``llama3-8b``, ``llama3-70b``, ``llama3-405b``, ``gpt3-175b``, ``opt-350m``,
``mochi-dit-10b`` (inference only), ``llama-tiny`` (CPU training test model), ``mochi-dit-tiny``
(CPU inference test model), and :func:`gpt_config` for Megatron-style GPT runs
(:func:`list_models` is the authority).

Modules: ``config.py`` (:class:`ModelConfig` and the registry; imports no JAX, so a command can
check a model name before paying for JAX), ``layers.py`` / ``decoder.py`` / ``mochi.py`` (the
layers), ``models.py`` (parameters, named layers, forward and loss, batches: see its docstring for
the pytree and layer names), ``costing.py`` (each unique fragment body costed from XLA's analysis:
a :class:`ir.Workload`).

Layering: the zoo sits above :mod:`compiler`, whose :func:`compiler.named_computation` labels its
layers, as a user's program would; the planner and the simulator never import it (they read a
``Workload``). The JAX parts of the face load on first use (PEP 562).
"""

from __future__ import annotations

import importlib

from zoo.config import (DTYPE_BYTES, ModelConfig, ZooError, get_config, gpt_config, list_models,
                        shard_dims, tensor_shard)

_MODELS = ("init_params", "param_shapes", "param_count", "active_param_count",
           "expert_param_count", "layer_names", "layer_fns", "body_of",
           "forward_loss", "forward", "batch_spec", "example_batch", "layer_param_shapes")
_COSTING = ("analytic_training_flops", "body_cost", "workload")

__all__ = ["DTYPE_BYTES", "ModelConfig", "ZooError", "get_config", "gpt_config", "list_models",
           "shard_dims", "tensor_shard",
           *_MODELS, *_COSTING]


def __getattr__(name: str):
    """The JAX parts of the face (``zoo.models``, ``zoo.costing``), imported on first use."""
    if name in _MODELS:
        return getattr(importlib.import_module("zoo.models"), name)
    if name in _COSTING:
        return getattr(importlib.import_module("zoo.costing"), name)
    if name in ("models", "costing", "decoder", "mochi", "layers", "config"):
        return importlib.import_module(f"zoo.{name}")
    raise AttributeError(f"module 'zoo' has no attribute {name!r}")
