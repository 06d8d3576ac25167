"""The fixed lists of names the tool's options take, spelled once for the packages and the CLI.

Standard library only (nothing is imported at all), so ``mpmd`` can offer them as choices, list
them in ``--help`` and refuse a mistyped one before it imports the planner, OR-Tools or JAX; the
package that acts on a name imports its list from here, so the CLI and the package cannot drift
apart.
"""

from __future__ import annotations

GOALS: tuple[str, ...] = ("time", "cost")
"""What the planner optimises (``planner.Goal.kind``; ``mpmd plan --objective``): ``time`` the
shortest step, ``cost`` the lowest USD per step (with a throughput floor, among plans that reach
it)."""

EXPORT_TARGETS: tuple[str, ...] = ("megatron", "megatron-bridge", "torchtitan", "torchtitan@0.2",
                                   "maxtext")
"""The launchers a plan is exported for (``launchers.export_plan``; ``mpmd export --to``):
Megatron-LM arguments, Megatron-Bridge (NeMo) recipe overrides, a torchtitan 0.3 config module,
a torchtitan 0.2 job TOML, a MaxText config YAML."""

__all__ = ["EXPORT_TARGETS", "GOALS"]
