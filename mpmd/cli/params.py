"""Bounded numeric option types of the CLI: every number a user types has a finite range.

click's ``FloatRange`` lets ``nan`` through (every comparison with NaN is false) and, without a
``max``, ``inf``; :class:`FiniteFloat` refuses both. The limits below are far beyond any real run
and far below what would make a command hang (a global batch of 10**12 samples, 10**9 steps).
"""

from __future__ import annotations

import math
from typing import Any

import click

MAX_GLOBAL_BATCH = 2**24
"""Samples per step (16.8 M; published LLM batches are a few thousand sequences)."""
MAX_SEQ_LEN = 2**22
"""Tokens per sample (4 M)."""
MAX_MICROBATCHES = 2**16
"""Microbatches per step."""
MAX_TENSOR = 2**20
"""Largest tensor-parallel degree (the cluster loader's devices-per-mesh limit)."""
MAX_TIME_LIMIT_S = 7 * 86400.0
"""Longest planner search budget, s (a week)."""
MAX_STEPS = 10**6
"""Most training steps ``mpmd run`` takes."""


class FiniteFloat(click.FloatRange):
    """A ``FloatRange`` that also refuses ``nan`` and ``inf``."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            x = float(value)
        except (TypeError, ValueError):
            x = None
        if x is not None and not math.isfinite(x):
            self.fail(f"{value!r} is not a finite number; give a number such as 1.5", param, ctx)
        return super().convert(value, param, ctx)


def int_range(lo: int, hi: int) -> click.IntRange:
    """``click.IntRange(lo, hi)``: an integer option bounded on both sides."""
    return click.IntRange(min=lo, max=hi)


__all__ = ["FiniteFloat", "MAX_GLOBAL_BATCH", "MAX_MICROBATCHES", "MAX_SEQ_LEN", "MAX_STEPS",
           "MAX_TENSOR", "MAX_TIME_LIMIT_S", "int_range"]
