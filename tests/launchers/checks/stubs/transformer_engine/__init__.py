"""Import-only stand-in for NVIDIA Transformer Engine, for the ``launchers`` suite's
Megatron-Bridge check (``checks/megatron_bridge_check.py``) on a machine without CUDA.

Megatron-Bridge 0.6.2 and Megatron-Core import Transformer Engine at module level (its layers
subclass TE's classes); TE itself is a CUDA build that cannot be installed here. Building a
recipe's ConfigContainer, applying overrides and ``runtime_config_update`` (the configuration
code under test) call none of it: every ``transformer_engine.*`` module imports, and any name in
one is an inert class. Never on the path of a real training run."""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types

__version__ = "2.11.0"      # the range megatron-core 0.19.2 pins (as checks/megatron_check.py)

SUBMODULES = {"common", "recipe", "pytorch", "jax", "distributed", "attention", "ops",
              "cpp_extensions", "module", "float8_tensor", "tensor", "utils", "fp8",
              "dot_product_attention", "router", "permutation", "cross_entropy", "optimizers",
              "quantization", "constants", "export", "graph", "debug", "features",
              "multi_tensor_apply"}


class _Inert(type):
    def __getattr__(cls, name):
        if name.startswith("__"):     # inspect's __signature__, __wrapped__, ...: absent
            raise AttributeError(name)
        return _inert(name)


def _inert(name: str) -> type:
    return _Inert(name, (object,), {"__init__": lambda self, *a, **k: None,
                                    "__call__": lambda self, *a, **k: None})


class FusedAdam:
    """``transformer_engine.pytorch.optimizers.FusedAdam``'s constructor as TE 2.x has it: the
    keywords Megatron-Core's ``OptimizerConfig`` looks for (``inspect.signature``) before it
    allows ``use_precision_aware_optimizer``."""

    def __init__(self, params=None, lr=1e-3, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0.0, amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False, master_weight_dtype=None,
                 exp_avg_dtype=None, exp_avg_sq_dtype=None, use_decoupled_grad=False,
                 store_param_remainders=False):
        pass


class _Module(types.ModuleType):
    __path__: list = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in SUBMODULES:
            return importlib.import_module(f"{self.__name__}.{name}")
        if name == "FusedAdam":
            return FusedAdam
        return _inert(name)


class _Finder:
    def find_spec(self, name, path, target=None):
        if name.startswith("transformer_engine."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _Module(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"transformer_engine.{name}")
