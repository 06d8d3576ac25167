"""``mpmd serve-plan``: a serving deployment for a decoder on a cluster, within TTFT and TPOT
objectives (:func:`planner.serving.plan_serving`): each family's best (one kind colocated, every kind
colocated, prefill on one kind and decode on another) replayed in the discrete-event simulator,
ranked by $/M output tokens, the best printed in full; ``--out`` writes them as JSON and
``--trace`` the best plan's simulated timeline as a Perfetto trace."""

from __future__ import annotations

import math

import click

from mpmd.cli.common import console, guard
from mpmd.cli.params import FiniteFloat

PRECISION_FORM = "FORMAT[,PART=FORMAT...], e.g. 'bfp8,gate_up=bfp4'"
"""How a ``--precision`` value is written (after an optional ``KIND:``)."""


def check_precision(item: str, precision: str) -> None:
    """Check one precision, ``FORMAT[,PART=FORMAT...]`` (what :func:`zoo.inference.parse_precision`
    reads), naming the malformed piece of the ``--precision`` value ``item`` and the expected form.

    Raises:
        click.BadParameter: an empty piece, a first piece that is not a format, or a later one
            that is not ``PART=FORMAT`` with a known part and format.
    """
    from ir.serving import WEIGHT_FORMATS
    from zoo.inference import PARTS

    formats, parts = ", ".join(WEIGHT_FORMATS), ", ".join(PARTS)
    for i, piece in enumerate(s.strip() for s in precision.split(",")):
        part, sep, fmt = piece.partition("=") if i else ("", "", piece)
        if i == 0 and fmt not in WEIGHT_FORMATS:
            why = f"starts with {fmt!r}, not a format (one of {formats})"
        elif i and not (sep and part in PARTS and fmt in WEIGHT_FORMATS):
            why = (f"item {piece!r} is not PART=FORMAT (PART one of {parts}; FORMAT one of "
                   f"{formats})")
        else:
            continue
        raise click.BadParameter(f"{item!r}: {why}; write [KIND:]{PRECISION_FORM}",
                                 param_hint="--precision")


def parse_precisions(items: tuple[str, ...]) -> tuple[str, dict[str, str]]:
    """``("bf16", "blackhole-p150b:bfp8,gate_up=bfp4")`` -> ``("bf16", {"blackhole-p150b": ...})``:
    the default precision (the last item without a ``KIND:`` prefix, else bf16) and per-kind ones.

    Raises:
        click.BadParameter: a malformed item (:func:`check_precision`), or ``:`` with no kind.
    """
    default, per = "bf16", {}
    for item in items:
        head, sep, rest = item.partition(":")
        if sep and "=" not in head and "," not in head:
            if not head.strip():
                raise click.BadParameter(f"{item!r} has no device kind before ':'; write "
                                         f"KIND:{PRECISION_FORM}, or drop the ':'",
                                         param_hint="--precision")
            check_precision(item, rest)
            per[head] = rest
        else:
            check_precision(item, item)
            default = item
    return default, per


def plan_to_json(plan) -> dict:
    """A :class:`planner.serving.ServingPlan` as a JSON document (SI units)."""
    return {"family": plan.family, "devices": plan.devices, "rate_per_s": plan.rate_per_s,
            "output_tokens_per_s": plan.output_tokens_per_s, "ttft_s": plan.ttft_s,
            "tpot_s": plan.tpot_s, "usd_per_m_tokens": plan.usd_per_m_tokens,
            "kwh_per_m_tokens": plan.kwh_per_m_tokens, "checked": plan.checked,
            "note": plan.note,
            "pools": [{"group": p.group, "device": p.device, "role": p.role, "tp": p.tp,
                       "replicas": p.replicas, "max_batch": p.max_batch,
                       "precision": p.precision} for p in plan.pools]}


def _fmt(x: float | None, spec: str, none: str = "-") -> str:
    return none if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


@click.command("serve-plan")
@click.option("--model", required=True,
              help="Zoo model name (e.g. llama3-70b) or a Hugging Face config.json.")
@click.option("--cluster", "cluster_path", required=True, type=click.Path(dir_okay=False),
              help="Cluster spec YAML with node groups (hardware as bought).")
@click.option("--prompt", type=click.IntRange(1, 1 << 20), required=True,
              help="Mean prompt length, tokens.")
@click.option("--output", type=click.IntRange(1, 1 << 20), required=True,
              help="Mean output length, tokens.")
@click.option("--ttft", type=FiniteFloat(min=1e-6, max=1e6), default=None,
              help="Time-to-first-token objective at the percentile, seconds (default: none).")
@click.option("--tpot", type=FiniteFloat(min=1e-6, max=1e6), default=None,
              help="Time-per-output-token objective at the percentile, seconds (default: "
                   "none).")
@click.option("--percentile", type=FiniteFloat(min=1, max=100), default=99.0,
              show_default=True, help="Percentile of requests the objectives hold at.")
@click.option("--precision", "precisions", multiple=True,
              help="Weight precision: a format (bf16, fp8, bfp8, ...) with optional part "
                   "overrides ('bfp8,gate_up=bfp4'); KIND:PRECISION sets one device kind's "
                   "(repeatable). Default bf16.")
@click.option("--kv-format", default="bf16", show_default=True, help="KV-cache format.")
@click.option("--spread", type=FiniteFloat(0, 0.99), default=0.0, show_default=True,
              help="Request lengths drawn uniformly within +/- this fraction of the means.")
@click.option("--requests", type=click.IntRange(20, 100000), default=300, show_default=True,
              help="Requests each simulated check serves.")
@click.option("--out", type=click.Path(), default=None,
              help="Write the plans as JSON here.")
@click.option("--trace", type=click.Path(), default=None,
              help="Write the best plan's simulated timeline as a Perfetto trace here.")
