"""Serving steps timed on one accelerator (``benchmarks/bench_device_serving.py``) against the
serving cost model (:func:`simulator.serving_cost.step_cost`) on a device profile.

Each row is one device of a tensor-parallel replica (its shard of the weights, heads and MLP), so
it is predicted as a replica of ``tensor`` devices whose all-reduces cost nothing (they were not
run). ``mpmd validate --layers CSV`` reads such a file when its header has a ``context`` column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hardware_profiles.types import DeviceProfile, Link, Span
from ir import BatchStep
from ir.files import read_csv_table
from runtime.calibration.csv_fields import choice, count, number, read_records, text
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


ITEMS = ("decode", "prefill")
MAX_TENSOR = 2**20
"""Most devices of a replica (the cluster loader's devices-per-mesh limit)."""
MAX_BATCH = 2**16
"""Most requests of a decode step."""
MAX_TOKENS = 2**22
"""Longest context or prompt, tokens (4 M)."""
WRITE_IT = "time it with `python benchmarks/bench_device_serving.py --out FILE`"


def is_serving_csv(path: str | Path) -> bool:
    """Whether ``path``'s header (found as :func:`~runtime.calibration.device_layers.shipped_csv`
    finds it, read through :func:`ir.files.read_csv_table`) is a serving-step timing file's (has a
    ``context`` column); False for a missing file (the layer-timing reader then says so).

    Raises:
        ir.files.InputError: an unreadable file (a directory, binary, not UTF-8, malformed CSV).
    """
    p = shipped_csv(path)
    if not p.exists():
        return False
    return "context" in read_csv_table(p, "timing CSV")[0]


def read_steps(path: str | Path) -> list[StepTiming]:
    """The rows of a ``bench_device_serving.py`` CSV, read through the tool's guarded reader,
    every field checked (:mod:`runtime.calibration.csv_fields`).

    Raises:
        CalibrationError: a missing file or column; a row (line named) whose item is not decode
            or prefill, whose seconds are not a positive finite number, or whose tensor, batch,
            context (decode) or prompt (prefill) is not a positive integer in range.
        ir.files.InputError: an unreadable file (binary, not UTF-8, too large, malformed CSV).
    """
    p = shipped_csv(path)
    if not p.exists():
        raise CalibrationError(f"timing CSV {str(path)!r} not found; fix: check the path")
    out = []
    for line, r in read_records(p, "serving-step timing CSV", COLUMNS, WRITE_IT):
        where = f"{p}: line {line}"
        item = choice(where, r, "item", ITEMS)
        out.append(StepTiming(
            text(r, "device_kind"), item, text(r, "model"),
            count(where, r, "tensor", MAX_TENSOR, WRITE_IT),
            count(where, r, "batch", MAX_BATCH, WRITE_IT, required=False) or 1,
            count(where, r, "context", MAX_TOKENS, WRITE_IT, required=item == "decode"),
            count(where, r, "prompt", MAX_TOKENS, WRITE_IT, required=item == "prefill"),
            number(where, r, "seconds", f"give the measured seconds, above 0, or {WRITE_IT}")))
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
