"""Sources cited by document name: a figure's source in a device profile may name a file of the
project's reference material by its path outside the repository (``/work/shared/...``,
``../shared/...``, ``shared/reference/...``), which means nothing to a report's reader;
:func:`cite` puts the document's title in its place. Reports pass every source and origin they
print through it."""

from __future__ import annotations

import re

TITLES = {
    "hardware_reference.md": "Accelerator reference figures",
    "DESIGN.md": "Design: an MPMD auto-planner, simulator and compiler for heterogeneous clusters",
    "reference/000": "MPMD RFC (Shardy)",
    "reference/001": "Shardy sharding propagation",
    "reference/002": "MLIR 'mesh' dialect",
    "reference/003": "MPMD compiler passes",
    "reference/004": "Sharding and Multi-Device Parallelism for Mochi on Tenstorrent Hardware",
    "validation/published_training.csv": "Published training measurements (calibration set)",
}
"""The reference documents by their path under ``shared/`` (a ``reference/NNN`` prefix stands
for ``reference/NNN_<hash>.txt``) -> title."""

OTHER = {"/work/.library/device/KINDS.md": "Accelerator kinds of the device pool"}
"""Other documents outside the repository by path -> what they are."""

PATH = re.compile(r"(?:/work/|(?:\.\./)+|(?<![\w./-]))shared/([\w.*/-]+\w)|/work/[\w.*/-]+\w")
"""A path outside the repository: under ``shared/`` (group 1: the part below it), or any other
``/work/`` path."""


def _title(m: re.Match[str]) -> str:
    below = m.group(1)
    if below is None:                       # another /work/ path: what it is, or its file name
        path = m.group(0)
        return f"'{OTHER[path]}'" if path in OTHER else path.rsplit("/", 1)[-1]
    for key, title in TITLES.items():
        if below == key or below.startswith(key + "_") or below.startswith(key + "."):
            return f"'{title}'"
    return below.rsplit("/", 1)[-1]


def cite(text: str) -> str:
    """``text`` with every path outside the repository replaced by its document's title (in
    single quotes), or by its file name when the document is not one of :data:`TITLES`, e.g.
    ``"collected in /work/shared/hardware_reference.md (H100 row)"`` -> ``"collected in
    'Accelerator reference figures' (H100 row)"``."""
    return PATH.sub(_title, text)
