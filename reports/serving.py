"""Serving what-if reports: which hardware serves a model cheapest at one service-level objective.

An example (``reports/examples/*.yaml``) with a ``serving:`` section lists cluster options; each is
planned by :func:`planner.serving.plan_serving` (every family, replayed in the serving simulator)
and the report shows each option's best deployment: requests/s, output tokens/s, tokens/s per
user, p-th percentile TTFT and TPOT, $ and kWh per million output tokens, and why an option misses.
It is written as HTML (self-contained, a bar chart inline), CSV and Markdown, like the training
what-ifs (:mod:`reports.render`).
"""

from __future__ import annotations

import base64
import html
import io
import math
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from ir import RequestMix, ServiceObjectives
from planner.errors import PlannerError
from planner.serving import plan_serving, serving_groups
from reports.errors import ReportError
from reports.spec import to_option
from zoo.inference import inference_model
from zoo.model_files import resolve_model

SERVING_KEYS = {"prompt", "output", "ttft_s", "tpot_s", "percentile", "precision", "kv_format",
                "spread", "requests"}
COLUMNS = ("option", "devices", "plan", "req/s", "tokens/s", "tokens/s/user", "TTFT", "TPOT",
           "$/M tokens", "kWh/M tokens", "note")


def _spec(serving: Mapping[str, Any]) -> tuple[RequestMix, ServiceObjectives, dict]:
    bad = set(serving) - SERVING_KEYS
    if bad:
        raise ReportError(f"serving: unknown keys {sorted(bad)}; use {sorted(SERVING_KEYS)}")
    try:
        mix = RequestMix(int(serving["prompt"]), int(serving["output"]),
                         spread=float(serving.get("spread", 0.0)))
        slo = ServiceObjectives(float(serving.get("ttft_s", math.inf)),
                                float(serving.get("tpot_s", math.inf)),
                                float(serving.get("percentile", 99.0)))
    except KeyError as e:
        raise ReportError(f"serving: {e.args[0]!r} is required (prompt and output, in tokens)") from None
    except (TypeError, ValueError) as e:
        raise ReportError(f"serving: {e}") from None
    prec = serving.get("precision") or {}
    if isinstance(prec, str):
        prec = {"default": prec}
    return mix, slo, dict(prec)


def _pools_text(plan) -> str:
    return "; ".join(f"{p.replicas} x {p.device} tp{p.tp} {p.role} (batch {p.max_batch}, "
                     f"{p.precision})" for p in plan.pools) or "-"


def serving_whatif(model: str, serving: Mapping[str, Any], options, *, base_dir: Path | None = None,
                   title: str | None = None,
                   progress: Callable[[int, int, str], None] | None = None) -> pd.DataFrame:
    """One row per option: its cheapest deployment meeting the objectives (or why none does).

    ``df.attrs`` holds ``title``, ``recommendation``, ``objectives`` and ``families`` (every
    family's figures per option).

    Raises:
        ReportError: a bad ``serving`` section or option (one line).
    """
    cfg = resolve_model(model)
    mix, slo, prec = _spec(serving)
    kv_format = str(serving.get("kv_format", "bf16"))
    requests = int(serving.get("requests", 300))
    opts = [to_option(o, base_dir) for o in options]
    rows, families = [], []
    for i, opt in enumerate(opts):
        if progress:
            progress(i, len(opts), opt.label)
        groups = serving_groups(opt.cluster)
        models = {n: inference_model(cfg, prec.get(g.device.name, prec.get("default", "bf16")),
                                     kv_format) for n, g in groups.items()}
        try:
            plans = plan_serving(models, opt.cluster, mix, slo, requests=requests)
        except PlannerError as e:
            rows.append({"option": opt.label, "devices": opt.cluster.num_devices, "plan": "-",
                         "note": str(e).split(" (", 1)[-1].rsplit("); fix", 1)[0]})
            continue
        for p in plans:
            families.append({"option": opt.label, "family": p.family,
                             "tokens/s": p.output_tokens_per_s, "$/M tokens": p.usd_per_m_tokens,
                             "note": p.note})
        best = plans[0]
        ok = best.rate_per_s > 0
        rows.append({"option": opt.label, "devices": best.devices if ok else opt.cluster.num_devices,
                     "plan": f"{best.family}: {_pools_text(best)}" if ok else "-",
                     "req/s": best.rate_per_s if ok else None,
                     "tokens/s": best.output_tokens_per_s if ok else None,
                     "tokens/s/user": 1.0 / best.tpot_s if ok and best.tpot_s > 0 else None,
                     "TTFT": best.ttft_s if ok else None, "TPOT": best.tpot_s if ok else None,
                     "$/M tokens": best.usd_per_m_tokens if ok else None,
                     "kWh/M tokens": best.kwh_per_m_tokens if ok else None,
                     "note": best.note if ok else "; ".join(
                         f"{p.family}: {p.note}" for p in plans if p.note)})
    if progress:
        progress(len(opts), len(opts), "done")
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    p = f"p{slo.percentile:g}"
    df.attrs["title"] = title or f"What-if: serve {cfg.name}"
    df.attrs["objectives"] = (f"prompt {mix.prompt_tokens} and output {mix.output_tokens} tokens; "
                              f"{p} TTFT <= {slo.ttft_s:g} s, {p} TPOT <= {slo.tpot_s * 1e3:g} ms")
    df.attrs["families"] = families
    served = df[df["$/M tokens"].notna()]
    if served.empty:
        df.attrs["recommendation"] = "No option meets the objectives; see the notes."
    else:
        b = served.loc[served["$/M tokens"].idxmin()]
        df.attrs["recommendation"] = (
            f"{b['option']}: ${b['$/M tokens']:.3f} per million output tokens at "
            f"{b['tokens/s']:,.0f} tokens/s ({b['plan']}).")
    return df


