"""Timing helpers of the calibration: the median time of a call until its results are ready,
calls timed in interleaved rounds, and parameters placed as ``mpmd run`` places them."""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import jax
from jax.sharding import Mesh, NamedSharding

from runtime.train.layouts import param_spec
from zoo.layers import init_from_shapes


def _block(x: Any) -> None:
    for leaf in jax.tree.leaves(x):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()


def time_call(fn: Callable[..., Any], *args: Any, repeats: int = 5, warmup: int = 2) -> float:
    """Median seconds of ``fn(*args)`` until ready, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        _block(fn(*args))
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        _block(fn(*args))
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def time_interleaved(calls: Sequence[tuple[Callable[..., Any], tuple]], rounds: int, *,
                     per_round: int = 1, warmup: int = 0, skip: int = 0) -> list[float]:
    """Median seconds of each ``(fn, args)`` in ``calls`` over ``rounds`` interleaved rounds, the
    first ``skip`` of them untimed: each round times every call once after the other
    (:func:`time_call` with ``per_round`` repeats and ``warmup`` untimed calls). A burst of load
    on a shared host then lands on one round of every call, not on all the timings of one."""
    times: list[list[float]] = [[] for _ in calls]
    for r in range(rounds):
        for ts, (fn, args) in zip(times, calls):
            t = time_call(fn, *args, repeats=per_round, warmup=warmup)
            if r >= skip:
                ts.append(t)
    return [statistics.median(ts) for ts in times]


def placed_params(cfg: Any, shapes: dict, mesh: Mesh, lay: Any, key: Any) -> dict:
    """Parameters of ``shapes`` drawn from ``key``, each on ``mesh`` with the sharding ``mpmd
    run`` gives it under ``lay`` (:func:`runtime.train.layouts.param_spec`)."""
    vals = init_from_shapes(shapes, cfg.jnp_dtype, key)
    return {k: jax.device_put(v, NamedSharding(mesh, param_spec(cfg, k, tuple(v.shape), lay)))
            for k, v in vals.items()}
