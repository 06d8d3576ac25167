"""The runtime: running plans on JAX devices, above the compiler, the zoo and the simulator.

- :mod:`runtime.train`: ``mpmd run``: compile a plan with :mod:`compiler`, train the plan's zoo
  model on the shipped text (or sample from a DiT), check the run against ``jax.jit``, the plan and
  the simulator; several processes with ``jax.distributed``.
- :mod:`runtime.calibration`: ``mpmd calibrate``: time the zoo's fragments and collectives on this
  host's devices and fit a device profile for the simulator.

Nothing below this package imports it; only the CLI (:mod:`mpmd`) does.
"""

__all__: list[str] = []
