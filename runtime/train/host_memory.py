"""Whether a plan's run fits in this machine's memory, checked before any array is allocated.

``mpmd run`` runs every mesh of a plan on this host's (CPU) devices and checks it against
``jax.jit`` of the same step, so the host holds the whole model twice over. A plan file edited by
hand (or planned for a cluster with more memory) can name a model that does not fit; without this
check the run dies inside XLA (``RESOURCE_EXHAUSTED``) or is killed by the kernel, taking other
work with it. The estimate is deliberately coarse and errs high:

- weights, gradients and Adam's two moments, once for the pipelined program and once for the
  ``jax.jit`` reference: ``8 x parameters x bytes per element``;
- activations kept for the backward, for the global batch, again twice: per layer and sample
  ``34 s h + 5 a s^2`` bytes at 2-byte elements (Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", Sec. 4.1, eq. 1; the ``5 a s^2`` score term only
  for materialized ("plain") attention), scaled to the model's element width and to an MLP
  wider than ``4h``.

A forward-only plan (generation, decoding) holds its weights twice and one layer's activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.train.step import RunError

__all__ = ["HostMemory", "available_bytes", "check_host_memory", "host_memory"]

GB = 1e9


@dataclass(frozen=True, slots=True)
class HostMemory:
    """Estimated host bytes of a run: ``state`` (weights, gradients, Adam moments, twice) and
    ``activations`` (kept for the backward, twice)."""

    state: float
    activations: float

    @property
    def total(self) -> float:
        """Bytes in all."""
        return self.state + self.activations


def host_memory(cfg: Any, global_batch: int, params: int) -> HostMemory:
    """The estimate of the module docstring.

    Args:
        cfg: the run's :class:`zoo.ModelConfig`.
        global_batch: samples per step.
        params: the model's parameters, every stage's copy (``zoo.param_count(cfg,
            unique=False)``).
    """
    b = cfg.dtype_bytes
    s, h = cfg.seq_len, cfg.hidden
    mlp = max(1.0, cfg.ffn / (4 * h))
    per_layer = 34 * s * h * mlp + (5 * cfg.heads * s * s if cfg.attention == "plain" else 0)
    if not cfg.training:       # forward only: weights (twice), one layer's activations live
        return HostMemory(state=2.0 * params * b, activations=float(2 * global_batch * per_layer * b / 2))
    acts = 2 * global_batch * cfg.layers * per_layer * b / 2
    return HostMemory(state=8.0 * params * b, activations=float(acts))


def available_bytes(meminfo: str | Path = "/proc/meminfo") -> float | None:
    """The memory this machine can give a new process (``MemAvailable``), bytes; ``None`` where
    the kernel does not say (not Linux)."""
    try:
        for line in Path(meminfo).read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_host_memory(cfg: Any, global_batch: int, *, available: float | None = None) -> HostMemory:
    """Refuse a run whose estimate exceeds what this machine has available.

    Args:
        available: bytes available (default: :func:`available_bytes`; no check when unknown).

    Raises:
        RunError: one line with the estimate, what is available and the fix.
    """
    from zoo import param_count

    need = host_memory(cfg, global_batch, param_count(cfg, unique=False))
    have = available_bytes() if available is None else available
    if have is not None and need.total > have:
        raise RunError(f"running model {cfg.name!r} at a global batch of {global_batch} needs about "
                       f"{need.total / GB:,.1f} GB of this machine's memory (weights, gradients and "
                       f"Adam state {need.state / GB:,.1f} GB, activations "
                       f"{need.activations / GB:,.1f} GB, each twice: the plan and its jax.jit "
                       f"check), and {have / GB:,.1f} GB is available; fix: run a smaller model or "
                       f"batch (mpmd run executes every mesh on this machine)")
    return need
