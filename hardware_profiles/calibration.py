"""Whether a device profile's efficiencies were fitted to measured runs ("calibrated") or are a
prior (hand-set from published figures, never checked against a measured training step).

The rule reads the origin text of the profile's matmul efficiency
(``DeviceProfile.sources["matmul_efficiency"]``, the ``efficiency.matmul.origin`` of its YAML),
because matmul efficiency sets the compute time that dominates every prediction. The tools that
fit a profile write its origins, and each starts with a fixed word:

* ``mpmd validate --fit`` writes "fitted by `mpmd validate --fit` over the N ... rows ..."
  (``mpmd.cli.validate``);
* ``mpmd calibrate`` writes "measured <date> on this machine ... by mpmd calibrate ..."
  (``runtime.calibration.files``).

So a profile is calibrated exactly when that origin starts with "fitted" or "measured" (case and
leading blanks or quotes ignored). Anything else is a prior: origins that start with "prior", ones
that cite a published benchmark (the Tenstorrent profiles cite tt-metal's GEMM report: a kernel
measurement, not a fit of this simulator to a training run), and a missing origin.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hardware_profiles.types import DeviceProfile

PRIOR_UNCERTAINTY = 0.20
"""Relative uncertainty of an uncalibrated (prior) profile's matmul efficiency, a fraction.

Basis: before calibration, the H100 prior profile (matmul efficiency 0.62) predicted the
published torchtitan and Megatron H100 training runs 7-31% too fast, 20% on average (issue 11's
measurement, replaying those runs with ``mpmd validate``). A prior is therefore taken to be
uncertain by about +/-20%; what-if reports widen their best/worst ranges by re-predicting with
the matmul efficiency scaled by (1 - 0.20) and (1 + 0.20), capped at 1.0
(:mod:`reports.uncertainty`)."""

CALIBRATED_PREFIXES = ("fitted", "measured")
"""Origin prefixes written by the fitting tools (see the module docstring)."""

_ORIGIN_KEY = "matmul_efficiency"
_MAX_SUMMARY = 80
"""Characters kept of an origin the summary does not recognise."""


def _origin_text(profile: DeviceProfile) -> str:
    return str(profile.sources.get(_ORIGIN_KEY, "") or "").strip().strip("'\"").strip()


def calibration_status(profile: DeviceProfile) -> str:
    """``"calibrated"`` when the matmul efficiency's origin starts with "fitted" or "measured",
    else ``"prior"`` (the rule and its reasons are in the module docstring)."""
    return "calibrated" if _origin_text(profile).lower().startswith(CALIBRATED_PREFIXES) else "prior"


def is_calibrated(profile: DeviceProfile) -> bool:
    """Whether :func:`calibration_status` is ``"calibrated"``."""
    return calibration_status(profile) == "calibrated"


def _origin_parts(profile: DeviceProfile) -> tuple[str, str]:
    """(what set the matmul efficiency, its fit error or "") for :func:`calibration_origin`."""
    text = " ".join(_origin_text(profile).split())
    if not is_calibrated(profile):
        return "prior: never fitted to a measured run", ""
    if text.lower().startswith("fitted"):
        by = re.match(r"fitted by `[^`]+`", text, re.IGNORECASE)
        rows = re.search(r"\bover the (\d+)\b", text)
        mape = re.search(r"\bMAPE ([0-9.]+)%", text)
        if by:
            return (by.group(0) + (f" on {rows.group(1)} rows" if rows else ""),
                    f"MAPE {mape.group(1)}%" if mape else "")
    else:
        date = re.match(r"measured (\d{4}-\d{2}-\d{2})", text, re.IGNORECASE)
        by = re.search(r"\bby (mpmd \w+)", text)
        err = re.search(r"relative rms error ([0-9.]+)", text)
        if date and by:
            return (f"measured by {by.group(1)} on {date.group(1)}",
                    f"relative rms error {err.group(1)}" if err else "")
    first = re.split(r"[:;(]", text, maxsplit=1)[0].strip()
    return (first if len(first) <= _MAX_SUMMARY else first[:_MAX_SUMMARY - 3].rstrip() + "..."), ""


def calibration_origin(profile: DeviceProfile) -> str:
    """Where the profile's matmul efficiency came from, in one short line.

    E.g. "fitted by `mpmd validate --fit` on 31 rows (MAPE 5.2%)", "measured by mpmd calibrate on
    2026-11-22 (relative rms error 0.038)", or "prior: never fitted to a measured run". A
    calibrated origin of neither known shape is cut to its first clause (at most 80 characters).
    """
    head, detail = _origin_parts(profile)
    return f"{head} ({detail})" if detail else head


def calibration_summary(profiles: Iterable[DeviceProfile]) -> str:
    """One line over the distinct device kinds of ``profiles`` (first-seen order), e.g.
    "a100-80gb-sxm calibrated (fitted by `mpmd validate --fit` on 31 rows, MAPE 5.2%);
    blackhole-p150b prior (never fitted: predictions may be off by +/-20%)"."""
    seen: dict[str, DeviceProfile] = {}
    for p in profiles:
        seen.setdefault(p.name, p)
    out = []
    for name, p in seen.items():
        if is_calibrated(p):
            head, detail = _origin_parts(p)
            out.append(f"{name} calibrated ({head}{', ' + detail if detail else ''})")
        else:
            out.append(f"{name} prior (never fitted: predictions may be off by "
                       f"+/-{PRIOR_UNCERTAINTY:.0%})")
    return "; ".join(out)
