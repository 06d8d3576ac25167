"""Serving steps timed on one accelerator (``benchmarks/bench_device_serving.py``) against the
serving cost model (:func:`simulator.serving_cost.step_cost`) on a device profile.

Each row is one device of a tensor-parallel replica (its shard of the weights, heads and MLP), so
it is predicted as a replica of ``tensor`` devices whose all-reduces cost nothing (they were not
run). ``mpmd validate --layers CSV`` reads such a file when its header has a ``context`` column.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from hardware_profiles.types import DeviceProfile, Link, Span
from ir import BatchStep
from runtime.calibration.device_layers import shipped_csv
from runtime.calibration.fit import CalibrationError
from simulator.serving_cost import Replica, step_cost
from zoo.inference import inference_model

COLUMNS = ("device_kind", "item", "model", "tensor", "batch", "context", "prompt", "seconds")
FREE_LINK = Link(float("inf"), 0.0, "not run: one device has no peer")


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One measured serving step: ``item`` is ``decode`` (``batch`` requests at ``context``
    cached tokens) or ``prefill`` (one ``prompt``-token request), ``seconds`` its median time."""

    device_kind: str
    item: str
    model: str
    tensor: int
    batch: int
    context: int
    prompt: int
    seconds: float

    @property
    def label(self) -> str:
        what = (f"decode b{self.batch} ctx{self.context}" if self.item == "decode"
                else f"prefill {self.prompt}")
        return f"{self.model} tp{self.tensor} {what}"


@dataclass(frozen=True, slots=True)
class StepComparison:
    timing: StepTiming
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.timing.seconds - 1.0


def is_serving_csv(path: str | Path) -> bool:
    """Whether ``path``'s header (found as :func:`~runtime.calibration.device_layers.shipped_csv`
    finds it) is a serving-step timing file's (has a ``context`` column); False for a missing
    file (the layer-timing reader then says so)."""
    p = shipped_csv(path)
    if not p.is_file():
        return False
    with open(p, newline="") as fh:
        return "context" in (next(csv.reader(fh), []) or [])


def read_steps(path: str | Path) -> list[StepTiming]:
    """The rows of a ``bench_device_serving.py`` CSV.

    Raises:
        CalibrationError: a missing file or column, or a malformed number (one line).
    """
    p = shipped_csv(path)
    if not p.is_file():
        raise CalibrationError(f"timing CSV {str(path)!r} not found; fix: check the path")
    out = []
    with open(p, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise CalibrationError(f"{path}: missing columns {', '.join(missing)}; fix: write it "
                                   "with benchmarks/bench_device_serving.py")
        for i, r in enumerate(reader, start=2):
            try:
                out.append(StepTiming(r["device_kind"], r["item"], r["model"], int(r["tensor"]),
                                      int(r["batch"] or 1), int(r["context"] or 0),
                                      int(r["prompt"] or 0), float(r["seconds"])))
            except ValueError:
                raise CalibrationError(f"{path}: line {i} has a malformed number; fix: rewrite "
                                       "it with benchmarks/bench_device_serving.py") from None
    return out


def compare(steps: list[StepTiming], device: DeviceProfile) -> list[StepComparison]:
    """Each measured step against :func:`step_cost` on ``device`` (bf16 weights and cache)."""
    out = []
    for s in steps:
        model = inference_model(s.model, "bf16", "bf16")
        rep = Replica(model, device, s.tensor, Span(s.tensor, 1, FREE_LINK))
        step = (BatchStep(decode=(s.context,) * s.batch) if s.item == "decode"
                else BatchStep(prefill=((0, s.prompt),)))
        out.append(StepComparison(s, step_cost(rep, step).total_s))
    return out
