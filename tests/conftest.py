"""Test set-up: 8 CPU JAX devices for multi-device tests (set before JAX initialises a backend)."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
