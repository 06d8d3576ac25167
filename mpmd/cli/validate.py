"""``mpmd validate [--fit] [--csv PATH] [--out FILE.md] [--profiles-out DIR] [--strict]``: the
simulator against published training measurements (``--layers CSV``: against layer timings
measured on one accelerator instead, :mod:`mpmd.cli.validate_layers`; ``--serving``: against
published serving measurements, :mod:`mpmd.cli.validate_serving`).

Builds every row's setup (:mod:`simulator.validate`), simulates it on its own device's profile (the
CSV's ``device`` column) with :func:`simulator.plan_sim.simulate_plan`, checks
:func:`planner.predict.predict` agrees, and prints the per-row table, the mean / max absolute
percentage error and the zero-bubble schedule rankings; ``--out`` also writes them as Markdown
(atomically). ``--fit`` first fits each device kind's efficiency values over that kind's dense
rows (kinds of one part that differ in memory capacity only, :func:`memory_twins`, over their rows
together; a mixture of experts' rows are held out of it, :func:`held_out`, and fit the token-path
figure last: :mod:`mpmd.cli.validate_moe`) and reports
leave-one-source-out errors; ``--profiles-out DIR`` writes the fitted profiles there. No
file is written without ``--out`` or ``--profiles-out``.

A row that cannot be simulated (it does not parse: :func:`simulator.validation_rows.
load_rows_lenient`; its setup or simulation raises one of :func:`row_errors`) is skipped, listed
under "Not simulated" with its line and reason, and the headline says "N of M rows scored"; the
exit status is 0 while at least one row is scored. ``--strict`` makes the first skipped row an
error (exit 2, one line). Every row is timed once on its profile before ``--fit`` fits anything,
so ``--fit`` skips the same rows.
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass
from pathlib import Path

import click

from mpmd.cli.common import console, guard

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CSV = ROOT / "reports" / "validation" / "published_training.csv"
FIT_COMMAND = "mpmd validate --fit"


JAX_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
"""A row's compute dtype (:attr:`simulator.validation_rows.Row.dtype`) -> the zoo model's
``dtype``."""


def row_config(row):
    """The row's decoder as a zoo :class:`~zoo.ModelConfig`, from its own columns, in the row's
    compute dtype (:attr:`~simulator.validation_rows.Row.dtype`: fp16 on a V100): a
    gated MLP (``glu`` 1) is a Llama-style block (RMSNorm, SwiGLU, RoPE, no biases, untied head),
    otherwise a GPT-style block (LayerNorm, GeLU, biases, learned positions, tied embeddings);
    grouped-query attention with ``kv_heads``; ``head_dim`` independent of the width; the
    attention kernel of :func:`simulator.validation_setup.attention_kernel`. Blank fields
    follow :data:`simulator.validation_setup.RULES`.

    Raises:
        ZooError: the row's sizes make no valid model (:func:`zoo.schema.check_model`).
    """
    from zoo import ModelConfig
    from zoo.schema import check_model
    from simulator.validation_rows import DEFAULT_VOCAB

    from simulator.validation_setup import attention_kernel

    vocab = row.vocab or DEFAULT_VOCAB
    kernel = attention_kernel(row)[0]
    name = "".join(c if c.isalnum() or c in "_.+-" else "-" for c in f"{row.source}-{row.model}")
    where = f"validation row {row.source} {row.model}"
    if not row.glu:
        cfg = ModelConfig(name=name, family="gpt", layers=row.layers, hidden=row.hidden,
                          heads=row.heads, kv_heads=row.kv_heads or row.heads,
                          ffn=row.ffn or 4 * row.hidden, vocab=vocab, seq_len=row.seq_len,
                          norm="layer", mlp="gelu", pos_emb="learned", bias=True,
                          tie_embeddings=True, head_size=row.head_dim or 0,
                          attention_kernel=kernel, dtype=JAX_DTYPES[row.dtype],
                          source=f"published run {row.source} {row.model} (validation CSV)")
    else:
        cfg = ModelConfig(name=name, family="llama", layers=row.layers, hidden=row.hidden,
                          heads=row.heads, kv_heads=row.kv_heads or row.heads,
                          ffn=row.ffn or 4 * row.hidden, vocab=vocab, seq_len=row.seq_len,
                          head_size=row.head_dim or 0, attention_kernel=kernel,
                          dtype=JAX_DTYPES[row.dtype],
                          source=f"published run {row.source} {row.model} (validation CSV)")
    return check_model(cfg, where)           # ZooError: the row's sizes make no model


@functools.lru_cache(maxsize=None)
def resolved_model(value: str):
    """The zoo model a row's ``model_config`` names (:func:`zoo.model_files.resolve_model`: a zoo
    name, a shipped config's name or a model file), cached per value.

    Raises:
        simulator.validation_rows.ValidationError: the value does not resolve (the resolver's
            one-line reason), or names a model that is not a decoder language model.
    """
    from ir.files import InputError
    from simulator.validation_rows import ValidationError
    from zoo import ZooError
    from zoo.model_files import resolve_model

    try:
        cfg = resolve_model(value)
    except (ZooError, InputError) as e:
        why = (str(e).splitlines() or [type(e).__name__])[0]
        raise ValidationError(f"model_config: {why}") from None
    if cfg.family not in ("llama", "gpt"):
        raise ValidationError(f"model_config {value[:80]!r} is a {cfg.family} model; fix: name a "
                              f"decoder language model (the llama or gpt family)")
    return cfg


def model_shape(cfg) -> dict[str, str]:
    """A zoo model's shape columns (:data:`simulator.validation_rows.SHAPE_COLUMNS`) as a
    validation CSV writes them (``glu`` 1 for a gated MLP)."""
    return {"layers": str(cfg.layers), "hidden": str(cfg.hidden), "heads": str(cfg.heads),
            "vocab": str(cfg.vocab), "ffn": str(cfg.ffn), "kv_heads": str(cfg.kv_heads),
            "head_dim": str(cfg.head_dim), "glu": "1" if cfg.mlp == "swiglu" else "0"}


def model_fill(csv_path: str | Path):
    """The ``fill`` hook of :func:`simulator.validation_rows.load_rows_lenient` for the CSV at
    ``csv_path``: a record with a ``model_config`` gets its blank shape columns from that model
    (a relative model file path is read relative to the CSV's folder, written back absolute so
    :func:`workload_for` reads the same file); a given shape column must agree with it. A record
    without one whose ``layers``, ``hidden`` and ``heads`` are blank takes its ``model`` column
    as the ``model_config`` when that resolves (``"Qwen3_30B_a3B (tokendrop)"``, as NVIDIA's
    tables print it: :func:`zoo.model_files.canonical_name`); a ``(tokendrop)`` qualifier there
    fills a blank ``dispatcher`` with ``tokendrop``. Other records are returned as they are.

    The hook raises :class:`~simulator.validation_rows.ValidationError` (the row is skipped): a
    ``model_config`` that does not resolve (:func:`resolved_model`), or a shape column that
    disagrees with the model's (naming both values).
    """
    folder = Path(csv_path).resolve().parent

    def fill(d: dict) -> dict:
        from simulator.validation_rows import ValidationError
        from zoo.model_files import is_model_file

        value = (d.get("model_config") or "").strip()
        if not value:
            model = (d.get("model") or "").strip()
            if not model or any((d.get(k) or "").strip() for k in ("layers", "hidden", "heads")):
                return d
            try:                    # no shape given: the model column names a zoo model
                resolved_model(model)
            except ValidationError as e:
                if "not modelled yet" in str(e):
                    raise           # a model the zoo knows it lacks: skipped with that reason
                return d            # parse_row names the missing shape columns
            d = {**d, "model_config": model}
            value = model

        local = folder / value
        if is_model_file(value) and not Path(value).is_absolute() and local.is_file():
            value = str(local)
        cfg = resolved_model(value)
        out = dict(d)
        printed = f"{d.get('model') or ''} {value}".lower()
        if not (d.get("dispatcher") or "").strip() and re.search(r"\(\s*token[-_ ]?drop", printed):
            out["dispatcher"] = "tokendrop"      # "Qwen3_30B_a3B (tokendrop)" as tables print it
        for k, v in model_shape(cfg).items():
            given = (d.get(k) or "").strip()
            if not given:
                out[k] = v
                continue
            try:
                same = int(given) == int(v)
            except ValueError:
                continue                    # not an integer: parse_row says so
            if not same:
                raise ValidationError(f"{k}={given[:40]} but model_config "
                                      f"{(d.get('model_config') or '').strip()[:80]} has {k} {v}; "
                                      f"fix: leave {k} blank or make it agree")
        out["model_config"] = value
        return out

    return fill


@functools.lru_cache(maxsize=None)
def _workload(cfg, batch: int):
    from zoo.costing import workload

    return workload(cfg, batch, seq_len=cfg.seq_len)


def workload_for(row):
    """The row's workload: its ``model_config`` model (:func:`resolved_model`: a mixture of
    experts, latent attention and the rest as the zoo knows them) at the row's sequence length,
    attention kernel and global batch, else :func:`row_config` (the synthetic GPT / Llama block of
    its shape columns), traced by ``zoo.costing.workload`` (cached per shape), in the row's
    compute dtype (:attr:`~simulator.validation_rows.Row.dtype`; a blank ``precision`` is
    resolved on the device by ``simulator.validation_setup.row_precision`` before this is
    called), training precision recipe (``precision`` column, with what its GEMMs keep:
    ``saved_inputs``) and loss (``cross_entropy``).

    Raises:
        ZooError: the row's sizes make no valid model, or its tensor degree cannot run it
            (:func:`ir.shards.layout_problem`: a published run's layout always can).
        ProfileError: the row's device does not run its precision recipe.
    """
    from ir import layout_problem
    from zoo import ZooError

    if row.model_config:
        from zoo import get_config
        from simulator.validation_setup import attention_kernel

        cfg = get_config(resolved_model(row.model_config), seq_len=row.seq_len,
                         attention_kernel=attention_kernel(row)[0],
                         dtype=JAX_DTYPES[row.dtype])
        w = _workload(cfg, row.global_batch)
    else:
        w = _workload(row_config(row), row.global_batch)
    why = layout_problem(w.shards, row.tp)
    if why:
        raise ZooError(f"validation row {row.source} {row.model}: {why}; fix the row's tp")
    if (row.cross_entropy, row.saved_inputs) != (w.cross_entropy, w.saved_inputs):
        from dataclasses import replace

        w = replace(w, cross_entropy=row.cross_entropy, saved_inputs=row.saved_inputs)
    if row.low_precision:
        from dataclasses import replace

        from hardware_profiles import load_device

        load_device(row.device).format_rate(row.recipe)   # ProfileError: not run there
        w = replace(w, precision=row.recipe)
    return w


def predict_step(plan, workload, cluster) -> float:
    from planner.predict import predict

    return predict(plan, workload, cluster).step_time_s


def write_profile_efficiency(path: Path, matmul: float, memory: float, overhead_us: float,
                             origin: str, elementwise: float = 0.0, *, out: Path | None = None,
                             extra: tuple[tuple[str, object, str], ...] = ()) -> None:
    """Write device YAML ``path`` with its ``efficiency:`` block replaced (values and origins) to
    ``out`` (default: ``path`` itself), atomically; ``extra`` entries ``(key, value, origin)``
    follow the four fitted ones (the profile's other efficiency keys, kept or fitted)."""
    from ir.files import write_atomic

    text = path.read_text()
    start = text.index("\nefficiency:\n") + 1
    m = re.search(r"\n(?=\S)", text[start + len("efficiency:\n"):])
    end = start + len("efficiency:\n") + (m.start() + 1 if m else len(text))

    def q(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"

    o_mat = q(origin + " (fitted)")
    o_mem = q(origin + " (held at the prior: no row is memory-bound, so it is not identifiable)")
    o_ovh = q(origin + " (held at the profile's own value, not fitted)")
    from simulator.validate import ELEMENTWISE_GRID

    grid = ", ".join(f"{g:g}" for g in ELEMENTWISE_GRID)
    o_ew = q(origin + f" (best of the grid {grid}: most schedule groups ranked as measured, then "
             "the lowest MAPE; a larger fraction must lower it by more than 0.1 points)")
    block = ("efficiency:\n"
             f"  matmul:\n    value: {matmul:.3f}\n    origin: {o_mat}\n"
             f"  memory:\n    value: {memory:.3f}\n    origin: {o_mem}\n"
             f"  fragment_overhead_us:\n    value: {overhead_us:g}\n    origin: {o_ovh}\n"
             f"  elementwise_traffic:\n    value: {elementwise:g}\n    origin: {o_ew}\n")
    block += "".join(f"  {k}:\n    value: {v:g}\n    origin: {q(o)}\n" if isinstance(v, float)
                     else f"  {k}:\n    value: {v}\n    origin: {q(o)}\n" for k, v, o in extra)
    # every other entry of the old block (serving overheads, attention rates, ...) kept verbatim
    written = {"matmul", "memory", "fragment_overhead_us", "elementwise_traffic"} | {k for k, *_ in extra}
    old = text[start + len("efficiency:\n"):end]
    for m in re.finditer(r"^  (\w+):\n(?:    .*\n?)*", old, re.MULTILINE):
        if m.group(1) not in written:
            block += m.group(0) if m.group(0).endswith("\n") else m.group(0) + "\n"
    write_atomic(out or path, text[:start] + block + text[end:])


def write_training_formats(path: Path, formats: "dict[str, tuple[float, str]]", *,
                           out: Path | None = None) -> None:
    """Write device YAML ``path`` with its ``training_formats:`` block replaced to ``out``
    (default: ``path``), atomically: ``formats`` maps each recipe the device runs to its
    (relative efficiency, origin), in the order given."""
    from ir.files import write_atomic

    text = path.read_text()

    def q(s: str) -> str:
        return "'" + s.replace("'", "''") + "'"

    block = "training_formats:\n" + "".join(
        f"  {k}:\n    efficiency: {e:.3f}\n    origin: {q(o)}\n" for k, (e, o) in formats.items())
    if "\ntraining_formats:\n" in text:
        start = text.index("\ntraining_formats:\n") + 1
        m = re.search(r"\n(?=\S)", text[start + len("training_formats:\n"):])
        end = start + len("training_formats:\n") + (m.start() + 1 if m else len(text))
    else:                                   # a new block before the memory figures
        start = end = text.index("\nmemory_g") + 1
    write_atomic(out or path, text[:start] + block + text[end:])


def format_origin(device: str, rows, f) -> str:
    """The origin of a fitted recipe efficiency: the rows, their sources and the fit's error."""
    sources = ", ".join(dict.fromkeys(r.source for r in rows))
    return (f"fitted by `{FIT_COMMAND}` over the {len(rows)} {device} rows of the published-"
            f"training CSV in {f.recipe} (sources: {sources}), the BF16 fit held: MAPE "
            f"{f.mape:.1f}% (scipy bounded search over the efficiency relative to BF16 GEMMs)")


FEW_ROWS = 3
"""A kind with fewer dense BF16 rows than this, on a chip another kind has fitted, fits only its
matmul efficiency on them (the GEMM rate its own clocks and power reach: GB300 against GB200),
its memory efficiency, dispatch overhead and elementwise fraction held at that kind's: one figure
from one or two rows, not four."""


def _same_chip(device, devices, fitted: list[str]):
    """The first kind of ``fitted`` on ``device``'s chip (``DeviceProfile.chip``), or None."""
    if not device.chip:
        return None
    return next((devices[n] for n in fitted if devices[n].chip == device.chip), None)


MEMORY_ONLY = ("name", "description", "memory_bytes", "sources", "matmul_efficiency",
               "memory_efficiency", "fragment_overhead", "elementwise_traffic", "sync_jitter")
"""``DeviceProfile`` fields two kinds of one part may differ in and still time every row alike:
the capacity of the memory (a V100 SXM2 with 16 or 32 GB), the words, and the efficiencies a fit
sets."""


def memory_twins(name: str, devices) -> list[str]:
    """The other kinds of ``devices`` that are ``name``'s chip (``DeviceProfile.chip``) and equal to
    it in every field but :data:`MEMORY_ONLY`: they time a row the same, so ``--fit`` fits them as
    one (their rows together, one value each of the fitted efficiencies)."""
    import dataclasses

    base = devices[name]

    def same(other) -> bool:
        return all(getattr(base, f.name) == getattr(other, f.name)
                   for f in dataclasses.fields(base) if f.name not in MEMORY_ONLY)

    return [n for n, d in devices.items()
            if n != name and base.chip and d.chip == base.chip and same(d)]


def recipe_groups(results) -> list[tuple[str, list]]:
    """The scored rows by (device, precision recipe, dense or mixture of experts), in order of
    first appearance, each as (label, rows): what the per-recipe targets are stated for, with
    the mixtures of experts (never fitted, :func:`held_out`) apart from the dense rows."""
    out: dict[str, list] = {}
    for r in results:
        kind = "MoE" if held_out(r.setup) else "dense"
        out.setdefault(f"{r.row.device} {r.row.precision} {kind}", []).append(r)
    return list(out.items())


def held_out(setup) -> bool:
    """Whether ``--fit`` leaves a row out of its fit (it is still scored): a mixture of experts'.
    The efficiencies fitted are the chip's on dense GEMMs and collectives; a mixture-of-experts
    row adds the model's own MoE terms (routed-expert rooflines, all-to-alls, folding), so it is
    held out and its error measures those terms instead of absorbing them into the fit."""
    return any(c.experts > 0 for c in setup.workload.costs.values())


def fit_formats(name: str, low, devices, fit_info: list[str]) -> "dict[str, tuple[float, str]]":
    """Fit each low-precision recipe of ``low`` (recipe -> the kind's setups in it) on
    ``devices[name]`` with its BF16 efficiencies held (:func:`simulator.validate.fit_format`);
    update ``devices[name]``, append a report line per recipe to ``fit_info`` and return every
    recipe the kind runs as (efficiency, origin) for :func:`write_training_formats`."""
    import dataclasses

    from simulator import validate as V

    base = devices[name]
    formats = {r: (base.format_efficiency[r], base.sources.get(f"training_formats.{r}", ""))
               for r in base.format_efficiency}
    for recipe, these in low.items():
        with console.status(f"{name}: fitting {recipe} over its {len(these)} rows ..."):
            ff = V.fit_format(these, devices[name], recipe, predict_step)
        formats[recipe] = (ff.efficiency, format_origin(name, [s.row for s in these], ff))
        devices[name] = dataclasses.replace(
            devices[name], format_efficiency={**devices[name].format_efficiency,
                                              recipe: ff.efficiency})
        line = (f"{name} {recipe}: efficiency relative to bf16 GEMMs **{ff.efficiency:.3f}** "
                f"over {ff.rows} rows, MAPE {ff.mape:.2f}% ({ff.evaluations} evaluations)")
        console.print(line)
        fit_info.append(f"## Calibration: {name}, {recipe}\n\n{line}")
    return formats


EXTRA_EFFICIENCY = (("backward", "backward_efficiency"),
                    ("scale_out", "scale_out_efficiency"), ("comm_interference", "comm_interference"),
                    ("grad_sync_overlap", "grad_sync_overlap"), ("sync_jitter", "sync_jitter"))
"""Profile efficiency keys beyond the four :func:`simulator.validate.fit` fits: (YAML key,
``DeviceProfile`` attribute), kept with their origins when a fit rewrites the block."""


def extra_efficiency(device, fitted_jitter: str | None) -> tuple[tuple[str, object, str], ...]:
    """The ``extra`` entries of :func:`write_profile_efficiency` for ``device``: every key of
    :data:`EXTRA_EFFICIENCY` its profile sets, with its origin, and ``sync_jitter`` with
    ``fitted_jitter`` as its origin when the scale fit set it."""
    out: list[tuple[str, object, str]] = []
    for key, attr in EXTRA_EFFICIENCY:
        if attr == "sync_jitter" and fitted_jitter:
            out.append((key, float(round(device.sync_jitter, 4)), fitted_jitter))
        elif attr in device.sources:
            v = getattr(device, attr)
            out.append((key, float(v) if not isinstance(v, str) else v, device.sources[attr]))
    return tuple(out)


def _fmt(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.1f}"


def _relative(path: str) -> str:
    """``path`` relative to the working directory when it lies below it (for stable reports)."""
    from pathlib import Path

    p = Path(path).resolve()
    try:
        return str(p.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


@dataclass(frozen=True, slots=True)
class MemoryFit:
    """A row's predicted peak memory per device (bytes), the device's capacity (bytes) and the
    peak its source measured (bytes; None where it publishes none)."""

    peak: float
    capacity: float
    published: float | None = None

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def error_pct(self) -> float | None:
        """Signed % of the predicted peak against the published one (negative: under it)."""
        return None if self.published is None else (self.peak / self.published - 1) * 100

    def __str__(self) -> str:
        """``"92 / 80 GB, no"``; with a published peak ``"62 / 86 GB, yes; measured 88 (-30%)"``."""
        text = (f"{self.peak / 1e9:.0f} / {self.capacity / 1e9:.0f} GB, "
                f"{'yes' if self.fits else 'no'}")
        if self.published is not None:
            text += f"; measured {self.published / 1e9:.0f} ({self.error_pct:+.0f}%)"
        return text


def memory_fit(setup, device) -> MemoryFit | None:
    """The row's predicted peak memory per device against the device's and, where the row gives
    one, the peak its source measured (the published layout as the model holds it: a peak above
    the capacity names a mechanism the model still lacks, since the run ran); None where the
    replay cannot say."""
    from planner.predict import predict
    from simulator.validation_setup import build_cluster

    try:
        pr = predict(setup.plan, setup.workload, build_cluster(setup.row, device))
    except Exception:  # noqa: BLE001  (an adaptive schedule's template, a refused plan: no figure)
        return None
    return MemoryFit(max(pr.peak_memory_bytes.values()), device.memory_bytes,
                     setup.row.peak_memory_bytes)


def memory_lines(memory) -> list[str]:
    """The report's lines on memory: how many published layouts fit, and the predicted peak
    against each published one (signed %, its mean absolute and max)."""
    known = [m for m in (memory or {}).values() if m is not None]
    lines = [f"Published layouts that fit in the model's memory: {sum(m.fits for m in known)} of "
             f"{len(known)} rows."]
    measured = [m for m in known if m.published is not None]
    if measured:
        errs = [abs(m.error_pct) for m in measured]
        lines.append(f"Predicted peak memory against the {len(measured)} published peaks: mean "
                     f"abs {sum(errs) / len(errs):.1f}%, max {max(errs):.1f}% (signed, per row, "
                     f"in the table's last column).")
    return lines


def render(results, rankings, agree_max: float, fit_info: str, csv_path: str, wall: float, *,
           skipped=(), total: int | None = None, memory=None) -> str:
    """The Markdown report: the rows scored (``N of M rows scored``), their table and errors, the
    zero-bubble rankings, the fit sections, and the rows not simulated with their reasons."""
    from simulator.validate import mape

    total = len(results) + len(skipped) if total is None else total

    lines = ["# Validation against published training measurements", "",
             f"Generated by `mpmd validate{' --fit' if fit_info else ''}` from "
             f"`{_relative(csv_path)}` "
             f"({wall:.0f} s). Sources: `reports/validation/README.md`. Every row is simulated with "
             "`simulator.plan_sim.simulate_plan`; `planner.predict` agrees within "
             f"{agree_max * 100:.2f}% on every row.", "",
             f"**{scored_line(len(results), total)}**"
             + (f" ({len(skipped)} not simulated: see below)." if skipped else "."), "",
             "| source | model | device | precision | gpus | tp/pp/dp | mb x M | schedule (simulated) "
             "| assumed | metric | predicted | measured | abs % err | peak memory, fits |",
             "|" + "---|" * 14]
    for r in results:
        s, row = r.setup, r.row
        lines.append(f"| {row.source} | {row.model} | {row.device} | {row.precision} | {row.gpus} | "
                     f"{row.tp}/{row.pp}/{row.dp}{f' cp{row.cp}' if row.cp > 1 else ''} | "
                     f"{s.micro_batch} x {s.microbatches} | {row.schedule or '-'} ({s.schedule}) | "
                     f"{'; '.join(s.assumptions) or '-'} | {row.metric} | {_fmt(r.predicted)} | "
                     f"{_fmt(row.value)} | {r.ape:.1f} | {(memory or {}).get(row.line) or '-'} |")
    lines += ["", f"**Mean absolute percentage error: {mape(results):.1f}%; max: "
              f"{max(r.ape for r in results):.1f}%** (targets per device kind: mean <= 8%, "
              "max <= 20%).", ""]
    for dev in dict.fromkeys(r.row.device for r in results):
        sub = [r for r in results if r.row.device == dev]
        lines.append(f"- **{dev}**: mean {mape(sub):.1f}%, max {max(r.ape for r in sub):.1f}% "
                     f"({len(sub)} rows)")
    lines += ["", "By device, precision recipe and kind (mixtures of experts are out of the "
              "efficiency fit; they fit one token-path figure per device kind, `mpmd validate "
              "--fit-moe`):", ""]
    for label, sub in recipe_groups(results):
        lines.append(f"- {label}: mean {mape(sub):.1f}%, max {max(r.ape for r in sub):.1f}% "
                     f"({len(sub)} rows)")
    lines.append("")
    for src in dict.fromkeys(r.row.source for r in results):
        sub = [r for r in results if r.row.source == src]
        lines.append(f"- {src}: mean {mape(sub):.1f}%, max {max(r.ape for r in sub):.1f}% "
                     f"({len(sub)} rows)")
    lines += ["", *memory_lines(memory)]
    lines += ["", "## Zero-bubble schedule ranking (higher samples/GPU/s first)", "",
              "| group | measured order | simulated order | agrees |", "|---|---|---|---|"]
    for g, m, p, ok in rankings:
        mo = " > ".join(f"{k} {m[k]:.2f}" for k in sorted(m, key=lambda k: -m[k]))
        po = " > ".join(f"{k} {p[k]:.2f}" for k in sorted(p, key=lambda k: -p[k]))
        lines.append(f"| {g} | {mo} | {po} | {'yes' if ok else 'NO'} |")
    lines += ["", f"Groups ranked correctly: {sum(x[3] for x in rankings)}/{len(rankings)} "
              "(measured ties accept either order).", ""]
    if fit_info:
        lines += [fit_info, ""]
    if skipped:
        lines += ["## Not simulated", "", "| line | source | model | reason |", "|---|---|---|---|"]
        lines += [f"| {k.line} | {_cell(k.source)} | {_cell(k.model)} | {_cell(k.reason)} |"
                  for k in skipped]
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (``|`` escaped; blank as ``-``)."""
    return text.replace("|", "\\|") or "-"


def _origin(device: str, rows, f) -> str:
    sources = ", ".join(dict.fromkeys(r.source for r in rows))
    return (f"fitted by `{FIT_COMMAND}` over the {len(rows)} {device} rows of the published-training "
            f"CSV (sources: {sources}), minimising the mean absolute percentage error of the "
            f"simulated metric (scipy bounded search over matmul efficiency for each "
            f"elementwise-traffic fraction): MAPE {f.mape:.1f}%, {f.disagreements} zero-bubble "
            f"groups ranked wrongly")


def fit_section(device: str, f, loso, written: str | None) -> str:
    """The Markdown section of one device kind's fit (values, trials, leave-one-source-out)."""
    trials = "; ".join(f"elementwise {ew:g} -> matmul {e:.3f}, MAPE {m:.2f}%, "
                       f"{bad} groups ranked wrongly" for o, ew, e, m, bad in f.trials)
    where = f"Written to `{written}`." if written else "Not written (no `--profiles-out`)."
    lines = [f"## Calibration: {device}", "",
             f"Fitted over its rows ({f.evaluations} evaluations, step times from "
             f"`planner.predict`): matmul efficiency **{f.matmul:.3f}**, elementwise traffic "
             f"**{f.elementwise:g}**, memory efficiency {f.memory:.3f} (held), fragment overhead "
             f"{f.overhead_s * 1e6:g} us; fit MAPE {f.mape:.2f}%. Trials: {trials}. {where}", ""]
    if not loso:
        lines += ["Leave-one-source-out: not possible, every row of this kind comes from one "
                  "source.", ""]
    if loso:
        lines += ["Leave-one-source-out (fit on the other sources, test on the held-out one):", "",
                  "| held out | fitted matmul | train MAPE | held-out MAPE |", "|---|---|---|---|"]
        lines += [f"| {src} | {fr.matmul:.3f} | {fr.mape:.1f}% | {err:.1f}% |"
                  for src, (fr, err) in loso.items()]
    return "\n".join(lines)


@click.command()
@click.option("--fit", is_flag=True,
              help="Fit each device kind's efficiency values over its rows (printed; the "
                   "profiles are written only with --profiles-out).")
@click.option("--fit-moe", is_flag=True,
              help="Fit only each device kind's mixture-of-experts token-path time over its "
                   "MoE rows, every other efficiency held (--fit does it last).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=str(DEFAULT_CSV),
              show_default=True, help="Published-training CSV.")
@click.option("--out", type=click.Path(), default=None,
              help="Write the Markdown report here (default: print only; the bundled report is "
                   "reports/validation/validation.md).")
@click.option("--profiles-out", type=click.Path(), default=None,
              help="With --fit: write each fitted device profile (DEVICE.yaml) into this folder; "
                   "hardware_profiles/devices updates the bundled ones.")
@click.option("--strict", is_flag=True,
              help="A row that cannot be simulated is an error (exit 2) instead of being "
                   "listed under 'Not simulated'.")
@click.option("--hold-elementwise", is_flag=True,
              help="With --fit: keep each profile's elementwise-traffic fraction instead of "
                   "searching the grid (six times fewer evaluations).")
@click.option("--layers", "layers_csv", type=click.Path(dir_okay=False), default=None,
              help="Instead: layer timings measured on one accelerator "
                   "(benchmarks/bench_device_layers.py) against the cost model.")
@click.option("--profile", default=None,
              help="With --layers: the device profile to predict on (default: the one of "
                   "the rows' device kind).")
@click.option("--serving", is_flag=True,
              help="Instead: published serving measurements (default CSV "
                   "reports/validation/published_serving.csv) against the serving cost "
                   "model; with --fit, fit each chip's serving parameters.")
@guard
def validate(fit: bool, csv_path: str, out: str | None, profiles_out: str | None,
             strict: bool, hold_elementwise: bool = False, layers_csv: str | None = None,
             profile: str | None = None, serving: bool = False, fit_moe: bool = False) -> None:
    """Check the simulator against published training runs (per-row table, MAPE, zb ranking).

    Every row is simulated on its own device's profile (the CSV's ``device`` column). A row
    that cannot be (an unknown policy, device or metric, an impossible layout, ...) is skipped
    and listed with its reason; exit 0 when at least one row is scored (--strict: exit 2 on
    the first skipped row).
    """
    from ir.files import check_output

    if profile and not layers_csv:
        raise click.BadParameter("--profile needs --layers; add --layers CSV or drop it")
    if profiles_out and not (fit or fit_moe):
        raise click.BadParameter("--profiles-out needs --fit or --fit-moe; add one or drop it")
    if out:                 # the outputs before any work: a bad path fails at once
        check_output(out, "validation report")
    if profiles_out:
        check_output(profiles_out, "fitted profiles", folder=True)
    if serving:
        from mpmd.cli import validate_serving
        validate_serving.run(None if csv_path == str(DEFAULT_CSV) else csv_path, fit,
                             profiles_out, out, console)
        return
    if layers_csv:
        from mpmd.cli import validate_layers
        validate_layers.run(layers_csv, profile, out, console)
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from hardware_profiles.loader import DEVICES_DIR, load_device
    from ir.files import write_atomic
    import dataclasses

    from simulator import validate as V
    from simulator.scale_fit import fit_jitter, scale_section

    t0 = time.time()
    rows, skipped = V.load_rows_lenient(csv_path, fill=model_fill(csv_path))
    total = len(rows) + len(skipped)
    _check(skipped, strict, csv_path, total, scored=len(rows))
    errors = row_errors()
    devices = {d: load_device(d) for d in dict.fromkeys(r.device for r in rows)}
    columns = (TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"costing {len(rows)} rows", total=len(rows))
        setups, bad = V.row_setups(rows, workload_for, step_fn=predict_step, devices=devices,
                                   errors=errors, advance=lambda: bar.advance(task))
        skipped += bad
        _check(skipped, strict, csv_path, total, scored=len(setups))
        # every row is timed once on its profile before anything is fitted, so --fit skips
        # the rows that plain `mpmd validate` skips
        task = bar.add_task("predicting every row", total=len(setups))
        preds, bad = V.evaluate_rows(setups, devices, predict_step, errors=errors,
                                     advance=lambda: bar.advance(task))
        skipped += bad
        _check(skipped, strict, csv_path, total, scored=len(preds))
    setups = tuple(p.setup for p in preds)
    fit_info: list[str] = []
    if fit:
        done: list[str] = []          # the kinds fitted on their own BF16 rows, in order
        joint: dict[str, tuple] = {}  # kind -> (fit, origin, jitter origin, base) of its group
        # kinds with BF16 rows first: a kind with none takes its chip's fitted efficiencies
        def own_rows(n: str) -> int:
            return sum(1 for s in setups if s.row.device == n and not s.row.low_precision
                       and not held_out(s))

        # kinds with BF16 rows first, the fewest last (they may lean on their chip's fit)
        order = sorted(devices, key=lambda n: (not own_rows(n), 0 < own_rows(n) < FEW_ROWS))
        for name in order:
            base = devices[name]
            grid = (base.elementwise_traffic,) if hold_elementwise else V.ELEMENTWISE_GRID
            # its own efficiencies: the rows in a compute dtype (bf16, or fp16 where the
            # device has no bf16), its memory twins' with them (one part, one fit); a
            # low-precision recipe's rows fit that recipe's efficiency
            group = [name] + memory_twins(name, devices)
            first = next((n for n in group[1:] if n in joint), None)
            mine = [s for s in setups if s.row.device in group and not s.row.low_precision
                    and not held_out(s)]
            low: dict[str, list] = {}
            for s in setups:
                if s.row.device == name and s.row.low_precision and not held_out(s):
                    low.setdefault(s.row.recipe, []).append(s)
            if not mine:
                twin = _same_chip(base, devices, done)
                if low and twin is not None:    # its BF16 efficiencies are its chip's, fitted
                    devices[name] = V.with_efficiency(
                        base, twin.matmul_efficiency, twin.memory_efficiency,
                        twin.fragment_overhead, twin.elementwise_traffic)
                    formats = fit_formats(name, low, devices, fit_info)
                    origin = (f"as {twin.name} (the same chip, {base.chip}), whose BF16 runs "
                              f"`{FIT_COMMAND}` fitted: {name} has no BF16 row in the CSV")
                    fit_info.append(f"## Calibration: {name}\n\nBF16 efficiencies {origin}.")
                    if profiles_out:
                        twin_out = Path(profiles_out) / f"{name}.yaml"
                        write_profile_efficiency(
                            DEVICES_DIR / f"{name}.yaml", twin.matmul_efficiency,
                            twin.memory_efficiency, twin.fragment_overhead * 1e6, origin,
                            twin.elementwise_traffic, out=twin_out,
                            extra=extra_efficiency(base, None))
                        write_training_formats(twin_out, formats)
                continue
            twin = _same_chip(base, devices, done) if len(mine) < FEW_ROWS else None
            if twin is not None:    # too few rows for more than one figure: the matmul alone
                base = V.with_efficiency(base, base.matmul_efficiency, twin.memory_efficiency,
                                         twin.fragment_overhead, twin.elementwise_traffic)
                grid = (twin.elementwise_traffic,)
            done.append(name)
            if first is not None:           # fitted with its memory twin: the same values
                f, origin, jitter_origin, fitted = joint[first]
                base = dataclasses.replace(base, sync_jitter=fitted.sync_jitter)
                devices[name] = V.with_efficiency(base, f.matmul, f.memory, f.overhead_s,
                                                  f.elementwise)
                formats = fit_formats(name, low, devices, fit_info)
                written = None
                if profiles_out:
                    written = str(Path(profiles_out) / f"{name}.yaml")
                    write_profile_efficiency(DEVICES_DIR / f"{name}.yaml", f.matmul, f.memory,
                                             f.overhead_s * 1e6, origin, f.elementwise,
                                             out=Path(written),
                                             extra=extra_efficiency(base, jitter_origin))
                    if low:
                        write_training_formats(Path(written), formats)
                line = (f"## Calibration: {name}\n\nFitted with {first} as one part (they differ "
                        f"in memory capacity only): matmul efficiency **{f.matmul:.3f}**, "
                        f"elementwise traffic **{f.elementwise:g}** (see {first}). "
                        + (f"Written to `{written}`." if written else
                           "Not written (no `--profiles-out`)."))
                console.print(line)
                fit_info.append(line)
                continue
            label = name if len(group) == 1 else " and ".join(group)
            with console.status(f"fitting {label} over their {len(mine)} rows ..."):
                f = V.fit(mine, base, predict_step, overheads_s=(base.fragment_overhead,),
                          elementwise=grid)
            with console.status(f"{name}: fitting sync jitter on one model's sizes ..."):
                sf = fit_jitter(mine, V.with_efficiency(base, f.matmul, f.memory, f.overhead_s,
                                                        f.elementwise), predict_step)
            jitter_origin = None
            if sf is not None and sf.jitter > 0:
                base = dataclasses.replace(base, sync_jitter=sf.jitter)
                with console.status(f"refitting {name} with sync jitter {sf.jitter:g} ..."):
                    f = V.fit(mine, base, predict_step, overheads_s=(base.fragment_overhead,),
                              elementwise=(f.elementwise,))
                    sf = fit_jitter(mine, V.with_efficiency(base, f.matmul, f.memory,
                                                            f.overhead_s, f.elementwise),
                                    predict_step)
                assert sf is not None   # the same rows: the same scale groups as the first fit
                base = dataclasses.replace(base, sync_jitter=sf.jitter)
                jitter_origin = (f"fitted by `{FIT_COMMAND}` on the {name} runs of "
                                 f"{sf.fit_group} at several sizes (the predicted drop in "
                                 f"throughput per device closest to the measured one); "
                                 f"checked on the kind's other such groups in "
                                 f"reports/validation/validation.md")
            loso = {}
            if len({s.row.source for s in mine}) == 1:
                console.print(f"{name}: one source ({mine[0].row.source}); "
                              f"leave-one-source-out needs two")
            if len({s.row.source for s in mine}) > 1:
                with console.status(f"{name}: leave-one-source-out fits ..."):
                    loso = V.leave_one_source_out(mine, base, predict_step,
                                                  overheads_s=(f.overhead_s,),
                                                  elementwise=(f.elementwise,))
            devices[name] = V.with_efficiency(base, f.matmul, f.memory, f.overhead_s,
                                              f.elementwise)
            origin = _origin(label, [s.row for s in mine], f)
            if twin is not None:
                origin += (f"; only the matmul efficiency: its memory efficiency, dispatch "
                           f"overhead and elementwise fraction are {twin.name}'s (the same chip, "
                           f"{base.chip}; fewer than {FEW_ROWS} BF16 rows)")
            joint[name] = (f, origin, jitter_origin, base)
            formats = fit_formats(name, low, devices, fit_info)
            written = None
            if profiles_out:
                written = str(Path(profiles_out) / f"{name}.yaml")
                write_profile_efficiency(DEVICES_DIR / f"{name}.yaml", f.matmul, f.memory,
                                         f.overhead_s * 1e6, origin,
                                         f.elementwise, out=Path(written),
                                         extra=extra_efficiency(base, jitter_origin))
                if low:
                    write_training_formats(Path(written), formats)
            section = fit_section(label, f, loso, written) + "\n\n" + scale_section(label, sf)
            console.print(section)
            fit_info.append(section)
    if fit or fit_moe:      # last: every other efficiency of each kind is held
        from mpmd.cli.validate_moe import fit_moe as fit_token_paths
        fit_token_paths(setups, devices, predict_step, console, fit_info, profiles_out,
                        held_out)
        fit = True          # the report re-predicts every row with the fitted profiles
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("simulating every row", total=(2 if fit else 1) * len(setups))
        results, bad = V.evaluate_rows(setups, devices, V.sim_step, errors=errors,
                                       advance=lambda: bar.advance(task))
        skipped += bad
        if fit:
            preds, bad = V.evaluate_rows([r.setup for r in results], devices, predict_step,
                                         errors=errors, advance=lambda: bar.advance(task))
            skipped += bad
    both = {p.row.line for p in preds}
    results = tuple(r for r in results if r.row.line in both)
    skipped = tuple(sorted(skipped, key=lambda k: k.line))
    _check(skipped, strict, csv_path, total, scored=len(results))
    pred = {p.row.line: p for p in preds}
    agree = max(abs(r.step_s / pred[r.row.line].step_s - 1) for r in results)
    rankings = V.zb_rankings(results)
    kinds = ", ".join(f"{d.name} (matmul eff {d.matmul_efficiency:.3f})"
                      for d in devices.values())
    t = Table(title=f"validation: {len(results)} published runs on {kinds}",
              title_justify="left")
    memory = {r.row.line: memory_fit(r.setup, devices[r.row.device]) for r in results}
    for c in ("source", "model", "device", "gpus", "tp/pp/dp", "mb x M", "schedule", "assumed",
              "predicted", "measured", "err %", "memory"):
        t.add_column(c, justify="right" if c in ("gpus", "predicted", "measured", "err %") else "left")
    for r in results:
        s = r.setup
        dev = r.row.device + ("" if r.row.precision == "bf16" else f" {r.row.precision}")
        t.add_row(r.row.source, r.row.model, dev, str(r.row.gpus),
                  f"{r.row.tp}/{r.row.pp}/{r.row.dp}" + (f" cp{r.row.cp}" if r.row.cp > 1 else ""), f"{s.micro_batch}x{s.microbatches}",
                  s.schedule, "; ".join(s.assumptions) or "-", _fmt(r.predicted),
                  _fmt(r.row.value), f"{r.ape:.1f}", str(memory[r.row.line] or "-"))
    console.print(t)
    console.print(f"{scored_line(len(results), total)}   mean abs % error {V.mape(results):.1f}%"
                  f"   max {max(r.ape for r in results):.1f}%"
                  f"   predict vs simulate: max {agree * 100:.2f}% apart")
    for dev in devices:
        sub = [r for r in results if r.row.device == dev]
        if sub:
            console.print(f"  {dev}: mean abs % error {V.mape(sub):.1f}%   max "
                          f"{max(r.ape for r in sub):.1f}%   ({len(sub)} rows)")
    for label, sub in recipe_groups(results):
        console.print(f"    {label}: mean {V.mape(sub):.1f}%   max {max(r.ape for r in sub):.1f}%"
                      f"   ({len(sub)} rows)")
    for line in memory_lines(memory):
        console.print(line[0].lower() + line[1:])
    for g, m, p, ok in rankings:
        console.print(f"zb ranking {g}: {'agrees' if ok else 'DISAGREES'}")
    if skipped:
        console.print(f"not simulated ({len(skipped)} rows):", highlight=False)
        for k in skipped:
            console.print(f"  line {k.line} {k.source or '-'}/{k.model or '-'}: {k.reason}",
                          highlight=False, markup=False, soft_wrap=True)
    if out:
        md = render(results, rankings, agree, "\n\n".join(fit_info), csv_path,
                    time.time() - t0, skipped=skipped, total=total, memory=memory)
        write_atomic(Path(out), md)
        console.print(f"wrote {out}")


def row_errors() -> tuple[type[BaseException], ...]:
    """What skips a row rather than the run: :data:`simulator.validate.ROW_ERRORS`, the model
    zoo's ``ZooError`` (a row's decoder the zoo cannot build) and ``ProfileError`` (a precision
    recipe the row's device does not run)."""
    from hardware_profiles.types import ProfileError
    from zoo import ZooError
    from simulator.validate import ROW_ERRORS

    return ROW_ERRORS + (ZooError, ProfileError)


def scored_line(scored: int, total: int) -> str:
    return f"{scored} of {total} rows scored"


def _check(skipped, strict: bool, csv_path: str, total: int, scored: int) -> None:
    """With ``strict``, the first skipped row is an error; in any case, so is no row left
    (``scored`` 0).

    Raises:
        simulator.validation_rows.ValidationError: one line naming the row and the reason.
    """
    from simulator.validation_rows import ValidationError

    if strict and skipped:
        first = min(skipped, key=lambda k: k.line)
        raise ValidationError(f"{first.message} (--strict: every row must be simulated; fix the "
                              f"row or drop --strict)")
    if not scored:
        first = min(skipped, key=lambda k: k.line) if skipped else None
        why = f"; the first: {first.message}" if first else ""
        raise ValidationError(f"{csv_path}: none of its {total} rows can be simulated{why}")
