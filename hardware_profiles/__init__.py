"""Hardware profiles: device specs and cluster specs as data, loaded into SI types, plus collective costs.

Leaf package: imports no other project package.
"""

from hardware_profiles.calibration import (
    PRIOR_UNCERTAINTY,
    calibration_origin,
    calibration_status,
    calibration_summary,
    is_calibrated,
)
from hardware_profiles.carve import GroupShape, carve, default_shapes, shapes_from_json
from hardware_profiles.collectives import (
    ALGORITHMS,
    all_gather,
    all_reduce,
    all_to_all,
    collective_time,
    reduce_scatter,
    ring_all_reduce,
    send_recv,
    tree_all_reduce,
)
from hardware_profiles.loader import (
    CLUSTERS_DIR,
    DEVICES_DIR,
    bundled_clusters,
    known_device_ids,
    list_devices,
    load_cluster,
    load_device,
)
from hardware_profiles.table import profiles_rows, profiles_table
from hardware_profiles.types import (
    Alternative,
    Cluster,
    DeviceProfile,
    InterMeshLink,
    Link,
    MeshSpec,
    NodeGroup,
    ProfileError,
)

__all__ = [
    "ALGORITHMS",
    "CLUSTERS_DIR",
    "DEVICES_DIR",
    "Alternative",
    "Cluster",
    "DeviceProfile",
    "GroupShape",
    "InterMeshLink",
    "Link",
    "MeshSpec",
    "NodeGroup",
    "PRIOR_UNCERTAINTY",
    "ProfileError",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "bundled_clusters",
    "calibration_origin",
    "calibration_status",
    "calibration_summary",
    "carve",
    "collective_time",
    "default_shapes",
    "is_calibrated",
    "known_device_ids",
    "list_devices",
    "load_cluster",
    "load_device",
    "profiles_rows",
    "profiles_table",
    "reduce_scatter",
    "ring_all_reduce",
    "send_recv",
    "shapes_from_json",
    "tree_all_reduce",
]
