"""The Pareto frontier (throughput vs USD per hour) and a plain-language recommendation."""

from __future__ import annotations

import math

import pandas as pd


def throughput_column(df: pd.DataFrame) -> str:
    """``tokens_per_s`` for training runs, ``videos_per_hour`` for inference."""
    return "tokens_per_s" if df.attrs.get("kind", "training") == "training" else "videos_per_hour"


def pareto_front(df: pd.DataFrame) -> list[str]:
    """Labels of the feasible options no other option beats on both throughput and low price.

    An option is dominated when another costs at most as much per hour (low price) and delivers at
    least as much throughput, one of them strictly. Returned in ascending price order.
    """
    col = throughput_column(df)
    if col not in df or not df["feasible"].any():
        return []
    ok = df[df["feasible"] & df["usd_per_hour_low"].notna()]
    front = []
    for i, r in ok.iterrows():
        dominated = any((o["usd_per_hour_low"] <= r["usd_per_hour_low"] and o[col] >= r[col]
                         and (o["usd_per_hour_low"] < r["usd_per_hour_low"] or o[col] > r[col]))
                        for j, o in ok.iterrows() if j != i)
        if not dominated:
            front.append((r["usd_per_hour_low"], r["option"]))
    return [label for _, label in sorted(front)]


def _money(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    if x >= 1e6:
        return f"${x / 1e6:.2f}M"
    if x >= 1e3:
        return f"${x / 1e3:.1f}k"
    return f"${x:.2f}" if x >= 1 else f"${x:.3f}"


def _mrange(lo: float, hi: float) -> str:
    a, b = _money(lo), _money(hi)
    return a if a == b else f"{a}-{b}"


def _energy(kwh: float) -> str:
    return f"{kwh / 1e3:,.0f} MWh" if kwh >= 1e4 else f"{kwh:,.0f} kWh"


def _price_caveat(df: pd.DataFrame, win) -> str:
    """A warning when the winner's price is an amortized purchase price that leaves power out."""
    devs = [d.split(" ", 1)[1] for d in str(win.devices).split(" + ")]
    amortized = sorted({f["device"] for f in df.attrs.get("figures", [])
                        if f["figure"] == "price per device-hour" and f["device"] in devs
                        and "excludes power" in f["source"]})
    if not amortized:
        return ""
    kwh = getattr(win, "energy_kwh", None)
    power = f" ({_energy(kwh)} of device power for this run)" if kwh and math.isfinite(kwh) else ""
    return (f" Note: the {', '.join(amortized)} price is a purchase price amortized over 3 years that "
            f"excludes power, hosts and operations{power}, while cloud prices include them; compare "
            f"with that in mind or pass --price.")


def _infeasible_note(df: pd.DataFrame) -> str:
    bad = df[~df["feasible"]]
    if bad.empty:
        return ""
    return (f" {len(bad)} option(s) found no plan: "
            + "; ".join(f"{r.option} ({r.reason})" for r in bad.itertuples()) + ".")


def _training(df: pd.DataFrame) -> str:
    ok = df[df["feasible"]]
    tokens, deadline = df.attrs.get("tokens"), df.attrs.get("deadline_days")
    if "cost_to_train_usd_low" not in ok or not tokens:
        best = ok.sort_values("usd_per_mtok_low").iloc[0]
        return (f"Cheapest per token: {best.option} at {_money(best.usd_per_mtok_low)}-"
                f"{_money(best.usd_per_mtok_high)} per million tokens "
                f"({best.tokens_per_s:,.0f} tokens/s).")
    ttok = f"{tokens / 1e12:g}T tokens" if tokens >= 1e12 else f"{tokens:.3g} tokens"
    pool = ok[ok["meets_deadline"]] if deadline and "meets_deadline" in ok else ok
    if pool.empty:
        fast = ok.sort_values("time_to_train_days").iloc[0]
        return (f"No option trains {ttok} within {deadline:g} days. The fastest is {fast.option}: "
                f"{fast.time_to_train_days:.1f} days for "
                f"{_mrange(fast.cost_to_train_usd_low, fast.cost_to_train_usd_high)}.")
    win = pool.sort_values(["cost_to_train_usd_low", "time_to_train_days"]).iloc[0]
    what = f"meets the {deadline:g}-day deadline" if deadline else "trains the budget"
    named = win.option if win.option == win.devices else f"{win.option} ({win.devices})"
    text = (f"Cheapest option that {what}: {named}. It trains {ttok} in "
            f"{win.time_to_train_days:.1f} days ({win.time_to_train_days_best:.1f}-"
            f"{win.time_to_train_days_worst:.1f} across the disagreeing device figures and the prior profiles' +/-20%) for "
            f"{_mrange(win.cost_to_train_usd_low, win.cost_to_train_usd_high)} "
            f"(low-high price; {_mrange(win.cost_to_train_usd_best, win.cost_to_train_usd_worst)}"
            f" with figure uncertainty too), using "
            f"{_energy(win.energy_kwh)} of device power.")
    if deadline and not win.get("meets_deadline_worst", True):
        text += (f" Caution: under the worst-case figures it needs {win.time_to_train_days_worst:.1f}"
                 f" days and misses the deadline.")
    hi = pool.sort_values("cost_to_train_usd_high").iloc[0]
    if hi.option != win.option:
        text += (f" At the high end of the price ranges {hi.option} is cheaper "
                 f"({_money(hi.cost_to_train_usd_high)} vs {_money(win.cost_to_train_usd_high)}).")
    if not win.get("alternatives_fit", True):
        text += (f" Its plan does not fit memory if {win.get('alternatives_nofit', 'a disagreeing figure')}"
                 f" holds (a published figure that disagrees with the one used; see the table).")
    return text + _price_caveat(df, win)


def _inference(df: pd.DataFrame) -> str:
    ok = df[df["feasible"]]
    demand = df.attrs.get("videos_per_hour")
    if demand and "fleet_usd_per_hour_low" in ok:
        win = ok.sort_values(["fleet_usd_per_hour_low", "usd_per_video_low"]).iloc[0]
        text = (f"Cheapest way to serve {demand:g} videos/hour: {int(win.replicas)} x {win.option} "
                f"({win.videos_per_hour:.2f} videos/h each, {win.seconds_per_video:.0f} s per video) "
                f"for {_money(win.fleet_usd_per_hour_low)}-{_money(win.fleet_usd_per_hour_high)} per "
                f"hour, {_money(win.usd_per_video_low)}-{_money(win.usd_per_video_high)} per video.")
        if win.replicas_worst != win.replicas:
            text += (f" Under the worst-case device figures it needs {int(win.replicas_worst)} "
                     f"copies ({_money(win.fleet_usd_per_hour_worst)}/h at the high price).")
        hi = ok.sort_values("fleet_usd_per_hour_high").iloc[0]
        if hi.option != win.option:
            text += (f" At the high end of the price ranges {hi.option} is cheaper "
                     f"({_money(hi.fleet_usd_per_hour_high)}/h).")
    else:
        win = ok.sort_values("usd_per_video_low").iloc[0]
        text = (f"Cheapest per video: {win.option} at {_money(win.usd_per_video_low)}-"
                f"{_money(win.usd_per_video_high)} ({win.videos_per_hour:.2f} videos/h).")
    if not win.get("alternatives_fit", True):
        text += (f" Its plan does not fit memory if {win.get('alternatives_nofit', 'a disagreeing figure')}"
                 f" holds (a published figure that disagrees with the one used; see the table).")
    fast = ok.sort_values("seconds_per_video").iloc[0]
    if fast.option != win.option:
        text += f" Lowest latency: {fast.option} at {fast.seconds_per_video:.0f} s per video."
    return text + _price_caveat(df, win)


def recommendation(df: pd.DataFrame) -> str:
    """One paragraph naming the cheapest option that meets the deadline (or demand), with ranges."""
    if df.empty or not df["feasible"].any():
        return "No option found a plan." + _infeasible_note(df)
    text = _training(df) if df.attrs.get("kind", "training") == "training" else _inference(df)
    if df.attrs.get("sweep") and "tokens_per_usd" in df:
        top = df[df["feasible"]].sort_values("tokens_per_usd", ascending=False).iloc[0]
        text += (f" Most tokens per dollar within the budget: {top.option} "
                 f"({top.tokens_per_usd / 1e6:.2f}M tokens per $ at the low price).")
    return text + _infeasible_note(df)
