"""Hardware profiles: device specs and cluster specs as data, loaded into SI types, plus collective costs.

Imports no project package above :mod:`ir`. The face is loaded on first use (PEP 562): naming
``hardware_profiles.paths`` or ``hardware_profiles.types`` costs milliseconds, while the loader
(pydantic) and the collectives load when one of their names is first used, so the CLI can check a
cluster path before paying for them.
"""

from __future__ import annotations

import importlib

# ``carve`` names both a submodule and a function of the face: bind the function now, or the
# submodule, once imported, would shadow it (the package attribute is set on import).
from hardware_profiles.carve import carve

_FACE = {
    "hardware_profiles.calibration": (
        "PRIOR_UNCERTAINTY", "calibration_origin", "calibration_status", "calibration_summary",
        "is_calibrated"),
    "hardware_profiles.carve": (
        "GroupShape", "default_shapes", "shapes_from_json"),
    "hardware_profiles.collectives": (
        "ALGORITHMS", "all_gather", "all_reduce", "all_to_all", "collective_time", "one_hop_all_reduce",
        "reduce_scatter",
        "ring_all_reduce", "send_recv", "span_all_gather", "span_all_reduce", "span_all_to_all",
        "span_collective", "span_reduce_scatter", "span_two_hop_all_to_all", "tree_all_reduce"),
    "hardware_profiles.cluster_loader": (
        "bundled_clusters", "load_cluster"),
    "hardware_profiles.loader": (
        "canonical_device", "known_device_ids", "list_devices", "load_device"),
    "hardware_profiles.paths": (
        "CLUSTERS_DIR", "DEVICES_DIR"),
    "hardware_profiles.table": (
        "PRECISION_COLUMNS", "precision_rows", "precision_table", "profiles_rows", "profiles_table",
        "recipe_origin", "recipe_rows", "recipe_table"),
    "hardware_profiles.types": (
        "Alternative", "Cluster", "DeviceProfile", "InterMeshLink", "Link", "MeshSpec", "NodeGroup",
        "ProfileError", "Span", "straggler_factor", "straggler_hosts"),
}
_WHERE = {name: mod for mod, names in _FACE.items() for name in names}

__all__ = sorted([*_WHERE, "carve"])


def __getattr__(name: str):
    """A name of the face, imported from its module on first use; a submodule by name."""
    if name in _WHERE:
        return getattr(importlib.import_module(_WHERE[name]), name)
    if name in ("calibration", "carve", "cluster_loader", "collectives", "file_shapes", "loader", "paths", "table",
                "types"):
        return importlib.import_module(f"hardware_profiles.{name}")
    raise AttributeError(f"module 'hardware_profiles' has no attribute {name!r}")
