"""Published serving measurements (``reports/validation/published_serving.csv``) against the serving
cost model (:mod:`simulator.serving_cost`), and the fit of a device kind's serving parameters.

A row states a model, a device kind, a replica of ``tp`` devices (``dp`` replicas), a batch, prompt
and output lengths, a precision, and one metric. What each metric is predicted as:

- ``tokens_per_s_per_user``: ``1 / decode step`` of ``batch`` requests at the context
  ``prompt + output / 2`` (the mean over the decode; ``prompt`` when no output length is stated);
  ``dp`` replicas driven by one host process sample all ``dp x batch`` users' logits there, so the
  step also pays the other replicas' ``logit_overhead``;
- ``ttft_s``: the prefill step of one request's ``prompt`` tokens (the per-user time to first
  token the tt-metal demos report: prefill time / users);
- ``tokens_per_s`` with a batch: a static batch served end to end: ``batch x output`` tokens over
  one prefill step of the batch's prompts plus ``output - 1`` decode steps;
- ``tokens_per_s`` without a batch: the replica under unbounded load
  (:func:`simulator.serving_cost.saturation_throughput`, at :data:`OFFLINE_MAX_BATCH` and
  :data:`OFFLINE_CHUNK_TOKENS`); ``tokens_per_s_total``: the same over ``dp`` replicas.

The fit (:func:`fit_kind`) sets a device kind's serving parameters by least squares on its rows'
relative errors (scipy ``least_squares``, bounded, several starts): on a kind not yet calibrated
(Tenstorrent) ``matmul_efficiency``, ``memory_efficiency``, ``decode_layer_overhead``,
``prefill_layer_overhead`` and, with multi-device rows, ``scale_up_latency`` (the achieved latency
per hop of the fabric's collectives); on a kind whose efficiencies were fitted to training runs,
only the two per-layer overheads of its serving engine. A kind is fitted on the rows of one engine
(:func:`fit_engine`: the one with most rows; a device profile describes the device under its
vendor's general serving stack); other engines' rows are scored, not fitted.
:func:`leave_one_out` refits without each row and scores that row.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from hardware_profiles.loader import load_device
from hardware_profiles.types import DeviceProfile, Link, NodeGroup
from ir import BatchStep
from runtime.calibration.csv_fields import choice, count, number, read_records, text
from runtime.calibration.fit import CalibrationError
from simulator.serving_cost import Replica, saturation_throughput, step_time, tp_span
from zoo.inference import inference_model
from zoo.model_files import resolve_model

COLUMNS = ("source", "model", "device", "devices", "tp", "dp", "batch", "prompt_tokens",
           "output_tokens", "weight_format", "kv_format", "metric", "value", "framework", "engine",
           "note")
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
    engine: str = ""


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


MAX_DEVICES = 2**20
"""Most devices of a row (the cluster loader's devices-per-mesh limit), and most replicas."""
MAX_BATCH = OFFLINE_MAX_BATCH
"""Largest batch a row may state."""
MAX_TOKENS = 2**20
"""Longest prompt or output a row may state, tokens (``mpmd serve-plan``'s limit)."""
FIX = "give the published figure (columns as in reports/validation/published_serving.csv)"


def read_rows(path: str | Path) -> list[ServingRow]:
    """The rows of a serving CSV with :data:`COLUMNS`, read through the tool's guarded reader,
    every field checked (:mod:`runtime.calibration.csv_fields`).

    Raises:
        CalibrationError: a missing file or column, no rows, a row with more fields than the
            header, or a bad field (line, column and value named): a metric not in
            :data:`METRICS`, a value that is not a positive finite number, or a device, replica,
            batch or token count that is not an integer in range (empty where required).
        ir.files.InputError: an unreadable file (binary, not UTF-8, too large, malformed CSV).
    """
    p = Path(path)
    if not p.exists():
        raise CalibrationError(f"serving CSV {str(path)!r} not found; fix: check the path")
    records = read_records(p, "serving CSV", COLUMNS, "use the columns of "
                           "reports/validation/published_serving.csv")
    if not records:
        raise CalibrationError(f"{path}: no rows; fix: add published serving rows")
    rows = []
    for line, r in records:
        where = f"{path}: line {line}"
        metric = choice(where, r, "metric", METRICS)
        rows.append(ServingRow(
            line=line, source=text(r, "source"), model=text(r, "model"),
            device=text(r, "device"), devices=count(where, r, "devices", MAX_DEVICES, FIX),
            tp=count(where, r, "tp", MAX_DEVICES, FIX),
            dp=count(where, r, "dp", MAX_DEVICES, FIX, required=False) or 1,
            batch=count(where, r, "batch", MAX_BATCH, FIX, required=False) or None,
            prompt_tokens=count(where, r, "prompt_tokens", MAX_TOKENS, FIX),
            output_tokens=count(where, r, "output_tokens", MAX_TOKENS, FIX, required=False) or None,
            weight_format=text(r, "weight_format") or "bf16",
            kv_format=text(r, "kv_format") or "bf16", metric=metric,
            value=number(where, r, "value", "the measured figure in SI units, above 0"),
            engine=text(r, "engine")))
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
        host = (row.dp - 1) * batch * rep.model.vocab * device.logit_overhead
        return 1.0 / (step_time(rep, BatchStep(decode=(ctx,) * batch)) + host)
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
          "prefill_layer_overhead", "logit_overhead", "scale_up_latency")
