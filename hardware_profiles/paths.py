"""Where the bundled profiles live and which file a cluster argument names.

Light on purpose (it imports no pydantic, only :mod:`hardware_profiles.types`), so
the CLI can refuse a missing cluster file before it pays for the loader, the planner or JAX.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from hardware_profiles.types import ProfileError

__all__ = ["CLUSTERS_DIR", "DEVICES_DIR", "PACKAGE_ROOT", "looks_like_path", "resolve_cluster_path"]

DEVICES_DIR = Path(__file__).parent / "devices"
CLUSTERS_DIR = Path(__file__).parent / "clusters"
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
"""The folder holding ``hardware_profiles/``: bundled files named ``hardware_profiles/clusters/X.yaml``
(as the README does) resolve against it when no such file exists below the working directory."""


def looks_like_path(s: str) -> bool:
    """Whether a cluster or device argument is a path (``.yaml``/``.yml`` or a separator) rather
    than a bundled stem."""
    return s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s


def _did_you_mean(path: str) -> str:
    """`` (did you mean ...?)`` naming the bundled cluster whose stem is closest to ``path``'s,
    or ``""`` when none is close (``difflib`` ratio 0.6)."""
    stems = sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml"))
    close = difflib.get_close_matches(Path(path).stem, stems, n=1)
    return f" (did you mean hardware_profiles/clusters/{close[0]}.yaml?)" if close else ""


def resolve_cluster_path(path: str | Path) -> Path:
    """The file a cluster argument names: ``path`` itself when it exists; else a bundled cluster's
    stem (``"h100x64"``); else a bundled file's path from the repository root
    (``"hardware_profiles/clusters/h100x64.yaml"``), from any working directory.

    Raises:
        ProfileError: a name no file system accepts (too long, a NUL, an unencodable character),
            or no such file (the message names the closest bundled cluster, if any).
    """
    p = Path(path)
    try:
        if p.exists():
            return p
        if not looks_like_path(str(path)) and (CLUSTERS_DIR / f"{path}.yaml").is_file():
            return CLUSTERS_DIR / f"{path}.yaml"
        if not p.is_absolute() and (PACKAGE_ROOT / p).is_file():
            return PACKAGE_ROOT / p    # a bundled file named as in the README, from any directory
    except (OSError, ValueError) as e:    # a name too long, a NUL, an unencodable character
        shown = repr(str(path))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ProfileError(f"cluster path {shown} is not a usable file name ({type(e).__name__}); "
                           f"fix: name an existing cluster YAML") from None
    raise ProfileError(f"{p}: cluster file not found; fix: check the path{_did_you_mean(str(path))}")
