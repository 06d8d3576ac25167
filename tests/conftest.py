"""Test set-up: 8 CPU JAX devices for multi-device tests (set before JAX initialises a backend), and
hypothesis settings free of wall-clock limits."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from hypothesis import HealthCheck, settings  # noqa: E402

# property tests must not fail because this machine is slow or busy: no per-example deadline and
# no "data generation too slow" health check (both are wall-clock limits), for every test
settings.register_profile("any-machine", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("any-machine")