"""Every ``DeviceProfile`` field a serving fit may set."""

OVERHEADS = ("decode_layer_overhead", "prefill_layer_overhead")
"""What a fit sets on a kind whose efficiencies are already fitted to training runs (its matmul and
memory efficiencies are the device's, kept; the serving engine's per-layer times are not)."""

BOUNDS = {"matmul_efficiency": (0.05, 0.95), "memory_efficiency": (0.1, 0.95),
          "decode_layer_overhead": (0.0, 5e-3), "prefill_layer_overhead": (0.0, 20e-3),
          "logit_overhead": (0.0, 50e-9), "scale_up_latency": (0.5e-6, 200e-6)}
"""Fit bounds: efficiencies as fractions (at most 0.95: no DRAM or matmul unit sustains its
datasheet peak), times in s (overheads per layer, latency per hop)."""

SCALES = {"matmul_efficiency": 0.1, "memory_efficiency": 0.1, "decode_layer_overhead": 1e-4,
          "prefill_layer_overhead": 1e-3, "logit_overhead": 1e-9, "scale_up_latency": 1e-5}

STARTS = ({"matmul_efficiency": 0.5, "memory_efficiency": 0.8, "decode_layer_overhead": 50e-6,
           "prefill_layer_overhead": 200e-6, "logit_overhead": 0.0, "scale_up_latency": 5e-6},
          {"matmul_efficiency": 0.3, "memory_efficiency": 0.6, "decode_layer_overhead": 200e-6,
           "prefill_layer_overhead": 1e-3, "logit_overhead": 2e-9, "scale_up_latency": 20e-6},
          {"matmul_efficiency": 0.7, "memory_efficiency": 0.9, "decode_layer_overhead": 10e-6,
           "prefill_layer_overhead": 50e-6, "logit_overhead": 0.0, "scale_up_latency": 2e-6})
"""Starting points the fit tries besides the profile's own values (the best result wins)."""


@dataclass(frozen=True, slots=True)
class ServingFit:
    """A chip's fitted serving parameters (``values``: field name -> SI value), the rows and engine
    they were fitted on, and the fit's MAPE (%)."""

    chip: str
    engine: str
    values: dict
    rows: int
    mape: float
    evaluations: int


def with_values(device: DeviceProfile, values: dict) -> DeviceProfile:
    """``device`` with the fields in ``values`` (names of :data:`PARAMS`) set."""
    return dataclasses.replace(device, **{k: float(v) for k, v in values.items()})


def current(device: DeviceProfile, name: str) -> float:
    """The profile's value of fit parameter ``name`` (an unset overhead reads as
    ``fragment_overhead``, as the cost model uses it)."""
    got = getattr(device, name)
    return device.fragment_overhead if got is None else got


def mape(scored: list[Scored]) -> float:
    """Mean absolute percentage error, %."""
    return 100.0 * sum(abs(s.error) for s in scored) / max(1, len(scored))


