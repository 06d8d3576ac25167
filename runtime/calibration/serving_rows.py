"""Published serving measurements (``reports/validation/published_serving.csv``) against the serving
cost model (:mod:`simulator.serving_cost`), and the fit of a device kind's serving parameters.

A row states a model, a device kind, a replica of ``tp`` devices (``dp`` replicas), a batch, prompt
and output lengths, a precision, and one metric. What each metric is predicted as:

- ``tokens_per_s_per_user``: ``1 / decode step`` of ``batch`` requests at the context
  ``prompt + output / 2`` (the mean over the decode; ``prompt`` when no output length is stated);
- ``ttft_s``: the prefill step of one request's ``prompt`` tokens (the per-user time to first
  token the tt-metal demos report: prefill time / users);
- ``tokens_per_s`` with a batch: a static batch served end to end: ``batch x output`` tokens over
  one prefill step of the batch's prompts plus ``output - 1`` decode steps;
- ``tokens_per_s`` without a batch: the replica under unbounded load
  (:func:`simulator.serving_cost.saturation_throughput`, at :data:`OFFLINE_MAX_BATCH` and
  :data:`OFFLINE_CHUNK_TOKENS`); ``tokens_per_s_total``: the same over ``dp`` replicas.

The fit (:func:`fit_kind`) sets four parameters of one device kind by least squares on the rows'
relative errors (scipy ``least_squares``, bounded): ``matmul_efficiency``, ``memory_efficiency``,
``decode_layer_overhead`` and ``prefill_layer_overhead``; :func:`leave_one_model_out` refits without
each model's rows and scores those rows.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

from hardware_profiles.loader import load_device
from hardware_profiles.types import DeviceProfile, Link, NodeGroup
from ir import BatchStep
from runtime.calibration.fit import CalibrationError
from simulator.serving_cost import Replica, saturation_throughput, step_time, tp_span
from zoo.inference import inference_model
from zoo.model_files import resolve_model

COLUMNS = ("source", "model", "device", "devices", "tp", "dp", "batch", "prompt_tokens",
           "output_tokens", "weight_format", "kv_format", "metric", "value", "framework", "note")
METRICS = ("tokens_per_s_per_user", "ttft_s", "tokens_per_s", "tokens_per_s_total")

OFFLINE_MAX_BATCH = 4096
"""Most requests resident under unbounded load when the row states no batch: TensorRT-LLM's
``trtllm-bench`` example run reports "Max Runtime Batch Size 4096"
(``docs/source/performance/perf-overview.md``)."""

OFFLINE_CHUNK_TOKENS = 8192
"""Prefill tokens per step under unbounded load: TensorRT-LLM's default ``max_num_tokens``, 8192
(``tensorrt_llm/builder.py: BuildConfig``)."""

@dataclass(frozen=True, slots=True)
class ServingRow:
    """One CSV row (see the module docstring); lengths in tokens, ``value`` in SI units."""

    line: int
    source: str
    model: str
    device: str
    devices: int
    tp: int
    dp: int
    batch: int | None
    prompt_tokens: int
    output_tokens: int | None
    weight_format: str
    kv_format: str
    metric: str
    value: float


@dataclass(frozen=True, slots=True)
class Scored:
    row: ServingRow
    predicted: float

    @property
    def error(self) -> float:
        """predicted / measured - 1."""
        return self.predicted / self.row.value - 1.0


@dataclass(frozen=True, slots=True)
class Skipped:
    line: int
    source: str
    model: str
    reason: str


def _int(text: str, line: int, col: str, *, optional: bool = False) -> int | None:
    text = text.strip()
    if not text:
        if optional:
            return None
        raise CalibrationError(f"line {line}: column {col!r} is empty; fix: give an integer")
    try:
        return int(float(text))
    except ValueError:
        raise CalibrationError(f"line {line}: column {col!r} = {text!r} is not a number; fix: "
                               "an integer") from None


def read_rows(path: str | Path) -> list[ServingRow]:
    """The rows of a serving CSV with :data:`COLUMNS`.

    Raises:
        CalibrationError: a missing file or column, or a malformed value (one line, naming it).
    """
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"serving CSV {str(path)!r} not found; fix: check the path")
    with open(p, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise CalibrationError(f"{path}: missing columns {', '.join(missing)}; fix: use the "
                                   f"columns {', '.join(COLUMNS)}")
        rows = []
        for i, r in enumerate(reader, start=2):
            if r["metric"] not in METRICS:
                raise CalibrationError(f"line {i}: unknown metric {r['metric']!r}; fix: one of "
                                       f"{', '.join(METRICS)}")
            try:
                value = float(r["value"])
            except ValueError:
                raise CalibrationError(f"line {i}: value {r['value']!r} is not a number") from None
            rows.append(ServingRow(
                line=i, source=r["source"], model=r["model"], device=r["device"],
                devices=_int(r["devices"], i, "devices"), tp=_int(r["tp"], i, "tp"),
                dp=_int(r["dp"], i, "dp", optional=True) or 1,
                batch=_int(r["batch"], i, "batch", optional=True),
                prompt_tokens=_int(r["prompt_tokens"], i, "prompt_tokens"),
                output_tokens=_int(r["output_tokens"], i, "output_tokens", optional=True),
                weight_format=r["weight_format"] or "bf16", kv_format=r["kv_format"] or "bf16",
                metric=r["metric"], value=value))
    return rows


def replica_for(row: ServingRow, device: DeviceProfile) -> Replica:
    """The row's replica: ``tp`` devices of ``device`` in one node (its scale-up link)."""
    model = inference_model(resolve_model(row.model), row.weight_format, row.kv_format)
    link = Link(device.scale_up_bandwidth, device.scale_up_latency)
    group = NodeGroup(name=device.name, device=device, nodes=1, devices_per_node=row.tp,
                      intra_link=link, scale_out_link=link)
    return Replica(model, device, row.tp, tp_span(group, row.tp))


