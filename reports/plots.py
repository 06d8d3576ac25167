"""Report plots as PNG bytes (matplotlib, Agg backend): no files, no external assets.

* :func:`throughput_vs_price`: throughput vs USD per hour (low price; the bar spans to the high
  price), vertical bars over the disagreeing device figures, the Pareto frontier as a step line.
* :func:`cost_vs_time`: cost to train vs time to train (training), or USD per video vs seconds per
  video (inference), with the deadline as a vertical line.
* :func:`timeline_thumbnail`: one simulated step, meshes as rows, F/B/W/all-reduce/optimizer colored.
"""

from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from reports.recommend import throughput_column
from simulator.plan_sim import plan_meshes

KIND_COLORS = {"F": "#4C78A8", "B": "#F58518", "W": "#54A24B", "allreduce": "#9D755D",
               "optimizer": "#B279A2"}
"""Timeline colors per event kind (forward, backward, weight-grad, gradient sync, optimizer)."""


def _png(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _spread(vals) -> bool:
    vals = [v for v in vals if v and math.isfinite(v) and v > 0]
    return len(vals) > 1 and max(vals) / min(vals) > 20


def throughput_vs_price(df: pd.DataFrame) -> bytes:
    """Throughput vs USD/hour, Pareto frontier marked. Returns PNG bytes."""
    col = throughput_column(df)
    unit = "tokens/s" if col == "tokens_per_s" else "videos/hour"
    ok = df[df["feasible"] & df["usd_per_hour_low"].notna()] if col in df else df.iloc[0:0]
    front = set(df.attrs.get("pareto", []))
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for r in ok.itertuples():
        y, lo, hi = getattr(r, col), getattr(r, col + "_worst"), getattr(r, col + "_best")
        on = r.option in front
        ax.errorbar([r.usd_per_hour_low], [y],
                    xerr=[[0], [r.usd_per_hour_high - r.usd_per_hour_low]],
                    yerr=[[y - lo], [hi - y]], fmt="o" if on else "s",
                    color="#D62728" if on else "#4C78A8", ms=7 if on else 5, capsize=3, lw=1)
        ax.annotate(r.option, (r.usd_per_hour_low, y), textcoords="offset points", xytext=(6, 4),
                    fontsize=7)
    f = ok[ok["option"].isin(front)].sort_values("usd_per_hour_low")
    if len(f):
        ax.step(f["usd_per_hour_low"], f[col], where="post", color="#D62728", lw=1.2, alpha=0.7,
                label="Pareto frontier (low price)")
        ax.legend(loc="lower right", fontsize=8)
    if _spread(ok["usd_per_hour_low"]):
        ax.set_xscale("log")
    if _spread(ok[col]):
        ax.set_yscale("log")
    ax.set_xlabel("USD per hour (marker: low price; bar: to the high price)")
    ax.set_ylabel(f"throughput, {unit}")
    ax.set_title("Throughput vs price", fontsize=10)
    ax.grid(True, alpha=0.3, which="both")
    return _png(fig)


def cost_vs_time(df: pd.DataFrame) -> bytes:
    """Cost vs time to train (or USD per video vs seconds per video). Returns PNG bytes."""
    training = df.attrs.get("kind", "training") == "training"
    if training and "time_to_train_days" in df:
        x, xb, xw = "time_to_train_days", "time_to_train_days_best", "time_to_train_days_worst"
        y, yb, yw = "cost_to_train_usd_low", "cost_to_train_usd_best", "cost_to_train_usd_worst"
        xl, yl, title = "time to train, days", "cost to train, USD", "Cost vs time to train"
    elif not training and "seconds_per_video" in df:
        x, y, yb, yw = "seconds_per_video", "usd_per_video_low", "usd_per_video_best", "usd_per_video_worst"
        xb = xw = None
        xl, yl, title = "seconds per video (one system)", "USD per video", "Cost vs time per video"
    else:
        x = y = None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    ok = df[df["feasible"]] if x else df.iloc[0:0]
    for r in ok.itertuples():
        xv, yv = getattr(r, x), getattr(r, y)
        if not (math.isfinite(xv) and math.isfinite(yv)):
            continue
        xerr = [[xv - getattr(r, xb)], [getattr(r, xw) - xv]] if xb else None
        ax.errorbar([xv], [yv], xerr=xerr, yerr=[[yv - getattr(r, yb)], [getattr(r, yw) - yv]],
                    fmt="o", color="#4C78A8", capsize=3, lw=1)
        ax.annotate(r.option, (xv, yv), textcoords="offset points", xytext=(6, 4), fontsize=7)
    if x:
        deadline = df.attrs.get("deadline_days")
        if training and deadline:
            ax.axvline(deadline, color="#D62728", ls="--", lw=1, label=f"deadline {deadline:g} days")
            ax.legend(loc="best", fontsize=8)
        if len(ok) and _spread(ok[x]):
            ax.set_xscale("log")
        if len(ok) and _spread(ok[y]):
            ax.set_yscale("log")
        ax.set_xlabel(xl + " (bar: best-worst device figures)" if xb else xl)
        ax.set_ylabel(yl + " (low price; bar: best-worst)")
        ax.set_title(title, fontsize=10)
    else:
        ax.text(0.5, 0.5, "no token budget given (--tokens)", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    ax.grid(True, alpha=0.3, which="both")
    return _png(fig)


def timeline_thumbnail(plan, sim, width: float = 6.0) -> bytes:
    """One simulated step: a row per mesh (pipeline order; a data-parallel plan's parts one after
    another), compute events colored by kind."""
    meshes = list(plan_meshes(plan))
    rows = {m: i for i, m in enumerate(meshes)}
    spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in sim.timeline.events:
        if e.track.endswith("/compute") and e.mesh in rows:
            spans.setdefault((e.mesh, e.kind), []).append((e.start_s, e.end_s - e.start_s))
    height = min(6.0, 0.9 + 0.16 * len(meshes))
    fig, ax = plt.subplots(figsize=(width, height))
    seen = set()
    for (m, kind), xs in spans.items():
        ax.broken_barh(xs, (rows[m] - 0.4, 0.8), facecolors=KIND_COLORS.get(kind, "#888888"),
                       linewidth=0, label=None if kind in seen else kind)
        seen.add(kind)
    ax.set_ylim(len(meshes) - 0.5, -0.5)
    ax.set_xlim(0, sim.step_time_s or 1.0)
    step = max(1, len(meshes) // 12)
    ax.set_yticks(range(0, len(meshes), step))
    ax.set_yticklabels(meshes[::step], fontsize=6)
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("seconds", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=KIND_COLORS.get(k, "#888888")) for k in KIND_COLORS
               if k in seen]
    ax.legend(handles, [k for k in KIND_COLORS if k in seen], fontsize=6, ncol=5,
              loc="upper center", bbox_to_anchor=(0.5, -0.28 if len(meshes) < 4 else -0.12),
              frameon=False)
    return _png(fig, dpi=90)
