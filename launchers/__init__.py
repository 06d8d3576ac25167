"""Export a plan to the launchers people train with: Megatron-LM arguments, Megatron-Bridge recipe
overrides, a torchtitan config module or job TOML, a MaxText config YAML (:func:`export_plan`).
What a target cannot express is returned as one line per item; a data-parallel plan gives one
file per part."""

from launchers.export import TARGETS, Exported, export_plan
from launchers.view import LauncherError, PartView, part_view, part_views

__all__ = ["TARGETS", "Exported", "export_plan", "LauncherError", "PartView", "part_view",
           "part_views"]