def _cell(col: str, v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    if col in ("TTFT",):
        return f"{v:.3f} s"
    if col == "TPOT":
        return f"{v * 1e3:.1f} ms"
    if col in ("$/M tokens", "kWh/M tokens"):
        return f"{v:.3f}"
    if col in ("tokens/s",):
        return f"{v:,.0f}"
    if col in ("req/s", "tokens/s/user"):
        return f"{v:.2f}"
    return str(v)


def to_markdown(df: pd.DataFrame) -> str:
    """The report as Markdown: objectives, recommendation, the option table, every family."""
    p = df.attrs["objectives"]
    lines = [f"# {df.attrs['title']}", "", f"Objectives: {p}.", "",
             f"**Recommendation.** {df.attrs['recommendation']}", "",
             "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for _, r in df.iterrows():
        lines.append("| " + " | ".join(_cell(c, r[c]).replace("|", "\\|") for c in COLUMNS) + " |")
    lines += ["", "## Every family per option", "", "| option | family | tokens/s | $/M tokens | note |",
              "|---|---|---|---|---|"]
    for f in df.attrs["families"]:
        lines.append(f"| {f['option']} | {f['family']} | {_cell('tokens/s', f['tokens/s'] or None)} | "
                     f"{_cell('$/M tokens', f['$/M tokens'])} | {f['note'] or '-'} |")
    lines += ["", "TTFT and TPOT at the objectives' percentile, replayed in the serving simulator "
              "(Poisson arrivals, continuous batching); $ at each kind's low price per device-hour "
              "over the devices the deployment uses; `mpmd serve-plan` plans one cluster.", ""]
    return "\n".join(lines)


def _chart(df: pd.DataFrame) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    served = df[df["$/M tokens"].notna()]
    fig, ax = plt.subplots(figsize=(8, 0.5 + 0.45 * max(1, len(served))))
    ax.barh(served["option"], served["$/M tokens"], color="#4C78A8")
    ax.set_xlabel("$ per million output tokens (lower is better)")
    ax.invert_yaxis()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def to_html(df: pd.DataFrame) -> str:
    """The report as one self-contained HTML page (the chart inline as a PNG data URI)."""
    esc = html.escape
    head = "".join(f"<th>{esc(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{esc(_cell(c, r[c]))}</td>" for c in COLUMNS) + "</tr>"
                   for _, r in df.iterrows())
    fam = "".join(f"<tr><td>{esc(f['option'])}</td><td>{esc(f['family'])}</td>"
                  f"<td>{esc(_cell('tokens/s', f['tokens/s'] or None))}</td>"
                  f"<td>{esc(_cell('$/M tokens', f['$/M tokens']))}</td>"
                  f"<td>{esc(f['note'] or '-')}</td></tr>" for f in df.attrs["families"])
    png = base64.b64encode(_chart(df)).decode()
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{esc(df.attrs['title'])}</title><style>body{{font-family:sans-serif;margin:2em}}"
            "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;"
            "font-size:13px;text-align:left}</style></head><body>"
            f"<h1>{esc(df.attrs['title'])}</h1><p>Objectives: {esc(df.attrs['objectives'])}.</p>"
            f"<p><b>Recommendation.</b> {esc(df.attrs['recommendation'])}</p>"
            f"<table><tr>{head}</tr>{body}</table>"
            f"<img class='plot' alt='$ per million tokens per option' src='data:image/png;base64,{png}'>"
            "<h2>Every family per option</h2><table><tr><th>option</th><th>family</th>"
            f"<th>tokens/s</th><th>$/M tokens</th><th>note</th></tr>{fam}</table></body></html>\n")


def write_serving_report(df: pd.DataFrame, out: str | Path) -> dict[str, Path]:
    """Write ``OUT.html``, ``OUT.csv`` and ``OUT.md`` atomically (``out`` is a path stem).

    Raises:
        ReportError: ``out`` is an existing directory.
    """
    from ir.files import write_atomic
    from reports.render import report_paths

    paths = report_paths(out)
    for p in paths.values():
        p.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(paths["html"], to_html(df))
    write_atomic(paths["csv"], df.to_csv(index=False, float_format="%.6g"))
    write_atomic(paths["md"], to_markdown(df))
    return paths