@guard
def serve_plan(model: str, cluster_path: str, prompt: int, output: int, ttft: float | None,
               tpot: float | None, percentile: float, precisions: tuple[str, ...], kv_format: str,
               spread: float, requests: int, out: str | None, trace: str | None) -> None:
    """Plan how to serve MODEL on CLUSTER within the TTFT / TPOT objectives.

    Tries every node group colocated, all of them colocated, and prefill on one kind with
    decode on another (the KV cache sent over the link between them), searches tensor-parallel
    degree, replicas and batch on the serving cost model, replays each family's best in the
    simulator (Poisson arrivals) and prints them ranked by $ per million output tokens."""
    import json

    from hardware_profiles.paths import resolve_cluster_path
    from ir.files import check_output, write_atomic
    from ir.serving import WEIGHT_FORMATS
    from zoo.model_files import resolve_model

    # the input first, before the planner loads: outputs, flags, the model, the cluster path
    if out:
        check_output(out, "serving plans JSON")
    if trace:
        check_output(trace, "trace")
    default, per_kind = parse_precisions(precisions)
    if kv_format not in WEIGHT_FORMATS:
        raise click.BadParameter(f"{kv_format!r} is not a format; use one of "
                                 f"{', '.join(WEIGHT_FORMATS)}", param_hint="--kv-format")
    ttft = math.inf if ttft is None else ttft
    tpot = math.inf if tpot is None else tpot
    cfg = resolve_model(model)
    path = resolve_cluster_path(cluster_path)
    from hardware_profiles.cluster_loader import load_cluster
    from ir import RequestMix, ServiceObjectives
    from planner.serving import plan_serving, serving_groups
    from zoo.inference import inference_model

    cluster = load_cluster(path)
    groups = serving_groups(cluster)
    unknown = sorted(set(per_kind) - {g.device.name for g in groups.values()})
    if unknown:
        raise click.BadParameter(f"--precision names {', '.join(unknown)}, which the cluster "
                                 f"does not have; its kinds: "
                                 f"{', '.join(sorted({g.device.name for g in groups.values()}))}")
    models = {name: inference_model(cfg, per_kind.get(g.device.name, default), kv_format)
              for name, g in groups.items()}
    mix = RequestMix(prompt, output, spread=spread)
    slo = ServiceObjectives(ttft, tpot, percentile)
    plans = plan_serving(models, cluster, mix, slo, requests=requests)
    best = plans[0]
    p = f"p{percentile:g}"
    console.print(f"serving {cfg.name} on {cluster.name}: prompt {prompt}, output {output} "
                  f"tokens; objectives {p} TTFT <= {ttft:g} s, TPOT <= {tpot:g} s",
                  highlight=False, markup=False)
    from rich.table import Table

    table = Table(title="Best deployment of each family (simulated, Poisson arrivals)")
    for col in ("family", "devices", "req/s", "tokens/s", "tokens/s/user",
                f"TTFT {p}", f"TPOT {p}", "$/M tokens", "kWh/M tokens"):
        table.add_column(col, justify="left" if col == "family" else "right")
    for plan in plans:
        ok = plan.rate_per_s > 0
        table.add_row(plan.family, str(plan.devices), _fmt(plan.rate_per_s, ".2f"),
                      _fmt(plan.output_tokens_per_s, ",.0f"),
                      _fmt(1 / plan.tpot_s if plan.tpot_s > 0 else None, ".1f"),
                      _fmt(plan.ttft_s, ".3f") + " s", _fmt(plan.tpot_s * 1e3, ".1f") + " ms",
                      _fmt(plan.usd_per_m_tokens, ".3f") if ok else "misses",
                      _fmt(plan.kwh_per_m_tokens, ".3f"))
    console.print(table)
    console.print(f"plan: {best.family}" + (f" ({best.note})" if best.note else ""),
                  highlight=False, markup=False)
    for pool in best.pools:
        console.print(f"  {pool.replicas} x {pool.device} tp{pool.tp} ({pool.role}, max batch "
                      f"{pool.max_batch}, {pool.precision})", highlight=False, markup=False)
    single = [x for x in plans if x.family.startswith("colocated ") and "," not in x.family
              and x.rate_per_s > 0]
    if best.rate_per_s <= 0:
        console.print("no family meets the objectives in simulation; see the notes above",
                      highlight=False, markup=False)
    elif single and best not in single:
        s = min(single, key=lambda x: x.usd_per_m_tokens or math.inf)
        console.print(f"beats the best single-kind plan ({s.family}: "
                      f"${_fmt(s.usd_per_m_tokens, '.3f')}/M tokens) on $/M tokens",
                      highlight=False, markup=False)
    elif len(groups) > 1:
        console.print(f"a single kind is cheapest: {best.family}; mixing kinds costs more per "
                      "token here (see the table)", highlight=False, markup=False)
    for plan in plans:
        if plan.note and plan is not best:
            console.print(f"  note, {plan.family}: {plan.note}", highlight=False, markup=False)
    if out:
        write_atomic(out, json.dumps({"model": cfg.name, "cluster": cluster.name,
                                      "prompt_tokens": prompt, "output_tokens": output,
                                      "objectives": {
                                          "ttft_s": ttft if math.isfinite(ttft) else None,
                                          "tpot_s": tpot if math.isfinite(tpot) else None,
                                          "percentile": percentile},
                                      "plans": [plan_to_json(x) for x in plans]},
                                     indent=1, default=str) + "\n")
        console.print(f"wrote {out}", highlight=False, markup=False)
    if trace and best.result is not None:
        from simulator.trace import write_chrome_trace

        write_chrome_trace(best.result.timeline, trace)
        console.print(f"wrote {trace}", highlight=False, markup=False)