def predict(row: ServingRow, device: DeviceProfile) -> float:
    """The row's metric as the cost model predicts it on ``device`` (module docstring)."""
    rep = replica_for(row, device)
    rep.check_fits()
    batch = row.batch or 1
    out = row.output_tokens
    if row.metric == "tokens_per_s_per_user":
        ctx = row.prompt_tokens + (out // 2 if out else 0)
        return 1.0 / step_time(rep, BatchStep(decode=(ctx,) * batch))
    if row.metric == "ttft_s":
        return step_time(rep, BatchStep(prefill=((0, row.prompt_tokens),)))
    if out is None:
        raise CalibrationError(f"line {row.line}: {row.metric} needs an output length")
    if row.batch is None or row.metric == "tokens_per_s_total":
        per = saturation_throughput(rep, row.prompt_tokens, out, max_batch=row.batch or
                                    OFFLINE_MAX_BATCH, chunk_tokens=OFFLINE_CHUNK_TOKENS)
        return per * (row.dp if row.metric == "tokens_per_s_total" else 1)
    total = step_time(rep, BatchStep(prefill=((0, row.prompt_tokens),) * batch))
    total += sum(step_time(rep, BatchStep(decode=(row.prompt_tokens + i,) * batch))
                 for i in range(1, out))
    return batch * out / total


def score(rows: list[ServingRow], devices: dict[str, DeviceProfile] | None = None
          ) -> tuple[list[Scored], list[Skipped]]:
    """Every row predicted on its kind's profile (``devices`` overrides by id); a row whose model,
    precision or fit fails is skipped with its reason."""
    devices = devices or {}
    scored, skipped = [], []
    for r in rows:
        try:
            dev = devices.get(r.device) or load_device(r.device)
            scored.append(Scored(r, predict(r, dev)))
        except (ValueError, KeyError) as e:
            skipped.append(Skipped(r.line, r.source, r.model, str(e).splitlines()[0]))
    return scored, skipped


PARAMS = ("matmul_efficiency", "memory_efficiency", "decode_layer_overhead",
          "prefill_layer_overhead")
BOUNDS = ((0.05, 1.0), (0.1, 1.0), (0.0, 5e-3), (0.0, 20e-3))
"""Fit bounds: efficiencies as fractions, overheads in s per layer."""

STARTS = ((0.5, 0.8, 50e-6, 200e-6), (0.3, 0.6, 200e-6, 1e-3), (0.7, 0.9, 10e-6, 50e-6))
"""Starting points the fit tries besides the profile's own values (the best result wins)."""


@dataclass(frozen=True, slots=True)
class ServingFit:
    device: str
    values: dict
    rows: int
    mape: float
    evaluations: int


def with_params(device: DeviceProfile, x) -> DeviceProfile:
    """``device`` with :data:`PARAMS` set to ``x``."""
    return dataclasses.replace(device, **dict(zip(PARAMS, (float(v) for v in x))))


def _x0(device: DeviceProfile) -> list[float]:
    return [device.matmul_efficiency, device.memory_efficiency,
            device.decode_layer_overhead if device.decode_layer_overhead is not None
            else device.fragment_overhead,
            device.prefill_layer_overhead if device.prefill_layer_overhead is not None
            else device.fragment_overhead]


def mape(scored: list[Scored]) -> float:
    """Mean absolute percentage error, %."""
    return 100.0 * sum(abs(s.error) for s in scored) / max(1, len(scored))


def fit_kind(rows: list[ServingRow], device: DeviceProfile) -> ServingFit:
    """The :data:`PARAMS` of ``device`` that best predict ``rows`` (all of that kind): scipy
    ``least_squares`` on the relative errors, within :data:`BOUNDS`, from the profile's values.

    Raises:
        CalibrationError: no rows can be predicted on the kind.
    """
    import numpy as np
    from scipy.optimize import least_squares

    ok = [r for r in rows if not score([r], {r.device: device})[1]]
    if not ok:
        raise CalibrationError(f"no {device.name} row can be predicted; fix: check the rows")
    lo, hi = zip(*BOUNDS)
    x0 = np.clip(_x0(device), lo, hi)

    def resid(x):
        dev = with_params(device, x)
        return [predict(r, dev) / r.value - 1.0 for r in ok]

    best = None
    for start in (x0, *STARTS):      # several starts: the overheads and efficiencies trade off
        res = least_squares(resid, np.clip(start, lo, hi), bounds=(lo, hi),
                            x_scale=[0.1, 0.1, 1e-4, 1e-3], diff_step=1e-3)
        evaluations = res.nfev + (best[1] if best else 0)
        if best is None or res.cost < best[0].cost:
            best = (res, evaluations)
        else:
            best = (best[0], evaluations)
    res = best[0]
    fitted = with_params(device, res.x)
    got = score(ok, {device.name: fitted})[0]
    return ServingFit(device.name, dict(zip(PARAMS, (float(v) for v in res.x))), len(ok),
                      mape(got), int(best[1]))


def leave_one_model_out(rows: list[ServingRow], device: DeviceProfile) -> dict[str, float]:
    """For each model with rows on the kind, the MAPE of its rows under a fit on the others (%);
    a model whose rows are the kind's only rows is left out."""
    out = {}
    for model in dict.fromkeys(r.model for r in rows):
        rest = [r for r in rows if r.model != model]
        if not rest:
            continue
        f = fit_kind(rest, device)
        got = score([r for r in rows if r.model == model],
                    {device.name: with_params(device, [f.values[p] for p in PARAMS])})[0]
        if got:
            out[model] = mape(got)
    return out


def fitted_profile(device: DeviceProfile, fit: ServingFit) -> DeviceProfile:
    """``device`` with the fit's values."""
    return with_params(device, [fit.values[p] for p in PARAMS])


def metric_label(row: ServingRow) -> str:
    """A short label of what the row measures (model, devices, batch, lengths, metric)."""
    name = Path(row.model).stem if row.model.endswith((".json", ".yaml")) else row.model
    b = f"b{row.batch}" if row.batch else "max-load"
    o = f"/{row.output_tokens}" if row.output_tokens else ""
    return f"{name} {row.devices}x{row.device} tp{row.tp} {b} {row.prompt_tokens}{o} {row.weight_format}"


def ape(s: Scored) -> float:
    """Absolute percentage error of one row, %."""
    return 100.0 * abs(s.error)