def default_params(devices: list[DeviceProfile], rows: list[ServingRow]) -> tuple[str, ...]:
    """What :func:`fit_chip` sets: :data:`OVERHEADS` when a kind of the chip is calibrated on
    training runs (a serving fit's own calibration does not count, so a refit is the same fit);
    otherwise the efficiencies too, and the scale-up hop latency when some row
    spans several devices."""
    from hardware_profiles.calibration import is_calibrated

    def trained(d: DeviceProfile) -> bool:    # calibrated, and not by a serving fit
        return is_calibrated(d) and "--serving" not in d.sources.get("matmul_efficiency", "")

    if any(trained(d) for d in devices):
        return OVERHEADS
    return PARAMS if any(r.tp > 1 for r in rows) else PARAMS[:5]


def fit_chip(rows: list[ServingRow], devices: dict[str, DeviceProfile],
             params: tuple[str, ...] | None = None, starts: tuple[dict, ...] = STARTS
             ) -> ServingFit:
    """The ``params`` (default :func:`default_params`) shared by the kinds ``devices`` (one chip)
    that best predict ``rows`` (each on its own kind's profile): scipy ``least_squares`` on the
    relative errors, within :data:`BOUNDS`, from the first profile's values and each of
    ``starts``. Efficiencies are fractions of each kind's own peak and bandwidth, so one chip's
    cards share them.

    Raises:
        CalibrationError: no rows can be predicted on the kinds.
    """
    import numpy as np
    from scipy.optimize import least_squares

    ok = [r for r in rows if r.device in devices and not score([r], devices)[1]]
    if not ok:
        raise CalibrationError(f"no row of {', '.join(devices)} can be predicted; fix: check the "
                               "rows")
    params = params or default_params(list(devices.values()), ok)
    first = next(iter(devices.values()))
    lo = [BOUNDS[p][0] for p in params]
    hi = [BOUNDS[p][1] for p in params]

    def shared(x) -> dict[str, DeviceProfile]:
        return {k: with_values(d, dict(zip(params, x))) for k, d in devices.items()}

    def resid(x):
        devs = shared(x)
        return [predict(r, devs[r.device]) / r.value - 1.0 for r in ok]

    best, evaluations = None, 0
    for start in ({p: current(first, p) for p in params}, *starts):
        x0 = np.clip([start[p] for p in params], lo, hi)
        res = least_squares(resid, x0, bounds=(lo, hi), x_scale=[SCALES[p] for p in params],
                            diff_step=1e-3)
        evaluations += res.nfev
        if best is None or res.cost < best.cost:
            best = res
    values = dict(zip(params, (float(v) for v in best.x)))
    got = score(ok, shared(best.x))[0]
    engine = ", ".join(dict.fromkeys(r.engine for r in ok))
    return ServingFit(first.chip or first.name, engine, values, len(ok), mape(got), evaluations)


def leave_one_out(rows: list[ServingRow], devices: dict[str, DeviceProfile],
                  fit: ServingFit) -> list[Scored]:
    """Each row predicted under a fit on the other rows (leave-one-row-out), each refit started
    from ``fit`` (the fit on all rows) over the same parameters."""
    params = tuple(fit.values)
    out = []
    for i, r in enumerate(rows):
        f = fit_chip(rows[:i] + rows[i + 1:], devices, params, starts=(fit.values,))
        out += score([r], {k: with_values(d, f.values) for k, d in devices.items()})[0]
    return out


def chip_kinds(chip: str) -> dict[str, DeviceProfile]:
    """Every bundled device profile on ``chip`` (``DeviceProfile.chip``), by id."""
    from hardware_profiles.loader import known_device_ids

    out = {}
    for name in known_device_ids():
        dev = load_device(name)
        if (dev.chip or dev.name) == chip:
            out[name] = dev
    return out


def fit_engine(rows: list[ServingRow]) -> str:
    """The engine a kind's fit uses: the one with most of its rows (ties: first listed)."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.engine] = counts.get(r.engine, 0) + 1
    return max(counts, key=counts.get)


def metric_label(row: ServingRow) -> str:
    """A short label of what the row measures (model, devices, batch, lengths, metric)."""
    name = Path(row.model).stem if row.model.endswith((".json", ".yaml")) else row.model
    b = f"b{row.batch}" if row.batch else "max-load"
    o = f"/{row.output_tokens}" if row.output_tokens else ""
    return f"{name} {row.devices}x{row.device} tp{row.tp} {b} {row.prompt_tokens}{o} {row.weight_format}"
